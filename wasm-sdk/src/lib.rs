//! Write Flint tasks in Rust.
//!
//! A Flint task is an ordinary WASI program (`wasm32-wasip1` module or `wasm32-wasip2`
//! command component). Nothing in this crate is required to write one; it hides the
//! plumbing of the contract ("guest ABI") so that a task reads like what it does:
//!
//! | channel   | meaning                                                  | in the SDK |
//! |-----------|----------------------------------------------------------|------------|
//! | stdin     | the task's input bytes                                   | the input argument of [`run`] / [`run_bytes`] ([`read_input`]) |
//! | stdout    | the task's result bytes                                  | what the task returns ([`write_result`]) |
//! | stderr    | the task's log, kept and capped by the executor          | [`Context::log`], `eprintln!` |
//! | argv      | `[job name] + job args + task args`                      | [`Context::args`] ([`args`]) |
//! | env       | job env + task env + the `FLINT_*` variables             | [`Context::index`], [`Context::count`], [`Context::attempt`], [`Context::job_id`] ([`TaskInfo`]) |
//! | `/files/<name>` | the job's named files, read-only                   | [`Context::file`], [`Context::read_file`] |
//! | exit code | 0 = success; anything else = failed, with the code       | [`Error`] and its [`ErrorKind`] |
//! | outbound HTTP | requests the executor judges against the job's `network.allow` and meters | [`http::get`], [`http::post`], [`http::request`], [`http::send`] |
//!
//! # Typed JSON in and out
//!
//! [`run`] reads stdin, decodes it into the closure's input type with serde, calls it,
//! and writes what it returns as JSON. An error ends the task with the exit code of its
//! kind and its message in the log: undecodable input is 65, a usage error (a bad
//! argument, a missing job file) 64, I/O 74, anything else 1 (any `std::error::Error`
//! converts with `?`).
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use flint_sdk::{Context, Error};
//!
//! #[derive(serde::Deserialize)]
//! struct Query { words: Vec<String> }
//!
//! fn main() -> std::process::ExitCode {
//!     flint_sdk::run(|ctx: &Context, query: Query| -> Result<BTreeMap<String, usize>, Error> {
//!         // job files are mounted read-only at /files/<name>
//!         let text = String::from_utf8_lossy(&ctx.read_file("book.txt")?).into_owned();
//!         ctx.log(format_args!("task {} of {}, attempt {}", ctx.index(), ctx.count(), ctx.attempt()));
//!         Ok(query.words.into_iter()
//!             .map(|w| { let n = text.matches(w.as_str()).count(); (w, n) })
//!             .collect())
//!     })
//! }
//! ```
//!
//! Submitted with `flint submit query.wasm --file book.txt=book.txt --input-text
//! '{"words": ["whale"]}' --wait`, it prints `{"whale":…}`.
//!
//! # Raw bytes
//!
//! [`run_bytes`] hands over stdin as bytes and writes the returned bytes:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     flint_sdk::run_bytes(|ctx, input| {
//!         let pattern = ctx.args().first().ok_or(flint_sdk::Error::usage("usage: PATTERN"))?;
//!         let lines: Vec<&[u8]> = input
//!             .split(|&b| b == b'\n')
//!             .filter(|line| line.windows(pattern.len()).any(|w| w == pattern.as_bytes()))
//!             .collect();
//!         Ok(lines.join(&b'\n'))
//!     })
//! }
//! ```
//!
//! [`run_streaming`] decodes the input the same way and hands the task an [`Output`]
//! to write a large result piece by piece.
//!
//! # Testing a task on the host
//!
//! [`call_json`] is [`run`] without stdin and stdout, and [`Context::new`] builds a
//! context by hand (with [`Context::with_files_dir`] for the files):
//!
//! ```
//! use flint_sdk::{Context, Error, call_json};
//!
//! fn task(ctx: &Context, names: Vec<String>) -> Result<String, Error> {
//!     Ok(format!("{} greets {}", ctx.index(), names.join(" and ")))
//! }
//!
//! let ctx = Context::new("job-1", 3, 8, vec![]);
//! let out = call_json(&ctx, br#"["ann", "bo"]"#, task).unwrap();
//! assert_eq!(out, br#""3 greets ann and bo""#);
//! ```
//!
//! # Outbound HTTP
//!
//! [`http`] sends requests through the executor, which refuses any the operator, the
//! tenant or the job (`"network": {"allow": ["https://api.example.com"]}`) does not
//! allow, and counts them against the task's `resources.egress`. A refusal is an
//! [`http::Error`] for the task to handle, not a failure by itself:
//!
//! ```no_run
//! use flint_sdk::http;
//!
//! match http::get("https://api.example.com/v1/ping") {
//!     Ok(response) => println!("{} {}", response.status, response.text().unwrap_or("")),
//!     Err(http::Error::Denied(why)) => eprintln!("not allowed: {why}"),
//!     Err(other) => eprintln!("{other}"),
//! }
//! ```
//!
//! # Building
//!
//! `cargo build --release --target wasm32-wasip1` (a core module) or `--target
//! wasm32-wasip2` (a component); build with `panic = "abort"`, so that a panic becomes
//! a wasm trap, reported as `trap`. WASI defines exit codes 0 to 125 only, and WASI 0.2
//! carries only success or failure, so a component's failure is exit code 1.
//!
//! # Invariants
//!
//! The crate depends on serde only (and, for wasm32-wasip2 alone, on the `wasip2`
//! bindings) and does no I/O other than the process's own stdin, stdout, stderr, argv,
//! environment and `/files`, and the HTTP requests a task makes through [`http`]. Those
//! go through the executor only: the `flint` import module from a core module, wasi:http
//! from a component (never the `flint` module, which would make it unbuildable), and on
//! any other target every call is [`http::Error::Unsupported`]. Everything between
//! reading stdin and writing stdout ([`call_json`], [`TaskInfo::from_vars`],
//! [`Context::new`]) is pure, so tasks are testable on the host.

pub mod http;
mod task;
mod task_info;

pub use task::{
    Context, Error, ErrorKind, FILES_DIR, Output, call_json, run, run_bytes, run_streaming,
};
pub use task_info::{
    ENV_ATTEMPT, ENV_JOB_ID, ENV_TASK_COUNT, ENV_TASK_INDEX, TaskInfo, TaskInfoError,
};

use std::io::{self, Read, Write};

/// Reads the task's whole input (all of stdin).
///
/// The whole input is held in memory, which the job's `memory_mb` limit has to allow
/// for. Call it once: a second call finds stdin at its end and returns an empty vector.
pub fn read_input() -> io::Result<Vec<u8>> {
    let mut input = Vec::new();
    io::stdin().lock().read_to_end(&mut input)?;
    Ok(input)
}

/// Writes `bytes` as (part of) the task's result on stdout and flushes it.
///
/// Successive calls append, so a large result can be written in pieces. The flush
/// matters because Rust's stdout is line-buffered and a task that exits through
/// `std::process::exit` would otherwise lose a buffered tail. An error here usually
/// means the executor stopped accepting output (for example, the job's output limit
/// was reached); the task should give up rather than retry.
pub fn write_result(bytes: &[u8]) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(bytes)?;
    stdout.flush()
}

/// The task's arguments: argv after the job name, i.e. the job's args followed by the
/// task's own args.
///
/// # Panics
///
/// Panics, like [`std::env::args`], if an argument is not valid Unicode. Flint's job
/// spec carries arguments as JSON strings, so this cannot happen for a task launched
/// by Flint.
pub fn args() -> Vec<String> {
    std::env::args().skip(1).collect()
}
