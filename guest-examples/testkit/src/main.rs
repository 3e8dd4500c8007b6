//! Flint test guest: one module whose arguments pick what it does, so that runtime and
//! end-to-end tests need a single fixture.
//!
//! The command is the first task argument (argv\[1\], right after the job name); numbers
//! are decimal.
//!
//! | command      | does                                                                  |
//! |--------------|-----------------------------------------------------------------------|
//! | `noop`       | nothing; exit 0, no output                                            |
//! | `echo`       | copies stdin to stdout byte for byte                                  |
//! | `sleep MS`   | sleeps MS milliseconds, then exits 0                                  |
//! | `after MS COMMAND...` | sleeps MS milliseconds, then does COMMAND (with its own arguments): a task that takes time and still has a result |
//! | `burn MS`    | computes for MS milliseconds of wall time (a busy wait: CPU time an executor can account for), then exits 0 |
//! | `slow-first MS` | on the first attempt (`FLINT_ATTEMPT=1`) computes for MS milliseconds (a busy wait, so a kill interrupts it, unlike `sleep`); then, on every attempt, copies stdin to stdout (for speculation) |
//! | `spin`       | computes forever without calling the host (for timeouts and kills)    |
//! | `alloc MB`   | allocates and touches MB MiB, then writes the byte count (decimal, no newline) |
//! | `exit N`     | logs `exiting with N` to stderr and exits with code N                 |
//! | `panic`      | panics with `testkit panic requested` (a trap, as guests abort)       |
//! | `print N`    | writes N bytes `x` to stdout, in chunks of up to 64 KiB               |
//! | `eprint N`   | writes N bytes `e` to stderr, in chunks of up to 64 KiB               |
//! | `env`        | writes the `FLINT_*` variables as sorted `KEY=VALUE` lines, then `ARGS=` and argv\[1..\] joined by spaces; extra arguments are allowed |
//! | `info`       | writes `{"job":…,"index":…,"count":…,"attempt":…}` from `flint_sdk::TaskInfo` |
//! | `read PATH`  | writes the bytes of the file at PATH to stdout (e.g. `/files/<name>`) |
//! | `write PATH` | creates or truncates the file at PATH and writes `flint` into it      |
//! | `recurse`    | recurses without bound until the wasm stack overflows (a trap); never returns |
//! | `facts`      | writes what it can learn of its host without reading a file's bytes: argv, environ in order, each preopen's fdstat and stats, its `fd_readdir` entries (`d_next`, `d_ino`) and each entry's stats (see `facts.rs`) |
//! | `http-get URL` | GET through `flint_sdk::http::get` (follows up to 10 redirects); writes `status=<code> bytes=<n> sha256=<hex>` and a newline, then the body as is when it is UTF-8 and under 1 KiB |
//! | `http-post URL` | POSTs stdin to URL (redirects not followed); writes as `http-get` |
//! | `http-req METHOD URL [NAME:VALUE...]` | any method, the headers in order (split at the first `:`, the value trimmed), stdin as the body, redirects not followed; writes as `http-get` |
//! | `http-n URL N` | N GETs one after another (redirects not followed), a `status=` line each (no body); stops at the first error |
//! | `http-par URL N` | sends N GETs before taking any response (`flint_sdk::http::send`; on wasip1 the executor holds each until taken, so each counts against `max_concurrent`), then a `status=` line per response; when one fails, the lines of those sent before it, then its error |
//!
//! The `http-*` commands write a failed request as one line on stdout, `error: <kind>:
//! <message>`, the kind being `Denied`, `Limit`, `Timeout`, `Io` or `Invalid` (or
//! `Unsupported` off wasm). `http-get`, `http-post` and `http-req` then exit 0: a
//! refusal alone must not fail the task, the test reads the line. `http-n` and
//! `http-par` write it to stderr too (the log: a failed task keeps no result) and exit 3
//! after it (a component exits 1: WASI 0.2 has success or failure only).
//!
//! Exit codes of its own: 2 for a missing or unknown command, a bad or missing number, a
//! missing path or URL, a header without `:`, or unexpected extra arguments (the message
//! on stderr names the valid commands); 1 when writing output fails, when `read` or
//! `write` cannot use PATH (`testkit: cannot read PATH: <error>`, or `cannot write`),
//! or, for `info`, when the `FLINT_*` variables are missing. PATH is passed to the
//! filesystem as given, so what it reaches is whatever the runtime preopened.
//! An `alloc` the memory limit cannot hold aborts, as does one over wasm32's 2 GiB
//! maximum `Vec`; both are traps. `exit` passes N through as given: WASI defines codes
//! 0 to 125 only, and a runtime may turn a larger one into a trap.
//!
//! `recurse` puts nothing on Rust's shadow stack, the 1 MiB region at the bottom of
//! linear memory that holds locals whose address is taken: overflowing that one shows
//! up as an out-of-bounds memory access, not as a stack overflow. Its frames live only
//! on the engine's own call stack, so the trap it ends in is the stack-overflow one.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::hint::black_box;
use std::io::{self, Write};
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flint_sdk::TaskInfo;

