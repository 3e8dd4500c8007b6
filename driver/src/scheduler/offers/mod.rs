//! A round of offers, as its phases (quickwit's `scheduling_logic::solve`): the jobs no
//! executor may run failed and preemption's kills made (full rounds only), the queue
//! cut to jobs with work, the executors with room and what each offers (free cores, and
//! queue slots as deep as `queue_depth` says), the queue ordered, what each job asks
//! (`demands`), the placement (plain, or shared between tenants), the locality waits
//! begun and ended, the placements launched (`launch`); then the round's post-conditions
//! checked ([`ClusterState::check_round`]).

use super::*;

mod demands;
mod excluded_jobs;
mod launch;
mod queue_depth;

#[cfg(test)]
mod tests;

/// What a round knows of the queued jobs before it looks at executors.
struct Round {
    /// The longest average run time among jobs with work (see `slowest_queued_run_time`).
    slowest_us: Option<f64>,
    /// How long an attempt may have been out before nothing more queues behind it.
    straggler: Duration,
    /// Tenants share this round ([`ClusterState::shared`]).
    shared: bool,
}

impl ClusterState {
    /// Every live executor offers its free cores; pending tasks are placed by the policy.
    /// Jobs it fails end at the time of the clock the service set.
    pub fn make_offers(&mut self) -> Vec<Action> {
        self.make_offers_at(self.wall, None)
    }

    /// [`Self::make_offers`], with `wall` as the end time of any job it fails; with
    /// `only`, a round for what that one executor gave back. Executors without room are
    /// never offered: at a thousand executors a round that looked at every executor (and
    /// every attempt it runs) for each burst of task ends was the driver's ceiling. A
    /// round for one executor is enough after its tasks end, unless they put work back
    /// (the caller asks for a full round then); the service's tick makes a full round at
    /// least every locality wait, which also picks up whatever a partial one left.
    pub(super) fn make_offers_at(
        &mut self,
        wall: SystemTime,
        only: Option<&ExecutorId>,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        if only.is_none() {
            // Jobs no executor may run change only with failures and with executors
            // coming and going, which all make full rounds.
            self.fail_excluded_jobs(wall, &mut actions);
            self.preempt(&mut actions);
        }
        // Jobs restored after a restart launch nothing while their executors may still
        // be coming back with their attempts (see `reactor::adoption`).
        let (jobs, adopting) = (&self.jobs, &self.adopting);
        self.queue.retain(|id| {
            jobs.get(id).is_some_and(Job::has_work)
                && !adopting.as_ref().is_some_and(|a| a.holds(id))
        });
        if self.queue.is_empty() {
            return actions;
        }
        let round = self.round();
        let ids = self.executors_with_room(only, &round);
        if ids.is_empty() {
            return actions;
        }
        self.order_queue();
        let offers = self.offers(&ids, &round);
        if offers.iter().all(|o| o.free_cores == 0 && o.ahead == 0) {
            return actions;
        }
        let plan = self.plan(&ids, &offers, round.shared);
        self.mark_locality_waits(&plan.waiting_for_locality, only.is_none());
        let launched_from = actions.len();
        self.launch(plan.placements, &ids, wall, &mut actions);
        debug_assert_eq!(
            self.check_round(&ids, &offers, &actions[launched_from..]),
            Ok(())
        );
        actions
    }

    fn round(&self) -> Round {
        let slowest_us = self.slowest_queued_run_time();
        Round {
            slowest_us,
            straggler: self.straggler_age(slowest_us),
            shared: self.shared(),
        }
    }

    /// The executors this round offers, in id order: `only`, or all, that take tasks, are
    /// not excluded, and have a free core or a queue slot.
    fn executors_with_room(&self, only: Option<&ExecutorId>, round: &Round) -> Vec<ExecutorId> {
        let now = self.now;
        let has_room = |e: &ExecutorData| {
            e.takes_tasks()
                && !e.health.is_excluded(now)
                && (e.free_cores > 0
                    || self.queue_depth(e.cores, round.slowest_us, round.shared) > e.queued_ahead)
        };
        match only {
            Some(id) => self
                .executors
                .get(id)
                .filter(|e| has_room(e))
                .map(|_| vec![id.clone()])
                .unwrap_or_default(),
            None => self
                .executors
                .iter()
                .filter(|(_, e)| has_room(e))
                .map(|(id, _)| id.clone())
                .collect(),
        }
    }

