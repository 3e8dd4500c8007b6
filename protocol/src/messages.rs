//! Driver <-> executor messages, with Spark's names where the concept is Spark's.
//!
//! A connection opens with the executor's [`Hello`] and the driver's [`HelloReply`]; both
//! have a frozen layout so that a version mismatch is reported, not misparsed. Then:
//!
//! ```text
//! executor                          driver
//!   RetrieveConfig           ->
//!                            <-   ExecutorConfig
//!   RegisterExecutor         ->
//!                            <-   RegisteredExecutor | RegisterExecutorFailed (then close)
//!                            <-   UpdateCredentials (right after, and whenever they change)
//!                            <-   DefineJob / LaunchTask / KillTask / ForgetJob (any time after)
//!   StatusUpdate / Heartbeat ->                                (any time after)
//!                            <-   EndsDurable (once the ends up to a number are committed)
//!                            <-   StopExecutor | Shutdown
//! ```
//!
//! An executor that loses its driver keeps running its tasks (for its
//! `--driver-loss-grace-ms`) and holds their ends; registering again, with the same id, it
//! lists every attempt it runs or holds the end of ([`HeldAttempt`]), and the driver (a
//! restarted one too) adopts those it knows and kills or drops the others. Ends are
//! numbered by the executor and kept until the driver says they are durable
//! (`EndsDurable`): one sent and lost with a driver that crashed before its commit is sent
//! again, and applied once.

use serde::{Deserialize, Serialize};

use crate::ids::{ExecutorId, TaskId};
use crate::task::{JobTemplate, TaskLaunch, TaskStatus};

/// Bumped on any change to the messages below. 5: a module's digest and size may be
/// unknown (modules by URL). 6: task inputs made of parts (`results` inputs), compile
/// cache hits in heartbeats. 7: a job's shared part defined once per connection
/// (`DefineJob`, `ForgetJob`), launches carrying only the task's own. 8: workers
/// (`RegisterWorker`, [`WorkerMessage`], [`DriverToWorker`]). 9: executor metrics in
/// heartbeats (task CPU time, bytes fetched, result bytes, attempts completed). 10:
/// object-store credentials pushed by the driver (`UpdateCredentials`). 11: per-attempt
/// usage and a deterministic attempt's pins in the task end, a job's determinism in its
/// template, a launch's own budget (escalated retries). 12: a later attempt's pins in
/// its launch, and the memory an attempt was held to in its end. 13: attempts kept through a
/// driver's absence and listed at registration ([`HeldAttempt`]), numbered task ends and
/// their acknowledgement after commit (`EndsDurable`), the end buffer in heartbeats. 14:
/// outbound HTTP (a job's `NetworkGrant`, the operator's `egress_allow`, egress usage,
/// pins and refusals in a task's end).
pub const PROTOCOL_VERSION: u32 = 14;

/// First frame on a connection, executor to driver. Layout frozen across versions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: [u8; 5],
    pub version: u32,
    /// The cluster secret, when the driver requires one.
    pub secret: Option<String>,
}

impl Hello {
    pub const MAGIC: [u8; 5] = *b"FLINT";

    pub fn new(secret: Option<String>) -> Self {
        Hello {
            magic: Self::MAGIC,
            version: PROTOCOL_VERSION,
            secret,
        }
    }
}

/// The driver's answer to [`Hello`]. Layout frozen across versions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloReply {
    pub version: u32,
    /// `Err(reason)` when the driver refuses the connection; it closes right after.
    pub accepted: Result<(), String>,
}

/// Executor to driver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecutorMessage {
    /// Ask for the cluster's settings before registering (Spark's RetrieveSparkAppConfig).
    RetrieveConfig,
    RegisterExecutor {
        executor_id: ExecutorId,
        hostname: String,
        cores: u32,
        app_id: Option<String>,
        pid: u32,
        /// Started with `--fuel`: runs tasks with a fuel budget.
        meters_fuel: bool,
        /// The attempts it runs or holds the end of, launched by an earlier connection
        /// (the driver lost and back, or restarted): empty on a first registration.
        attempts: Vec<HeldAttempt>,
    },
    /// A task attempt ended. `seq` numbers the executor's ends from 1, in the order sent
    /// (0: not to be acknowledged); the executor keeps the end until an `EndsDurable`
    /// covers its number, and sends it again on its next connection until then.
    StatusUpdate {
        seq: u64,
        status: TaskStatus,
    },
    Heartbeat(Heartbeat),
    /// Not an executor but a standalone worker (`flint worker`): the connection goes on
    /// as [`WorkerMessage`]s in and [`DriverToWorker`]s out.
    RegisterWorker(Box<WorkerRegistration>),
}

/// An attempt an executor runs (or has queued), or whose end it holds unacknowledged,
/// as it lists them when it registers again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldAttempt {
    pub task: TaskId,
    pub attempt: u32,
    /// The `generation` of its launch.
    pub generation: u64,
    /// When its guest started (executor wall clock, Unix microseconds); 0 while queued.
    pub started_at_us: u64,
    /// Its end is held (sent after the registration), not running any more.
    pub ended: bool,
}

/// What a worker offers, and the executors it still runs (after the driver restarted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRegistration {
    pub worker_id: String,
    /// The name its executors and the driver's views give it.
    pub host: String,
    pub cores: u32,
    pub memory_mb: u64,
    pub pid: u32,
    /// Executors it runs, launched by an earlier connection.
    pub executors: Vec<ExecutorId>,
}

