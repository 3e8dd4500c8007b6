//! The scheduler's state machine: executors, jobs and tasks, changed only through the
//! methods below, each of which returns the [`Action`]s the service layer must carry out.
//! No sockets, no clock reads (time comes in as arguments), so it is tested directly.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use flint_protocol::api::{ExecutorState, JobState, TaskCounts, TaskState};
use flint_protocol::{
    Digest, ExecutorId, FailureKind, JobId, TaskDescription, TaskFailure, TaskId, TaskInput,
    TaskResult, TaskStatus,
};

pub use flint_protocol::records::JobDef;

use flint_protocol::messages::Heartbeat;

use crate::policy::{self, Demand, Offer};

/// What the service layer must do after a state change.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    Launch {
        executor: ExecutorId,
        task: Box<TaskDescription>,
    },
    Kill {
        executor: ExecutorId,
        task: TaskId,
        attempt: u32,
    },
    /// A task reached `succeeded` or `failed`: its end is worth keeping.
    TaskEnded(TaskId),
    /// A job reached a final state (tasks it killed end with it).
    JobFinished(JobId),
}

pub struct ExecutorData {
    pub host: String,
    pub cores: u32,
    pub free_cores: u32,
    pub generation: u64,
    pub state: ExecutorState,
    pub running: HashMap<TaskId, u32>,
    pub last_heartbeat: Instant,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub tasks_finished: u64,
    pub meters_fuel: bool,
    /// The executor's own figures, as of its latest heartbeat.
    pub reported: Heartbeat,
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
    pub tasks: Vec<Task>,
    pub(crate) pending: VecDeque<u32>,
    pub state: JobState,
    pub finished_at: Option<SystemTime>,
    pub error: Option<(String, String)>,
    /// Bytes of the results kept so far, against `def.max_result_bytes`.
    pub result_bytes: u64,
}

pub struct Task {
    pub input: TaskInput,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub state: TaskState,
    /// Attempts launched so far; the running one (if any) is the latest.
    pub attempts: u32,
    /// Attempts lost to host failures; these count towards `max_failures`.
    pub host_failures: u32,
    pub executor: Option<ExecutorId>,
    pub result: Option<TaskResult>,
    pub result_digest: Option<Digest>,
    pub failure: Option<TaskFailure>,
    pub started_at_us: Option<u64>,
    pub finished_at_us: Option<u64>,
    pub log: Vec<u8>,
}

#[derive(Default)]
pub struct ClusterState {
    pub executors: BTreeMap<ExecutorId, ExecutorData>,
    pub jobs: HashMap<JobId, Job>,
    /// Jobs in submission order, newest last.
    pub job_order: Vec<JobId>,
    /// Jobs that may still have pending tasks, oldest first.
    pub(crate) queue: VecDeque<JobId>,
    next_generation: u64,
}

impl Job {
    /// Ends every task that has not started: its job is over.
    pub(crate) fn kill_pending(&mut self) {
        for index in self.pending.drain(..) {
            let task = &mut self.tasks[index as usize];
            task.state = TaskState::Killed;
            task.failure = Some(TaskFailure::new(
                FailureKind::Killed,
                "not run: the job ended before this task started",
            ));
        }
    }

