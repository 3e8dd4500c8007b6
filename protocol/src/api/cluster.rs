//! What the driver reports about the cluster rather than any one job: its history, the
//! executors, the standalone workers and the allocation of executors.

use serde::{Deserialize, Serialize};

use crate::ids::ExecutorId;

/// `GET /v1/cluster/history`: the cluster once a second over the last minutes, oldest
/// first (kept in the driver's memory: a restart starts it afresh). To a tenant, its
/// own tasks only (`tenant` says whose), without the cluster's cores and executors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterHistory {
    pub interval_ms: u64,
    /// The tenant whose tasks the samples count (a tenant's token sees only its own);
    /// absent: the whole cluster's, as the admin sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub samples: Vec<ClusterSample>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterSample {
    /// Unix milliseconds.
    pub t_ms: u64,
    /// Attempts running (or queued) on executors; in a tenant's history, its tasks
    /// running.
    pub running_tasks: u32,
    /// Cores of live executors given to tasks; in a tenant's history, the cores its
    /// running tasks hold.
    pub busy_cores: u32,
    /// Cores of live executors; absent in a tenant's history (the cluster's size follows
    /// every tenant's load where executors are launched on demand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Executors alive; absent in a tenant's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executors: Option<u32>,
    /// Tasks of live jobs waiting for a core; in a tenant's history, its own.
    pub pending_tasks: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecutorState {
    /// Launched by the driver's cluster manager, not registered yet.
    Launching,
    /// Registered and connected.
    Alive,
    /// Its connection closed; its running tasks went back to pending.
    Lost,
    /// A process the driver's cluster manager launched has exited (see `exit_code`,
    /// `exit_signal` and `exit_reason`).
    Exited,
}

impl ExecutorState {
    pub const ALL: [ExecutorState; 4] = [
        ExecutorState::Launching,
        ExecutorState::Alive,
        ExecutorState::Lost,
        ExecutorState::Exited,
    ];

