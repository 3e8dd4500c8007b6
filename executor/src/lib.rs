//! Flint's executor: Spark's CoarseGrainedExecutorBackend and Executor, rebuilt for wasm.
//!
//! - [`backend`]: the one connection to the driver: hello, RetrieveConfig,
//!   RegisterExecutor, then LaunchTask / KillTask in and StatusUpdate / Heartbeat out.
//! - [`runner`]: the task runner: module fetch + compile cache, the task thread pool,
//!   kill flags, exactly one status per attempt.
//! - [`compiler`]: compiled artifacts on disk (verified before loading) and the
//!   compiler subprocess, killed at a time bound.
//! - [`sandbox`]: wasmtime: the engine, compiling, running one attempt under its limits,
//!   classifying how it ended.
//! - [`pipes`]: capped stdout / stderr.
//!
//! Invariants: guests run only on the runner's threads, never on the async runtime, so
//! heartbeats and kills are never stuck behind a guest; a `Store` serves one attempt and is
//! dropped after it; the executor never imports the driver (they meet in `flint-protocol`).

pub mod backend;
pub mod blocks;
pub mod compiler;
pub mod local;
mod outcome;
mod pipes;
pub mod results;
pub mod runner;
pub mod sandbox;

pub use backend::{ExecutorOptions, ExitReason, run};