    /// In fair mode, the job running the fewest tasks first; otherwise the queue stays in
    /// submission order. (Tenants' shares reorder it again when they apply.)
    fn order_queue(&mut self) {
        if self.config.mode == SchedulingMode::Fair {
            // Keys grow with submission: the oldest wins a tie.
            let jobs = &self.jobs;
            self.queue
                .make_contiguous()
                .sort_by_cached_key(|id| jobs.get(id).map(|j| (j.counts.running, j.key)));
        }
    }

    /// What each executor offers: its free cores, and the queue slots it has left.
    fn offers(&self, ids: &[ExecutorId], round: &Round) -> Vec<Offer> {
        let now = self.now;
        ids.iter()
            .map(|id| {
                let e = &self.executors[id];
                // Queued tasks and a multi-core task would run side by side; tasks queued
                // behind a straggler would wait for it (and hold back the quantile that
                // speculation waits for).
                let no_queue = e.running.values().any(|r| {
                    r.cores > 1 || now.saturating_duration_since(r.since) > round.straggler
                });
                let ahead = match no_queue {
                    true => 0,
                    false => self
                        .queue_depth(e.cores, round.slowest_us, round.shared)
                        .saturating_sub(e.queued_ahead),
                };
                Offer {
                    free_cores: e.free_cores,
                    meters_fuel: e.meters_fuel,
                    usable: true,
                    ahead,
                    ahead_unknown: ahead
                        .min(self.queue_depth_unknown(e.queued_ahead, round.shared)),
                }
            })
            .collect()
    }

    /// Where the queued jobs' tasks go: the plain placement, or the one shared between
    /// tenants (which orders the queue by their shares first).
    fn plan(&mut self, ids: &[ExecutorId], offers: &[Offer], shared: bool) -> policy::Plan {
        let now = self.now;
        match shared {
            true => self.place_shared(offers, |s| s.demands(ids, offers, now)),
            false => policy::place(offers, &self.demands(ids, offers, now)),
        }
    }

    /// Starts the locality wait of each queued job that held tasks back from a cold
    /// executor, and ends it for those that did not (in a full round only: a round for
    /// one executor does not see the cold ones a job may be holding back from).
    fn mark_locality_waits(&mut self, waiting: &[bool], full_round: bool) {
        let now = self.now;
        for (d, waiting) in waiting.iter().enumerate() {
            let job = self
                .jobs
                .get_mut(&self.queue[d])
                .expect("queued jobs exist");
            if !*waiting {
                if full_round {
                    job.locality_wait_since = None;
                }
            } else if job.locality_wait_since.is_none() {
                job.locality_wait_since = Some(now);
            }
        }
    }

    /// What a round must leave true, given the executors it offered (in id order), their
    /// offers and the actions it made: every launch went to an offered executor, to one
    /// its task is not excluded from, and is the task's latest attempt, running there;
    /// no executor gave more cores than it had free, nor queued more than its slots.
    /// Checked after every round in debug builds.
    pub(super) fn check_round(
        &self,
        ids: &[ExecutorId],
        offers: &[Offer],
        actions: &[Action],
    ) -> Result<(), String> {
        let mut cores = vec![0u32; ids.len()];
        for action in actions {
            let Action::Launch {
                executor,
                job,
                launch,
            } = action
            else {
                continue;
            };
            let at = ids
                .binary_search(executor)
                .map_err(|_| format!("a launch on {executor}, which was not offered"))?;
            cores[at] += self.jobs[job].def.resources.cores;
            let task_id = TaskId {
                job: job.clone(),
                index: launch.index,
            };
            let task = &self.jobs[job].tasks[launch.index as usize];
            let running = self.executors[executor].running.get(&task_id);
            if task.state != TaskState::Running
                || task.attempts != launch.attempt
                || running.map(|r| r.attempt) != Some(launch.attempt)
            {
                return Err(format!(
                    "{task_id} attempt {} launched on {executor} is not what runs there",
                    launch.attempt
                ));
            }
            if excluded_for_task(&self.config.exclusion, &task.failed_on, executor) {
                return Err(format!("{task_id} launched on {executor}, excluded for it"));
            }
        }
        for ((id, offer), cores) in ids.iter().zip(offers).zip(cores) {
            let e = &self.executors[id];
            // Only launches take cores in a round, and only 1-core tasks queue: what the
            // launches asked beyond the free cores they took is what they queued.
            let queued = (offer.free_cores.checked_sub(e.free_cores))
                .and_then(|taken| cores.checked_sub(taken));
            if queued.is_none_or(|q| q > offer.ahead) || e.free_cores > e.cores {
                return Err(format!(
                    "{id} was given {cores} cores of launches on {offer:?}, left {} of {} free",
                    e.free_cores, e.cores
                ));
            }
        }
        Ok(())
    }
}
