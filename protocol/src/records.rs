//! What the driver keeps in its job store, so that a restart loses no accepted job and no
//! finished result. Encoded with postcard; a change here needs a new table name in the
//! driver's store (the old one is then read and migrated, or refused with a clear error).

use serde::{Deserialize, Serialize};

use crate::api::{JobState, TaskState};
use crate::ids::{Digest, ExecutorId, JobId};
use crate::task::{
    Determinism, FailureKind, FileRef, ModuleRef, NetworkGrant, Pins, Resources, TaskFailure,
    TaskInput, TaskResult, Usage,
};

/// What a job is, as accepted; fixed for the job's life. The driver's scheduler holds it
/// as it is stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDef {
    pub id: JobId,
    pub name: String,
    pub module: ModuleRef,
    pub files: Vec<FileRef>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub resources: Resources,
    pub max_failures: u32,
    /// Cap on the sum of the job's results.
    pub max_result_bytes: u64,
    pub created_at_ms: u64,
    /// Not in this record's encoding: stored beside it, in the table `job_options.v1`
    /// (added without a new layout; a job without a value there has the defaults), and
    /// joined in whenever a job is read. The job store's journal record (version 2)
    /// carries it after the record: a change of its encoding needs a new table name and
    /// a new journal record version.
    #[serde(skip)]
    pub options: JobOptions,
    /// Whose job it is and its priority among that tenant's jobs. Not in this record's
    /// encoding either: stored beside it in `job_owners.v1` (a job without a row there
    /// is the admin's, at priority 0, as every job before tenants was), and carried by
    /// the journal record as `options` is.
    #[serde(skip)]
    pub owner: Owner,
    /// The outbound HTTP its tasks may make (`"network"`), as admitted: the job's and its
    /// tenant's allow-lists and the limits per attempt. Not in this record's encoding:
    /// stored beside it in `job_network.v1` (a job without a row there has no network)
    /// and carried by the journal record after its owner.
    #[serde(skip)]
    pub network: Option<NetworkGrant>,
}

/// A job's tenant (`None`: the admin, `--token`) and priority (higher goes first among
/// that tenant's jobs; capped by the tenant's `max_priority`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub tenant: Option<String>,
    pub priority: i32,
}

impl Owner {
    pub fn is_default(&self) -> bool {
        *self == Owner::default()
    }
}

impl JobDef {
    /// Whether its tasks run only where fuel is metered: a fuel budget, or exact
    /// accounting (which counts fuel).
    pub fn needs_fuel(&self) -> bool {
        self.resources.fuel.is_some() || self.options.exact_accounting
    }
}

/// What a job asked for beyond running its tasks with its resources: exact accounting,
/// escalated retries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOptions {
    /// Count fuel: run only on executors that meter it.
    pub exact_accounting: bool,
    pub escalate: Option<Escalation>,
    /// `"deterministic": true`, with its seed (drawn at submission when not given).
    pub determinism: Option<Determinism>,
    /// `"memoize": true`: a task computed before is taken from there.
    pub memoize: bool,
    /// The tasks taken from earlier ones at submission, in task order: (task, the job
    /// and task whose result it is). Their ends (the results) are stored with the job's
    /// record, in its first task-end value.
    pub memoized: Vec<(u32, JobId, u32)>,
}

impl JobOptions {
    pub fn is_default(&self) -> bool {
        *self == JobOptions::default()
    }
}

/// `"retry": {"escalate": ...}` as accepted: factors of 1 mean that budget never grows.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Escalation {
    pub memory: f64,
    pub timeout: f64,
    pub max_memory_mb: u32,
    pub max_timeout_ms: u64,
}

impl Eq for Escalation {}

/// A job as accepted, written before the API answers 202.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub def: JobDef,
    pub tasks: Vec<TaskInputRecord>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInputRecord {
    pub input: TaskInput,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// A task that reached a final state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEndRecord {
    pub state: TaskState,
    pub attempts: u32,
    pub executor: Option<ExecutorId>,
    pub failure: Option<TaskFailure>,
    pub started_at_us: Option<u64>,
    pub finished_at_us: Option<u64>,
    pub result: Option<TaskResult>,
    #[serde(with = "serde_bytes")]
    pub log: Vec<u8>,
}

/// A job that reached a final state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEndRecord {
    pub state: JobState,
    pub finished_at_ms: u64,
    pub error: Option<(String, String)>,
}

/// What listing a job needs, kept apart from its (large) record: written when the job
/// is accepted (state `queued`, every task pending) and again when it ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSummaryRecord {
    pub name: String,
    pub state: JobState,
    pub created_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    pub tasks: u32,
    pub counts: StoredCounts,
    pub error: Option<(String, String)>,
}

/// [`TaskCounts`](crate::api::TaskCounts) as a summary keeps them: the five counts of
/// before tasks could wait (a record encodes fields by place). A summary is written as
/// its job is accepted, every unended task counted pending, and as it ends, when no task
/// waits; so waiting tasks are counted as pending here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCounts {
    pub pending: u32,
    pub running: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub killed: u32,
}

impl StoredCounts {
    /// The count of tasks in `state` (none waits in a summary).
    pub fn of(&self, state: crate::api::TaskState) -> u32 {
        match state {
            crate::api::TaskState::Waiting => 0,
            state => crate::api::TaskCounts::from(*self).of(state),
        }
    }

    /// The count of tasks in `state`, to change (a waiting task counts as pending).
    pub fn of_mut(&mut self, state: crate::api::TaskState) -> &mut u32 {
        use crate::api::TaskState;
        match state {
            TaskState::Waiting | TaskState::Pending => &mut self.pending,
            TaskState::Running => &mut self.running,
            TaskState::Succeeded => &mut self.succeeded,
            TaskState::Failed => &mut self.failed,
            TaskState::Killed => &mut self.killed,
        }
    }
}

