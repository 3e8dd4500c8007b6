//! Flint's executor: Spark's CoarseGrainedExecutorBackend and Executor, rebuilt for wasm.
//!
//! - [`backend`]: the connection to the driver: hello, RetrieveConfig, RegisterExecutor
//!   (listing the attempts held here), then LaunchTask / KillTask / EndsDurable in and
//!   StatusUpdate / Heartbeat out; through a driver's absence, tasks keep running for
//!   the driver-loss grace while it reconnects.
//! - [`runner`]: the task runner: module fetch + compile cache, the task thread pool,
//!   kill flags, exactly one end per attempt.
//! - [`ends`]: the end buffer: every end numbered and held (in memory, then on disk)
//!   until the driver says it is durable, sent again on each new connection until then.
//! - [`blocks`]: large results' uploads, kept on disk while the driver is away.
//! - [`compiler`]: compiled artifacts on disk (verified before loading) and the
//!   compiler subprocess, killed at a time bound.
//! - [`sandbox`]: wasmtime: the engine, compiling, running one attempt under its limits,
//!   classifying how it ended.
//! - [`pipes`]: capped stdout / stderr.
//!
//! Invariants: guests run only on the runner's threads, never on the async runtime, so
//! heartbeats and kills are never stuck behind a guest; a `Store` serves one attempt and is
//! dropped after it; the executor never imports the driver (they meet in `flint-protocol`);
//! an attempt's end goes out in its number's order and is kept until the driver says it
//! is durable, so that no end is lost with a connection or a driver.

pub mod backend;
pub mod blocks;
pub mod compiler;
pub mod ends;
pub mod local;
mod outcome;
mod pipes;
pub mod results;
pub mod runner;
pub mod sandbox;

pub use backend::{ExecutorOptions, ExitReason, run};
