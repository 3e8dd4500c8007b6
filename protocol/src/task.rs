//! A task on the wire: what the driver launches and what the executor reports back.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::usage::Usage;

use crate::defaults;
use crate::ids::{Digest, JobId, TaskId};

mod input;
pub use input::{InputPart, TaskInput, Upstream};

/// What every task of a job shares: sent to an executor once, in
/// [`DriverMessage::DefineJob`](crate::DriverMessage::DefineJob), before the job's first
/// launch there, so that a launch carries only what is the task's own (a 200k-task job
/// used to send, and its executors decode, the module URL, name and env 200k times).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTemplate {
    /// Names the template in [`TaskLaunch::job`] on one connection.
    pub key: u64,
    pub job: JobId,
    /// Tasks in the job, for `FLINT_TASK_COUNT`.
    pub task_count: u32,
    /// The guest's `argv[0]`: the job's name.
    pub name: String,
    pub module: ModuleRef,
    /// The job's files, mounted read-only at `/files/<name>`.
    pub files: Vec<FileRef>,
    /// The job's args, before each task's own.
    pub args: Vec<String>,
    /// The job's env, under each task's own. The executor adds the `FLINT_*` variables.
    pub env: Vec<(String, String)>,
    pub resources: Resources,
    /// Set for a job submitted with `"deterministic": true`: its guests get a virtual
    /// clock, a random source seeded from this, and no ambient environment.
    pub determinism: Option<Determinism>,
    /// The outbound HTTP the job's tasks may make; `None`: none (every request is
    /// refused, naming `network.allow`).
    pub network: Option<NetworkGrant>,
}

/// A job's outbound HTTP as admitted: its own allow-list and its tenant's (the executor
/// holds the operator's, `--egress-allow`; a request must pass all three) and each
/// attempt's limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkGrant {
    /// The job's `network.allow`.
    pub allow: Vec<String>,
    /// The tenant's `egress_allow`; `None` for the admin's jobs (no tenant layer).
    pub tenant_allow: Option<Vec<String>>,
    pub max_requests: u32,
    pub max_bytes: u64,
    pub max_concurrent: u32,
}

/// A deterministic job's one source of variety: its seed (the job's `"seed"`, or one the
/// driver drew and recorded). Each task's random source is seeded from it and the task's
/// index ([`Determinism::task_seed`]), so that tasks differ from each other and every
/// attempt of a task sees the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Determinism {
    pub seed: u64,
}

impl Determinism {
    /// The seed of task `index`'s random source: SHA-256 over a fixed label, the job's
    /// seed and the index, so that no two tasks of a job share a stream.
    pub fn task_seed(&self, index: u32) -> [u8; 32] {
        use sha2::{Digest as _, Sha256};
        let mut hash = Sha256::new();
        hash.update(b"flint deterministic task seed v1\0");
        hash.update(self.seed.to_le_bytes());
        hash.update(index.to_le_bytes());
        hash.finalize().into()
    }
}

/// One attempt of one task on the wire: its job's template by key, and what is the
/// task's own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskLaunch {
    /// The [`JobTemplate::key`] of a template defined earlier on this connection.
    pub job: u64,
    pub index: u32,
    /// 1 for the first attempt; every relaunch of the task gets the next number.
    pub attempt: u32,
    /// The executor registration this launch belongs to, echoed in the status: a status
    /// that outlives its registration (the executor reconnected, the driver restarted)
    /// is recognised as stale even if an attempt with the same number runs now.
    pub generation: u64,
    /// The task's args, after the job's.
    pub args: Vec<String>,
    /// The task's env, over the job's.
    pub env: Vec<(String, String)>,
    pub input: TaskInput,
    /// This attempt's budget when it is not the job's: a retry that escalated its memory
    /// or time after a `memory_limit` or `timeout` failure (`"retry": {"escalate": ...}`).
    pub resources: Option<Resources>,
    /// For a later attempt of a deterministic task: what an earlier attempt of it ran,
    /// by digest. This attempt must run on the very same bytes (a URL that now serves
    /// others fails it as `fetch_error`, naming both digests).
    pub pins: Option<Box<Pins>>,
}

