//! JSON shapes of the driver's HTTP API (see API.md). Fields may be added, not renamed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{Digest, ExecutorId, JobId};

/// `POST /v1/jobs`. Exactly one of `inputs` (one task per input) and `tasks` is given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An uploaded module's id, `sha256:<hex>`, or a URL (`http://`, `https://`,
    /// `s3://`, `file://`) the executors fetch where their URL policy allows it, cached by
    /// (URL, the time the driver first saw it). No pattern in the OpenAPI document: one
    /// for URLs would have API fuzzers make executors dial whatever address they invent.
    pub module: String,
    /// For a module by URL: what its bytes must hash to (`<hex>` or `sha256:<hex>`). An
    /// executor that fetches other bytes fails the task as `fetch_error`, naming both
    /// digests. Refused with an uploaded module's id (that id is its digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_sha256: Option<String>,
    /// For a module by URL: when its content was (re)published, ms since the Unix
    /// epoch. Executors cache a module by (URL, timestamp), so a newer timestamp makes
    /// them fetch it again. Left out, it is when the driver first saw the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_timestamp_ms: Option<u64>,
    /// Files the tasks read at `/files/<name>`: name -> an uploaded file's id
    /// (`PUT /v1/files`) or `{"url": ..., "sha256": ...}`. Names are 1-128 of
    /// `A-Z a-z 0-9 . _ -`, not `.` or `..`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, FileSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1_000_000))]
    pub inputs: Option<Vec<InputSpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1_000_000))]
    pub tasks: Option<Vec<TaskSpec>>,
    #[serde(default)]
    pub resources: ResourcesSpec,
    /// Attempts per task when the host fails it (executor lost, fetch error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_failures: Option<u32>,
    /// Cap on the sum of the job's results (Spark's `maxResultSize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_result_bytes: Option<u64>,
}

/// A job file: an uploaded file's id (`sha256:<hex>`), or a URL the executors fetch
/// (through their fetch cache and URL policy).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum FileSpec {
    Id(String),
    Url(UrlFileSpec),
}

impl From<&str> for FileSpec {
    fn from(id: &str) -> Self {
        FileSpec::Id(id.to_owned())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UrlFileSpec {
    pub url: String,
    /// What the bytes must hash to (`<hex>` or `sha256:<hex>`); checked by executors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// When the URL's content was (re)published, ms since the Unix epoch. Executors
    /// cache by (url, timestamp): a newer timestamp makes them fetch again. Left out,
    /// it is when the driver first saw the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_ms: Option<u64>,
}

/// A task's input (its stdin): `{"text": "..."}`, `{"base64": "..."}`,
/// `{"url": "...", "sha256": "<hex>"}` (fetched by the executor; `sha256` optional),
/// `{"result": {"job": "<id>", "task": N}}` (an earlier task's result: chained jobs), or
/// `{"results": {"job": "<id>", "tasks": [N, ...]}}` (several earlier results, one after
/// the other: a reduce over a map job).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawInput", into = "RawInput")]
pub enum InputSpec {
    Text(String),
    Base64(String),
    Url { url: String, sha256: Option<String> },
    Result(ResultRef),
    Results(ResultsRef),
}

/// An earlier task's result, by job and task index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResultRef {
    pub job: JobId,
    pub task: u32,
}

/// Earlier results concatenated in the order given: every task of `job` in index order
/// when `tasks` is left out, else the tasks it lists (repeats allowed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResultsRef {
    pub job: JobId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub tasks: Option<Vec<u32>>,
}

/// [`InputSpec`]'s JSON form: one object whose one key says which kind it is, so that a
/// wrong input gets an error naming the keys rather than "no variant matched".
#[derive(Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
struct RawInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<ResultRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    results: Option<ResultsRef>,
}

// The document shows the JSON form, which is what clients send.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for InputSpec {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <RawInput as utoipa::PartialSchema>::schema()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for InputSpec {
    fn name() -> std::borrow::Cow<'static, str> {
        "InputSpec".into()
    }
}

impl TryFrom<RawInput> for InputSpec {
    type Error = String;

    fn try_from(raw: RawInput) -> Result<Self, String> {
        let kinds = [
            raw.text.is_some(),
            raw.base64.is_some(),
            raw.url.is_some(),
            raw.result.is_some(),
            raw.results.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(
                "an input has exactly one of `text`, `base64`, `url` (with optional `sha256`), \
                 `result` and `results`"
                    .into(),
            );
        }
        if raw.sha256.is_some() && raw.url.is_none() {
            return Err("`sha256` goes with `url`".into());
        }
        Ok(match raw {
            RawInput { text: Some(t), .. } => InputSpec::Text(t),
            RawInput {
                base64: Some(b), ..
            } => InputSpec::Base64(b),
            RawInput {
                url: Some(url),
                sha256,
                ..
            } => InputSpec::Url { url, sha256 },
            RawInput {
                result: Some(r), ..
            } => InputSpec::Result(r),
            RawInput {
                results: Some(r), ..
            } => InputSpec::Results(r),
            RawInput { .. } => unreachable!("exactly one kind checked above"),
        })
    }
}

