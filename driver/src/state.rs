//! The scheduler's state machine: executors, jobs and tasks, changed only through the
//! methods below, each of which returns the [`Action`]s the service layer must carry out.
//! No sockets, no clock reads: the service sets the clock ([`ClusterState::set_clock`])
//! before each change, so it is tested directly.
//!
//! A task runs as at most one attempt, or two when speculation copied it; the first
//! success wins and the other attempt is killed. Where an attempt runs is in its
//! executor's `running` map, which is the only record of running attempts.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use flint_protocol::api::{ErrorBody, ExecutorState, JobState, TaskCounts, TaskEvent, TaskState};
use flint_protocol::{
    Digest, ExecutorId, FailureKind, JobId, JobTemplate, TaskFailure, TaskId, TaskInput,
    TaskLaunch, TaskResult, TaskStatus,
};

pub use flint_protocol::records::JobDef;

use flint_protocol::messages::Heartbeat;

use crate::exclusion::{ExclusionConfig, ExecutorHealth, excluded_for_task};
use crate::policy::{self, Demand, Offer};
use crate::speculation::SpeculationConfig;

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
    /// A task reached `succeeded` or `failed`: its end is worth keeping.
    TaskEnded(TaskId),
    /// A task went back to pending (its executor was lost, or it failed for the host's
    /// reasons and will run again): worth telling its watchers, not worth storing. The
    /// event is made now: by the time actions are carried out the task may be running
    /// again.
    TaskRequeued { job: JobId, event: TaskEvent },
    /// A job reached a final state (tasks it killed end with it).
    JobFinished(JobId),
}

/// How the scheduler places work, beyond free cores.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulingConfig {
    pub exclusion: ExclusionConfig,
    /// How long a job's tasks wait for an executor that already ran its module before
    /// taking a free core elsewhere (Spark's `spark.locality.wait`). Zero: no waiting.
    pub locality_wait: Duration,
    /// Copies of slow tasks; `None` (the default) never copies.
    pub speculation: Option<SpeculationConfig>,
    /// 1-core tasks launched to each executor beyond its free cores, queued there for
    /// its task threads, so that no thread waits a round trip for its next task. The
    /// depth when nothing is known of the tasks' run time; 0 turns pipelining off.
    pub launch_ahead: u32,
    /// How deep the queue may grow once the jobs with work are known to run short tasks:
    /// up to `queue_budget` of their run time per core, at most this many.
    pub launch_ahead_max: u32,
    pub queue_budget: Duration,
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        SchedulingConfig {
            exclusion: ExclusionConfig::default(),
            locality_wait: Duration::from_millis(flint_protocol::defaults::LOCALITY_WAIT_MS),
            speculation: None,
            launch_ahead: flint_protocol::defaults::LAUNCH_AHEAD,
            launch_ahead_max: flint_protocol::defaults::LAUNCH_AHEAD_MAX,
            queue_budget: Duration::from_micros(flint_protocol::defaults::QUEUE_BUDGET_US),
        }
    }
}

/// An attempt running on an executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunningAttempt {
    pub attempt: u32,
    pub since: Instant,
    /// Its job's cores per task, so that placement can see a multi-core task here
    /// without a job lookup per running attempt.
    pub cores: u32,
}

/// The driver makes the ids (jobs, tasks) that key these maps, so no client can pick
/// colliding keys: foldhash (seeded per process) is enough, where SipHash took a tenth
/// of the scheduler's time.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

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
    pub exit_code: Option<i32>,
    pub tasks_finished: u64,
    pub meters_fuel: bool,
    /// The executor's own figures, as of its latest heartbeat.
    pub reported: Heartbeat,
    /// Host failures seen here and the exclusion they earned (kept across generations:
    /// a restarted process on a bad host is still on that host).
    pub health: ExecutorHealth,
    /// Modules this executor was given tasks of, newest last: they are fetched and
    /// compiled there (or about to be), so their tasks prefer it.
    pub modules: VecDeque<Digest>,
    /// Keys of the jobs defined on this registration's connection (`DefineJob`) and not
    /// yet forgotten.
    pub(crate) defined: HashSet<u64, foldhash::fast::RandomState>,
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
}

pub struct Job {
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
}

/// The one way a task's state changes, so that its job's counts stay true.
pub(crate) fn set_state(counts: &mut TaskCounts, task: &mut Task, to: TaskState) {
    fn slot(counts: &mut TaskCounts, state: TaskState) -> &mut u32 {
        match state {
            TaskState::Pending => &mut counts.pending,
            TaskState::Running => &mut counts.running,
            TaskState::Succeeded => &mut counts.succeeded,
            TaskState::Failed => &mut counts.failed,
            TaskState::Killed => &mut counts.killed,
        }
    }
    *slot(counts, task.state) -= 1;
    *slot(counts, to) += 1;
    task.state = to;
}

pub struct Task {
    pub input: TaskInput,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub state: TaskState,
    /// Attempts launched so far; the latest has this number.
    pub attempts: u32,
    /// Attempts lost to host failures; these count towards `max_failures`.
    pub host_failures: u32,
    /// Executors where an attempt failed for the host's reasons, once per failure.
    pub failed_on: Vec<ExecutorId>,
    pub executor: Option<ExecutorId>,
    pub result: Option<TaskResult>,
    pub result_digest: Option<Digest>,
    pub failure: Option<TaskFailure>,
    pub started_at_us: Option<u64>,
    pub finished_at_us: Option<u64>,
    pub log: Vec<u8>,
}

pub struct ClusterState {
    pub executors: BTreeMap<ExecutorId, ExecutorData>,
    pub jobs: FastMap<JobId, Job>,
    /// Jobs in submission order, newest last.
    pub job_order: Vec<JobId>,
    /// Jobs that may still have tasks to launch, oldest first.
    pub(crate) queue: VecDeque<JobId>,
    next_generation: u64,
    next_job_key: u64,
    pub config: SchedulingConfig,
    /// The time of the change being made, set by the caller.
    now: Instant,
}