/// Everything an executor needs to run one attempt of one task (Spark's
/// TaskDescription): a [`TaskLaunch`] joined with its job's [`JobTemplate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskDescription {
    pub task: TaskId,
    pub attempt: u32,
    pub generation: u64,
    /// What the task shares with the rest of its job.
    pub job: Arc<JobTemplate>,
    /// The task's own args, after the job's.
    pub args: Vec<String>,
    /// The task's own env, over the job's.
    pub env: Vec<(String, String)>,
    pub input: TaskInput,
    /// What this attempt may use: the launch's own budget, else the job's.
    pub resources: Resources,
    /// See [`TaskLaunch::pins`].
    pub pins: Option<Box<Pins>>,
}

impl TaskDescription {
    /// `launch` joined with its job's template (`launch.job == job.key`).
    pub fn new(job: Arc<JobTemplate>, launch: TaskLaunch) -> Self {
        debug_assert_eq!(job.key, launch.job);
        let resources = launch.resources.unwrap_or(job.resources);
        TaskDescription {
            task: TaskId {
                job: job.job.clone(),
                index: launch.index,
            },
            attempt: launch.attempt,
            generation: launch.generation,
            job,
            args: launch.args,
            env: launch.env,
            input: launch.input,
            resources,
            pins: launch.pins,
        }
    }
}

/// Where an executor fetches a module, and what the bytes must hash to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleRef {
    /// Known for uploaded modules; for a module by URL only when the job gave it. When
    /// unknown, the executor learns it from the bytes it fetched.
    pub digest: Option<Digest>,
    pub url: String,
    /// When the driver was given the module: the cache key is (url, timestamp).
    pub timestamp_ms: u64,
    /// `Some` for uploaded modules and only for them: the driver never gives a module by
    /// URL a size, wherever the URL points (even at the driver's own
    /// `/v1/modules/<digest>`), so `Some` marks the bytes the driver serves itself
    /// ([`ModuleRef::served_by_driver`]).
    pub size: Option<u64>,
}

impl ModuleRef {
    /// Whether the driver made this ref for a module it stores and serves (an upload),
    /// as opposed to a URL a job named: the only modules an executor may fetch with the
    /// cluster secret. Decided by `size`, which only uploads have, never by the URL, which
    /// a job can point anywhere, the driver included.
    pub fn served_by_driver(&self) -> bool {
        self.size.is_some()
    }

    /// What the driver's locality remembers a module by: its reference, as executors
    /// cache what a reference resolved to (a digest of (url, timestamp, served by the
    /// driver)). Never the digest alone: an executor that ran a module under one
    /// reference has another reference to the same bytes still to fetch, and placement
    /// must not tell a job whether some other job's module, named by its digest, ran
    /// somewhere.
    pub fn locality_key(&self) -> Digest {
        Digest::of(
            format!(
                "{}\n{}\n{}",
                self.url,
                self.timestamp_ms,
                self.served_by_driver()
            )
            .as_bytes(),
        )
    }
}

/// One of a job's named files, mounted read-only at `/files/<name>` for its tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    pub name: String,
    /// Known for uploaded files; for files given by URL only when the job said.
    pub digest: Option<Digest>,
    pub url: String,
    /// When the driver was given the file: the cache key is (url, timestamp).
    pub timestamp_ms: u64,
    /// `Some` for uploaded files and only for them: the driver never gives a file by URL
    /// a size, wherever the URL points, so `Some` marks the bytes the driver serves
    /// itself ([`FileRef::served_by_driver`]).
    pub size: Option<u64>,
}

impl FileRef {
    /// Whether the driver made this ref for a file it stores and serves (an upload), as
    /// opposed to a URL a job named: the only files an executor may fetch with the
    /// cluster secret. Decided by `size`, never by the URL.
    pub fn served_by_driver(&self) -> bool {
        self.size.is_some()
    }
}

/// Bytes behind a URL, cached under (url, timestamp).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchRef {
    pub url: String,
    /// When the driver was given this URL; a newer timestamp means fetch again.
    /// [`FetchRef::DRIVER_MADE`] (0) is reserved for the refs the driver makes itself
    /// (a `result` or `results` input: its result route or its block store, whose bytes
    /// never change under one URL); a URL a job named always has a timestamp of 1 or
    /// more, whatever the job said and wherever the URL points.
    pub timestamp_ms: u64,
    /// What the bytes must hash to, when known.
    pub digest: Option<Digest>,
}