    pub fn counts(&self) -> TaskCounts {
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

impl ClusterState {
    /// A state whose registrations are numbered from `first_generation` on. The driver
    /// starts from the wall clock in microseconds, so that generations keep increasing
    /// across its restarts and a status from before a restart is never taken for one of
    /// a new registration.
    pub fn new(first_generation: u64) -> Self {
        ClusterState {
            next_generation: first_generation,
            ..ClusterState::default()
        }
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
        now: Instant,
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
        self.executors.insert(
            id,
            ExecutorData {
                host,
                cores,
                free_cores: cores,
                generation,
                state: ExecutorState::Alive,
                running: HashMap::new(),
                last_heartbeat: now,
                pid: Some(pid),
                exit_code: None,
                tasks_finished: 0,
                meters_fuel,
                reported: Heartbeat::default(),
            },
        );
        Ok((generation, actions))
    }

    /// The executor is alive; with `report`, its figures are new too.
    pub fn heartbeat(
        &mut self,
        id: &ExecutorId,
        generation: u64,
        now: Instant,
        report: Option<Heartbeat>,
    ) {
        if let Some(e) = self.live_executor(id, generation) {
            e.last_heartbeat = now;
            if let Some(report) = report {
                e.reported = report;
            }
        }
    }

    /// The executor's connection is gone: its running tasks go back to pending without
    /// counting as failures of the task.
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
        let running: Vec<(TaskId, u32)> = executor.running.drain().collect();
        for (task_id, attempt) in running {
            let Some(job) = self.jobs.get_mut(&task_id.job) else {
                continue;
            };
            let task = &mut job.tasks[task_id.index as usize];
            if task.state == TaskState::Running && task.attempts == attempt {
                task.state = TaskState::Pending;
                job.pending.push_front(task_id.index);
                if !self.queue.contains(&task_id.job) {
                    self.queue.push_front(task_id.job.clone());
                }
            }
        }
        self.make_offers()
    }

    /// Live executors whose last heartbeat is older than `timeout`: hung (SIGSTOP) or cut
    /// off without their connection closing. Each is lost as if its connection had closed.
    pub fn expire_executors(
        &mut self,
        now: Instant,
        timeout: Duration,
    ) -> (Vec<(ExecutorId, u64)>, Vec<Action>) {
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
    pub fn executor_exited(&mut self, id: &ExecutorId, exit_code: Option<i32>, now: Instant) {
        let executor = self
            .executors
            .entry(id.clone())
            .or_insert_with(|| ExecutorData {
                host: String::new(),
                cores: 0,
                free_cores: 0,
                generation: 0,
                state: ExecutorState::Exited,
                running: HashMap::new(),
                last_heartbeat: now,
                pid: None,
                exit_code: None,
                tasks_finished: 0,
                meters_fuel: false,
                reported: Heartbeat::default(),
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
        self.job_order.push(job.def.id.clone());
        self.queue.push_back(job.def.id.clone());
        self.jobs.insert(
            job.def.id.clone(),
            Job {
                def: job.def,
                tasks,
                pending,
                state: JobState::Queued,
                finished_at: None,
                error: None,
                result_bytes: 0,
            },
        );
    }

    /// A task attempt ended on an executor. Stale reports (an old attempt, another
    /// executor, a lost generation) change nothing.
    pub fn status_update(
        &mut self,
        executor_id: &ExecutorId,
        generation: u64,
        status: TaskStatus,
        now: SystemTime,
    ) -> Vec<Action> {
        let Some(cores) = self
            .jobs
            .get(&status.task.job)
            .map(|j| j.def.resources.cores)
        else {
            return Vec::new();
        };
        let Some(executor) = self.live_executor(executor_id, generation) else {
            return Vec::new();
        };
        if executor.running.get(&status.task) != Some(&status.attempt)
            || status.generation != generation
        {
            return Vec::new();
        }
        executor.running.remove(&status.task);
        executor.tasks_finished += 1;
        executor.free_cores += cores;
        let job = self
            .jobs
            .get_mut(&status.task.job)
            .expect("job checked above");
        let task = &mut job.tasks[status.task.index as usize];
        task.started_at_us = Some(status.end.started_at_us);
        task.finished_at_us = Some(status.end.finished_at_us);
        task.log = status.end.log;
        let mut actions = Vec::new();
        if task.state.is_final() {
            // A kill (of this task or its job) got here first: the cores are back now,
            // and the outcome is the kill's, not whatever the attempt did meanwhile.
            return actions;
        }
        match status.end.outcome {
            Ok(result) if job.result_bytes + result.len() > job.def.max_result_bytes => {
                task.state = TaskState::Failed;
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
                self.clear_running(&status.task.job, &mut actions);
            }
            Ok(result) => {
                job.result_bytes += result.len();
                task.state = TaskState::Succeeded;
                task.result_digest = Some(result.digest());
                task.result = Some(result);
                task.failure = None;
                actions.push(Action::TaskEnded(status.task.clone()));
            }
            Err(failure)
                if failure.kind.is_retryable() && task.host_failures + 1 < job.def.max_failures =>
            {
                task.host_failures += 1;
                task.state = TaskState::Pending;
                task.failure = Some(failure);
                job.pending.push_back(status.task.index);
                if !self.queue.contains(&job.def.id) {
                    self.queue.push_back(job.def.id.clone());
                }
            }
            Err(failure) => {
                task.state = TaskState::Failed;
                let reason = format!(
                    "task {} failed after {} attempt(s): {}: {}",
                    status.task.index, task.attempts, failure.kind, failure.message
                );
                task.failure = Some(failure);
                actions.push(Action::TaskEnded(status.task.clone()));
                actions.extend(Self::end_job(job, JobState::Failed, Some(reason), now));
                self.clear_running(&status.task.job, &mut actions);
            }
        }
        let job = self
            .jobs
            .get_mut(&status.task.job)
            .expect("job checked above");
        if !job.state.is_final() && job.tasks.iter().all(|t| t.state.is_final()) {
            actions.extend(Self::end_job(job, JobState::Succeeded, None, now));
        }
        actions.extend(self.make_offers());
        actions
    }

    /// Every live executor offers its free cores; pending tasks are placed by the policy.
    pub fn make_offers(&mut self) -> Vec<Action> {
        let live: Vec<&ExecutorId> = self
            .executors
            .iter()
            .filter(|(_, e)| e.state == ExecutorState::Alive && e.free_cores > 0)
            .map(|(id, _)| id)
            .collect();
        if live.is_empty() {
            return Vec::new();
        }
        self.queue.retain(|id| {
            self.jobs
                .get(id)
                .is_some_and(|j| !j.pending.is_empty() && !j.state.is_final())
        });
        let offers: Vec<Offer> = live
            .iter()
            .map(|id| Offer {
                free_cores: self.executors[*id].free_cores,
                meters_fuel: self.executors[*id].meters_fuel,
            })
            .collect();
        let demands: Vec<Demand> = self
            .queue
            .iter()
            .map(|id| {
                let job = &self.jobs[id];
                Demand {
                    cores: job.def.resources.cores,
                    count: job.pending.len(),
                    needs_fuel: job.def.resources.fuel.is_some(),
                }
            })
            .collect();
        let live: Vec<ExecutorId> = live.into_iter().cloned().collect();
        let placements = policy::place(&offers, &demands);
        let mut actions = Vec::with_capacity(placements.len());
        for placement in placements {
            let job_id = &self.queue[placement.demand];
            let executor_id = &live[placement.offer];
            let job = self.jobs.get_mut(job_id).expect("queued jobs exist");
            let index = job.pending.pop_front().expect("policy respects counts");
            let executor = self
                .executors
                .get_mut(executor_id)
                .expect("offers come from executors");
            executor.free_cores -= job.def.resources.cores;
            if job.state == JobState::Queued {
                job.state = JobState::Running;
            }
            let task = &mut job.tasks[index as usize];
            task.state = TaskState::Running;
            task.attempts += 1;
            task.executor = Some(executor_id.clone());
            executor.running.insert(
                TaskId {
                    job: job_id.clone(),
                    index,
                },
                task.attempts,
            );
            actions.push(Action::Launch {
                executor: executor_id.clone(),
                task: Box::new(describe(job, index, executor.generation)),
            });
        }
        actions
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
        for (executor_id, executor) in self.executors.iter_mut() {
            let attempts: Vec<(TaskId, u32)> = executor
                .running
                .iter()
                .filter(|(t, _)| &t.job == job_id)
                .map(|(t, a)| (t.clone(), *a))
                .collect();
            for (task_id, attempt) in attempts {
                let task = &mut job.tasks[task_id.index as usize];
                if task.state.is_final() {
                    continue;
                }
                task.state = TaskState::Killed;
                let why = match job.state {
                    JobState::Killed => "killed: the job was killed",
                    _ => "killed: another task of the job failed",
                };
                task.failure = Some(TaskFailure::new(FailureKind::Killed, why));
                actions.push(Action::Kill {
                    executor: executor_id.clone(),
                    task: task_id,
                    attempt,
                });
            }
        }
    }
}

fn describe(job: &Job, index: u32, generation: u64) -> TaskDescription {
    let task = &job.tasks[index as usize];
    let mut env = job.def.env.clone();
    env.extend(task.env.iter().cloned());
    TaskDescription {
        task: TaskId {
            job: job.def.id.clone(),
            index,
        },
        attempt: task.attempts,
        generation,
        task_count: job.tasks.len() as u32,
        name: job.def.name.clone(),
        module: job.def.module.clone(),
        files: job.def.files.clone(),
        args: job.def.args.iter().chain(&task.args).cloned().collect(),
        env,
        input: task.input.clone(),
        resources: job.def.resources,
    }
}

#[cfg(test)]
mod tests {
    use flint_protocol::{ModuleRef, Resources, TaskEnd};

    use super::*;

    fn exec(n: u32) -> ExecutorId {
        ExecutorId(format!("exec-{n}"))
    }

    fn job(id: &str, tasks: usize, cores: u32) -> NewJob {
        NewJob {
            def: JobDef {
                id: JobId(id.into()),
                name: id.into(),
                module: ModuleRef {
                    digest: Digest::of(b"m"),
                    url: "http://driver/v1/modules/m".into(),
                    timestamp_ms: 1,
                    size: 1,
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
                Action::Launch { executor, task } => {
                    Some((executor.clone(), task.task.index, task.attempt))
                }
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
        let mut state = ClusterState::default();
        let generations = (1..=executors)
            .map(|n| {
                state
                    .register_executor(exec(n), "h".into(), cores, n, false, Instant::now())
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
            .register_executor(exec(1), "h".into(), 2, 9, false, Instant::now())
            .unwrap_err();
        assert!(err.contains("already registered"), "{err}");
        state.executor_lost(&exec(1), gens[0]);
        let (again, _) = state
            .register_executor(exec(1), "h".into(), 2, 9, false, Instant::now())
            .unwrap();
        assert!(again > gens[0]);
        // The same process (host and pid) coming back supersedes its live registration.
        let (third, _) = state
            .register_executor(exec(1), "h".into(), 2, 9, false, Instant::now())
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

    #[test]
    fn host_failures_are_retried_up_to_max_failures() {
        let (mut state, gens) = cluster(1, 1);
        state.submit_job(job("j", 1, 1));
        for attempt in 1..=3 {
            let failure = TaskFailure::new(FailureKind::FetchError, "connection refused");
            let actions = report(
                &mut state,
                &exec(1),
                gens[0],
                status("j", 0, attempt, Err(failure)),
                SystemTime::UNIX_EPOCH,
            );
            let again = launches(&actions);
            if attempt < 3 {
                assert_eq!(again, vec![(exec(1), 0, attempt + 1)]);
            } else {
                assert!(again.is_empty());
            }
        }
        let job = &state.jobs[&JobId("j".into())];
        assert_eq!(job.state, JobState::Failed);
        assert!(
            job.error
                .as_ref()
                .unwrap()
                .1
                .contains("after 3 attempt(s): fetch_error")
        );
    }

    #[test]
    fn a_silent_executor_is_lost_after_the_heartbeat_timeout() {
        let (mut state, gens) = cluster(2, 1);
        let placed = launches(&state.submit_job(job("j", 2, 1)));
        assert_eq!(placed.len(), 2);
        let t0 = state.executors[&exec(1)].last_heartbeat;
        let timeout = Duration::from_secs(8);
        state.heartbeat(&exec(2), gens[1], t0 + Duration::from_secs(7), None);
        let (expired, _) = state.expire_executors(t0 + Duration::from_secs(7), timeout);
        assert!(expired.is_empty(), "nobody is late yet");
        let (expired, actions) = state.expire_executors(t0 + Duration::from_secs(9), timeout);
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
        assert!(
            state
                .kill_job(&JobId("nope".into()), SystemTime::UNIX_EPOCH)
                .is_none()
        );
    }
}
