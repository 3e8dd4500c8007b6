//! The scheduler's state machine: executors, jobs and tasks, changed only through the
//! methods below, each of which returns the [`Action`]s the service layer must carry out.
//! No sockets, no clock reads: the service sets the clock ([`ClusterState::set_clock`])
//! before each change, so it is tested directly.
//!
//! A task runs as at most one attempt, or two when speculation copied it; the first
//! success wins and the other attempt is killed. Where an attempt runs is in its
//! executor's `running` map, which is the only record of running attempts.
//!
//! Here: the state's types, jobs arriving and ending. `executors`: executors coming
//! and going. `status`: task ends. `offers`: placement onto free cores and queues, and speculation.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use flint_protocol::api::{ErrorBody, ExecutorState, JobState, TaskCounts, TaskEvent, TaskState};
use flint_protocol::{
    ExecutorId, FailureKind, JobId, JobTemplate, Pins, TaskFailure, TaskId, TaskLaunch, TaskResult,
    TaskStatus, Usage,
};

use exclusion::excluded_for_task;
use policy::{Demand, Offer};

pub mod escalation;
pub mod exclusion;
mod executors;
pub mod latency;
pub mod memo;
mod model;
mod offers;
pub mod policy;
mod preemption;
mod settings;
pub mod speculation;
mod status;
pub mod tenancy;
#[cfg(test)]
pub(crate) mod tests;

pub use model::*;
pub use settings::*;

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
    /// What every attempt that reported its end used, summed since the driver started
    /// (`/metrics`), and how many those were.
    pub usage: Usage,
    pub attempts_measured: u64,
    /// The same by tenant (`None`: the admin's jobs), since the driver started.
    pub tenant_spent: FastMap<Option<String>, Spent>,
    /// Tenants' weights and core limits, as the tenants file last said.
    pub shares: tenancy::Shares,
    /// Since when each tenant below its share with work waiting has been so (see
    /// [`preemption`]).
    starving: FastMap<Option<String>, Instant>,
    /// Each tenant with work: the cores it was given over its weight (see [`tenancy`]).
    vtime: FastMap<Option<String>, f64>,
}

/// What one tenant's attempts used since the driver started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spent {
    pub attempts: u64,
    pub preempted: u64,
    pub succeeded: u64,
    pub cpu_us: u64,
    pub wall_us: u64,
    pub output_bytes: u64,
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
            usage: Usage::default(),
            attempts_measured: 0,
            tenant_spent: FastMap::default(),
            shares: tenancy::Shares::default(),
            starving: FastMap::default(),
            vtime: FastMap::default(),
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

    pub fn submit_job(&mut self, job: NewJob) -> Vec<Action> {
        let id = job.def.id.clone();
        let memoized: Vec<u32> = (job.tasks.iter().enumerate())
            .filter(|(_, t)| t.memoized.is_some())
            .map(|(index, _)| index as u32)
            .collect();
        self.insert_job(job);
        // Memoized tasks ended as they were accepted: stored and told like any end, and
        // a job with nothing left to run ends here.
        let mut actions: Vec<Action> = (memoized.into_iter())
            .map(|index| {
                Action::TaskEnded(TaskId {
                    job: id.clone(),
                    index,
                })
            })
            .collect();
        let wall = self.wall;
        if let Some(job) = self.jobs.get_mut(&id)
            && job.all_final()
        {
            actions.extend(Self::end_job(job, JobState::Succeeded, None, wall));
        }
        actions.extend(self.make_offers());
        actions
    }

    /// Adds a job with every task pending, and nothing launched yet.
    pub(crate) fn insert_job(&mut self, job: NewJob) {
        let mut result_bytes = 0;
        let tasks = job
            .tasks
            .into_iter()
            .map(|t| Task {
                input: t.input,
                args: t.args,
                env: t.env,
                state: match t.memoized {
                    Some(_) => TaskState::Succeeded,
                    None => TaskState::Pending,
                },
                attempts: 0,
                host_failures: 0,
                failed_on: Vec::new(),
                executor: None,
                result_digest: t.memoized.as_ref().map(TaskResult::digest),
                result: t.memoized.inspect(|r| result_bytes += r.len()),
                failure: None,
                started_at_us: None,
                finished_at_us: None,
                log: Vec::new(),
            })
            .collect::<Vec<_>>();
        let pending = (0..tasks.len() as u32)
            .filter(|&i| tasks[i as usize].state == TaskState::Pending)
            .collect::<VecDeque<u32>>();
        let counts = TaskCounts {
            pending: pending.len() as u32,
            succeeded: (tasks.len() - pending.len()) as u32,
            ..TaskCounts::default()
        };
        self.queue.push_back(job.def.id.clone());
        self.next_job_key += 1;
        self.jobs.insert(
            job.def.id.clone(),
            Job {
                locality: job.def.module.locality_key(),
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
                result_bytes,
                counts,
                run_time_us: None,
                attempts: Vec::new(),
                attempt_executors: Vec::new(),
                attempt_executor_at: FastMap::default(),
                rebuilt: Vec::new(),
                usage: None,
                budgets: FastMap::default(),
                pins: FastMap::default(),
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