impl FetchRef {
    /// The timestamp of every ref the driver makes itself, and of no other.
    pub const DRIVER_MADE: u64 = 0;

    /// Whether the driver made this ref (an earlier task's result), as opposed to a `url`
    /// input a job named: the only inputs an executor may fetch with the cluster secret.
    /// Decided by the reserved timestamp, never by the URL.
    pub fn served_by_driver(&self) -> bool {
        self.timestamp_ms == Self::DRIVER_MADE
    }
}

/// What a task may use. Present in a job spec as optional fields over [`defaults`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub cores: u32,
    pub memory_mb: u32,
    pub timeout_ms: u64,
    pub max_output_bytes: u64,
    /// A deterministic budget of wasm work (wasmtime fuel); only executors started with
    /// `--fuel` run tasks that have one.
    pub fuel: Option<u64>,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cores: defaults::TASK_CORES,
            memory_mb: defaults::TASK_MEMORY_MB,
            timeout_ms: defaults::TASK_TIMEOUT_MS,
            max_output_bytes: defaults::TASK_MAX_OUTPUT_BYTES,
            fuel: None,
        }
    }
}

/// The final status of one task attempt (Spark's StatusUpdate with a finished state).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStatus {
    pub task: TaskId,
    pub attempt: u32,
    /// The `generation` of the launch.
    pub generation: u64,
    pub end: TaskEnd,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEnd {
    /// Executor wall clock, microseconds since the Unix epoch, when the guest started and
    /// ended (0 when it never started, e.g. the module failed to compile).
    pub started_at_us: u64,
    pub finished_at_us: u64,
    pub outcome: Result<TaskResult, TaskFailure>,
    /// The task's stderr, capped at the log limit.
    #[serde(with = "serde_bytes")]
    pub log: Vec<u8>,
    /// True when the log was cut at the cap.
    pub log_truncated: bool,
    /// What the attempt used, as far as it got.
    pub usage: Usage,
    /// For a deterministic job, the digests of exactly what the attempt ran: none when
    /// it never got as far as having them (its module failed to fetch, say).
    pub pins: Option<Box<Pins>>,
    /// The linear memory the attempt was held to, in MiB, when the executor gave less
    /// than its budget asked (`flint executor --max-memory-mb`, or `--memory-mb` shared
    /// by `--cores`); `None` when it got what it asked for.
    pub memory_mb: Option<u32>,
    /// Outbound requests the executor refused (the first few messages, each naming the
    /// URL and the rule): a refusal is an error returned to the guest, never a failure
    /// of the attempt by itself.
    pub egress_denied: Vec<String>,
}

/// The digests of what a deterministic attempt ran: URLs resolved to the bytes the
/// executor fetched, so that the record names bytes, not places.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pins {
    pub module: Digest,
    /// The job's files, in the order of [`JobTemplate::files`].
    pub files: Vec<Digest>,
    /// The task's whole stdin.
    pub input: Digest,
    /// The responses its outbound requests received, in the order the guest made them.
    pub egress: Vec<EgressPin>,
    /// The recorded responses' bytes (status, headers and body of each, one after the
    /// other at each pin's `offset`), in the block store; `None` when it made no request.
    pub egress_tape: Option<BlockRef>,
}

/// One outbound request of a deterministic attempt and the response it got: what a
/// replay serves instead of the network, and checks the guest asks for again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressPin {
    pub method: String,
    pub url: String,
    /// SHA-256 of the request's body.
    pub request_sha256: Digest,
    pub status: u16,
    /// SHA-256 of the response's record on the tape (status, headers and body).
    pub response: Digest,
    pub offset: u64,
    pub len: u64,
}

/// A successful task's stdout: inline up to the inline limit, else a block in the block
/// store (Spark's IndirectTaskResult).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskResult {
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    Block(BlockRef),
}

/// A stored result: where it is, how long, and what it hashes to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRef {
    /// Path under the block store's root: `<job>/<task>-<attempt>-<generation>`.
    pub id: String,
    pub size: u64,
    pub digest: Digest,
}

impl BlockRef {
    /// The block's id for one attempt of a task; attempts never share a block, so a
    /// late or speculative attempt cannot overwrite the result that won.
    pub fn id_for(task: &TaskId, attempt: u32, generation: u64) -> String {
        format!("{}/{}-{}-{}", task.job, task.index, attempt, generation)
    }
}