impl Job {
    /// Ends every task that has not started: its job is over.
    pub(crate) fn kill_pending(&mut self) {
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

    fn has_work(&self) -> bool {
        let idle =
            self.pending.is_empty() && self.constrained.is_empty() && self.speculative.is_empty();
        !self.state.is_final() && !idle
    }

    /// Puts a task back to be launched again.
    fn requeue(&mut self, index: u32, front: bool) {
        let task = &mut self.tasks[index as usize];
        set_state(&mut self.counts, task, TaskState::Pending);
        self.speculative.retain(|&i| i != index);
        if !task.failed_on.is_empty() {
            self.constrained.push(index);
        } else if front {
            self.pending.push_front(index);
        } else {
            self.pending.push_back(index);
        }
    }

    pub fn counts(&self) -> TaskCounts {
        debug_assert_eq!(self.counts, self.scan_counts(), "job {}", self.def.id);
        self.counts
    }

    /// Whether every task has ended.
    pub fn all_final(&self) -> bool {
        // The field, not `counts()`: this runs per status update, and the debug check
        // there scans every task (once per API view is fine, once per end is not).
        self.counts.pending == 0 && self.counts.running == 0
    }

    fn scan_counts(&self) -> TaskCounts {
        let mut counts = TaskCounts::default();
        for task in &self.tasks {
            *match task.state {
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
    fn new(host: String, cores: u32, now: Instant) -> Self {
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
            exit_code: None,
            tasks_finished: 0,
            meters_fuel: false,
            reported: Heartbeat::default(),
            health: ExecutorHealth::default(),
            modules: VecDeque::new(),
            defined: HashSet::default(),
        }
    }

    fn remember_module(&mut self, digest: Digest) {
        if let Some(at) = self.modules.iter().position(|d| *d == digest) {
            self.modules.remove(at);
        } else if self.modules.len() >= MODULES_REMEMBERED {
            self.modules.pop_front();
        }
        self.modules.push_back(digest);
    }
}

impl ClusterState {
    /// A state whose registrations are numbered from `first_generation` on. The driver
    /// starts from the wall clock in microseconds, so that generations keep increasing
    /// across its restarts and a status from before a restart is never taken for one of
    /// a new registration.
    pub fn new(first_generation: u64, config: SchedulingConfig, now: Instant) -> Self {
        ClusterState {
            executors: BTreeMap::new(),
            jobs: FastMap::default(),
            job_order: Vec::new(),
            queue: VecDeque::new(),
            next_generation: first_generation,
            next_job_key: 0,
            config,
            now,
        }
    }

    /// Sets the time of the changes that follow. Time never goes back.
    pub fn set_clock(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    pub fn now(&self) -> Instant {
        self.now
    }

    /// Whether any live executor meters fuel (runs tasks with fuel budgets).
    pub fn any_executor_meters_fuel(&self) -> bool {
        self.executors
            .values()
            .any(|e| e.state == ExecutorState::Alive && e.meters_fuel)
    }

    /// The largest executor, for refusing jobs that could never be placed.
    pub fn max_executor_cores(&self) -> Option<u32> {
        self.executors
            .values()
            .filter(|e| e.state == ExecutorState::Alive)
            .map(|e| e.cores)
            .max()
    }

    /// The job ended: the executors it was defined on may forget it. Those executors.
    pub(crate) fn forget_job(&mut self, job: &JobId) -> Vec<(ExecutorId, u64)> {
        let Some(key) = self.jobs.get(job).map(|j| j.key) else {
            return Vec::new();
        };
        self.executors
            .iter_mut()
            .filter_map(|(id, e)| e.defined.remove(&key).then(|| (id.clone(), key)))
            .collect()
    }

    /// Registers an executor; a second live executor with the same id is refused. The
    /// same process (host and pid) registering again replaces its old registration: it
    /// reconnected before its old connection was seen to close, and that generation is
    /// lost (its tasks run again; the returned actions launch them).
    pub fn register_executor(
        &mut self,
        id: ExecutorId,
        host: String,
        cores: u32,
        pid: u32,
        meters_fuel: bool,
    ) -> Result<(u64, Vec<Action>), String> {
        if cores == 0 {
            return Err("an executor needs at least one core".into());
        }
        let mut actions = Vec::new();
        if let Some(existing) = self.executors.get(&id)
            && existing.state == ExecutorState::Alive
        {
            if existing.pid != Some(pid) || existing.host != host {
                return Err(format!(
                    "executor id {id} is already registered (host {}, pid {})",
                    existing.host,
                    existing.pid.map_or("?".into(), |p| p.to_string())
                ));
            }
            let old = existing.generation;
            actions = self.executor_lost(&id, old);
        }
        self.next_generation += 1;
        let generation = self.next_generation;
        // An exclusion outlives the process; what the last process had compiled does not.
        let health = self
            .executors
            .remove(&id)
            .map(|old| old.health)
            .unwrap_or_default();
        let mut executor = ExecutorData::new(host, cores, self.now);
        executor.generation = generation;
        executor.pid = Some(pid);
        executor.meters_fuel = meters_fuel;
        executor.health = health;
        self.executors.insert(id, executor);
        Ok((generation, actions))
    }

    /// The executor is alive; with `report`, its figures are new too.
    pub fn heartbeat(&mut self, id: &ExecutorId, generation: u64, report: Option<Heartbeat>) {
        let now = self.now;
        if let Some(e) = self.live_executor(id, generation) {
            e.last_heartbeat = now;
            if let Some(report) = report {
                e.reported = report;
            }
        }
    }

    /// The executor's connection is gone: its running tasks go back to pending without
    /// counting as failures of the task (unless a copy still runs elsewhere).
    pub fn executor_lost(&mut self, id: &ExecutorId, generation: u64) -> Vec<Action> {
        let Some(executor) = self.live_executor(id, generation) else {
            return Vec::new();
        };
        // The process may already have been seen exiting (flint dev's children).
        executor.state = match executor.exit_code {
            Some(_) => ExecutorState::Exited,
            None => ExecutorState::Lost,
        };
        executor.free_cores = 0;
        executor.queued_ahead = 0;
        let running: Vec<TaskId> = executor.running.drain().map(|(t, _)| t).collect();
        let mut actions = Vec::new();
        for task_id in running {
            if self.attempts_running(&task_id) > 0 {
                continue;
            }
            let Some(job) = self.jobs.get_mut(&task_id.job) else {
                continue;
            };
            if job.tasks[task_id.index as usize].state == TaskState::Running {
                job.requeue(task_id.index, true);
                if !self.queue.contains(&task_id.job) {
                    self.queue.push_front(task_id.job.clone());
                }
                let why = ErrorBody {
                    kind: "executor_lost".into(),
                    message: format!("executor {id} was lost; the task runs again"),
                };
                actions.push(requeued(job, task_id.index, why));
            }
        }
        actions.extend(self.make_offers());
        actions
    }

    /// Live executors whose last heartbeat is older than `timeout`: hung (SIGSTOP) or cut
    /// off without their connection closing. Each is lost as if its connection had closed.
    pub fn expire_executors(&mut self, timeout: Duration) -> (Vec<(ExecutorId, u64)>, Vec<Action>) {
        let now = self.now;
        let expired: Vec<(ExecutorId, u64)> = self
            .executors
            .iter()
            .filter(|(_, e)| {
                e.state == ExecutorState::Alive
                    && now.saturating_duration_since(e.last_heartbeat) > timeout
            })
            .map(|(id, e)| (id.clone(), e.generation))
            .collect();
        let mut actions = Vec::new();
        for (id, generation) in &expired {
            actions.extend(self.executor_lost(id, *generation));
        }
        (expired, actions)
    }

    /// A process that `flint dev` started has exited.
    /// One that never registered is listed too, so its exit code is visible.
    pub fn executor_exited(&mut self, id: &ExecutorId, exit_code: Option<i32>) {
        let now = self.now;
        let executor = self.executors.entry(id.clone()).or_insert_with(|| {
            let mut e = ExecutorData::new(String::new(), 0, now);
            e.state = ExecutorState::Exited;
            e
        });
        executor.exit_code = exit_code;
        if executor.state != ExecutorState::Alive {
            executor.state = ExecutorState::Exited;
        }
    }

    pub fn submit_job(&mut self, job: NewJob) -> Vec<Action> {
        self.insert_job(job);
        self.make_offers()
    }

    /// Adds a job with every task pending, and nothing launched yet.
    pub(crate) fn insert_job(&mut self, job: NewJob) {
        let tasks = job
            .tasks
            .into_iter()
            .map(|t| Task {
                input: t.input,
                args: t.args,
                env: t.env,
                state: TaskState::Pending,
                attempts: 0,
                host_failures: 0,
                failed_on: Vec::new(),
                executor: None,
                result: None,
                result_digest: None,
                failure: None,
                started_at_us: None,
                finished_at_us: None,
                log: Vec::new(),
            })
            .collect::<Vec<_>>();
        let pending = (0..tasks.len() as u32).collect();
        let counts = TaskCounts {
            pending: tasks.len() as u32,
            ..TaskCounts::default()
        };
        self.job_order.push(job.def.id.clone());
        self.queue.push_back(job.def.id.clone());
        self.next_job_key += 1;
        self.jobs.insert(
            job.def.id.clone(),
            Job {
                def: job.def,
                key: self.next_job_key,
                tasks,
                pending,
                constrained: Vec::new(),
                speculative: Vec::new(),
                locality_wait_since: None,
                state: JobState::Queued,
                finished_at: None,
                error: None,
                result_bytes: 0,
                counts,
                run_time_us: None,
            },
        );
    }

    /// Attempts of a task running on live executors.
    fn attempts_running(&self, task: &TaskId) -> usize {
        self.executors
            .values()
            .filter(|e| e.running.contains_key(task))
            .count()
    }

    /// A task attempt ended on an executor. Stale reports (an old attempt, another
    /// executor, a lost generation) change nothing. The first success of a task wins; a
    /// copy still running elsewhere is killed.
    pub fn status_update(
        &mut self,
        executor_id: &ExecutorId,
        generation: u64,
        status: TaskStatus,
        now: SystemTime,
    ) -> Vec<Action> {
        self.status_updates(executor_id, generation, vec![status], now)
    }

    /// Several ends from one executor, as they arrived, then one round of offers for
    /// the cores they gave back: placement once per burst, not once per task.
    pub fn status_updates(
        &mut self,
        executor_id: &ExecutorId,
        generation: u64,
        statuses: Vec<TaskStatus>,
        now: SystemTime,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        for status in statuses {
            self.attempt_ended(executor_id, generation, status, now, &mut actions);
        }
        actions.extend(self.make_offers_at(now));
        actions
    }

    fn attempt_ended(
        &mut self,
        executor_id: &ExecutorId,
        generation: u64,
        status: TaskStatus,
        now: SystemTime,
        out: &mut Vec<Action>,
    ) {
        let clock = self.now;
        let exclusion = self.config.exclusion;
        let Some(cores) = self
            .jobs
            .get(&status.task.job)
            .map(|j| j.def.resources.cores)
        else {
            return;
        };
        let Some(executor) = self.live_executor(executor_id, generation) else {
            return;
        };
        if executor.running.get(&status.task).map(|r| r.attempt) != Some(status.attempt)
            || status.generation != generation
        {
            return;
        }
        executor.running.remove(&status.task);
        executor.tasks_finished += 1;
        if executor.queued_ahead > 0 {
            // A queued attempt takes the thread this one leaves.
            executor.queued_ahead -= 1;
        } else {
            executor.free_cores += cores;
        }
        let job = self
            .jobs
            .get_mut(&status.task.job)
            .expect("job checked above");
        let run = status
            .end
            .finished_at_us
            .saturating_sub(status.end.started_at_us) as f64;
        // A short memory (weight 0.2 for the newest): a job whose tasks slow down stops
        // queueing deep within a few ends.
        job.run_time_us = Some(job.run_time_us.map_or(run, |avg| avg + 0.2 * (run - avg)));
        let task = &mut job.tasks[status.task.index as usize];
        let actions = out;
        // A killed task's times and log are its last attempt's; a succeeded or failed
        // one keeps those of the attempt that decided it.
        if !matches!(task.state, TaskState::Succeeded | TaskState::Failed) {
            task.started_at_us = Some(status.end.started_at_us);
            task.finished_at_us = Some(status.end.finished_at_us);
            task.log = status.end.log;
        }
        if task.state.is_final() {
            // A kill (of this task or its job), or the other attempt's success, got here
            // first: the cores are back now, and whatever this attempt did is not taken.
            return;
        }
        let copy_running = self
            .executors
            .values()
            .any(|e| e.running.contains_key(&status.task));
        match status.end.outcome {
            Ok(result) if job.result_bytes + result.len() > job.def.max_result_bytes => {
                set_state(&mut job.counts, task, TaskState::Failed);
                let failure = TaskFailure::new(
                    FailureKind::ResultLimit,
                    format!(
                        "a {} byte result takes the job's results past max_result_bytes ({} bytes)",
                        result.len(),
                        job.def.max_result_bytes
                    ),
                );
                let reason = format!(
                    "task {} failed: {}: {}",
                    status.task.index, failure.kind, failure.message
                );
                task.failure = Some(failure);
                actions.push(Action::TaskEnded(status.task.clone()));
                actions.extend(Self::end_job(job, JobState::Failed, Some(reason), now));
                self.clear_running(&status.task.job, actions);
            }
            Ok(result) => {
                job.result_bytes += result.len();
                set_state(&mut job.counts, task, TaskState::Succeeded);
                task.executor = Some(executor_id.clone());
                task.result_digest = Some(result.digest());
                task.result = Some(result);
                task.failure = None;
                job.speculative.retain(|&i| i != status.task.index);
                actions.push(Action::TaskEnded(status.task.clone()));
                for (other, e) in &self.executors {
                    if let Some(running) = e.running.get(&status.task) {
                        actions.push(Action::Kill {
                            executor: other.clone(),
                            task: status.task.clone(),
                            attempt: running.attempt,
                            reason: "another attempt of this task succeeded",
                        });
                    }
                }
            }
            Err(failure)
                if failure.kind.is_retryable() && task.host_failures + 1 < job.def.max_failures =>
            {
                task.host_failures += 1;
                task.failure = Some(failure);
                if excluded_for_task(&exclusion, &task.failed_on, executor_id) {
                    // Already excluded: cannot have run here; nothing more to learn.
                } else {
                    task.failed_on.push(executor_id.clone());
                }
                let executor = self
                    .executors
                    .get_mut(executor_id)
                    .expect("executor checked above");
                if executor
                    .health
                    .record_failure(&exclusion, status.task.clone(), clock)
                {
                    tracing::warn!(
                        executor = %executor_id,
                        failures = exclusion.executor_failures,
                        window = ?exclusion.window,
                        period = ?exclusion.period,
                        "executor excluded after repeated task failures"
                    );
                }
                if !copy_running {
                    job.requeue(status.task.index, false);
                    let failure = job.tasks[status.task.index as usize].failure.as_ref();
                    let why = ErrorBody {
                        kind: failure.map_or("host_error", |f| f.kind.as_str()).into(),
                        message: failure.map_or(String::new(), |f| f.message.clone()),
                    };
                    actions.push(requeued(job, status.task.index, why));
                    if !self.queue.contains(&job.def.id) {
                        self.queue.push_back(job.def.id.clone());
                    }
                }
            }
            Err(failure) => {
                set_state(&mut job.counts, task, TaskState::Failed);
                let reason = format!(
                    "task {} failed after {} attempt(s): {}: {}",
                    status.task.index, task.attempts, failure.kind, failure.message
                );
                task.failure = Some(failure);
                actions.push(Action::TaskEnded(status.task.clone()));
                actions.extend(Self::end_job(job, JobState::Failed, Some(reason), now));
                self.clear_running(&status.task.job, actions);
            }
        }
        let job = self
            .jobs
            .get_mut(&status.task.job)
            .expect("job checked above");
        if !job.state.is_final() && job.all_final() {
            actions.extend(Self::end_job(job, JobState::Succeeded, None, now));
        }
    }

    /// The longest moving-average run time among jobs with work to launch, or `None` if
    /// one of them has had no attempt end yet (it may be slow: queue as little as ever).
    fn slowest_queued_run_time(&self) -> Option<f64> {
        let mut slowest = 0.0f64;
        for job in self.queue.iter().filter_map(|id| self.jobs.get(id)) {
            slowest = slowest.max(job.run_time_us?);
        }
        Some(slowest)
    }

    /// Tasks to keep queued on an executor of `cores` cores beyond its free ones:
    /// `launch_ahead` while the queued jobs' run times are unknown, then as many as
    /// `queue_budget` of run time per core, between `launch_ahead` and
    /// `launch_ahead_max`. Short tasks are bound by the round trip to the driver, not the
    /// guest, and only a deep queue hides it.
    fn queue_depth(&self, cores: u32, slowest_us: Option<f64>) -> u32 {
        let c = &self.config;
        let (Some(slowest), false) = (slowest_us, c.launch_ahead == 0) else {
            return c.launch_ahead;
        };
        let fits = c.queue_budget.as_micros() as f64 * f64::from(cores) / slowest.max(1.0);
        (fits as u32).clamp(c.launch_ahead, c.launch_ahead_max.max(c.launch_ahead))
    }

    /// How long an attempt may have been out (queued, then running) on an executor before
    /// nothing more is queued behind it there: twice the queue budget, plus four times
    /// the run time of the slowest queued job when that is known. An attempt queued
    /// behind others waits about one queue budget; a run of several times the average is
    /// a straggler, and what queues behind it waits for it.
    fn straggler_age(&self, slowest_us: Option<f64>) -> Duration {
        let budget = self.config.queue_budget * 2;
        match slowest_us {
            Some(us) => budget + Duration::from_secs_f64(us.max(0.0) * 4.0 / 1e6),
            None => budget,
        }
    }

    /// Every live executor offers its free cores; pending tasks are placed by the policy.
    pub fn make_offers(&mut self) -> Vec<Action> {
        self.make_offers_at(SystemTime::now())
    }

    /// [`Self::make_offers`], with `wall` as the end time of any job it fails.
    fn make_offers_at(&mut self, wall: SystemTime) -> Vec<Action> {
        let now = self.now;
        let mut actions = Vec::new();
        self.fail_excluded_jobs(wall, &mut actions);
        let ids: Vec<ExecutorId> = self
            .executors
            .iter()
            .filter(|(_, e)| e.state == ExecutorState::Alive)
            .map(|(id, _)| id.clone())
            .collect();
        self.queue
            .retain(|id| self.jobs.get(id).is_some_and(Job::has_work));
        if ids.is_empty() || self.queue.is_empty() {
            return actions;
        }
        let slowest = self.slowest_queued_run_time();
        let straggler = self.straggler_age(slowest);
        let offers: Vec<Offer> = ids
            .iter()
            .map(|id| {
                let e = &self.executors[id];
                // Queued tasks and a multi-core task would run side by side; tasks queued
                // behind a straggler would wait for it (and hold back the quantile that
                // speculation waits for).
                let no_queue = e
                    .running
                    .values()
                    .any(|r| r.cores > 1 || now.saturating_duration_since(r.since) > straggler);
                Offer {
                    free_cores: e.free_cores,
                    meters_fuel: e.meters_fuel,
                    usable: !e.health.is_excluded(now),
                    ahead: if no_queue {
                        0
                    } else {
                        self.queue_depth(e.cores, slowest)
                            .saturating_sub(e.queued_ahead)
                    },
                }
            })
            .collect();
        if offers
            .iter()
            .all(|o| (o.free_cores == 0 && o.ahead == 0) || !o.usable)
        {
            return actions;
        }
        let position = |id: &ExecutorId| ids.iter().position(|e| e == id);
        let demands: Vec<Demand> = self
            .queue
            .iter()
            .map(|job_id| {
                let job = &self.jobs[job_id];
                let constrained = job
                    .constrained
                    .iter()
                    .map(|&i| {
                        let task = &job.tasks[i as usize];
                        ids.iter()
                            .enumerate()
                            .filter(|(_, e)| {
                                excluded_for_task(&self.config.exclusion, &task.failed_on, e)
                            })
                            .map(|(k, _)| k)
                            .collect()
                    })
                    .chain(job.speculative.iter().map(|&i| {
                        let task = TaskId {
                            job: job_id.clone(),
                            index: i,
                        };
                        ids.iter()
                            .filter(|e| self.executors[*e].running.contains_key(&task))
                            .filter_map(position)
                            .collect()
                    }))
                    .collect();
                let warm: Vec<bool> = ids
                    .iter()
                    .zip(&offers)
                    .map(|(id, o)| {
                        o.usable
                            && self.executors[id]
                                .modules
                                .contains(&job.def.module.locality_key())
                    })
                    .collect();
                let waited = job.locality_wait_since.is_some_and(|since| {
                    now.saturating_duration_since(since) >= self.config.locality_wait
                });
                Demand {
                    cores: job.def.resources.cores,
                    count: job.pending.len(),
                    constrained,
                    needs_fuel: job.def.resources.fuel.is_some(),
                    cold_allowed: self.config.locality_wait.is_zero()
                        || waited
                        || !warm.contains(&true),
                    warm,
                }
            })
            .collect();
        let plan = policy::place(&offers, &demands);
        for (d, waiting) in plan.waiting_for_locality.iter().enumerate() {
            let job = self
                .jobs
                .get_mut(&self.queue[d])
                .expect("queued jobs exist");
            if !*waiting {
                job.locality_wait_since = None;
            } else if job.locality_wait_since.is_none() {
                job.locality_wait_since = Some(now);
            }
        }
        // Constrained tasks are taken out by position, so they go last-first.
        let mut taken: Vec<(usize, usize)> = Vec::new();
        for placement in plan.placements {
            let job_id = self.queue[placement.demand].clone();
            let executor_id = &ids[placement.offer];
            let job = self.jobs.get_mut(&job_id).expect("queued jobs exist");
            let index = match placement.constrained {
                None => job.pending.pop_front().expect("policy respects counts"),
                Some(c) if c < job.constrained.len() => {
                    taken.push((placement.demand, c));
                    job.constrained[c]
                }
                Some(c) => {
                    taken.push((placement.demand, c));
                    let index = job.speculative[c - job.constrained.len()];
                    if job.tasks[index as usize].state != TaskState::Running {
                        continue;
                    }
                    index
                }
            };
            let executor = self
                .executors
                .get_mut(executor_id)
                .expect("offers come from executors");
            if executor.free_cores >= job.def.resources.cores {
                executor.free_cores -= job.def.resources.cores;
            } else {
                executor.queued_ahead += 1;
            }
            executor.remember_module(job.def.module.locality_key());
            if job.state == JobState::Queued {
                job.state = JobState::Running;
            }
            let task = &mut job.tasks[index as usize];
            set_state(&mut job.counts, task, TaskState::Running);
            task.attempts += 1;
            task.executor = Some(executor_id.clone());
            executor.running.insert(
                TaskId {
                    job: job_id.clone(),
                    index,
                },
                RunningAttempt {
                    attempt: task.attempts,
                    since: now,
                    cores: job.def.resources.cores,
                },
            );
            if executor.defined.insert(job.key) {
                actions.push(Action::Define {
                    executor: executor_id.clone(),
                    template: Box::new(template(job)),
                });
            }
            actions.push(Action::Launch {
                executor: executor_id.clone(),
                job: job_id.clone(),
                launch: Box::new(launch(job, index, executor.generation)),
            });
        }
        taken.sort_unstable_by(|a, b| b.cmp(a));
        for (d, c) in taken {
            let job = self
                .jobs
                .get_mut(&self.queue[d])
                .expect("queued jobs exist");
            if c < job.constrained.len() {
                job.constrained.remove(c);
            } else {
                job.speculative.remove(c - job.constrained.len());
            }
        }
        actions
    }

    /// Fails every job with a task that no live executor may run: each is excluded for
    /// the task (it failed there twice) or for a period. Without this such a job would
    /// wait forever. With no live executor at all, jobs wait for one to register.
    fn fail_excluded_jobs(&mut self, now: SystemTime, actions: &mut Vec<Action>) {
        let clock = self.now;
        let exclusion = self.config.exclusion;
        let live: Vec<(&ExecutorId, &ExecutorData)> = self
            .executors
            .iter()
            .filter(|(_, e)| e.state == ExecutorState::Alive)
            .collect();
        if live.is_empty() {
            return;
        }
        let mut doomed = Vec::new();
        for job_id in &self.queue {
            let Some(job) = self.jobs.get(job_id).filter(|j| !j.state.is_final()) else {
                continue;
            };
            let candidates = job
                .constrained
                .iter()
                .copied()
                .chain(job.pending.front().copied());
            for index in candidates {
                let task = &job.tasks[index as usize];
                let why: Option<Vec<String>> = live
                    .iter()
                    .map(|(id, e)| {
                        if excluded_for_task(&exclusion, &task.failed_on, id) {
                            Some(format!(
                                "{id} (failed this task {} times)",
                                exclusion.task_failures_per_executor
                            ))
                        } else if e.health.is_excluded(clock) {
                            Some(format!(
                                "{id} (excluded for {:?} after {} task failures within {:?})",
                                exclusion.period, exclusion.executor_failures, exclusion.window
                            ))
                        } else {
                            None
                        }
                    })
                    .collect();
                if let Some(why) = why {
                    let last = task
                        .failure
                        .as_ref()
                        .map(|f| format!("; last failure: {}: {}", f.kind, f.message))
                        .unwrap_or_default();
                    doomed.push((
                        job_id.clone(),
                        format!(
                            "task {index} cannot run: every live executor is excluded for it: {}{last}",
                            why.join(", ")
                        ),
                    ));
                    break;
                }
            }
        }
        for (job_id, reason) in doomed {
            let job = self.jobs.get_mut(&job_id).expect("doomed jobs exist");
            actions.extend(Self::end_job(job, JobState::Failed, Some(reason), now));
            self.clear_running(&job_id, actions);
        }
    }

    /// Finds running tasks slow enough to copy (see [`SpeculationConfig`]) and launches
    /// copies where cores are free. Nothing when speculation is off.
    pub fn speculate(&mut self) -> Vec<Action> {
        let Some(config) = self.config.speculation else {
            return Vec::new();
        };
        let now = self.now;
        // Attempts that have run long enough to be worth a look, by job.
        let mut slow: HashMap<JobId, Vec<(u32, Duration)>> = HashMap::new();
        let mut copies: HashMap<&TaskId, usize> = HashMap::new();
        for e in self.executors.values() {
            for (task, running) in &e.running {
                *copies.entry(task).or_default() += 1;
                let ran = now.saturating_duration_since(running.since);
                if ran > config.min_runtime {
                    slow.entry(task.job.clone())
                        .or_default()
                        .push((task.index, ran));
                }
            }
        }
        let copies: HashMap<TaskId, usize> =
            copies.into_iter().map(|(t, n)| (t.clone(), n)).collect();
        let mut any = false;
        for (job_id, attempts) in slow {
            let Some(job) = self.jobs.get_mut(&job_id).filter(|j| !j.state.is_final()) else {
                continue;
            };
            let mut durations: Vec<Duration> = job
                .tasks
                .iter()
                .filter(|t| t.state == TaskState::Succeeded)
                .filter_map(|t| Some(t.finished_at_us?.saturating_sub(t.started_at_us?)))
                .map(Duration::from_micros)
                .collect();
            let Some(threshold) = config.threshold(job.tasks.len(), &mut durations) else {
                continue;
            };
            for (index, ran) in attempts {
                let task_id = TaskId {
                    job: job_id.clone(),
                    index,
                };
                if ran > threshold
                    && copies.get(&task_id) == Some(&1)
                    && job.tasks[index as usize].state == TaskState::Running
                    && !job.speculative.contains(&index)
                {
                    tracing::info!(task = %task_id, ?ran, ?threshold, "speculating a slow task");
                    job.speculative.push(index);
                    any = true;
                }
            }
            if any && !self.queue.contains(&job_id) {
                self.queue.push_back(job_id);
            }
        }
        if any { self.make_offers() } else { Vec::new() }
    }

    fn live_executor(&mut self, id: &ExecutorId, generation: u64) -> Option<&mut ExecutorData> {
        self.executors
            .get_mut(id)
            .filter(|e| e.generation == generation && e.state == ExecutorState::Alive)
    }
    /// Marks a job final; its pending tasks are killed without running.
    pub(crate) fn end_job(
        job: &mut Job,
        state: JobState,
        reason: Option<String>,
        now: SystemTime,
    ) -> Option<Action> {
        job.state = state;
        job.finished_at = Some(now);
        job.error = reason.map(|r| {
            let kind = match state {
                JobState::Killed => "killed",
                _ => "task_failed",
            };
            (kind.to_owned(), r)
        });
        job.kill_pending();
        Some(Action::JobFinished(job.def.id.clone()))
    }

    /// Stops a job at a user's request: pending tasks end without running, running ones
    /// are killed. `None` when there is no such job; a job already over is left as it is.
    pub fn kill_job(&mut self, job_id: &JobId, now: SystemTime) -> Option<Vec<Action>> {
        let job = self.jobs.get_mut(job_id)?;
        if job.state.is_final() {
            return Some(Vec::new());
        }
        let mut actions: Vec<Action> =
            Self::end_job(job, JobState::Killed, Some("killed by request".into()), now)
                .into_iter()
                .collect();
        self.clear_running(job_id, &mut actions);
        Some(actions)
    }

    /// Kills a final job's running attempts. Each keeps its cores until its executor
    /// reports the attempt over (an epoch tick away), so a core is never offered twice;
    /// whatever that report says, the task stays killed.
    fn clear_running(&mut self, job_id: &JobId, actions: &mut Vec<Action>) {
        let Some(job) = self.jobs.get_mut(job_id) else {
            return;
        };
        let why = match job.state {
            JobState::Killed => "killed: the job was killed",
            _ => "killed: another task of the job failed",
        };
        for (executor_id, executor) in self.executors.iter_mut() {
            for (task_id, running) in executor.running.iter().filter(|(t, _)| &t.job == job_id) {
                let task = &mut job.tasks[task_id.index as usize];
                if task.state == TaskState::Succeeded {
                    // A speculative copy's loser: its kill was sent when the task succeeded.
                    continue;
                }
                if !task.state.is_final() {
                    set_state(&mut job.counts, task, TaskState::Killed);
                    task.failure = Some(TaskFailure::new(FailureKind::Killed, why));
                }
                actions.push(Action::Kill {
                    executor: executor_id.clone(),
                    task: task_id.clone(),
                    attempt: running.attempt,
                    reason: "job ended",
                });
            }
        }
    }
}

/// The event of a task put back to pending, with why.
fn requeued(job: &Job, index: u32, why: ErrorBody) -> Action {
    Action::TaskRequeued {
        job: job.def.id.clone(),
        event: TaskEvent {
            index,
            state: TaskState::Pending,
            attempt: job.tasks[index as usize].attempts,
            executor: None,
            error: Some(why),
        },
    }
}

/// What the job's tasks share, for the executors that run them.
fn template(job: &Job) -> JobTemplate {
    JobTemplate {
        key: job.key,
        job: job.def.id.clone(),
        task_count: job.tasks.len() as u32,
        name: job.def.name.clone(),
        module: job.def.module.clone(),
        files: job.def.files.clone(),
        args: job.def.args.clone(),
        env: job.def.env.clone(),
        resources: job.def.resources,
    }
}

fn launch(job: &Job, index: u32, generation: u64) -> TaskLaunch {
    let task = &job.tasks[index as usize];
    TaskLaunch {
        job: job.key,
        index,
        attempt: task.attempts,
        generation,
        args: task.args.clone(),
        env: task.env.clone(),
        input: task.input.clone(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use flint_protocol::{ModuleRef, Resources, TaskEnd};

    use super::*;
    use crate::speculation::SpeculationConfig;

    fn exec(n: u32) -> ExecutorId {
        ExecutorId(format!("exec-{n}"))
    }

    pub(crate) fn job(id: &str, tasks: usize, cores: u32) -> NewJob {
        NewJob {
            def: JobDef {
                id: JobId(id.into()),
                name: id.into(),
                module: ModuleRef {
                    digest: Some(Digest::of(b"m")),
                    url: "http://driver/v1/modules/m".into(),
                    timestamp_ms: 1,
                    size: Some(1),
                },
                files: vec![],
                args: vec![],
                env: vec![],
                resources: Resources {
                    cores,
                    ..Resources::default()
                },
                max_failures: 3,
                max_result_bytes: u64::MAX,
                created_at_ms: 0,
            },
            tasks: (0..tasks)
                .map(|_| NewTask {
                    input: TaskInput::Inline(vec![]),
                    args: vec![],
                    env: vec![],
                })
                .collect(),
        }
    }

    fn launches(actions: &[Action]) -> Vec<(ExecutorId, u32, u32)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Launch {
                    executor, launch, ..
                } => Some((executor.clone(), launch.index, launch.attempt)),
                _ => None,
            })
            .collect()
    }

    fn status(job: &str, index: u32, attempt: u32, outcome: Result<(), TaskFailure>) -> TaskStatus {
        TaskStatus {
            task: TaskId {
                job: JobId(job.into()),
                index,
            },
            attempt,
            generation: 0,
            end: TaskEnd {
                started_at_us: 1,
                finished_at_us: 2,
                outcome: outcome.map(|()| TaskResult::Inline(b"ok".to_vec())),
                log: vec![],
                log_truncated: false,
            },
        }
    }

    /// An executor's report, stamped with the generation its launch carried.
    fn report(
        state: &mut ClusterState,
        executor: &ExecutorId,
        generation: u64,
        mut status: TaskStatus,
        now: SystemTime,
    ) -> Vec<Action> {
        status.generation = generation;
        state.status_update(executor, generation, status, now)
    }

    fn cluster(executors: u32, cores: u32) -> (ClusterState, Vec<u64>) {
        // Launches only onto free cores unless a test asks for pipelining.
        let config = SchedulingConfig {
            launch_ahead: 0,
            launch_ahead_max: 0,
            ..SchedulingConfig::default()
        };
        let mut state = ClusterState::new(0, config, Instant::now());
        let generations = (1..=executors)
            .map(|n| {
                state
                    .register_executor(exec(n), "h".into(), cores, n, false)
                    .unwrap()
                    .0
            })
            .collect();
        (state, generations)
    }

    fn free(state: &ClusterState, n: u32) -> u32 {
        state.executors[&exec(n)].free_cores
    }

    #[test]
    fn a_duplicate_live_id_is_refused_and_a_lost_one_comes_back_newer() {
        let (mut state, gens) = cluster(1, 2);
        let err = state
            .register_executor(exec(1), "h".into(), 2, 9, false)
            .unwrap_err();
        assert!(err.contains("already registered"), "{err}");
        state.executor_lost(&exec(1), gens[0]);
        let (again, _) = state
            .register_executor(exec(1), "h".into(), 2, 9, false)
            .unwrap();
        assert!(again > gens[0]);
        // The same process (host and pid) coming back supersedes its live registration.
        let (third, _) = state
            .register_executor(exec(1), "h".into(), 2, 9, false)
            .unwrap();
        assert!(third > again);
    }

    #[test]
    fn tasks_take_cores_until_their_final_status() {
        let (mut state, gens) = cluster(2, 2);
        let placed = launches(&state.submit_job(job("j", 3, 2)));
        assert_eq!(placed.len(), 2, "one 2-core task per 2-core executor");
        assert_eq!((free(&state, 1), free(&state, 2)), (0, 0));
        let (first, index, attempt) = placed[0].clone();
        let n = if first == exec(1) { 1 } else { 2 };
        let next = launches(&report(
            &mut state,
            &first,
            gens[n as usize - 1],
            status("j", index, attempt, Ok(())),
            SystemTime::UNIX_EPOCH,
        ));
        assert_eq!(
            next,
            vec![(first.clone(), 2, 1)],
            "the freed executor takes the last task"
        );
        assert_eq!(free(&state, n), 0);
    }

    #[test]
    fn stale_reports_change_nothing() {
        let (mut state, gens) = cluster(1, 1);
        state.submit_job(job("j", 1, 1));
        let wrong_attempt = report(
            &mut state,
            &exec(1),
            gens[0],
            status("j", 0, 7, Ok(())),
            SystemTime::UNIX_EPOCH,
        );
        let wrong_generation = report(
            &mut state,
            &exec(1),
            gens[0] + 1,
            status("j", 0, 1, Ok(())),
            SystemTime::UNIX_EPOCH,
        );
        // A status of an earlier registration arriving on the current connection.
        let mut earlier = status("j", 0, 1, Ok(()));
        earlier.generation = gens[0] - 1;
        let earlier = state.status_update(&exec(1), gens[0], earlier, SystemTime::UNIX_EPOCH);
        assert!(wrong_attempt.is_empty() && wrong_generation.is_empty() && earlier.is_empty());
        assert_eq!(
            state.jobs[&JobId("j".into())].tasks[0].state,
            TaskState::Running
        );
        assert_eq!(free(&state, 1), 0);
    }

    #[test]
    fn a_lost_executors_tasks_run_again_elsewhere_without_counting_as_failures() {
        let (mut state, gens) = cluster(2, 1);
        let placed = launches(&state.submit_job(job("j", 2, 1)));
        assert_eq!(placed.len(), 2);
        let relaunched = launches(&state.executor_lost(&exec(1), gens[0]));
        assert!(relaunched.is_empty(), "exec-2 is still busy");
        let lost_index = placed.iter().find(|p| p.0 == exec(1)).unwrap().1;
        let other = placed.iter().find(|p| p.0 == exec(2)).unwrap().1;
        let relaunched = launches(&report(
            &mut state,
            &exec(2),
            gens[1],
            status("j", other, 1, Ok(())),
            SystemTime::UNIX_EPOCH,
        ));
        assert_eq!(relaunched, vec![(exec(2), lost_index, 2)]);
        let task = &state.jobs[&JobId("j".into())].tasks[lost_index as usize];
        assert_eq!(task.host_failures, 0);
    }

    #[test]
    fn a_guest_failure_fails_the_job_and_kills_the_rest_holding_their_cores() {
        let (mut state, gens) = cluster(2, 1);
        let placed = launches(&state.submit_job(job("j", 3, 1)));
        let (failing, index, _) = placed[0].clone();
        let failure = TaskFailure {
            kind: FailureKind::Exit,
            message: "exited with code 3".into(),
            exit_code: Some(3),
        };
        let g = |e: &ExecutorId| if *e == exec(1) { gens[0] } else { gens[1] };
        let actions = report(
            &mut state,
            &failing,
            g(&failing),
            status("j", index, 1, Err(failure)),
            SystemTime::UNIX_EPOCH,
        );
        let job = &state.jobs[&JobId("j".into())];
        assert_eq!(job.state, JobState::Failed);
        assert!(job.error.as_ref().unwrap().1.contains("task 0 failed"));
        assert_eq!(job.counts().killed, 2, "one running, one never started");
        let (other, other_index, _) = placed[1].clone();
        assert!(actions.contains(&Action::Kill {
            executor: other.clone(),
            task: TaskId {
                job: JobId("j".into()),
                index: other_index
            },
            attempt: 1,
            reason: "job ended",
        }));
        let n = if other == exec(1) { 1 } else { 2 };
        assert_eq!(
            free(&state, n),
            0,
            "held until the executor confirms the kill"
        );
        // Even a success arriving now leaves the task killed; the core comes back.
        report(
            &mut state,
            &other,
            g(&other),
            status("j", other_index, 1, Ok(())),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(free(&state, n), 1);
        let task = &state.jobs[&JobId("j".into())].tasks[other_index as usize];
        assert_eq!(task.state, TaskState::Killed);
    }

    fn fetch_error() -> Result<(), TaskFailure> {
        Err(TaskFailure::new(
            FailureKind::FetchError,
            "connection refused",
        ))
    }

    fn generation_of(state: &ClusterState, e: &ExecutorId) -> u64 {
        state.executors[e].generation
    }

    /// Reports the attempt `placed` with `outcome`, returning the launches that follow.
    fn finish(
        state: &mut ClusterState,
        placed: &(ExecutorId, u32, u32),
        job: &str,
        outcome: Result<(), TaskFailure>,
    ) -> Vec<(ExecutorId, u32, u32)> {
        let generation = generation_of(state, &placed.0);
        launches(&report(
            state,
            &placed.0,
            generation,
            status(job, placed.1, placed.2, outcome),
            SystemTime::UNIX_EPOCH,
        ))
    }

    #[test]
    fn host_failures_are_retried_up_to_max_failures() {
        // Three executors, so that no executor fails the task twice and exclusion does
        // not end the job before max_failures (3) does.
        let (mut state, _) = cluster(3, 1);
        let mut placed = launches(&state.submit_job(job("j", 1, 1)));
        for attempt in 1..=3 {
            assert_eq!(placed.len(), 1, "attempt {attempt}");
            assert_eq!(placed[0].2, attempt);
            placed = finish(&mut state, &placed[0].clone(), "j", fetch_error());
        }
        assert!(placed.is_empty());
        let job = &state.jobs[&JobId("j".into())];
        assert_eq!(job.state, JobState::Failed);
        let error = &job.error.as_ref().unwrap().1;
        assert!(error.contains("after 3 attempt(s): fetch_error"), "{error}");
    }

    #[test]
    fn a_task_that_failed_twice_on_an_executor_never_runs_there_again() {
        let (mut state, _) = cluster(2, 1);
        let mut def = job("j", 2, 1);
        def.def.max_failures = 10;
        let placed = launches(&state.submit_job(def));
        let on_1 = placed.iter().find(|p| p.0 == exec(1)).unwrap().clone();
        let on_2 = placed.iter().find(|p| p.0 == exec(2)).unwrap().clone();
        let again = finish(&mut state, &on_1, "j", fetch_error());
        assert_eq!(
            again,
            vec![(exec(1), on_1.1, 2)],
            "once is not enough to exclude"
        );
        let again = finish(&mut state, &again[0], "j", fetch_error());
        assert!(again.is_empty(), "excluded from exec-1, and exec-2 is busy");
        assert_eq!(
            free(&state, 1),
            1,
            "exec-1 idles rather than run it a third time"
        );
        assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Running);
        let again = finish(&mut state, &on_2, "j", Ok(()));
        assert_eq!(again, vec![(exec(2), on_1.1, 3)]);
    }

    #[test]
    fn a_job_whose_task_every_executor_is_excluded_for_fails_saying_so() {
        let (mut state, _) = cluster(1, 1);
        let placed = launches(&state.submit_job(job("j", 1, 1)));
        let again = finish(&mut state, &placed[0], "j", fetch_error());
        let again = finish(&mut state, &again[0], "j", fetch_error());
        assert!(again.is_empty());
        let job = &state.jobs[&JobId("j".into())];
        assert_eq!(job.state, JobState::Failed);
        let error = &job.error.as_ref().unwrap().1;
        assert_eq!(
            error,
            "task 0 cannot run: every live executor is excluded for it: exec-1 (failed this \
             task 2 times); last failure: fetch_error: connection refused"
        );
    }

    #[test]
    fn an_executor_failing_many_tasks_is_excluded_for_a_period() {
        let (mut state, _) = cluster(2, 1);
        let t0 = state.now();
        let mut def = job("j", 12, 1);
        def.def.max_failures = 10;
        let mut running = launches(&state.submit_job(def));
        // Every attempt on exec-1 fails, every one on exec-2 is held (not reported).
        // A task fails there twice before it moves on: 4 distinct tasks, 8 failures.
        let mut failed_on_1 = 0;
        while !state.executors[&exec(1)].health.is_excluded(t0) {
            let at = running.iter().position(|p| p.0 == exec(1)).unwrap();
            let attempt = running.remove(at);
            running.extend(finish(&mut state, &attempt, "j", fetch_error()));
            failed_on_1 += 1;
            assert!(
                failed_on_1 <= 8,
                "not excluded after {failed_on_1} failures"
            );
        }
        let failed: Vec<_> = state.jobs[&JobId("j".into())]
            .tasks
            .iter()
            .filter(|t| !t.failed_on.is_empty())
            .collect();
        assert_eq!(failed.len(), 4, "four distinct tasks");
        assert!(running.iter().all(|p| p.0 != exec(1)), "{running:?}");
        assert_eq!(free(&state, 1), 1, "free but excluded");
        assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Running);
        // exec-2 keeps the job going, and exec-1 is back once the period is over.
        let on_2 = running.pop().unwrap();
        let next = finish(&mut state, &on_2, "j", Ok(()));
        assert!(next.iter().all(|p| p.0 == exec(2)), "{next:?}");
        state.set_clock(t0 + Duration::from_secs(61));
        let next = launches(&state.make_offers());
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].0, exec(1));
    }

