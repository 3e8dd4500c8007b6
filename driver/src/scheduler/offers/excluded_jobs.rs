//! Jobs no executor may run: a task that every live executor is excluded for (it
//! failed there twice with host errors, or the executor is excluded for a period) fails
//! its job, rather than wait forever.

use super::*;

impl ClusterState {
    /// Fails every job with a task that no live executor may run: each is excluded for
    /// the task (it failed there twice with host errors) or for a period. Without this
    /// such a job would wait forever. With no live executor at all, jobs wait for one to
    /// register. Fetch errors never get here: they exclude nothing, and a task failing
    /// only with them ends when its job's `max_failures` is spent.
    pub(super) fn fail_excluded_jobs(&mut self, now: SystemTime, actions: &mut Vec<Action>) {
        let clock = self.now;
        let exclusion = self.config.exclusion;
        let live: Vec<(&ExecutorId, &ExecutorData)> = self
            .executors
            .iter()
            .filter(|(_, e)| e.takes_tasks())
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
            Self::kill_running_attempts(job, &self.executors, actions);
        }
    }
}
