//! The scheduler's types: executors, jobs and tasks as the state holds them, and what a
//! change asks the service to do ([`Action`]). How placement is configured is in
//! `settings.rs`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Instant, SystemTime};

use flint_protocol::api::{ErrorBody, ExecutorState, JobState, TaskCounts, TaskEvent, TaskState};
use flint_protocol::{
    Digest, ExecutorId, FailureKind, JobId, JobTemplate, Pins, Resources, TaskFailure, TaskId,
    TaskInput, TaskLaunch, TaskResult, Usage,
};

use flint_protocol::exit::ProcessExit;
use flint_protocol::messages::Heartbeat;

pub use flint_protocol::records::JobDef;

use super::exclusion::ExecutorHealth;

mod spans;

/// Modules remembered per executor for locality; older ones are forgotten first.
pub const MODULES_REMEMBERED: usize = 64;

/// What the service layer must do after a state change.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Tell the executor what a job's tasks share; comes before the job's first launch
    /// on each registration.
    Define {
        executor: ExecutorId,
        template: Box<JobTemplate>,
    },
    Launch {
        executor: ExecutorId,
        job: JobId,
        launch: Box<TaskLaunch>,
    },
    Kill {
        executor: ExecutorId,
        task: TaskId,
        attempt: u32,
        reason: &'static str,
    },
    /// The executor is decommissioned and drained (or out of time): StopExecutor.
    Stop { executor: ExecutorId },
    /// A task reached `succeeded` or `failed`: its end is worth keeping.
    TaskEnded(TaskId),
    /// A task went back to pending (its executor was lost, or it failed for the host's
    /// reasons and will run again): worth telling its watchers, not worth storing. The
    /// event is made now: by the time actions are carried out the task may be running
    /// again.
    TaskRequeued { job: JobId, event: TaskEvent },
    /// A job reached a final state (tasks it killed end with it).
    JobFinished(JobId),
    /// An attempt an executor listed when it registered again was adopted (`dropped`
    /// is `None`) or dropped (killed, if it ran): an event for its job's watchers.
    Reconciled {
        task: TaskId,
        attempt: u32,
        executor: ExecutorId,
        dropped: Option<super::Dropped>,
    },
    /// Waiting tasks of `job` whose named results have all succeeded: the service makes
    /// their inputs (reading ended jobs from the job store where it must) and hands them
    /// to [`super::ClusterState::inputs_ready`].
    Resolve { job: JobId, tasks: Vec<u32> },
}

/// What the service made of a waiting task's input once its results were there (see
/// [`super::ClusterState::inputs_ready`]).
#[derive(Debug)]
pub enum Resolved {
    /// The input: the task is pending.
    Input(TaskInput),
    /// A memoized job's task whose key, known now, has an entry: it takes that result
    /// and never runs.
    Memoized {
        input: TaskInput,
        result: TaskResult,
    },
    /// The input could not be made: the task ends with this failure.
    Failed(TaskFailure),
}

/// An attempt running on an executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunningAttempt {
    pub attempt: u32,
    /// The registration it was launched under: an attempt adopted after its executor
    /// registered again (the driver restarted, or the connection broke) keeps the
    /// generation its end will name.
    pub generation: u64,
    pub since: Instant,
    /// Its span in its job's [`Job::attempts`].
    pub span: u32,
    /// Its job's cores per task, so that placement can see a multi-core task here
    /// without a job lookup per running attempt.
    pub cores: u32,
    /// Killed to give its cores to another tenant: its end puts the task back as
    /// `preempted`, not as a failure.
    pub preempted: bool,
}

/// The driver makes the ids (jobs, tasks) that key these maps, so no client can pick
/// colliding keys: foldhash (seeded per process) is enough, where SipHash took a tenth
/// of the scheduler's time.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

