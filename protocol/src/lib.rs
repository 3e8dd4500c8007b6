//! Flint's wire types: what the driver, the executors and HTTP clients say to each other.
//!
//! - [`ids`]: typed identifiers (`JobId`, `TaskId`, `ExecutorId`, `Digest`).
//! - [`task`]: what an executor is asked to run (a [`JobTemplate`] once per job, then a
//!   [`TaskLaunch`] per attempt, joined as a [`TaskDescription`]) and what it reports
//!   back ([`TaskStatus`]), including the classified failure kinds.
//! - [`messages`]: the driver <-> executor messages, named after Spark's
//!   CoarseGrainedClusterMessages, and the versioned [`Hello`] that opens a connection.
//! - [`codec`]: length-delimited frames of postcard-encoded messages.
//! - `handshake` (with `codec`): the hello that opens a connection, both ends of it.
//! - [`api`]: the JSON shapes of the HTTP API (`JobSpec`, job / task / executor views).
//! - [`records`]: what the driver's job store keeps on disk.
//! - [`exit`]: the executor's exit codes and what an exit means (Spark's ExecutorExitCode).
//!
//! Invariants: this crate does no I/O and has no runtime; it is the only crate whose types
//! derive `Serialize`/`Deserialize`, so a wire change is always visible here. Defaults that
//! users see (task resources, limits) live in [`defaults`].

pub mod api;
pub mod codec;
pub mod defaults;
pub mod exit;
#[cfg(feature = "codec")]
pub mod handshake;
pub mod ids;
pub mod messages;
pub mod records;
pub mod task;
pub mod usage;

pub use ids::{Digest, ExecutorId, JobId, TaskId};
pub use messages::{
    DriverMessage, ExecutorMessage, HeldAttempt, Hello, HelloReply, PROTOCOL_VERSION,
};
pub use task::{
    BlockRef, Determinism, EgressPin, FailureKind, FetchRef, FileRef, InputPart, JobTemplate,
    ModuleRef, NetworkGrant, Pins, Resources, TaskDescription, TaskEnd, TaskFailure, TaskInput,
    TaskLaunch, TaskResult, TaskStatus, Upstream,
};
pub use usage::Usage;