use egress::{Ended, HttpCommand};

mod egress;
#[cfg(target_os = "wasi")]
mod facts;

const USAGE: &str = "valid commands: noop, echo, sleep MS, after MS COMMAND..., burn MS, slow-first MS, \
                     spin, alloc MB, exit N, panic, print N, eprint N, env, info, read PATH, write PATH, \
                     recurse, facts, http-get URL, http-post URL, http-req METHOD URL [NAME:VALUE...], \
                     http-n URL N, http-par URL N";

const MIB: usize = 1024 * 1024;
const CHUNK: usize = 64 * 1024;
/// One write per 4 KiB commits every page whatever the host's page size (wasm pages
/// are 64 KiB, host pages usually 4 KiB), so the memory is used, not just reserved.
const TOUCH_STRIDE: usize = 4096;
/// What `write` puts into its file.
const WRITTEN: &[u8] = b"flint";

fn main() -> ExitCode {
    let args = flint_sdk::args();
    let command = match Command::parse(&args) {
        Ok(command) => command,
        Err(err) => {
            eprintln!("testkit: {err}; {USAGE}");
            return ExitCode::from(2);
        }
    };
    match command.run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("testkit: {err}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    Noop,
    Echo,
    Sleep(Duration),
    SlowFirst(Duration),
    Spin,
    Alloc { bytes: usize },
    Exit(i32),
    Panic,
    Print(u64),
    Eprint(u64),
    Env,
    Info,
    Read(String),
    Write(String),
    Recurse,
    Facts,
    After(Duration, Box<Command>),
    Burn(Duration),
    Http(HttpCommand),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum UsageError {
    NoCommand,
    UnknownCommand(String),
    MissingNumber {
        command: &'static str,
    },
    MissingPath {
        command: &'static str,
    },
    BadNumber {
        command: &'static str,
        value: String,
    },
    ExtraArguments {
        command: &'static str,
    },
    MissingUrl {
        command: &'static str,
    },
    BadHeader(String),
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsageError::NoCommand => write!(f, "no command given"),
            UsageError::UnknownCommand(name) => write!(f, "unknown command {name:?}"),
            UsageError::MissingNumber { command } => write!(f, "{command} needs a number"),
            UsageError::MissingPath { command } => write!(f, "{command} needs a path"),
            UsageError::BadNumber { command, value } => {
                write!(f, "{command}: {value:?} is not a valid number here")
            }
            UsageError::ExtraArguments { command } => {
                write!(f, "{command} takes no further arguments")
            }
            UsageError::MissingUrl { command } => write!(f, "{command} needs a URL"),
            UsageError::BadHeader(arg) => write!(f, "{arg:?} is not a header NAME:VALUE"),
        }
    }
}

impl Command {
    /// Parses argv after the job name.
    fn parse(args: &[String]) -> Result<Command, UsageError> {
        let (name, rest) = args.split_first().ok_or(UsageError::NoCommand)?;
        let command = match name.as_str() {
            "noop" => Command::Noop,
            "echo" => Command::Echo,
            "sleep" => Command::Sleep(Duration::from_millis(number("sleep", rest)?)),
            "after" => {
                let pause = Duration::from_millis(number("after", rest)?);
                let then = Command::parse(&rest[1..])?;
                return Ok(Command::After(pause, Box::new(then)));
            }
            "burn" => Command::Burn(Duration::from_millis(number("burn", rest)?)),
            "slow-first" => Command::SlowFirst(Duration::from_millis(number("slow-first", rest)?)),
            "spin" => Command::Spin,
            "alloc" => {
                let mib: usize = number("alloc", rest)?;
                let bytes = mib.checked_mul(MIB).ok_or_else(|| UsageError::BadNumber {
                    command: "alloc",
                    value: rest[0].clone(),
                })?;
                Command::Alloc { bytes }
            }
            "exit" => Command::Exit(number("exit", rest)?),
            "panic" => Command::Panic,
            "print" => Command::Print(number("print", rest)?),
            "eprint" => Command::Eprint(number("eprint", rest)?),
            // `env` exists to show what argv the task received, so it takes anything.
            "env" => return Ok(Command::Env),
            "info" => Command::Info,
            "read" => Command::Read(path("read", rest)?),
            "write" => Command::Write(path("write", rest)?),
            "recurse" => Command::Recurse,
            "facts" => Command::Facts,
            other => {
                return match HttpCommand::parse(other, rest) {
                    Some(parsed) => parsed.map(Command::Http),
                    None => Err(UsageError::UnknownCommand(other.to_owned())),
                };
            }
        };
        let expected = usize::from(command.takes_argument());
        if rest.len() > expected {
            return Err(UsageError::ExtraArguments {
                command: command.name(),
            });
        }
        Ok(command)
    }

