//! What each queued job asks of a round's offers: its tasks by kind (free to go
//! anywhere, or barred from some executors: those a constrained task is excluded from,
//! and those a speculative copy's original runs on), where its module is warm, and
//! whether it may go cold yet (its locality wait).

use super::*;

impl ClusterState {
    /// What each queued job asks of these offers, in the queue's order.
    pub(super) fn demands(
        &self,
        ids: &[ExecutorId],
        offers: &[Offer],
        now: Instant,
    ) -> Vec<Demand> {
        let position = |id: &ExecutorId| ids.iter().position(|e| e == id);
        self.queue
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
                    .zip(offers)
                    .map(|(id, o)| o.usable && self.executors[id].modules.contains(&job.locality))
                    .collect();
                let waited = job.locality_wait_since.is_some_and(|since| {
                    now.saturating_duration_since(since) >= self.config.locality_wait
                });
                let cold_allowed = self.config.locality_wait.is_zero() || waited;
                let warm_elsewhere =
                    !cold_allowed && !warm.contains(&true) && self.warm_without_room(job, ids);
                Demand {
                    cores: job.def.resources.cores,
                    count: job.pending.len(),
                    constrained,
                    needs_fuel: job.def.needs_fuel(),
                    cold_allowed: cold_allowed || (!warm.contains(&true) && !warm_elsewhere),
                    warm_elsewhere,
                    warm,
                    run_time_unknown: job.run_time_us.is_none(),
                }
            })
            .collect()
    }

    /// Whether an executor that could take the job's tasks but has no room now (so it is
    /// not among `offered`) already has the job's module: then the job waits for it, up
    /// to the locality wait, rather than going to a cold one. Looked at only when no
    /// offered executor is warm, so it costs a walk over the executors only while a job
    /// is about to start cold.
    fn warm_without_room(&self, job: &Job, offered: &[ExecutorId]) -> bool {
        let module = job.locality;
        let now = self.now;
        self.executors.iter().any(|(id, e)| {
            e.takes_tasks()
                && !e.health.is_excluded(now)
                && e.modules.contains(&module)
                && !offered.contains(id)
        })
    }
}