pub struct ExecutorData {
    pub host: String,
    pub cores: u32,
    pub free_cores: u32,
    /// Attempts launched beyond its free cores (1-core tasks, launch pipelining): the
    /// next attempts to end give back these before any core.
    pub queued_ahead: u32,
    pub generation: u64,
    pub state: ExecutorState,
    pub running: FastMap<TaskId, RunningAttempt>,
    pub last_heartbeat: Instant,
    pub pid: Option<u32>,
    /// How its process ended, when its cluster manager said.
    pub exit: Option<ProcessExit>,
    /// How it ended in its launcher's words, when it said more than an exit: the
    /// reason's name and a sentence (`oom_killed`, `lost`, `launch_timeout`).
    pub end_note: Option<(String, String)>,
    /// Which cluster manager (and worker) launched it; none for one that dialled in.
    pub launched_by: Option<LaunchedBy>,
    pub tasks_finished: u64,
    pub meters_fuel: bool,
    /// The executor's own figures, as of its latest heartbeat.
    pub reported: Heartbeat,
    /// Its own failures (host errors) seen here and the exclusion they earned (kept
    /// across generations: a restarted process on a bad host is still on that host).
    pub health: ExecutorHealth,
    /// Modules this executor was given tasks of, newest last: they are fetched and
    /// compiled there (or about to be), so their tasks prefer it.
    pub modules: VecDeque<Digest>,
    /// Keys of the jobs defined on this registration's connection (`DefineJob`) and not
    /// yet forgotten.
    pub(crate) defined: HashSet<u64, foldhash::fast::RandomState>,
    /// Being decommissioned: takes no new tasks, and is sent StopExecutor once what it
    /// runs has ended or at this deadline, whichever is first.
    pub decommission_by: Option<Instant>,
    /// StopExecutor was sent to this registration.
    pub stop_sent: bool,
}

/// Where an executor came from: the cluster manager's name and, under `standalone`, the
/// worker it runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchedBy {
    pub cluster_manager: &'static str,
    pub worker: Option<String>,
}

/// A job as accepted: its definition and its tasks' own parts.
pub struct NewJob {
    pub def: JobDef,
    pub tasks: Vec<NewTask>,
}

pub struct NewTask {
    pub input: TaskInput,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// A memoized task's result (`options.memoized` says whose): it never runs.
    pub memoized: Option<TaskResult>,
}

pub struct Job {
    /// [`flint_protocol::ModuleRef::locality_key`] of its module, which placement looks
    /// up per offer: computed once.
    pub(crate) locality: Digest,
    pub def: JobDef,
    /// Names the job in the launches of its tasks (see [`JobTemplate::key`]); unique in
    /// this driver process, not kept across restarts.
    pub(crate) key: u64,
    pub tasks: Vec<Task>,
    /// Pending tasks that may run anywhere, in launch order.
    pub(crate) pending: VecDeque<u32>,
    /// Pending tasks excluded from some executor; launched before `pending`.
    pub(crate) constrained: Vec<u32>,
    /// Running tasks slow enough to get a speculative copy.
    pub(crate) speculative: Vec<u32>,
    /// Since when the job has held tasks back from a cold executor with free cores.
    pub(crate) locality_wait_since: Option<Instant>,
    pub state: JobState,
    pub finished_at: Option<SystemTime>,
    pub error: Option<(String, String)>,
    /// Bytes of the results kept so far, against `def.max_result_bytes`.
    pub result_bytes: u64,
    /// Tasks by state, kept as states change through [`set_state`]: a job of a million
    /// tasks must not be scanned once per status update.
    pub(crate) counts: TaskCounts,
    /// Moving average of its attempts' run time (guest start to end, in microseconds),
    /// which sizes how far ahead its tasks are queued; `None` until one has ended.
    pub(crate) run_time_us: Option<f64>,
    /// Every attempt launched, in launch order: the job's timeline.
    pub attempts: Vec<AttemptSpan>,
    /// The executors named by `attempts` (an index into this), so that a span holds no
    /// string of its own; and where each is in it.
    pub attempt_executors: Vec<ExecutorId>,
    pub(crate) attempt_executor_at: FastMap<ExecutorId, u32>,
    /// Tasks that ended without a span (before a driver restart, or in a data dir from
    /// before attempts were kept), in task order: the timeline shows each as one attempt
    /// from its task's times, ahead of the spans. Set once, when the job is read back
    /// (see [`Job::note_rebuilt`]); a task that ends later has a span.
    pub(crate) rebuilt: Vec<u32>,
    /// What its attempts used, summed as they end; none until one has reported.
    pub usage: Option<Usage>,
    /// Escalated budgets by task: a map, as escalation is rare and tasks pay per field.
    pub(crate) budgets: FastMap<u32, Resources>,
    /// What each attempt of a deterministic job ran, by its span's index.
    pub pins: FastMap<u32, Pins>,
}