    fn takes_argument(&self) -> bool {
        matches!(
            self,
            Command::Sleep(_)
                | Command::Burn(_)
                | Command::SlowFirst(_)
                | Command::Alloc { .. }
                | Command::Exit(_)
                | Command::Print(_)
                | Command::Eprint(_)
                | Command::Read(_)
                | Command::Write(_)
        )
    }

    fn name(&self) -> &'static str {
        match self {
            Command::Noop => "noop",
            Command::Echo => "echo",
            Command::Sleep(_) => "sleep",
            Command::After(..) => "after",
            Command::Burn(_) => "burn",
            Command::SlowFirst(_) => "slow-first",
            Command::Spin => "spin",
            Command::Alloc { .. } => "alloc",
            Command::Exit(_) => "exit",
            Command::Panic => "panic",
            Command::Print(_) => "print",
            Command::Eprint(_) => "eprint",
            Command::Env => "env",
            Command::Info => "info",
            Command::Read(_) => "read",
            Command::Write(_) => "write",
            Command::Recurse => "recurse",
            Command::Facts => "facts",
            Command::Http(command) => command.name(),
        }
    }

    /// Runs the command; `args` is argv after the job name, which `env` echoes.
    fn run(self, args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
        match self {
            Command::Noop => {}
            Command::Echo => {
                let mut stdout = io::stdout().lock();
                io::copy(&mut io::stdin().lock(), &mut stdout)?;
                stdout.flush()?;
            }
            Command::Sleep(duration) => std::thread::sleep(duration),
            Command::After(pause, then) => {
                std::thread::sleep(pause);
                return then.run(args);
            }
            Command::Burn(duration) => {
                let start = std::time::Instant::now();
                while start.elapsed() < duration {
                    black_box(0u64);
                }
            }
            Command::SlowFirst(duration) => {
                if std::env::var("FLINT_ATTEMPT").as_deref() == Ok("1") {
                    let start = std::time::Instant::now();
                    while start.elapsed() < duration {
                        black_box(0u64);
                    }
                }
                let mut stdout = io::stdout().lock();
                io::copy(&mut io::stdin().lock(), &mut stdout)?;
                stdout.flush()?;
            }
            Command::Spin => spin(),
            Command::Alloc { bytes } => alloc(bytes)?,
            Command::Exit(code) => {
                eprintln!("exiting with {code}");
                std::process::exit(code);
            }
            Command::Panic => panic!("testkit panic requested"),
            Command::Print(count) => repeat(b'x', count, flint_sdk::write_result)?,
            Command::Eprint(count) => {
                let mut stderr = io::stderr().lock();
                repeat(b'e', count, |chunk| stderr.write_all(chunk))?;
            }
            Command::Env => {
                flint_sdk::write_result(env_report(std::env::vars_os(), args).as_bytes())?
            }
            Command::Info => flint_sdk::write_result(info_json(&TaskInfo::from_env()?).as_bytes())?,
            Command::Read(path) => {
                let bytes = fs::read(&path).map_err(|err| format!("cannot read {path}: {err}"))?;
                flint_sdk::write_result(&bytes)?;
            }
            Command::Write(path) => {
                fs::write(&path, WRITTEN).map_err(|err| format!("cannot write {path}: {err}"))?
            }
            Command::Recurse => {
                recurse();
            }
            Command::Facts => flint_sdk::write_result(facts_report()?.as_bytes())?,
            Command::Http(command) => {
                if command.run()? == Ended::Stopped {
                    // Like `exit`: the output is flushed, and the code is the result.
                    std::process::exit(egress::STOPPED.into());
                }
            }
        }
        Ok(())
    }
}

