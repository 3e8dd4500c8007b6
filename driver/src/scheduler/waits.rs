//! Tasks that wait for results not there yet (a `result` or `results` input naming a
//! task of a job still running, or of a job of the same graph): readiness per task, as
//! HyperQueue's and Dask's graphs have it. A waiting task is linked to what it names
//! ([`Waits`]); when the last of those succeeds, the service is asked to make its input
//! ([`Action::Resolve`]) and hands it back through [`ClusterState::inputs_ready`], after
//! which the task is pending like any other. When one of them fails or is killed the
//! task never runs: it ends `upstream_failed`, naming which, and its job fails with it.
//!
//! What a task names outside the live jobs (a job that has ended, whose results are in
//! the job store) counts as there: the service reads it when it makes the input, and a
//! result that is not there after all fails the task then.

use super::*;

/// Who waits for what. Only live jobs' tasks are waited for; what a waiting task names
/// elsewhere has ended. Entries for tasks that stopped waiting another way (their job
/// was killed) are dropped when they are met.
#[derive(Default)]
pub struct Waits {
    /// An upstream task -> the tasks waiting for its success.
    on_task: FastMap<TaskId, Vec<TaskId>>,
    /// An upstream job -> the tasks waiting for every one of its tasks (`results`
    /// without `tasks`): its success, the same thing, is one edge instead of one per
    /// task.
    on_job: FastMap<JobId, Vec<TaskId>>,
    /// A waiting task -> how many of what it waits for have not succeeded yet.
    remaining: FastMap<TaskId, u32>,
}

impl Waits {
    pub fn is_empty(&self) -> bool {
        self.remaining.is_empty() && self.on_task.is_empty() && self.on_job.is_empty()
    }

    /// The edges held.
    #[cfg(test)]
    pub fn edges(&self) -> usize {
        self.on_task.values().map(Vec::len).sum::<usize>()
            + self.on_job.values().map(Vec::len).sum::<usize>()
    }
}

/// What a waiting task names: one task of a job, or all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Named {
    Task(u32),
    AllTasks,
}

/// The distinct things an input names.
fn named(upstream: &Upstream) -> (&JobId, Vec<Named>) {
    match upstream {
        Upstream::Result { job, task } => (job, vec![Named::Task(*task)]),
        Upstream::Results { job, tasks: None } => (job, vec![Named::AllTasks]),
        Upstream::Results {
            job,
            tasks: Some(tasks),
        } => {
            let mut tasks = tasks.clone();
            tasks.sort_unstable();
            tasks.dedup();
            (job, tasks.into_iter().map(Named::Task).collect())
        }
    }
}

/// Where a named result stands.
enum Standing {
    /// Succeeded, or out of the live jobs (the service finds out when it reads it).
    There,
    /// Failed or killed, or never to be: why, for the waiting task's failure.
    Never(String),
    Coming,
}

fn standing(jobs: &FastMap<JobId, Job>, job_id: &JobId, named: Named) -> Standing {
    let Some(job) = jobs.get(job_id) else {
        return Standing::There;
    };
    match named {
        Named::AllTasks => match job.state {
            JobState::Succeeded => Standing::There,
            state if state.is_final() => Standing::Never(format!(
                "job {job_id} ({}) {}",
                job.def.name,
                state.as_str()
            )),
            _ => Standing::Coming,
        },
        Named::Task(index) => match job.tasks.get(index as usize).map(|t| t.state) {
            None => Standing::Never(format!("job {job_id} has no task {index}")),
            Some(TaskState::Succeeded) => Standing::There,
            Some(state) if state.is_final() => Standing::Never(upstream_end(job, index)),
            Some(_) => Standing::Coming,
        },
    }
}

/// How a named task ended, in the words of its dependents' failure.
fn upstream_end(job: &Job, index: u32) -> String {
    let task = &job.tasks[index as usize];
    let how = match &task.failure {
        Some(f) => format!("{}: {}: {}", task.state.as_str(), f.kind, f.message),
        None => task.state.as_str().to_owned(),
    };
    format!(
        "task {index} of job {} ({}) {how}",
        job.def.id, job.def.name
    )
}