impl From<crate::api::TaskCounts> for StoredCounts {
    fn from(c: crate::api::TaskCounts) -> Self {
        StoredCounts {
            pending: c.pending + c.waiting,
            running: c.running,
            succeeded: c.succeeded,
            failed: c.failed,
            killed: c.killed,
        }
    }
}

impl From<StoredCounts> for crate::api::TaskCounts {
    fn from(c: StoredCounts) -> Self {
        crate::api::TaskCounts {
            waiting: 0,
            pending: c.pending,
            running: c.running,
            succeeded: c.succeeded,
            failed: c.failed,
            killed: c.killed,
        }
    }
}

/// One attempt of a task, for a finished job's timeline: written once the job's last
/// attempt has ended (the table `job_attempts.v3`, one value per job).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub task: u32,
    pub attempt: u32,
    pub executor: ExecutorId,
    pub start_us: u64,
    pub end_us: Option<u64>,
    /// None: it never ended (its job ended first and nothing reported it).
    pub outcome: Option<AttemptOutcome>,
    pub speculative: bool,
    /// The memory and time it ran with (an escalated retry's are more than the job's).
    pub memory_mb: u32,
    pub timeout_ms: u64,
    /// What it used, as its executor measured it; none when it never reported.
    pub usage: Option<Usage>,
    /// What a deterministic job's attempt ran, by digest.
    pub pins: Option<Pins>,
}

/// [`AttemptRecord`] as the table `job_attempts.v2` holds it (before outbound HTTP was
/// counted and recorded): read where a data dir has no `job_attempts.v3` value for a
/// job. Frozen: its usage and pins are the layouts of then, [`UsageV1`] and [`PinsV1`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecordV2 {
    pub task: u32,
    pub attempt: u32,
    pub executor: ExecutorId,
    pub start_us: u64,
    pub end_us: Option<u64>,
    pub outcome: Option<AttemptOutcome>,
    pub speculative: bool,
    pub memory_mb: u32,
    pub timeout_ms: u64,
    pub usage: Option<UsageV1>,
    pub pins: Option<PinsV1>,
}

impl From<AttemptRecordV2> for AttemptRecord {
    fn from(a: AttemptRecordV2) -> Self {
        AttemptRecord {
            task: a.task,
            attempt: a.attempt,
            executor: a.executor,
            start_us: a.start_us,
            end_us: a.end_us,
            outcome: a.outcome,
            speculative: a.speculative,
            memory_mb: a.memory_mb,
            timeout_ms: a.timeout_ms,
            usage: a.usage.map(Usage::from),
            pins: a.pins.map(Pins::from),
        }
    }
}

/// [`Usage`] as `job_attempts.v2` encodes it: without the egress counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageV1 {
    pub fuel: Option<u64>,
    pub cpu_us: u64,
    pub wall_us: u64,
    pub peak_memory_bytes: u64,
    pub input_bytes: u64,
    pub output_bytes: u64,
    pub fetched_bytes: u64,
}

impl From<UsageV1> for Usage {
    fn from(u: UsageV1) -> Self {
        Usage {
            fuel: u.fuel,
            cpu_us: u.cpu_us,
            wall_us: u.wall_us,
            peak_memory_bytes: u.peak_memory_bytes,
            input_bytes: u.input_bytes,
            output_bytes: u.output_bytes,
            fetched_bytes: u.fetched_bytes,
            // No request could be made then.
            egress_requests: 0,
            egress_bytes_sent: 0,
            egress_bytes_received: 0,
        }
    }
}

/// [`Pins`] as `job_attempts.v2` encodes them: without recorded responses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinsV1 {
    pub module: Digest,
    pub files: Vec<Digest>,
    pub input: Digest,
}

impl From<PinsV1> for Pins {
    fn from(p: PinsV1) -> Self {
        Pins {
            module: p.module,
            files: p.files,
            input: p.input,
            egress: Vec::new(),
            egress_tape: None,
        }
    }
}

/// [`AttemptRecord`] as the table `job_attempts.v1` holds it (before usage and budgets
/// were kept): read where a data dir has neither a `job_attempts.v3` nor a `v2` value
/// for a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecordV1 {
    pub task: u32,
    pub attempt: u32,
    pub executor: ExecutorId,
    pub start_us: u64,
    pub end_us: Option<u64>,
    pub outcome: Option<AttemptOutcome>,
    pub speculative: bool,
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptOutcome {
    Succeeded,
    Failed(FailureKind),
    /// Its executor was lost, or withdrew it (stopping): the task ran again.
    Lost,
    /// Killed to give its cores to a tenant below its share: the task ran again, and
    /// no failure was counted.
    Preempted,
}

impl AttemptOutcome {
    /// As the API names it: `succeeded`, the failure's kind, or `lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed(kind) => kind.as_str(),
            AttemptOutcome::Lost => "lost",
            AttemptOutcome::Preempted => "preempted",
        }
    }
}

/// A graph of jobs submitted together (the table `graphs.v1`): each job's local name
/// and id, in an order where each comes after the jobs it reads, and the edges between
/// them by place in `jobs` (read, reader).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphRecord {
    pub id: String,
    pub created_at_ms: u64,
    /// The tenant that submitted it; none for the admin.
    pub tenant: Option<String>,
    pub jobs: Vec<(String, JobId)>,
    pub edges: Vec<(u32, u32)>,
    /// The graph this one recovers (`POST /v1/graphs/{id}/recover`), if it does.
    pub recovered_from: Option<String>,
}