/// Worker to driver, after `RegisterWorker` (Spark's `ExecutorStateChanged`,
/// `Heartbeat`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerMessage {
    ExecutorStateChanged {
        executor_id: ExecutorId,
        state: WorkerExecutorState,
    },
    Heartbeat,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerExecutorState {
    /// Its process runs, with this pid.
    Running {
        pid: u32,
    },
    /// It could not be started (the reason says why).
    FailedToLaunch(String),
    Exited(crate::exit::ProcessExit),
}

/// Driver to worker (Spark's `RegisteredWorker`, `LaunchExecutor`, `KillExecutor`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DriverToWorker {
    RegisteredWorker {
        app_id: String,
        heartbeat_interval_ms: u64,
    },
    RegisterWorkerFailed {
        reason: String,
    },
    LaunchExecutor {
        executor_id: ExecutorId,
        app_id: String,
        cores: u32,
        memory_mb: u64,
    },
    KillExecutor {
        executor_id: ExecutorId,
    },
    /// The driver is going away for good: stop the executors and wait for the next.
    Shutdown,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Task attempts running or queued on the executor right now.
    pub running: u32,
    /// Modules compiled since start, and tasks served from an already compiled module.
    pub modules_compiled: u64,
    pub module_cache_hits: u64,
    /// Fetch-cache requests (modules, files, inputs) served from disk, and downloads.
    pub fetch_hits: u64,
    pub fetch_misses: u64,
    /// Modules loaded from the compiled-module cache on disk (compiled by an earlier run
    /// of the executor) instead of being compiled.
    pub compile_cache_hits: u64,
    /// CPU time its task threads have had since start, in microseconds (guests, their
    /// WASI calls, instantiation): Spark's ExecutorSource `cpuTime`.
    pub task_cpu_us: u64,
    /// Bytes downloaded into its fetch cache (modules, files, inputs; hits are free).
    pub bytes_fetched: u64,
    /// Bytes of the results of its attempts that succeeded, inline or in blocks.
    pub result_bytes: u64,
    /// Attempts it has reported the end of, however they ended.
    pub tasks_completed: u64,
    /// Its end buffer: ends not yet acknowledged durable, the bytes of them held in
    /// memory and on its disk, the most of each it held at once, and how many times a
    /// task's end waited for room (both budgets full).
    pub ends_held: u64,
    pub ends_memory_bytes: u64,
    pub ends_disk_bytes: u64,
    pub ends_peak_memory_bytes: u64,
    pub ends_peak_disk_bytes: u64,
    pub ends_waited: u64,
}

/// Driver to executor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DriverMessage {
    /// Answer to RetrieveConfig (Spark's SparkAppConfig).
    ExecutorConfig(ExecutorConfig),
    RegisteredExecutor {
        /// Increases with every registration the driver accepts; stale generations'
        /// messages can be told apart.
        generation: u64,
    },
    RegisterExecutorFailed {
        reason: String,
    },
    /// What a job's tasks share, sent before its first launch on this connection.
    DefineJob(Box<JobTemplate>),
    /// One attempt of a task of a job defined on this connection.
    LaunchTask(Box<TaskLaunch>),
    /// The job defined under this key ended: no more launches will name it.
    ForgetJob {
        key: u64,
    },
    KillTask {
        task: TaskId,
        attempt: u32,
        reason: String,
    },
    /// Every task end this executor numbered up to `up_to` is committed to the job
    /// store: it may forget them.
    EndsDurable {
        up_to: u64,
    },
    /// The object-store credentials to use from now on for fetches and block writes
    /// (Spark's UpdateDelegationTokens): sent after RegisteredExecutor and whenever the
    /// driver's are refreshed, so that executors hold no long-lived secrets.
    UpdateCredentials(Credentials),
    /// This executor is no longer wanted: kill what runs and exit.
    StopExecutor,
    /// The driver is going away for good: exit without trying to reconnect.
    Shutdown,
}

/// Cluster-wide settings an executor learns before registering.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorConfig {
    pub app_id: String,
    pub heartbeat_interval_ms: u64,
    /// Largest stderr kept per task.
    pub max_log_bytes: u64,
    /// The driver's HTTP origin (`http://HOST:PORT`): modules, files and blocks are
    /// fetched from it, so the executor's URL policy always allows it.
    pub driver_http_url: String,
    /// Origins the operator allows fetching from besides the driver (`--fetch-allow`).
    pub fetch_allow: Vec<String>,
    /// Origins the operator lets tasks call (`--egress-allow`): the ceiling over every
    /// tenant's and job's list; empty, no task may make a request.
    pub egress_allow: Vec<String>,
    /// Where results larger than `inline_result_bytes` go: `driver` (uploaded to the
    /// driver, which keeps them in its data dir) or an object store URL such as
    /// `s3://bucket/prefix` that executors write to directly.
    pub block_store: String,
    pub inline_result_bytes: u64,
    /// The driver pushes object-store credentials (`UpdateCredentials`): S3 access
    /// signs with those, not with the executor's own environment.
    pub credentials_pushed: bool,
}

/// Credentials an executor uses on the driver's behalf.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub s3: Option<S3Credentials>,
}

/// AWS-style keys (S3 and S3-compatible stores), short-lived ones with their token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// When they stop working (Unix ms), if the issuer said.
    pub expires_at_ms: Option<u64>,
}

// Never in a log: the key id alone says which credentials are meant.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("s3", &self.s3).finish()
    }
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .field("expires_at_ms", &self.expires_at_ms)
            .finish()
    }
}