    #[test]
    fn tasks_wait_briefly_for_an_executor_that_already_ran_their_module() {
        let (mut state, _) = cluster(2, 1);
        let t0 = state.now();
        let first = launches(&state.submit_job(job("a", 1, 1)));
        assert_eq!(
            first,
            vec![(exec(1), 0, 1)],
            "nothing is warm yet: anywhere"
        );
        let waiting = launches(&state.submit_job(job("b", 2, 1)));
        assert!(
            waiting.is_empty(),
            "exec-2 is free but cold; exec-1 is warm but busy"
        );
        state.set_clock(t0 + Duration::from_millis(50));
        assert!(launches(&state.make_offers()).is_empty());
        let next = finish(&mut state, &first[0], "a", Ok(()));
        assert_eq!(next, vec![(exec(1), 0, 1)], "the warm executor takes one");
        state.set_clock(t0 + state.config.locality_wait);
        let late = launches(&state.make_offers());
        assert_eq!(
            late,
            vec![(exec(2), 1, 1)],
            "the wait is over: the cold one too"
        );
        assert!(
            state.executors[&exec(2)]
                .modules
                .contains(&Digest::of(b"m"))
        );
    }

    #[test]
    fn with_no_locality_wait_tasks_go_anywhere_at_once() {
        let (mut state, _) = cluster(2, 1);
        state.config.locality_wait = Duration::ZERO;
        launches(&state.submit_job(job("a", 1, 1)));
        let placed = launches(&state.submit_job(job("b", 1, 1)));
        assert_eq!(placed, vec![(exec(2), 0, 1)]);
    }

