//! How deep each executor's queue may be: tasks launched beyond its free cores so that
//! its threads never wait a round trip for their next task, sized by the queued jobs'
//! run times, and nothing queued behind a straggler.

use super::*;

impl ClusterState {
    /// The longest moving-average run time among jobs with work to launch whose run
    /// time is known, or `None` if none of them has had an attempt end yet. A job whose
    /// run time is not known yet (it may be slow) queues no deeper than `launch_ahead`
    /// whatever this says (`Offer::ahead_unknown`): it no longer holds every other job's
    /// queue at that depth, which made two jobs submitted together (or a graph's map and
    /// its waiting combine) run at a fifth of one job's rate.
    pub(super) fn slowest_queued_run_time(&self) -> Option<f64> {
        (self.queue.iter())
            .filter_map(|id| self.jobs.get(id)?.run_time_us)
            .reduce(f64::max)
    }

    /// Tasks to keep queued on an executor of `cores` cores beyond its free ones:
    /// `launch_ahead` while no queued job's run time is known, then as many as
    /// `queue_budget` of run time per core, between `launch_ahead` and
    /// `launch_ahead_max`. Short tasks are bound by the round trip to the driver, not the
    /// guest, and only a deep queue hides it. While tenants share the cluster (`shared`)
    /// nothing beyond the budget queues, not even `launch_ahead`: a task queued on an
    /// executor runs before whatever another tenant is owed, so long tasks (and tasks
    /// of unknown length) queue none.
    /// What a job of unknown run time may queue on an executor with `queued` queued
    /// already: up to `launch_ahead` in all (none while tenants share the cluster).
    pub(super) fn queue_depth_unknown(&self, queued: u32, shared: bool) -> u32 {
        match shared {
            true => 0,
            false => self.config.launch_ahead.saturating_sub(queued),
        }
    }

    pub(super) fn queue_depth(&self, cores: u32, slowest_us: Option<f64>, shared: bool) -> u32 {
        let c = &self.config;
        let least = if shared { 0 } else { c.launch_ahead };
        let (Some(slowest), false) = (slowest_us, c.launch_ahead == 0) else {
            return least;
        };
        let fits = c.queue_budget.as_micros() as f64 * f64::from(cores) / slowest.max(1.0);
        (fits as u32).clamp(least, c.launch_ahead_max.max(least))
    }

    /// How long an attempt may have been out (queued, then running) on an executor before
    /// nothing more is queued behind it there: twice the queue budget, plus four times
    /// the run time of the slowest queued job when that is known. An attempt queued
    /// behind others waits about one queue budget; a run of several times the average is
    /// a straggler, and what queues behind it waits for it.
    pub(super) fn straggler_age(&self, slowest_us: Option<f64>) -> Duration {
        let budget = self.config.queue_budget * 2;
        match slowest_us {
            Some(us) => budget + Duration::from_secs_f64(us.max(0.0) * 4.0 / 1e6),
            None => budget,
        }
    }
}