impl ClusterState {
    /// Links the waiting tasks of `job` (just submitted, or read back after a restart)
    /// to what they wait for. A task whose results are all there is to be resolved; one
    /// that names a result that will never be fails at once.
    pub(crate) fn link_waiting(&mut self, job_id: &JobId, out: &mut Vec<Action>) {
        let Some(job) = self.jobs.get(job_id) else {
            return;
        };
        if job.counts.waiting == 0 {
            return;
        }
        let waiting: Vec<(u32, Upstream)> = (job.tasks.iter().enumerate())
            .filter(|(_, t)| t.state == TaskState::Waiting)
            .filter_map(|(index, t)| match &t.input {
                TaskInput::Upstream(u) => Some((index as u32, (**u).clone())),
                _ => None,
            })
            .collect();
        let mut ready = Vec::new();
        let mut never = Vec::new();
        for (index, upstream) in waiting {
            let id = TaskId {
                job: job_id.clone(),
                index,
            };
            let (upstream_job, names) = named(&upstream);
            let mut coming = 0;
            let mut why_never = None;
            for name in names {
                match standing(&self.jobs, upstream_job, name) {
                    Standing::There => {}
                    Standing::Never(why) => {
                        why_never = Some(why);
                        break;
                    }
                    Standing::Coming => {
                        coming += 1;
                        let list = match name {
                            Named::Task(t) => self
                                .waits
                                .on_task
                                .entry(TaskId {
                                    job: upstream_job.clone(),
                                    index: t,
                                })
                                .or_default(),
                            Named::AllTasks => {
                                self.waits.on_job.entry(upstream_job.clone()).or_default()
                            }
                        };
                        list.push(id.clone());
                    }
                }
            }
            match (why_never, coming) {
                (Some(why), _) => never.push((id, why)),
                (None, 0) => ready.push(index),
                (None, n) => {
                    self.waits.remaining.insert(id, n);
                }
            }
        }
        for (id, why) in never {
            self.waits.remaining.remove(&id);
            self.fail_upstream(&id, why, out);
        }
        if !ready.is_empty() {
            out.push(Action::Resolve {
                job: job_id.clone(),
                tasks: ready,
            });
        }
    }

    /// Follows the ends among `actions` to the tasks waiting for them:
    /// a success counts down what its dependents wait for, and those with nothing left
    /// are to be resolved; a failure or kill fails them, whose own ends are followed in
    /// turn. Called on every batch of actions before they are carried out; nothing to do
    /// while no task waits.
    pub fn settle_waits(&mut self, actions: &mut Vec<Action>) {
        if self.waits.is_empty() {
            return;
        }
        let mut at = 0;
        while at < actions.len() {
            match &actions[at] {
                Action::TaskEnded(task) => {
                    let task = task.clone();
                    self.upstream_task_ended(&task, actions);
                }
                Action::JobFinished(job) => {
                    let job = job.clone();
                    self.upstream_job_ended(&job, actions);
                }
                _ => {}
            }
            at += 1;
        }
    }

    fn upstream_task_ended(&mut self, task: &TaskId, out: &mut Vec<Action>) {
        let Some(dependents) = self.waits.on_task.remove(task) else {
            return;
        };
        let Some(job) = self.jobs.get(&task.job) else {
            return;
        };
        match job.tasks.get(task.index as usize).map(|t| t.state) {
            Some(TaskState::Succeeded) => self.count_down(dependents, out),
            Some(state) if state.is_final() => {
                let why = upstream_end(job, task.index);
                for dependent in dependents {
                    self.fail_upstream(&dependent, why.clone(), out);
                }
            }
            // Not an end after all (cannot happen): keep waiting.
            _ => {
                self.waits.on_task.insert(task.clone(), dependents);
            }
        }
    }

    /// A job ended: those waiting for all of its tasks, and for any of its tasks that
    /// ended with it unrun (killed while pending or waiting, with no end of their own).
    fn upstream_job_ended(&mut self, job_id: &JobId, out: &mut Vec<Action>) {
        let Some(job) = self.jobs.get(job_id) else {
            return;
        };
        let state = job.state;
        let ended_unsucceeded: Vec<(TaskId, String)> = (job.tasks.iter().enumerate())
            .filter(|(_, t)| t.state.is_final() && t.state != TaskState::Succeeded)
            .map(|(index, _)| TaskId {
                job: job_id.clone(),
                index: index as u32,
            })
            .filter(|t| self.waits.on_task.contains_key(t))
            .map(|t| {
                let why = upstream_end(job, t.index);
                (t, why)
            })
            .collect();
        let whole = format!("job {job_id} ({}) {}", job.def.name, state.as_str());
        let tasks = job.tasks.len() as u32;
        // Its own waiting tasks were killed with it: nothing counts down for them now.
        for index in 0..tasks {
            if self.waits.remaining.is_empty() {
                break;
            }
            self.waits.remaining.remove(&TaskId {
                job: job_id.clone(),
                index,
            });
        }
        for (task, why) in ended_unsucceeded {
            for dependent in self.waits.on_task.remove(&task).unwrap_or_default() {
                self.fail_upstream(&dependent, why.clone(), out);
            }
        }
        if let Some(dependents) = self.waits.on_job.remove(job_id) {
            match state {
                JobState::Succeeded => self.count_down(dependents, out),
                _ => {
                    for dependent in dependents {
                        self.fail_upstream(&dependent, whole.clone(), out);
                    }
                }
            }
        }
    }

