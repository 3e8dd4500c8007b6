//! Flint's commands, behind two binaries. `flint` (src/main.rs) is what users run: it
//! parses every command, runs the client commands itself and `exec`s `flint-engine`
//! (src/bin/flint-engine.rs, installed beside it) for the rest: the driver, the
//! executors, the local dev cluster, replay and the benchmarks. Only the engine carries
//! the wasm compiler and the driver: a client command's start was mostly the dynamic
//! linker relocating the binary (a copy-on-write fault per page of relocated data),
//! and they made that 88,000 relocations, 1.3 ms of every `flint status`.
//!
//! The subcommands are declared in `cli` and the long-running ones' flags in `flags`
//! (clap, each with a `FLINT_*` variable), parsed once here and handed down as typed
//! configs; libraries never read the environment. This file only dispatches: each
//! command lives in its own module, and no module names this file.

mod bench;
mod cli;
mod client;
mod dev;
mod flags;
mod follow;
mod graph;
mod jobs;
mod progress;
mod replay;
mod rest;
mod shutdown;
mod submit;
mod worker;

use clap::{ArgMatches, CommandFactory, FromArgMatches};
use flint_executor::ExitReason;

pub use crate::rest::Allocator;

use crate::cli::{Cli, Command};
use crate::flags::{CompileArgs, DriverCommand, ExecutorArgs};
use crate::shutdown::shutdown_signal;

/// mimalloc asks for transparent huge pages on its arenas and hands unused 64 KiB
/// slices back to the kernel a second later; touching such a range again faults in a whole
/// 2 MiB page, zeroed. With the driver's and executors' message churn that zeroing was a
/// tenth of all CPU in `flint bench` (clear_page_erms under do_huge_pmd_anonymous_page),
/// so Flint's processes (and the executors they start, which inherit it) opt out. The
/// allocator's first arena, made before `main`, is kept off huge pages by mimalloc's
/// `no_thp` (Cargo.toml); this covers kernels set to THP `always` from here on.
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process's memory map.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        // Kernels without THP refuse it; nothing to turn off there.
        tracing::debug!("PR_SET_THP_DISABLE: {}", std::io::Error::last_os_error());
    }
}

/// The compiler subprocess: no runtime, no logging, one job.
fn compile_module(args: &CompileArgs) -> i32 {
    let config = flint_executor::sandbox::SandboxConfig {
        slots: args.slots,
        max_memory_bytes: args.max_memory_bytes,
        fuel: args.fuel,
    };
    let result = std::fs::read(&args.input)
        .map_err(|e| (1, format!("reading {}: {e}", args.input.display())))
        .and_then(|wasm| {
            let kind = flint_executor::sandbox::EngineKind::of(args.deterministic);
            let engine = flint_executor::sandbox::engine_for(config, kind)
                .map_err(|e| (1, format!("{e:#}")))?;
            flint_executor::sandbox::precompile(&engine, &wasm)
                .map_err(|m| (flint_executor::compiler::EXIT_INVALID_MODULE, m))
        })
        .and_then(|artifact| {
            std::fs::write(&args.out, artifact)
                .map_err(|e| (1, format!("writing {}: {e}", args.out.display())))
        });
    match result {
        Ok(()) => 0,
        Err((code, message)) => {
            eprintln!("{message}");
            code
        }
    }
}

/// `flint`: runs the client commands here and hands the rest to `flint-engine`; help,
/// versions and usage errors are this binary's (they never start the engine).
pub fn client_main() -> ! {
    no_transparent_huge_pages();
    let (cli, matches) = parse_client().unwrap_or_else(parse);
    if let Some(code) = run_at_once(&cli.command) {
        std::process::exit(code);
    }
    if !is_client(&cli.command) {
        exec_engine();
    }
    let command = cli.command;
    init_tracing("warn");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    let result = runtime.block_on(run_client(command, &matches));
    std::process::exit(exit_code(result));
}