impl TaskResult {
    pub fn len(&self) -> u64 {
        match self {
            TaskResult::Inline(b) => b.len() as u64,
            TaskResult::Block(b) => b.size,
        }
    }

    pub fn digest(&self) -> Digest {
        match self {
            TaskResult::Inline(b) => Digest::of(b),
            TaskResult::Block(b) => b.digest,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for TaskResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskResult::Inline(b) => write!(f, "Inline({} bytes)", b.len()),
            TaskResult::Block(b) => write!(f, "Block({}, {} bytes)", b.id, b.size),
        }
    }
}

/// Why a task attempt did not succeed: one classified kind, a message for people, and the
/// exit code where the guest chose one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFailure {
    pub kind: FailureKind,
    pub message: String,
    pub exit_code: Option<i32>,
}

impl TaskFailure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        TaskFailure {
            kind,
            message: message.into(),
            exit_code: None,
        }
    }
}

/// Every way a task attempt can fail. Names are the `error.kind` strings of the HTTP API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The guest exited with a non-zero code.
    Exit,
    /// The guest trapped (unreachable, out-of-bounds access, a Rust panic, ...).
    Trap,
    /// The guest ran past its wall-clock limit.
    Timeout,
    /// The guest tried to grow memory past its limit.
    MemoryLimit,
    /// The guest recursed past the wasm stack limit.
    StackOverflow,
    /// The guest wrote more than its output cap.
    OutputLimit,
    /// The job's results together went past its `max_result_bytes` (Spark's
    /// `maxResultSize`).
    ResultLimit,
    /// The task was killed (job killed or failed).
    Killed,
    /// The module is not valid wasm.
    InvalidModule,
    /// The module imports something the sandbox does not provide.
    UnknownImport,
    /// Compiling the module took longer than the executor allows.
    CompileLimit,
    /// The guest used up its fuel budget.
    FuelLimit,
    /// The module, a file or an input could not be had from its source, through no
    /// fault of the executor: what the job referred to answered with an HTTP error,
    /// hashed to another digest, passed the size cap, was refused by the URL policy, or
    /// is not a regular file. Retried on the job's own budget (`max_failures`), never
    /// held against the executor.
    FetchError,
    /// Something failed on the executor's own side (its disk, its cache, its process),
    /// not the guest's and not a source's: retried, and counted towards excluding the
    /// executor ([`FailureKind::blames_executor`]).
    HostError,
    /// Never ran: a task whose result its input names failed or was killed (the
    /// message names which). Decided by the driver, never retried.
    UpstreamFailed,
    /// Never ran: the results its input names came to more than a task's input may
    /// take (`MAX_TASK_INPUT_BYTES`), found once they were there.
    InputTooLarge,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Exit => "exit",
            FailureKind::Trap => "trap",
            FailureKind::Timeout => "timeout",
            FailureKind::MemoryLimit => "memory_limit",
            FailureKind::StackOverflow => "stack_overflow",
            FailureKind::OutputLimit => "output_limit",
            FailureKind::ResultLimit => "result_limit",
            FailureKind::Killed => "killed",
            FailureKind::InvalidModule => "invalid_module",
            FailureKind::UnknownImport => "unknown_import",
            FailureKind::CompileLimit => "compile_limit",
            FailureKind::FuelLimit => "fuel_limit",
            FailureKind::FetchError => "fetch_error",
            FailureKind::HostError => "host_error",
            FailureKind::UpstreamFailed => "upstream_failed",
            FailureKind::InputTooLarge => "input_too_large",
        }
    }

    /// Whether another attempt could end differently. A guest's own behaviour is
    /// deterministic, so only the host's failures are worth retrying.
    pub fn is_retryable(self) -> bool {
        matches!(self, FailureKind::FetchError | FailureKind::HostError)
    }

    /// Whether the failure says something about the executor it happened on, and so
    /// counts towards excluding it (for the task, and for a period). Only the
    /// executor's own failures do: a job's module, inputs, URLs and their servers'
    /// answers (`fetch_error`) never take an executor away from other jobs, and a guest's
    /// own failure is the guest's.
    pub fn blames_executor(self) -> bool {
        matches!(self, FailureKind::HostError)
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
