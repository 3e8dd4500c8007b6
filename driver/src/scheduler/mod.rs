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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use flint_protocol::api::{ErrorBody, ExecutorState, JobState, TaskCounts, TaskEvent, TaskState};
use flint_protocol::{
    ExecutorId, FailureKind, JobId, JobTemplate, TaskFailure, TaskId, TaskLaunch, TaskStatus,
};

use flint_protocol::exit::ProcessExit;
use flint_protocol::messages::Heartbeat;

use exclusion::excluded_for_task;
use policy::{Demand, Offer};

pub mod exclusion;
pub mod latency;
mod model;
mod offers;
pub mod policy;
pub mod speculation;
mod status;
#[cfg(test)]
pub(crate) mod tests;

pub use model::*;

pub struct ClusterState {
    pub executors: BTreeMap<ExecutorId, ExecutorData>,
    /// The live jobs: accepted and not yet ended. A job that ends is taken out by the
    /// service ([`Self::remove_job`]) once its end is handed to the job store.
    pub jobs: FastMap<JobId, Job>,
    /// Jobs that may still have tasks to launch, oldest first.
    pub(crate) queue: VecDeque<JobId>,
    /// Final jobs with attempts still running (being killed): they leave the state once
    /// the last of those reports its end ([`Self::take_drained`]), so that its times and
    /// log are the task's.
    retiring: std::collections::HashSet<JobId>,
    /// Executors alive and being decommissioned (an upper bound: counted down as
    /// [`Self::stop_drained`] finds them gone).
    decommissioning: usize,
    next_generation: u64,
    next_job_key: u64,
    pub config: SchedulingConfig,
    /// The time of the change being made, set by the caller.
    now: Instant,
    /// The same moment by the wall clock: the end time of jobs a change fails.
    wall: SystemTime,
    /// Every attempt's launch-to-status time.
    pub launch_to_status: latency::LatencyHistogram,
}

impl ClusterState {
    /// A state whose registrations are numbered from `first_generation` on. The driver
    /// starts from the wall clock in microseconds, so that generations keep increasing
    /// across its restarts and a status from before a restart is never taken for one of
    /// a new registration.
    pub fn new(
        first_generation: u64,
        config: SchedulingConfig,
        now: Instant,
        wall: SystemTime,
    ) -> Self {
        ClusterState {
            executors: BTreeMap::new(),
            jobs: FastMap::default(),
            queue: VecDeque::new(),
            retiring: Default::default(),
            decommissioning: 0,
            next_generation: first_generation,
            next_job_key: 0,
            config,
            now,
            wall,
            launch_to_status: latency::LatencyHistogram::default(),
        }
    }