/// `flint-engine`: every command, in this process. Services, replay and the benchmarks
/// reach it through `flint`; the processes it starts (executors, compilers, simulated
/// executors) run it directly.
pub fn engine_main(allocator: Allocator) -> ! {
    check_client_build();
    no_transparent_huge_pages();
    let (cli, matches) = parse();
    let command = match cli.command {
        Command::CompileModule(args) => std::process::exit(compile_module(&args)),
        Command::SimulateExecutors(args) => std::process::exit(bench::simulate::run(args)),
        command => match run_at_once(&command) {
            Some(code) => std::process::exit(code),
            None => command,
        },
    };
    // The services log what they do; a client command, or a benchmark (whose in-process
    // driver would log every job it runs between its figures), logs warnings only
    // unless FLINT_LOG asks for more.
    let service = matches!(
        command,
        Command::Dev(_) | Command::Driver(_) | Command::Executor(_) | Command::Worker(_)
    );
    // wasmtime-wasi opens a span on every preview-1 call a guest makes, at `info` (its
    // `#[instrument]`'s default level), and the log formats its arguments on the task
    // thread: a per-task cost for spans that nothing of ours logs inside. FLINT_LOG can
    // still ask for them.
    init_tracing(if service {
        "info,wasmtime_wasi=warn"
    } else {
        "warn"
    });
    if service {
        rest::keep_lean(allocator);
    }
    let runtime = runtime_for(&command);
    let result = runtime.block_on(run(command, &matches));
    // Task threads and the epoch ticker are plain threads; exit without waiting for them.
    std::process::exit(exit_code(result));
}

/// The binary `flint` hands its service commands to, looked for beside it.
pub const ENGINE: &str = "flint-engine";

/// A digest of the sources both binaries are built from (build.rs).
const BUILD_ID: &str = env!("FLINT_BUILD_ID");

/// Set by `flint` on the engine it execs: its own [`BUILD_ID`].
const CLIENT_BUILD: &str = "FLINT_CLIENT_BUILD";

/// Refuses to run for a `flint` of another build (an engine left from before a
/// `cargo build --bin flint`, or one file of an install replaced): its flags and its
/// behaviour would be the old build's, silently. Then names the process `flint`, as
/// it was before the engine was a binary of its own, so that `ps`, `top` and
/// `pkill -x flint` find every Flint process as they did.
fn check_client_build() {
    if let Some(client) = std::env::var_os(CLIENT_BUILD) {
        // SAFETY: the first thing `main` does, before any other thread exists: nothing
        // reads the environment meanwhile. Removed so that no child inherits it.
        unsafe { std::env::remove_var(CLIENT_BUILD) };
        if client != BUILD_ID {
            eprintln!(
                "flint: the {ENGINE} beside flint is of another build (flint {}, \
                 {ENGINE} {BUILD_ID}): build or install both together (`cargo build` \
                 and `cargo install --path .` do)",
                client.to_string_lossy()
            );
            std::process::exit(127);
        }
    }
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"flint".as_ptr(), 0, 0, 0) };
}

/// A client command parsed with its own subcommand alone ([`cli::client_subcommand`]);
/// `None` for anything else, help and parse errors included, which the whole tree
/// parses (and reports) as it always has.
fn parse_client() -> Option<(Cli, ArgMatches)> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let name = args.get(1)?.to_str()?;
    // `help` too: `flint graph help` is clap's help subcommand (rarely, an input).
    let asks_help = |arg: &std::ffi::OsString| arg == "-h" || arg == "--help" || arg == "help";
    if args[2..].iter().any(asks_help) {
        return None;
    }
    let command = clap::Command::new("flint").subcommand(cli::client_subcommand(name)?);
    let matches = command.try_get_matches_from(&args).ok()?;
    let cli = Cli::from_arg_matches(&matches).ok()?;
    Some((cli, matches))
}

fn parse() -> (Cli, ArgMatches) {
    let matches = Cli::command().get_matches();
    match Cli::from_arg_matches(&matches) {
        Ok(cli) => (cli, matches),
        Err(e) => e.exit(),
    }
}

/// Replaces this process with `flint-engine`, same arguments, same `argv[0]` (so `ps`
/// and the process id a caller holds are unchanged).
fn exec_engine() -> ! {
    use std::os::unix::process::CommandExt;
    let engine = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(ENGINE),
        Err(e) => {
            eprintln!("flint: locating this binary to find {ENGINE} beside it: {e}");
            std::process::exit(127);
        }
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "flint".into());
    let error = std::process::Command::new(&engine)
        .arg0(arg0)
        .args(args)
        .env(CLIENT_BUILD, BUILD_ID)
        .exec();
    eprintln!(
        "flint: this command runs in {ENGINE}, which should be beside flint at {}: {error} \
         (install both: `cargo install --path .` does)",
        engine.display()
    );
    std::process::exit(127);
}