    #[test]
    fn a_slow_task_gets_a_copy_and_the_first_success_wins() {
        let (mut state, _) = cluster(2, 1);
        state.config.speculation = Some(SpeculationConfig::default());
        let t0 = state.now();
        let placed = launches(&state.submit_job(job("j", 4, 1)));
        let slow = placed.iter().find(|p| p.0 == exec(1)).unwrap().clone();
        let mut fast = placed.iter().find(|p| p.0 == exec(2)).unwrap().clone();
        for _ in 0..3 {
            let next = finish(&mut state, &fast, "j", Ok(()));
            if let Some(n) = next.first() {
                fast = n.clone();
            }
        }
        assert_eq!(state.jobs[&JobId("j".into())].counts().succeeded, 3);
        assert!(state.speculate().is_empty(), "not slow yet");
        state.set_clock(t0 + Duration::from_millis(200));
        let copy = launches(&state.speculate());
        assert_eq!(copy, vec![(exec(2), slow.1, 2)], "a copy, never on exec-1");
        assert!(state.speculate().is_empty(), "one copy only");
        let generation = generation_of(&state, &exec(2));
        let actions = report(
            &mut state,
            &exec(2),
            generation,
            status("j", slow.1, 2, Ok(())),
            SystemTime::UNIX_EPOCH,
        );
        assert!(actions.contains(&Action::Kill {
            executor: exec(1),
            task: TaskId {
                job: JobId("j".into()),
                index: slow.1
            },
            attempt: 1,
            reason: "another attempt of this task succeeded",
        }));
        let job = &state.jobs[&JobId("j".into())];
        assert_eq!(job.state, JobState::Succeeded);
        assert_eq!(job.tasks[slow.1 as usize].executor, Some(exec(2)));
        assert_eq!(free(&state, 1), 0, "held until the kill is confirmed");
        // The loser's late report changes nothing but its core.
        let killed = TaskFailure::new(FailureKind::Killed, "killed");
        assert!(finish(&mut state, &slow, "j", Err(killed)).is_empty());
        assert_eq!(free(&state, 1), 1);
        let job = &state.jobs[&JobId("j".into())];
        assert_eq!(job.tasks[slow.1 as usize].state, TaskState::Succeeded);
        assert_eq!(job.counts().succeeded, 4);
    }