/// One attempt of a task, from its launch to its end. About 40 bytes: a job keeps one
/// per launch for its timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptSpan {
    pub task: u32,
    pub attempt: u32,
    /// Index into [`Job::attempt_executors`].
    pub executor: u32,
    pub speculative: bool,
    /// Unix microseconds: the driver's launch time until the executor reports the
    /// guest's own start.
    pub start_us: u64,
    pub end_us: Option<u64>,
    pub outcome: Option<Outcome>,
    /// The memory and time it was launched with (escalated retries get more).
    pub memory_mb: u32,
    pub timeout_ms: u64,
    /// What it used, as its executor reported (none if it never reported).
    pub usage: Option<Usage>,
}

pub use flint_protocol::records::AttemptOutcome as Outcome;

/// Unix microseconds of a wall-clock time.
pub(crate) fn unix_us(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The one way a task's state changes, so that its job's counts stay true.
pub(crate) fn set_state(counts: &mut TaskCounts, task: &mut Task, to: TaskState) {
    *counts.of_mut(task.state) -= 1;
    *counts.of_mut(to) += 1;
    task.state = to;
}

pub struct Task {
    pub input: TaskInput,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub state: TaskState,
    /// Attempts launched so far; the latest has this number.
    pub attempts: u32,
    /// Attempts lost to retryable failures (a source's or an executor's: fetch and host
    /// errors); these count towards `max_failures`.
    pub host_failures: u32,
    /// Executors where an attempt failed for the executor's own reasons (a host error,
    /// [`FailureKind::blames_executor`]), once per failure.
    pub failed_on: Vec<ExecutorId>,
    pub executor: Option<ExecutorId>,
    pub result: Option<TaskResult>,
    pub result_digest: Option<Digest>,
    pub failure: Option<TaskFailure>,
    pub started_at_us: Option<u64>,
    pub finished_at_us: Option<u64>,
    pub log: Vec<u8>,
}

impl Job {
    /// Notes the tasks that ended without a span, for the timeline (see
    /// [`Job::rebuilt`]). Called once its tasks and spans are read back.
    pub(crate) fn note_rebuilt(&mut self) {
        let mut covered = vec![false; self.tasks.len()];
        for s in &self.attempts {
            if let Some(c) = covered.get_mut(s.task as usize) {
                *c = true;
            }
        }
        self.rebuilt = (self.tasks.iter().enumerate())
            .filter(|(index, task)| {
                !covered[*index]
                    && task.state.is_final()
                    && task.started_at_us.is_some()
                    && task.finished_at_us.is_some()
                    && task.executor.is_some()
            })
            .map(|(index, _)| index as u32)
            .collect();
    }

    /// What task `index`'s next attempt may use: its escalated budget, else the job's.
    pub fn budget(&self, index: u32) -> Resources {
        *self.budgets.get(&index).unwrap_or(&self.def.resources)
    }

    /// Ends every task that has not started (pending, or waiting for results): its job
    /// is over.
    pub(crate) fn kill_pending(&mut self) {
        if self.counts.waiting > 0 {
            for task in self.tasks.iter_mut() {
                if task.state == TaskState::Waiting {
                    set_state(&mut self.counts, task, TaskState::Killed);
                    task.failure = Some(TaskFailure::new(
                        FailureKind::Killed,
                        "not run: the job ended while this task waited for the results it reads",
                    ));
                }
            }
        }
        self.speculative.clear();
        self.locality_wait_since = None;
        let constrained = std::mem::take(&mut self.constrained);
        for index in self.pending.drain(..).chain(constrained) {
            let task = &mut self.tasks[index as usize];
            set_state(&mut self.counts, task, TaskState::Killed);
            task.failure = Some(TaskFailure::new(
                FailureKind::Killed,
                "not run: the job ended before this task started",
            ));
        }
    }

    pub(super) fn has_work(&self) -> bool {
        let idle =
            self.pending.is_empty() && self.constrained.is_empty() && self.speculative.is_empty();
        !self.state.is_final() && !idle
    }

    pub fn counts(&self) -> TaskCounts {
        debug_assert_eq!(self.counts, self.scan_counts(), "job {}", self.def.id);
        self.counts
    }

    /// Whether every task has ended.
    pub fn all_final(&self) -> bool {
        // The field, not `counts()`: this runs per status update, and the debug check
        // there scans every task (once per API view is fine, once per end is not).
        self.counts.pending == 0 && self.counts.running == 0 && self.counts.waiting == 0
    }

    fn scan_counts(&self) -> TaskCounts {
        let mut counts = TaskCounts::default();
        for task in &self.tasks {
            *match task.state {
                TaskState::Waiting => &mut counts.waiting,
                TaskState::Pending => &mut counts.pending,
                TaskState::Running => &mut counts.running,
                TaskState::Succeeded => &mut counts.succeeded,
                TaskState::Failed => &mut counts.failed,
                TaskState::Killed => &mut counts.killed,
            } += 1;
        }
        counts
    }
}

impl Task {
    /// Why the task did not succeed, as the API shows it: none once it has (a failed
    /// attempt before the success is history, not its outcome).
    pub fn error_body(&self) -> Option<ErrorBody> {
        self.failure
            .as_ref()
            .filter(|_| self.state != TaskState::Succeeded)
            .map(|f| ErrorBody {
                kind: f.kind.as_str().to_owned(),
                message: f.message.clone(),
            })
    }
}

impl ExecutorData {
    /// Whether offers may place tasks here: alive and not being decommissioned.
    pub fn takes_tasks(&self) -> bool {
        self.state == ExecutorState::Alive && self.decommission_by.is_none()
    }

    pub(super) fn new(host: String, cores: u32, now: Instant) -> Self {
        ExecutorData {
            host,
            cores,
            free_cores: cores,
            queued_ahead: 0,
            generation: 0,
            state: ExecutorState::Alive,
            running: FastMap::default(),
            last_heartbeat: now,
            pid: None,
            exit: None,
            end_note: None,
            launched_by: None,
            decommission_by: None,
            stop_sent: false,
            tasks_finished: 0,
            meters_fuel: false,
            reported: Heartbeat::default(),
            health: ExecutorHealth::default(),
            modules: VecDeque::new(),
            defined: HashSet::default(),
        }
    }

    /// An attempt starts here: it takes its cores, or a queue slot when they are taken
    /// (a pipelined 1-core launch, or an adopted attempt past the cores: the next end
    /// gives a slot back before any core), and its module is warm here from now on.
    pub(super) fn take_slot(&mut self, cores: u32, module: Digest) {
        if self.free_cores >= cores {
            self.free_cores -= cores;
        } else {
            self.queued_ahead += 1;
        }
        self.remember_module(module);
    }

    pub(super) fn remember_module(&mut self, digest: Digest) {
        if let Some(at) = self.modules.iter().position(|d| *d == digest) {
            self.modules.remove(at);
        } else if self.modules.len() >= MODULES_REMEMBERED {
            self.modules.pop_front();
        }
        self.modules.push_back(digest);
    }
}