impl From<InputSpec> for RawInput {
    fn from(input: InputSpec) -> Self {
        match input {
            InputSpec::Text(text) => RawInput {
                text: Some(text),
                ..RawInput::default()
            },
            InputSpec::Base64(b) => RawInput {
                base64: Some(b),
                ..RawInput::default()
            },
            InputSpec::Url { url, sha256 } => RawInput {
                url: Some(url),
                sha256,
                ..RawInput::default()
            },
            InputSpec::Result(r) => RawInput {
                result: Some(r),
                ..RawInput::default()
            },
            InputSpec::Results(r) => RawInput {
                results: Some(r),
                ..RawInput::default()
            },
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// No input means empty stdin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<InputSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// Per-task needs; anything left out takes its default (README, limits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResourcesSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub cores: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub memory_mb: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 1_073_741_824))]
    pub max_output_bytes: Option<u64>,
    /// Wasm work the task may do (wasmtime fuel); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub fuel: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Killed,
}

impl JobState {
    /// Every state, in the order of a life (and of `/metrics` label values).
    pub const ALL: [JobState; 5] = [
        JobState::Queued,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Killed,
    ];

    /// The state's name, as the JSON API, `/metrics` and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Killed => "killed",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Killed
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Pending,
    Running,
    Succeeded,
    Failed,
    Killed,
}

impl TaskState {
    /// Every state, in the order of a life (and of `/metrics` label values).
    pub const ALL: [TaskState; 5] = [
        TaskState::Pending,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Killed,
    ];

    /// The state's name, as the JSON API, `/metrics` and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Killed => "killed",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Killed
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub kind: String,
    pub message: String,
}

/// Every error response: `{"error": {"kind": ..., "message": ...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskCounts {
    pub pending: u32,
    pub running: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub killed: u32,
}

impl TaskCounts {
    /// The count of tasks in `state`.
    pub fn of(&self, state: TaskState) -> u32 {
        match state {
            TaskState::Pending => self.pending,
            TaskState::Running => self.running,
            TaskState::Succeeded => self.succeeded,
            TaskState::Failed => self.failed,
            TaskState::Killed => self.killed,
        }
    }

    /// The count of tasks in `state`, to change.
    pub fn of_mut(&mut self, state: TaskState) -> &mut u32 {
        match state {
            TaskState::Pending => &mut self.pending,
            TaskState::Running => &mut self.running,
            TaskState::Succeeded => &mut self.succeeded,
            TaskState::Failed => &mut self.failed,
            TaskState::Killed => &mut self.killed,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    pub id: JobId,
    pub name: String,
    pub state: JobState,
    /// RFC 3339.
    pub created_at: String,
    pub finished_at: Option<String>,
    pub tasks: u32,
    pub counts: TaskCounts,
    pub error: Option<ErrorBody>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResultInfo {
    pub size: u64,
    pub sha256: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskView {
    pub index: u32,
    pub state: TaskState,
    pub attempts: u32,
    pub executor: Option<ExecutorId>,
    pub exit_code: Option<i32>,
    pub error: Option<ErrorBody>,
    pub result: Option<ResultInfo>,
    /// RFC 3339 with microseconds, from the executor's clock: when the guest of the latest
    /// attempt started and ended.
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

/// `GET /v1/jobs/{id}/timeline`: every attempt of every task, for drawing the job over
/// time (the web UI's timeline, throughput and duration charts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TimelineView {
    pub job: JobId,
    /// The driver's clock when this was read (Unix microseconds): where a running
    /// attempt's bar ends for now.
    pub now_us: u64,
    /// When the job was accepted and when it ended (Unix microseconds, driver's clock).
    pub created_us: u64,
    pub finished_us: Option<u64>,
    /// In launch order (tasks that ended before a driver restart first, one attempt
    /// each from their task's times).
    pub attempts: Vec<AttemptView>,
    /// More attempts follow: pass this as `after` for the next page.
    pub next: Option<String>,
}

/// One attempt of a task on an executor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptView {
    pub task: u32,
    /// 1 for the first launch of the task, counting retries and speculative copies.
    pub attempt: u32,
    pub executor: ExecutorId,
    /// Unix microseconds: when the guest started and ended, from the executor's clock
    /// where it reported them; otherwise the driver's launch time, and for an attempt
    /// that never reported (its executor was lost, its job ended first) the time the
    /// driver gave up on it.
    pub start_us: u64,
    /// None while it runs.
    pub end_us: Option<u64>,
    /// `succeeded`, a failure kind (`exit`, `timeout`, `killed`, `host_error`, ...),
    /// `lost` (its executor was lost or stopped it; the task ran again), or none while
    /// it runs.
    pub outcome: Option<String>,
    /// A copy launched because the task ran slow (speculation).
    pub speculative: bool,
}

/// `GET /v1/cluster/history`: the cluster once a second over the last minutes, oldest
/// first (kept in the driver's memory: a restart starts it afresh).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterHistory {
    pub interval_ms: u64,
    pub samples: Vec<ClusterSample>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterSample {
    /// Unix milliseconds.
    pub t_ms: u64,
    /// Attempts running (or queued) on executors.
    pub running_tasks: u32,
    /// Cores of live executors given to tasks.
    pub busy_cores: u32,
    /// Cores of live executors.
    pub cores: u32,
    /// Executors alive.
    pub executors: u32,
    /// Tasks of live jobs waiting for a core.
    pub pending_tasks: u64,
}

/// The data of a `task` event on `GET /v1/jobs/{id}/events`: a task changed state
/// (launched, ended, back to pending for a retry, killed with its job).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskEvent {
    pub index: u32,
    pub state: TaskState,
    /// The latest attempt's number (0 before the first launch).
    pub attempt: u32,
    pub executor: Option<ExecutorId>,
    /// Why it failed or was killed, or why the attempt before a retry failed.
    pub error: Option<ErrorBody>,
}

/// The data of a `lagged` event: the subscriber read too slowly and this many events
/// were dropped for it; `GET /v1/jobs/{id}/tasks` has the current states.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LaggedEvent {
    pub missed: u64,
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct List<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

/// `PUT /v1/modules` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Uploaded {
    pub id: Digest,
    pub size: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_are_the_json_names() {
        fn json<T: Serialize>(v: T) -> String {
            serde_json::to_value(v)
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned()
        }
        for s in JobState::ALL {
            assert_eq!(s.as_str(), json(s));
        }
        for s in TaskState::ALL {
            assert_eq!(s.as_str(), json(s));
        }
        for s in ExecutorState::ALL {
            assert_eq!(s.as_str(), json(s));
        }
    }

    #[test]
    fn job_spec_reads_the_documented_shape() {
        let spec: JobSpec = serde_json::from_str(
            r#"{"name":"wc","module":"sha256:00","args":["--top","10"],"env":{"LANG":"C"},
                "inputs":[{"text":"a b"},{"base64":"YQ=="}],
                "resources":{"cores":2,"timeout_ms":1000},"max_failures":2}"#,
        )
        .unwrap();
        assert_eq!(
            spec.inputs.unwrap(),
            vec![
                InputSpec::Text("a b".into()),
                InputSpec::Base64("YQ==".into())
            ]
        );
        assert_eq!(spec.resources.cores, Some(2));
        assert_eq!(spec.resources.memory_mb, None);
    }