#[cfg(target_os = "wasi")]
fn facts_report() -> Result<String, &'static str> {
    Ok(facts::facts())
}

/// The host unit tests build for the host, where there is no WASI to ask.
#[cfg(not(target_os = "wasi"))]
fn facts_report() -> Result<String, &'static str> {
    Err("facts calls WASI preview 1: it runs as a wasm guest only")
}

/// Parses the single number argument of `command`.
fn number<T: FromStr>(command: &'static str, rest: &[String]) -> Result<T, UsageError> {
    let value = rest.first().ok_or(UsageError::MissingNumber { command })?;
    value.parse().map_err(|_| UsageError::BadNumber {
        command,
        value: value.clone(),
    })
}

/// The single path argument of `command`, taken as given.
fn path(command: &'static str, rest: &[String]) -> Result<String, UsageError> {
    rest.first()
        .cloned()
        .ok_or(UsageError::MissingPath { command })
}

fn spin() -> ! {
    // An LCG step per iteration; `black_box` keeps the compiler from proving the loop
    // has no effect, and nothing in it calls the host, so only an epoch deadline (or
    // fuel) can stop it.
    let mut state: u64 = 1;
    loop {
        state = black_box(
            state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407),
        );
    }
}

/// How deep `recurse` has gone.
static DEPTH: AtomicU64 = AtomicU64::new(0);

/// Calls itself until the engine's call stack runs out.
///
/// Updating a static before and after the inner call gives every frame an effect the
/// optimizer must keep, and the update after it makes the call a non-tail call, which
/// no optimisation can turn into a loop. Nothing here takes an address, so no frame
/// uses the shadow stack in linear memory (see the module doc). Never returns.
#[expect(
    unconditional_recursion,
    reason = "running out of stack is the purpose"
)]
fn recurse() -> u64 {
    let depth = DEPTH.fetch_add(1, Ordering::Relaxed);
    let below = recurse();
    DEPTH.store(depth, Ordering::Relaxed);
    below.rotate_left(1) ^ depth
}

fn alloc(bytes: usize) -> io::Result<()> {
    let mut block = vec![0u8; bytes];
    for byte in block.iter_mut().step_by(TOUCH_STRIDE) {
        *byte = 1;
    }
    black_box(&mut block);
    flint_sdk::write_result(bytes.to_string().as_bytes())
}

/// Hands `count` copies of `byte` to `write` in chunks of at most [`CHUNK`] bytes.
fn repeat(byte: u8, count: u64, mut write: impl FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
    let chunk_len = usize::try_from(count).map_or(CHUNK, |count| count.min(CHUNK));
    let chunk = vec![byte; chunk_len];
    let mut left = count;
    while left > 0 {
        let len = usize::try_from(left).map_or(chunk_len, |left| left.min(chunk_len));
        write(&chunk[..len])?;
        left -= len as u64;
    }
    Ok(())
}

/// The `FLINT_*` variables as sorted `KEY=VALUE` lines, then `ARGS=` and the args.
fn env_report<K, V>(vars: impl IntoIterator<Item = (K, V)>, args: &[String]) -> String
where
    K: AsRef<std::ffi::OsStr>,
    V: AsRef<std::ffi::OsStr>,
{
    // Keyed by name, not sorted as whole lines: `=` sorts after the digits, so line
    // order would put `FLINT_A1` before `FLINT_A`.
    let flint_vars: BTreeMap<String, String> = vars
        .into_iter()
        .filter_map(|(key, value)| {
            let key = key.as_ref().to_str()?;
            key.starts_with("FLINT_").then(|| {
                let value = value.as_ref().to_string_lossy().into_owned();
                (key.to_owned(), value)
            })
        })
        .collect();
    let mut report = String::new();
    for (key, value) in &flint_vars {
        report.push_str(&format!("{key}={value}\n"));
    }
    report.push_str("ARGS=");
    report.push_str(&args.join(" "));
    report.push('\n');
    report
}

fn info_json(info: &TaskInfo) -> String {
    // Written by hand to keep the documented key order; serde_json still quotes the
    // job id, which comes from outside.
    let job = serde_json::Value::from(info.job_id.as_str());
    format!(
        r#"{{"job":{job},"index":{},"count":{},"attempt":{}}}"#,
        info.index, info.count, info.attempt
    )
}

#[cfg(test)]
mod tests;