/// The commands that send a request or a few to a driver and wait: what `flint` runs
/// itself.
fn is_client(command: &Command) -> bool {
    matches!(
        command,
        Command::Submit(_)
            | Command::Status(_)
            | Command::Graph(_)
            | Command::Results(_)
            | Command::Logs(_)
            | Command::Kill(_)
            | Command::Delete(_)
            | Command::Executors(_)
            | Command::Workers(_)
    )
}

/// The commands either binary runs at once, with no runtime: their exit code.
fn run_at_once(command: &Command) -> Option<i32> {
    match command {
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "flint", &mut std::io::stdout());
            Some(0)
        }
        Command::HashToken => {
            let mut token = String::new();
            if std::io::stdin().read_line(&mut token).is_err() || token.trim().is_empty() {
                eprintln!("flint hash-token: give the token on standard input");
                return Some(2);
            }
            println!(
                "{}",
                flint_driver::tenants::hash_token(token.trim_end_matches(['\r', '\n']))
            );
            Some(0)
        }
        _ => None,
    }
}

fn exit_code(result: anyhow::Result<i32>) -> i32 {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flint: {e:#}");
            1
        }
    }
}

/// A client command sends a request or a few and waits: one thread does that, where a
/// multi-threaded runtime would start a worker per CPU first. An executor's runtime
/// carries its wire, fetches and uploads beside task threads of its own, so its
/// workers are sized to the cores it offers, not to the host's (a 1-core executor on a
/// 64-core host would start 64). The driver, the benchmarks and `replay` (whose
/// runtime waits on the guest's thread) take every CPU.
fn runtime_for(command: &Command) -> tokio::runtime::Runtime {
    let mut builder = match command {
        command if is_client(command) => tokio::runtime::Builder::new_current_thread(),
        Command::Executor(args) => {
            let mut builder = rest::service_runtime();
            builder.worker_threads(args.runtime_threads());
            builder
        }
        Command::Dev(_) | Command::Driver(_) | Command::Worker(_) => rest::service_runtime(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    builder
        .enable_all()
        .build()
        .expect("building the tokio runtime")
}

async fn run(command: Command, matches: &ArgMatches) -> anyhow::Result<i32> {
    match command {
        Command::Dev(args) => dev::run(args).await.map(|()| 0),
        Command::Driver(args) => run_driver(args).await.map(|()| 0),
        Command::Executor(args) => run_executor(args).await,
        Command::Worker(args) => worker::run(args).await,
        Command::Replay(args) => replay::run(args).await,
        Command::Bench(args) => bench::run(args).await.map(|()| 0),
        command => run_client(command, matches).await,
    }
}

async fn run_client(command: Command, matches: &ArgMatches) -> anyhow::Result<i32> {
    match command {
        Command::Submit(args) => {
            let sub = matches
                .subcommand_matches("submit")
                .expect("the submit subcommand was parsed");
            submit::run(args, sub).await
        }
        Command::Status(args) => jobs::status(args).await,
        Command::Graph(args) => graph::run(args).await,
        Command::Results(args) => jobs::results(args).await,
        Command::Logs(args) => jobs::logs(args).await,
        Command::Kill(args) => jobs::kill(args).await,
        Command::Delete(args) => jobs::delete(args).await,
        Command::Executors(args) => jobs::executors(args).await,
        Command::Workers(args) => jobs::workers(args).await,
        _ => unreachable!("only client commands come here"),
    }
}

async fn run_driver(args: DriverCommand) -> anyhow::Result<()> {
    let config = args.config()?;
    let listeners = dev::bind(&args.driver).await?;
    let driver = flint_driver::Driver::new(config, listeners.http.local_addr()?)?;
    flint_driver::run(driver, listeners, shutdown_signal()).await
}

async fn run_executor(args: ExecutorArgs) -> anyhow::Result<i32> {
    let options = args.options()?;
    // On a worker, not in the main thread's block_on: a worker parked in epoll runs the
    // connection it woke for itself, where block_on's future would need that worker to
    // wake the main thread for every frame (a futex call and a context switch, 2 us of
    // a no-op task's 12 in `flint bench`).
    let reason = tokio::spawn(flint_executor::run(options, shutdown_signal())).await??;
    match &reason {
        ExitReason::Stopped => tracing::info!("executor stopped"),
        ExitReason::RegistrationRefused(why) => {
            eprintln!("flint executor: the driver refused this executor: {why}")
        }
        ExitReason::DriverUnreachable(why) | ExitReason::DriverLost(why) => {
            eprintln!("flint executor: {why}")
        }
    }
    Ok(reason.exit_code())
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLINT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
