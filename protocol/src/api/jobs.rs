//! What the driver reports about jobs and their tasks: states, counts, the job and task
//! views, the timeline of attempts, and the events of a job's event stream.

use serde::{Deserialize, Serialize};

use super::ErrorBody;
use crate::ids::{ExecutorId, JobId};
use crate::task::Usage;

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
    /// Its input names results not there yet (tasks of a job still running, or of a job
    /// of its graph): it becomes pending once every one of them has succeeded. Last in
    /// the enum because records encode a state by its place.
    Waiting,
}

impl TaskState {
    /// Every state, in the order of a life (and of `/metrics` label values).
    pub const ALL: [TaskState; 6] = [
        TaskState::Waiting,
        TaskState::Pending,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Killed,
    ];

    /// The state's name, as the JSON API, `/metrics` and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Waiting => "waiting",
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

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskCounts {
    /// Tasks whose inputs are results not there yet.
    #[serde(default)]
    pub waiting: u32,
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
            TaskState::Waiting => self.waiting,
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
            TaskState::Waiting => &mut self.waiting,
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
    /// What its attempts used, summed (`peak_memory_bytes` is the largest of any one):
    /// none when no attempt has reported, and in job listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// A deterministic job's seed (given, or derived from its spec at submission); none
    /// for other jobs, and in job listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The tenant that submitted it; none for the admin's jobs (`--token`, or a driver
    /// without tenants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Its priority among its tenant's jobs (0 unless given).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// The jobs whose results its waiting tasks read, in the order first named; none
    /// once no task waits, and in job listings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits_for: Vec<JobId>,
}

fn is_zero(p: &i32) -> bool {
    *p == 0
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
    /// What its attempts used, summed (`peak_memory_bytes`: the largest of any one);
    /// none until one has reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Each attempt, in launch order: its budget, how it ended and what it used. Empty
    /// for a task that ended before a driver restart while its job ran on (its attempts
    /// are kept when the job ends).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<TaskAttemptView>,
    /// For a task of a `"memoize": true` job that did not run: the earlier task whose
    /// result it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memoized_from: Option<MemoSource>,
}

/// The task a memoized task's result comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoSource {
    pub job: JobId,
    pub task: u32,
}

/// One attempt of a task as its task view lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskAttemptView {
    pub attempt: u32,
    pub executor: ExecutorId,
    /// The memory and time limits it ran with: the job's, or more for a retry that
    /// escalated (`"retry": {"escalate": ...}`). 0 for an attempt stored before budgets
    /// were kept.
    pub memory_mb: u32,
    pub timeout_ms: u64,
    /// `succeeded`, a failure kind, `lost`, or none while it runs.
    pub outcome: Option<String>,
    pub speculative: bool,
    /// None while it runs, and for one that never reported (lost with its executor).
    pub usage: Option<Usage>,
    /// What a deterministic job's attempt ran, by digest; none for other jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pins: Option<PinsView>,
}

/// The SHA-256 of exactly what a deterministic attempt ran (`sha256:<hex>` each): URLs
/// resolved to the bytes the executor fetched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PinsView {
    pub module: String,
    /// The job's files, by name.
    pub files: std::collections::BTreeMap<String, String>,
    /// The task's whole stdin.
    pub input: String,
    /// Its outbound requests and the responses they got, in the order the guest made
    /// them (a deterministic attempt with `network`); what `flint replay` serves again.
    #[serde(default)]
    pub egress: Vec<EgressPinView>,
}

/// One recorded request of a deterministic attempt: what was asked and what came back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EgressPinView {
    pub method: String,
    pub url: String,
    /// SHA-256 of the request's body.
    pub request_sha256: String,
    /// The response's status; 0 for a request that got no response (refused at
    /// connect, cut, timed out, failed), whose error the guest was given and the record
    /// keeps.
    pub status: u16,
    /// SHA-256 of the response's record (status, headers and body, or the error).
    pub response: String,
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

/// The data of an `adopted` or a `dropped` event on `GET /v1/jobs/{id}/events`: an
/// executor registering again (after a driver's restart, or a broken connection) listed
/// an attempt it had kept running or whose end it held. `adopted`: the attempt is the
/// task's running attempt again (nothing is launched for it); `dropped`: it is killed
/// (or its end ignored), and `reason` says why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptNote {
    pub index: u32,
    pub attempt: u32,
    pub executor: ExecutorId,
    pub reason: Option<String>,
}

/// The data of an `egress_denied` event on `GET /v1/jobs/{id}/events`: outbound requests
/// of an attempt that its executor refused (each message names the URL and the rule).
/// The guest was told (an error from its request); the attempt went on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EgressDenial {
    pub index: u32,
    pub attempt: u32,
    pub executor: ExecutorId,
    /// The first refusals of the attempt (at most 8), in order.
    pub denied: Vec<String>,
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