    /// Sets the time of the changes that follow, by the monotonic clock (which never
    /// goes back here) and the wall clock.
    pub fn set_clock(&mut self, now: Instant, wall: SystemTime) {
        self.now = self.now.max(now);
        self.wall = wall;
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

    /// Takes a final job out of the state once none of its attempts runs any more: now,
    /// or when the last one reports its end (see [`Self::take_drained`]).
    pub fn retire_job(&mut self, job: &JobId) -> Option<Job> {
        if self
            .executors
            .values()
            .any(|e| e.running.keys().any(|t| t.job == *job))
        {
            self.retiring.insert(job.clone());
            return None;
        }
        self.remove_job(job)
    }

    /// Retiring jobs whose last attempt has ended, taken out of the state.
    pub fn take_drained(&mut self) -> Vec<Job> {
        if self.retiring.is_empty() {
            return Vec::new();
        }
        let drained: Vec<JobId> = self
            .retiring
            .iter()
            .filter(|job| {
                !self
                    .executors
                    .values()
                    .any(|e| e.running.keys().any(|t| t.job == **job))
            })
            .cloned()
            .collect();
        drained
            .iter()
            .filter_map(|job| {
                self.retiring.remove(job);
                self.remove_job(job)
            })
            .collect()
    }

    fn remove_job(&mut self, job: &JobId) -> Option<Job> {
        let mut removed = self.jobs.remove(job)?;
        // Nothing reports an attempt of a job out of the state; every one has reported
        // by now, so this is only for the timeline's sake.
        removed.close_open_spans(self.wall);
        if let Some(at) = self.queue.iter().position(|q| q == job) {
            self.queue.remove(at);
        }
        Some(removed)
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
        // An exclusion outlives the process, and so does where it was launched; what the
        // last process had compiled does not.
        let (health, launched_by) = self
            .executors
            .remove(&id)
            .map(|old| (old.health, old.launched_by))
            .unwrap_or_default();
        let mut executor = ExecutorData::new(host, cores, self.now);
        executor.generation = generation;
        executor.pid = Some(pid);
        executor.meters_fuel = meters_fuel;
        executor.health = health;
        executor.launched_by = launched_by;
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
        // The process may already have been seen exiting (a cluster manager's report).
        executor.state = match executor.exit {
            Some(_) => ExecutorState::Exited,
            None => ExecutorState::Lost,
        };
        executor.free_cores = 0;
        executor.queued_ahead = 0;
        let running: Vec<(TaskId, RunningAttempt)> = executor.running.drain().collect();
        let mut actions = Vec::new();
        let now = self.wall;
        for (task_id, attempt) in running {
            if let Some(job) = self.jobs.get_mut(&task_id.job) {
                job.close_span(attempt.span, Outcome::Lost, None, now);
            }
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

    /// A cluster manager launched this executor: it is listed as `launching` until it
    /// registers (or its process exits), with where it came from.
    pub fn executor_launched(&mut self, id: &ExecutorId, by: LaunchedBy, pid: Option<u32>) {
        let now = self.now;
        let executor = self.executors.entry(id.clone()).or_insert_with(|| {
            let mut e = ExecutorData::new(String::new(), 0, now);
            e.state = ExecutorState::Launching;
            e
        });
        executor.launched_by = Some(by);
        if executor.state != ExecutorState::Alive {
            executor.state = ExecutorState::Launching;
            executor.pid = pid;
            executor.free_cores = 0;
            executor.exit = None;
            executor.end_note = None;
        }
    }

    /// Decommissions an executor (Spark's DecommissionExecutor): no new task goes to
    /// it; once what it runs has ended, or at `deadline`, it is sent StopExecutor (its
    /// attempts still running then are killed there and run again elsewhere, not
    /// counted against their tasks).
    /// With `only_if_idle`, one that runs or holds a task is left alone (dynamic
    /// allocation never removes a busy executor).
    pub fn decommission_executor(
        &mut self,
        id: &ExecutorId,
        deadline: Instant,
        only_if_idle: bool,
    ) -> Result<Vec<Action>, String> {
        let executor = self
            .executors
            .get_mut(id)
            .ok_or_else(|| format!("no executor {id}"))?;
        if executor.state != ExecutorState::Alive {
            return Err(format!("executor {id} is {}", executor.state.as_str()));
        }
        if only_if_idle && !executor.running.is_empty() {
            return Err(format!("executor {id} is busy"));
        }
        if executor.decommission_by.is_none() {
            executor.decommission_by = Some(deadline);
            self.decommissioning += 1;
        }
        Ok(self.stop_drained())
    }

    /// Decommissioned executors with nothing left to run, or out of time: StopExecutor,
    /// once per registration.
    pub fn stop_drained(&mut self) -> Vec<Action> {
        if self.decommissioning == 0 {
            return Vec::new();
        }
        let now = self.now;
        let mut actions = Vec::new();
        let mut left = 0;
        for (id, e) in &mut self.executors {
            let Some(deadline) = e
                .decommission_by
                .filter(|_| e.state == ExecutorState::Alive)
            else {
                continue;
            };
            if !e.stop_sent && (e.running.is_empty() || now >= deadline) {
                e.stop_sent = true;
                actions.push(Action::Stop {
                    executor: id.clone(),
                });
            }
            left += 1;
        }
        self.decommissioning = left;
        actions
    }

    /// Cores the live jobs' pending tasks ask for, and cores running attempts hold:
    /// what dynamic allocation sizes the executors by.
    pub fn demand(&self) -> (u64, u64) {
        let pending = self
            .jobs
            .values()
            .filter(|j| !j.state.is_final())
            .map(|j| u64::from(j.counts.pending) * u64::from(j.def.resources.cores))
            .sum();
        let running = self
            .executors
            .values()
            .filter(|e| e.state == ExecutorState::Alive)
            .flat_map(|e| e.running.values())
            .map(|r| u64::from(r.cores))
            .sum();
        (pending, running)
    }

    /// Executors a cluster manager launched that take tasks and run none now.
    pub fn idle_launched_executors(&self) -> Vec<ExecutorId> {
        self.executors
            .iter()
            .filter(|(_, e)| e.takes_tasks() && e.launched_by.is_some() && e.running.is_empty())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Its cluster manager lost it with its host, or could not launch it. One that
    /// registered is lost when its connection closes; one that never did is lost now.
    pub fn executor_gone(&mut self, id: &ExecutorId, note: Option<(&str, &str)>) {
        if let Some(e) = self.executors.get_mut(id) {
            if e.state == ExecutorState::Launching {
                e.state = ExecutorState::Lost;
            }
            if let Some((reason, description)) = note {
                e.end_note = Some((reason.to_owned(), description.to_owned()));
            }
        }
    }

    /// A process a cluster manager launched has exited. One that never registered is
    /// listed too, so its exit is visible; a registered one is `exited` once its
    /// connection closes too (its tasks are re-queued then).
    pub fn executor_exited(&mut self, id: &ExecutorId, exit: ProcessExit, cause: Option<&str>) {
        let now = self.now;
        let executor = self.executors.entry(id.clone()).or_insert_with(|| {
            let mut e = ExecutorData::new(String::new(), 0, now);
            e.state = ExecutorState::Exited;
            e
        });
        executor.exit = Some(exit);
        // A note the driver made first (it gave up on the launch, and killed it for
        // that) says more than the SIGKILL that followed.
        if let Some(cause) = cause {
            executor.end_note = Some(match cause {
                "OOMKilled" => (
                    "oom_killed".to_owned(),
                    format!("{}: OOMKilled, over its memory limit", exit.describe()),
                ),
                other => (
                    exit.reason().to_owned(),
                    format!("{} ({other})", exit.describe()),
                ),
            });
        }
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
                attempts: Vec::new(),
                attempt_executors: Vec::new(),
                attempt_executor_at: FastMap::default(),
                rebuilt: Vec::new(),
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
