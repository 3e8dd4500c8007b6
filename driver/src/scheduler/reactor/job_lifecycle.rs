//! Jobs arriving and ending: a job submitted (its memoized tasks ending as it is
//! accepted), killed or stopped (its pending tasks killed unrun, its running attempts
//! killed), and a final job leaving the state once its last attempt has reported.

use super::*;

impl ClusterState {
    /// A job is accepted: its memoized tasks end at once (and the job with them if that
    /// was all), its waiting tasks are linked to what they read, the rest wait for a
    /// round of offers.
    pub fn submit_job(&mut self, job: NewJob) -> Vec<Action> {
        self.submit_jobs(vec![job])
    }

    /// Jobs accepted together (a graph's, each after the jobs it reads), as
    /// [`Self::submit_job`] accepts one, with one round of offers for all: a graph of
    /// 10,000 jobs must not cost 10,000 rounds under the lock.
    pub fn submit_jobs(&mut self, jobs: Vec<NewJob>) -> Vec<Action> {
        let mut actions = Vec::new();
        for job in jobs {
            self.accept_job(job, &mut actions);
        }
        actions.extend(self.make_offers());
        actions
    }

    fn accept_job(&mut self, job: NewJob, out: &mut Vec<Action>) {
        let id = job.def.id.clone();
        let memoized: Vec<u32> = (job.tasks.iter().enumerate())
            .filter(|(_, t)| t.memoized.is_some())
            .map(|(index, _)| index as u32)
            .collect();
        self.insert_job(job);
        let mut linked = Vec::new();
        self.link_waiting(&id, &mut linked);
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
        actions.extend(linked);
        let wall = self.wall;
        if let Some(job) = self.jobs.get_mut(&id)
            && job.all_final()
            && !job.state.is_final()
        {
            actions.extend(Self::end_job(job, JobState::Succeeded, None, wall));
        }
        out.extend(actions);
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
        Self::kill_running_attempts(job, &self.executors, &mut actions);
        Some(actions)
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

    /// Kills a final job's running attempts. Each keeps its cores until its executor
    /// reports the attempt over (an epoch tick away), so a core is never offered twice;
    /// whatever that report says, the task stays killed.
    pub(in crate::scheduler) fn kill_running_attempts(
        job: &mut Job,
        executors: &BTreeMap<ExecutorId, ExecutorData>,
        actions: &mut Vec<Action>,
    ) {
        let why = match job.state {
            JobState::Killed => "killed: the job was killed",
            _ => "killed: another task of the job failed",
        };
        for (executor_id, executor) in executors {
            for (task_id, running) in executor.running.iter().filter(|(t, _)| t.job == job.def.id) {
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

    /// Adds a job with every task pending, and nothing launched yet.
    pub(crate) fn insert_job(&mut self, job: NewJob) {
        let mut result_bytes = 0;
        let tasks = job
            .tasks
            .into_iter()
            .map(|t| Task {
                state: match (&t.memoized, &t.input) {
                    (Some(_), _) => TaskState::Succeeded,
                    (None, TaskInput::Upstream(_)) => TaskState::Waiting,
                    (None, _) => TaskState::Pending,
                },
                input: t.input,
                args: t.args,
                env: t.env,
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
        let waiting = (tasks.iter())
            .filter(|t| t.state == TaskState::Waiting)
            .count();
        let counts = TaskCounts {
            waiting: waiting as u32,
            pending: pending.len() as u32,
            succeeded: (tasks.len() - pending.len() - waiting) as u32,
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
}