    #[test]
    fn losing_the_original_while_its_copy_runs_does_not_launch_a_third() {
        let (mut state, _) = cluster(3, 1);
        state.config.speculation = Some(SpeculationConfig::default());
        let t0 = state.now();
        let placed = launches(&state.submit_job(job("j", 4, 1)));
        // Tasks 1 and 2 succeed on exec-2 and exec-3; task 3 then succeeds too.
        let mut done = 0;
        let mut queue: Vec<_> = placed.iter().filter(|p| p.0 != exec(1)).cloned().collect();
        while let Some(p) = queue.pop() {
            queue.extend(finish(&mut state, &p, "j", Ok(())));
            done += 1;
        }
        assert_eq!(done, 3);
        state.set_clock(t0 + Duration::from_millis(200));
        let copy = launches(&state.speculate());
        assert_eq!(copy.len(), 1);
        let generation = generation_of(&state, &exec(1));
        let relaunched = launches(&state.executor_lost(&exec(1), generation));
        assert!(relaunched.is_empty(), "the copy still runs: {relaunched:?}");
        assert_eq!(state.jobs[&JobId("j".into())].counts().running, 1);
        finish(&mut state, &copy[0], "j", Ok(()));
        assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Succeeded);
    }

    #[test]
    fn a_silent_executor_is_lost_after_the_heartbeat_timeout() {
        let (mut state, gens) = cluster(2, 1);
        let placed = launches(&state.submit_job(job("j", 2, 1)));
        assert_eq!(placed.len(), 2);
        let t0 = state.executors[&exec(1)].last_heartbeat;
        let timeout = Duration::from_secs(8);
        state.set_clock(t0 + Duration::from_secs(7));
        state.heartbeat(&exec(2), gens[1], None);
        let (expired, _) = state.expire_executors(timeout);
        assert!(expired.is_empty(), "nobody is late yet");
        state.set_clock(t0 + Duration::from_secs(9));
        let (expired, actions) = state.expire_executors(timeout);
        assert_eq!(expired, vec![(exec(1), gens[0])]);
        assert_eq!(state.executors[&exec(1)].state, ExecutorState::Lost);
        assert!(
            launches(&actions).is_empty(),
            "exec-2 is busy; the task waits, pending"
        );
        assert_eq!(state.jobs[&JobId("j".into())].counts().pending, 1);
        // Its late result, should it come, is from a lost generation and changes nothing.
        let index = placed.iter().find(|p| p.0 == exec(1)).unwrap().1;
        let late = report(
            &mut state,
            &exec(1),
            gens[0],
            status("j", index, 1, Ok(())),
            SystemTime::UNIX_EPOCH,
        );
        assert!(late.is_empty());
        assert_eq!(state.jobs[&JobId("j".into())].counts().succeeded, 0);
    }

    #[test]
    fn killing_a_job_stops_its_pending_and_running_tasks() {
        let (mut state, gens) = cluster(1, 1);
        state.submit_job(job("j", 2, 1));
        let actions = state
            .kill_job(&JobId("j".into()), SystemTime::UNIX_EPOCH)
            .unwrap();
        assert!(actions.iter().any(|a| matches!(a, Action::Kill { .. })));
        let job = &state.jobs[&JobId("j".into())];
        assert_eq!(job.state, JobState::Killed);
        assert_eq!(job.counts().killed, 2);
        assert_eq!(free(&state, 1), 0);
        let killed = TaskFailure::new(FailureKind::Killed, "killed");
        report(
            &mut state,
            &exec(1),
            gens[0],
            status("j", 0, 1, Err(killed)),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(free(&state, 1), 1);
        // The killed attempt's report still says when the guest stopped.
        let task = &state.jobs[&JobId("j".into())].tasks[0];
        assert_eq!(
            (task.state, task.finished_at_us),
            (TaskState::Killed, Some(2))
        );
        assert!(
            state
                .kill_job(&JobId("nope".into()), SystemTime::UNIX_EPOCH)
                .is_none()
        );
    }

    /// (executor, job key) of each Define and Launch, in order.
    fn definitions_and_launches(actions: &[Action]) -> Vec<(&'static str, ExecutorId, u64)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Define { executor, template } => {
                    Some(("define", executor.clone(), template.key))
                }
                Action::Launch {
                    executor, launch, ..
                } => Some(("launch", executor.clone(), launch.job)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_job_is_defined_once_per_registration_before_its_first_launch_and_forgotten_at_its_end() {
        let (mut state, gens) = cluster(1, 1);
        let first = state.submit_job(job("j", 3, 1));
        let key = state.jobs[&JobId("j".into())].key;
        assert_eq!(
            definitions_and_launches(&first),
            [("define", exec(1), key), ("launch", exec(1), key)]
        );
        let template = first
            .iter()
            .find_map(|a| match a {
                Action::Define { template, .. } => Some(template),
                _ => None,
            })
            .unwrap();
        assert_eq!((template.job.0.as_str(), template.task_count), ("j", 3));
        let next = report(
            &mut state,
            &exec(1),
            gens[0],
            status("j", 0, 1, Ok(())),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(
            definitions_and_launches(&next),
            [("launch", exec(1), key)],
            "defined already on this connection"
        );
        // A new registration is a new connection, which knows no jobs.
        state.executor_lost(&exec(1), gens[0]);
        let (generation, _) = state
            .register_executor(exec(1), "h".into(), 1, 1, false)
            .unwrap();
        let again = state.make_offers();
        assert_eq!(
            definitions_and_launches(&again),
            [("define", exec(1), key), ("launch", exec(1), key)]
        );
        let mut last = Vec::new();
        for index in [1, 2] {
            let attempt = state.jobs[&JobId("j".into())].tasks[index as usize].attempts;
            last = report(
                &mut state,
                &exec(1),
                generation,
                status("j", index, attempt, Ok(())),
                SystemTime::UNIX_EPOCH,
            );
        }
        assert!(last.iter().any(|a| matches!(a, Action::JobFinished(_))));
        assert_eq!(state.forget_job(&JobId("j".into())), [(exec(1), key)]);
        assert!(
            state.forget_job(&JobId("j".into())).is_empty(),
            "forgotten once"
        );
    }

    #[test]
    fn a_pending_task_stays_within_its_memory_budget() {
        // BENCHMARKS.md measures the driver at about 300 bytes per pending task against
        // a budget of 1 KB; a field added to every task shows up here first. (336: the
        // result is inline bytes or a block reference since the block store.)
        assert!(
            std::mem::size_of::<Task>() <= 336,
            "{}",
            std::mem::size_of::<Task>()
        );
    }

    #[test]
    fn one_core_tasks_are_launched_ahead_and_the_cores_come_back() {
        let (mut state, _) = cluster(1, 1);
        state.config.launch_ahead = 1;
        let mut placed = launches(&state.submit_job(job("j", 3, 1)));
        assert_eq!(
            placed.len(),
            1,
            "nothing queues where the module is not yet"
        );
        placed.extend(launches(&state.make_offers()));
        assert_eq!(placed.len(), 2, "one running, one queued behind it");
        let e = &state.executors[&exec(1)];
        assert_eq!((e.free_cores, e.queued_ahead), (0, 1));
        let next = finish(&mut state, &placed[0], "j", Ok(()));
        assert_eq!(next.len(), 1, "the queue is topped up");
        finish(&mut state, &placed[1], "j", Ok(()));
        finish(&mut state, &next[0], "j", Ok(()));
        let e = &state.executors[&exec(1)];
        assert_eq!((e.free_cores, e.queued_ahead), (1, 0));
        assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Succeeded);
    }

    #[test]
    fn short_tasks_queue_deeper_and_an_unknown_job_queues_as_little_as_ever() {
        let (mut state, _) = cluster(1, 1);
        state.config.launch_ahead = 2;
        state.config.launch_ahead_max = 8;
        state.config.queue_budget = Duration::from_micros(1_000);
        let ended = |state: &mut ClusterState, job: &str, placed: &(ExecutorId, u32, u32), us| {
            let generation = generation_of(state, &placed.0);
            let mut status = status(job, placed.1, placed.2, Ok(()));
            status.end.finished_at_us = status.end.started_at_us + us;
            launches(&report(
                state,
                &placed.0,
                generation,
                status,
                SystemTime::UNIX_EPOCH,
            ))
        };
        let mut placed = launches(&state.submit_job(job("short", 100, 1)));
        placed.extend(launches(&state.make_offers()));
        assert_eq!(
            placed.len(),
            3,
            "one running, launch_ahead (2) queued: nothing known yet"
        );
        // A 10 us task: 1 ms of them is 100, capped at launch_ahead_max (8) queued.
        let topped = ended(&mut state, "short", &placed[0], 10);
        assert_eq!(
            topped.len(),
            8 - 1,
            "queue grown to 8 behind the one running"
        );
        assert_eq!(state.executors[&exec(1)].queued_ahead, 8);

        // A second job whose run time is unknown keeps everything at launch_ahead; the
        // queue drains to it rather than growing.
        state.submit_job(job("new", 10, 1));
        let next = ended(&mut state, "short", &placed[1], 10);
        assert!(next.is_empty(), "8 queued, depth back to 2: {next:?}");

        // Slow tasks (1 ms): the budget fits one, launch_ahead (2) still holds.
        let (mut state, _) = cluster(1, 1);
        state.config.launch_ahead = 2;
        state.config.launch_ahead_max = 8;
        let mut placed = launches(&state.submit_job(job("slow", 100, 1)));
        placed.extend(launches(&state.make_offers()));
        let topped = ended(&mut state, "slow", &placed[0], 1_000);
        assert_eq!(topped.len(), 1, "one ended, one launched: still 2 queued");
        assert_eq!(state.executors[&exec(1)].queued_ahead, 2);
    }

    #[test]
    fn nothing_more_queues_behind_a_straggler() {
        let (mut state, gens) = cluster(1, 1);
        state.config.launch_ahead = 2;
        state.config.launch_ahead_max = 8;
        state.config.queue_budget = Duration::from_micros(1_000);
        let mut placed = launches(&state.submit_job(job("j", 20, 1)));
        placed.extend(launches(&state.make_offers()));
        assert_eq!(placed.len(), 3, "one running, two queued");
        // The first ends after 100 us: 1 ms of such tasks is 10, capped at 8 queued.
        let mut first = status("j", placed[0].1, placed[0].2, Ok(()));
        first.end.finished_at_us = first.end.started_at_us + 100;
        let topped = launches(&report(
            &mut state,
            &exec(1),
            gens[0],
            first,
            SystemTime::UNIX_EPOCH,
        ));
        assert_eq!(topped.len(), 8 - 1, "the queue grows to 8");
        // The attempt now running (placed[1]) goes on and on: past 2 ms + 4 x 100 us,
        // nothing more is queued behind it, though its queue has room again once a
        // queued attempt ends.
        state.set_clock(state.now() + Duration::from_millis(3));
        let (_, index, attempt) = placed[2].clone();
        let after = launches(&report(
            &mut state,
            &exec(1),
            gens[0],
            status("j", index, attempt, Ok(())),
            SystemTime::UNIX_EPOCH,
        ));
        assert!(after.is_empty(), "queued behind a straggler: {after:?}");
        assert_eq!(state.executors[&exec(1)].queued_ahead, 7);
    }

    #[test]
    fn nothing_queues_beside_a_multi_core_task() {
        let (mut state, _) = cluster(1, 2);
        state.config.launch_ahead = 2;
        assert_eq!(launches(&state.submit_job(job("big", 2, 2))).len(), 1);
        assert!(launches(&state.submit_job(job("small", 2, 1))).is_empty());
        let generation = generation_of(&state, &exec(1));
        let lost = state.executor_lost(&exec(1), generation);
        // Nothing to launch on: the big task only goes back to pending.
        assert!(launches(&lost).is_empty());
        assert_eq!(
            lost,
            vec![Action::TaskRequeued {
                job: JobId("big".into()),
                event: TaskEvent {
                    index: 0,
                    state: TaskState::Pending,
                    attempt: 1,
                    executor: None,
                    error: Some(ErrorBody {
                        kind: "executor_lost".into(),
                        message: "executor exec-1 was lost; the task runs again".into(),
                    }),
                },
            }]
        );
        assert_eq!(state.executors[&exec(1)].queued_ahead, 0);
    }
}