    /// The state's name, as the JSON API, `/metrics` and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorState::Launching => "launching",
            ExecutorState::Alive => "alive",
            ExecutorState::Lost => "lost",
            ExecutorState::Exited => "exited",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecutorView {
    pub id: ExecutorId,
    pub host: String,
    pub state: ExecutorState,
    pub cores: u32,
    pub free_cores: u32,
    pub running: u32,
    pub generation: u64,
    /// Milliseconds since the last heartbeat (or registration).
    pub last_heartbeat_ms: Option<u64>,
    pub pid: Option<u32>,
    /// Exit code of an executor process the driver's cluster manager launched, once it
    /// has exited with one.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did (9: SIGKILL).
    #[serde(default)]
    pub exit_signal: Option<i32>,
    /// The exit by name (`stopped`, `start_failed`, `bad_command_line`,
    /// `registration_refused`, `driver_unreachable`, `driver_lost`, `error`, `killed`,
    /// `signal`, `unknown`; the README's executor exit codes; and from its cluster
    /// manager `oom_killed`, `lost` (its host or pod went away), `launch_failed`,
    /// `launch_timeout`) and as a sentence (a pod's scheduler reason, say).
    #[serde(default)]
    pub exit_reason: Option<String>,
    #[serde(default)]
    pub exit_description: Option<String>,
    /// The cluster manager that launched it (`local`, `standalone`, `kubernetes`); none for an
    /// executor that dialled in on its own.
    #[serde(default)]
    pub cluster_manager: Option<String>,
    /// The worker it runs on, under `standalone`.
    #[serde(default)]
    pub worker: Option<String>,
    pub tasks_finished: u64,
    /// Started with `--fuel`: takes tasks with fuel budgets.
    pub meters_fuel: bool,
    /// From its latest heartbeat: modules it compiled, and tasks that found their module
    /// already compiled in memory.
    pub modules_compiled: u64,
    pub module_cache_hits: u64,
    /// From its latest heartbeat: modules loaded compiled from its disk cache, and
    /// fetches served from its fetch cache or downloaded.
    #[serde(default)]
    pub compile_cache_hits: u64,
    #[serde(default)]
    pub fetch_hits: u64,
    #[serde(default)]
    pub fetch_misses: u64,
    /// From its latest heartbeat (Spark's ExecutorSource): CPU time of its task threads
    /// in microseconds, bytes downloaded into its fetch cache, bytes of the results it
    /// produced, and attempts running or queued there and ended there.
    #[serde(default)]
    pub task_cpu_us: u64,
    #[serde(default)]
    pub bytes_fetched: u64,
    #[serde(default)]
    pub result_bytes: u64,
    #[serde(default)]
    pub tasks_active: u32,
    #[serde(default)]
    pub tasks_completed: u64,
    /// Its end buffer, from its latest heartbeat: task ends it holds until the driver
    /// has committed them, the bytes of those in memory and on its disk, the most of
    /// each it held at once, and how many task ends had to wait for room (both budgets,
    /// `--end-buffer-bytes` and `--end-spill-bytes`, full while the driver was away).
    #[serde(default)]
    pub ends_held: u64,
    #[serde(default)]
    pub ends_memory_bytes: u64,
    #[serde(default)]
    pub ends_disk_bytes: u64,
    #[serde(default)]
    pub ends_peak_memory_bytes: u64,
    #[serde(default)]
    pub ends_peak_disk_bytes: u64,
    #[serde(default)]
    pub ends_waited: u64,
    /// Excluded from all placement for this many more milliseconds, after too many task
    /// failures in a short window (see the README's "Failures and exclusion").
    #[serde(default)]
    pub excluded_for_ms: Option<u64>,
    /// Host failures of tasks here that still count towards an exclusion.
    #[serde(default)]
    pub recent_task_failures: u32,
    /// Where its own log (stderr) can be read (`/v1/executors/{id}/log`): for executors
    /// `flint dev` started.
    #[serde(default)]
    pub log_url: Option<String>,
}

/// `GET /v1/executors`: the executors, and what the cluster manager is asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecutorList {
    pub items: Vec<ExecutorView>,
    pub next: Option<String>,
    /// With a cluster manager (`--cluster-manager`); none when executors only dial in.
    #[serde(default)]
    pub allocation: Option<AllocationView>,
}

/// A standalone worker (`GET /v1/workers`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerView {
    pub id: String,
    pub host: String,
    /// `alive`, or `lost` once its connection is gone (its executors with it).
    pub state: String,
    pub cores: u32,
    /// Cores not held by executors placed on it.
    pub free_cores: u32,
    pub memory_mb: u64,
    pub free_memory_mb: u64,
    pub pid: u32,
    /// Executors placed on it and not exited.
    pub executors: Vec<ExecutorId>,
    /// Milliseconds since it was last heard from.
    pub last_heartbeat_ms: u64,
    /// When it registered, ms since the Unix epoch.
    pub registered_at_ms: u64,
    pub lost_reason: Option<String>,
}

/// The driver's executor allocation: its target, what it launched, and its failures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocationView {
    pub cluster_manager: String,
    /// Executors wanted.
    pub target: u32,
    /// Launched and not registered yet.
    pub launching: u32,
    /// Launched and registered, not exited.
    pub running: u32,
    /// Of those running, being decommissioned (they take no new tasks).
    #[serde(default)]
    pub decommissioning: u32,
    /// Of those running, with no task running or queued.
    #[serde(default)]
    pub idle: u32,
    /// Executors that exited unasked, not cleanly, within `failures_interval_ms`.
    pub recent_failures: u32,
    /// At this many recent failures the driver stops launching (`--max-executor-failures`).
    pub max_failures: u32,
    pub failures_interval_ms: u64,
    /// The next launch waits this much longer (backoff after failures).
    pub backoff_ms: u64,
    /// Why the driver stopped launching executors, once it has.
    pub gave_up: Option<String>,
}