    #[test]
    fn job_spec_names_unknown_fields() {
        let err = serde_json::from_str::<JobSpec>(r#"{"module":"m","colour":"red"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `colour`"), "{err}");
        let err = serde_json::from_str::<JobSpec>(r#"{"module":"m","inputs":[{"txt":"a"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `txt`"), "{err}");
    }

    #[test]
    fn inputs_of_every_kind_read_and_write_their_documented_shape() {
        let json = r#"[{"text":"a"},{"base64":"YQ=="},{"url":"http://h/x","sha256":"ab"},
            {"url":"http://h/y"},{"result":{"job":"job-1","task":3}},
            {"results":{"job":"job-1"}},{"results":{"job":"job-2","tasks":[2,0,2]}}]"#;
        let inputs: Vec<InputSpec> = serde_json::from_str(json).unwrap();
        assert_eq!(
            inputs[2],
            InputSpec::Url {
                url: "http://h/x".into(),
                sha256: Some("ab".into())
            }
        );
        assert_eq!(
            inputs[4],
            InputSpec::Result(ResultRef {
                job: JobId("job-1".into()),
                task: 3
            })
        );
        assert_eq!(
            inputs[5],
            InputSpec::Results(ResultsRef {
                job: JobId("job-1".into()),
                tasks: None
            })
        );
        assert_eq!(
            inputs[6],
            InputSpec::Results(ResultsRef {
                job: JobId("job-2".into()),
                tasks: Some(vec![2, 0, 2])
            })
        );
        let back: Vec<InputSpec> =
            serde_json::from_str(&serde_json::to_string(&inputs).unwrap()).unwrap();
        assert_eq!(back, inputs);
        for bad in [
            r#"{"text":"a","url":"u"}"#,
            r#"{}"#,
            r#"{"text":"a","sha256":"x"}"#,
            r#"{"result":{"job":"j","task":0},"results":{"job":"j"}}"#,
        ] {
            let err = serde_json::from_str::<InputSpec>(bad)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("`text`") || err.contains("`url`"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn files_are_ids_or_urls() {
        let files: BTreeMap<String, FileSpec> =
            serde_json::from_str(r#"{"a":"sha256:00","b":{"url":"http://h/b","timestamp_ms":5}}"#)
                .unwrap();
        assert_eq!(files["a"], FileSpec::Id("sha256:00".into()));
        assert!(matches!(&files["b"], FileSpec::Url(u) if u.timestamp_ms == Some(5)));
    }
}
