//! The scheduler's state machine: executors, jobs and tasks, changed only through the
//! methods below, each of which returns the [`Action`]s the service layer must carry out.
//! No sockets, no clock reads: the service sets the clock ([`ClusterState::set_clock`])
//! before each change, so it is tested directly.
//!
//! A task runs as at most one attempt, or two when speculation copied it; the first
//! success wins and the other attempt is killed. Where an attempt runs is in its
//! executor's `running` map, which is the only record of running attempts.
//!
//! Here: the state's types, executors coming and going, jobs arriving and ending.
//! `status`: task ends. `offers`: placement onto free cores and queues, and speculation.

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

mod offers;
mod status;
#[cfg(test)]
pub(crate) mod tests;

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
    /// Which job's tasks go first when cores free up (Spark's `spark.scheduler.mode`).
    pub mode: SchedulingMode,
}

/// The order in which jobs with pending tasks are offered cores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedulingMode {
    /// The oldest job first: a job gets every free core until it has no pending task.
    #[default]
    Fifo,
    /// The job with the fewest running tasks first (the oldest among equals), decided
    /// anew each time cores free up, so jobs running side by side share the cluster
    /// (Spark's FAIR mode with equal weights).
    Fair,
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
            mode: SchedulingMode::Fifo,
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
    /// Its own failures (host errors) seen here and the exclusion they earned (kept
    /// across generations: a restarted process on a bad host is still on that host).
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
        self.stop_job(job_id, "killed by request".into(), now)
    }

    /// [`Self::kill_job`], for `reason`.
    pub fn stop_job(
        &mut self,
        job_id: &JobId,
        reason: String,
        now: SystemTime,
    ) -> Option<Vec<Action>> {
        let job = self.jobs.get_mut(job_id)?;
        if job.state.is_final() {
            return Some(Vec::new());
        }
        let mut actions: Vec<Action> = Self::end_job(job, JobState::Killed, Some(reason), now)
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
