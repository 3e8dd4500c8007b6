//! Helpers for writing Flint tasks in Rust.
//!
//! A Flint task is an ordinary WASI preview-1 program (`wasm32-wasip1`). Nothing in
//! this crate is required to write one: it only names the pieces of the contract so
//! that a task reads like what it does. The contract ("guest ABI") is:
//!
//! | channel   | meaning                                                             |
//! |-----------|---------------------------------------------------------------------|
//! | stdin     | the task's input bytes ([`read_input`])                             |
//! | stdout    | the task's result bytes ([`write_result`])                          |
//! | stderr    | the task's log, kept and capped by the executor (`eprintln!`)       |
//! | argv      | `[job name] + job args + task args` ([`args`] skips the job name)   |
//! | env       | job env + task env + the `FLINT_*` variables ([`TaskInfo`])         |
//! | `/files/<name>` | the job's named files, read-only (`std::fs`)                  |
//! | exit code | 0 = success; anything else = failed, with that code reported        |
//!
//! A panic is a failure too: guests are built with `panic = "abort"`, so a panic
//! becomes a wasm trap, which the executor reports as `trap`. Returning `Err` from
//! `main` prints the error to stderr and exits with code 1.
//!
//! WASI defines exit codes 0 to 125 only; a runtime may treat a larger code passed to
//! `std::process::exit` as a trap rather than as that code.
//!
//! # Example
//!
//! A task that upper-cases its input and logs where it runs:
//!
//! ```no_run
//! use flint_sdk::{TaskInfo, read_input, write_result};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let info = TaskInfo::from_env()?;
//!     eprintln!(
//!         "job {} task {}/{} attempt {}",
//!         info.job_id, info.index, info.count, info.attempt
//!     );
//!     let input = read_input()?;
//!     write_result(&input.to_ascii_uppercase())?;
//!     Ok(())
//! }
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip1` and submit the
//! resulting `.wasm` with `flint submit`.
//!
//! # Invariants
//!
//! The crate has no dependencies beyond `std` and does no I/O other than the
//! process's own stdin, stdout, argv and environment. [`TaskInfo::from_vars`] is pure,
//! so the environment parsing is testable on the host without touching the real
//! process environment.

mod task_info;

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