    /// One more of what each of `dependents` waits for has succeeded.
    fn count_down(&mut self, dependents: Vec<TaskId>, out: &mut Vec<Action>) {
        let mut ready: FastMap<JobId, Vec<u32>> = FastMap::default();
        for dependent in dependents {
            let Some(left) = self.waits.remaining.get_mut(&dependent) else {
                continue;
            };
            *left -= 1;
            if *left == 0 {
                self.waits.remaining.remove(&dependent);
                ready
                    .entry(dependent.job)
                    .or_default()
                    .push(dependent.index);
            }
        }
        for (job, tasks) in ready {
            out.push(Action::Resolve { job, tasks });
        }
    }

    /// A waiting task whose input names a result that will never be: it ends
    /// `upstream_failed` without running, and its job fails with it.
    fn fail_upstream(&mut self, id: &TaskId, why: String, out: &mut Vec<Action>) {
        self.waits.remaining.remove(id);
        let Some(job) = self.jobs.get_mut(&id.job) else {
            return;
        };
        let Some(task) = job.tasks.get_mut(id.index as usize) else {
            return;
        };
        if task.state != TaskState::Waiting {
            return;
        }
        let failure = TaskFailure::new(FailureKind::UpstreamFailed, format!("not run: {why}"));
        self.end_unrun(id, failure, out);
    }

    /// The inputs the service made for waiting tasks of `job` (see [`Action::Resolve`]):
    /// each task with its input is pending now, one that found its memoized result has
    /// succeeded without running, and one whose input could not be made ends with that
    /// failure, its job with it. Tasks no longer waiting (their job ended meanwhile) are
    /// left as they are.
    pub fn inputs_ready(&mut self, job_id: &JobId, inputs: Vec<(u32, Resolved)>) -> Vec<Action> {
        let mut out = Vec::new();
        let mut any = false;
        for (index, resolved) in inputs {
            let Some(job) = self.jobs.get_mut(job_id) else {
                break;
            };
            if job.state.is_final() {
                break;
            }
            let Some(task) = job.tasks.get_mut(index as usize) else {
                continue;
            };
            if task.state != TaskState::Waiting {
                continue;
            }
            let id = TaskId {
                job: job_id.clone(),
                index,
            };
            match resolved {
                Resolved::Input(input) => {
                    task.input = input;
                    set_state(&mut job.counts, task, TaskState::Pending);
                    job.pending.push_back(index);
                    any = true;
                    out.push(Action::TaskRequeued {
                        job: job_id.clone(),
                        event: TaskEvent {
                            index,
                            state: TaskState::Pending,
                            attempt: 0,
                            executor: None,
                            error: None,
                        },
                    });
                }
                Resolved::Memoized { input, result } => {
                    task.input = input;
                    job.result_bytes += result.len();
                    set_state(&mut job.counts, task, TaskState::Succeeded);
                    task.result_digest = Some(result.digest());
                    task.result = Some(result);
                    out.push(Action::TaskEnded(id));
                }
                Resolved::Failed(failure) => self.end_unrun(&id, failure, &mut out),
            }
        }
        let wall = self.wall;
        if let Some(job) = self.jobs.get_mut(job_id)
            && !job.state.is_final()
        {
            if job.all_final() {
                out.extend(Self::end_job(job, JobState::Succeeded, None, wall));
            } else if any && !self.queue.contains(job_id) {
                self.queue.push_back(job_id.clone());
            }
        }
        self.settle_waits(&mut out);
        out.extend(self.make_offers());
        out
    }

    /// Ends a task that never ran with `failure`, and fails its job for it: the job's
    /// error kind is the failure's (`upstream_failed`, `input_too_large`).
    fn end_unrun(&mut self, id: &TaskId, failure: TaskFailure, out: &mut Vec<Action>) {
        let wall = self.wall;
        let Some(job) = self.jobs.get_mut(&id.job) else {
            return;
        };
        let task = &mut job.tasks[id.index as usize];
        set_state(&mut job.counts, task, TaskState::Failed);
        let kind = failure.kind.as_str().to_owned();
        let reason = format!("task {} {kind}: {}", id.index, failure.message);
        task.failure = Some(failure);
        out.push(Action::TaskEnded(id.clone()));
        if job.state.is_final() {
            return;
        }
        out.extend(Self::end_job(job, JobState::Failed, Some(reason), wall));
        if let Some((k, _)) = &mut job.error {
            *k = kind;
        }
        Self::kill_running_attempts(job, &self.executors, out);
    }
}
