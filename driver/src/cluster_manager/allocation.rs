//! Dynamic allocation: how many executors the work wants (Spark's
//! ExecutorAllocationManager). Pure: the caller passes the demand, the executors' idle
//! times and the clock, and carries out the target and the removals.
//!
//! - Tasks pending for `backlog_timeout` raise the target by 1, then 2, 4, ... each
//!   further `backlog_timeout` the backlog lasts, never past what the pending and
//!   running tasks can use, nor `max`.
//! - When the work needs fewer, the target falls to what it needs (not below `min`):
//!   nothing is killed for that, but executors idle for `idle_timeout` above the target
//!   are removed, the longest idle first. An executor running or holding a task is
//!   never idle.
//!
//! Results live in the driver's store, not on executors, so unlike Spark no shuffle
//! or cached-block tracking holds an idle executor back.

use std::time::{Duration, Instant};

use flint_protocol::ExecutorId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationLimits {
    pub min: u32,
    pub max: u32,
    pub initial: u32,
    pub executor_cores: u32,
    pub backlog_timeout: Duration,
    pub idle_timeout: Duration,
}

/// What the scheduler holds: cores of pending tasks and of running ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    pub pending_cores: u64,
    pub running_cores: u64,
}

pub struct Allocation {
    limits: AllocationLimits,
    target: u32,
    /// Since when tasks have been pending, and when the target may next rise.
    backlog_since: Option<Instant>,
    next_raise: Option<Instant>,
    to_add: u32,
}

impl Allocation {
    pub fn new(limits: AllocationLimits) -> Self {
        let initial = limits.initial.clamp(limits.min, limits.max);
        Allocation {
            limits,
            target: initial,
            backlog_since: None,
            next_raise: None,
            to_add: 1,
        }
    }

    pub fn target(&self) -> u32 {
        self.target
    }

    /// Executors the demand can keep busy.
    fn needed(&self, demand: Demand) -> u32 {
        let cores = demand.pending_cores + demand.running_cores;
        let per = u64::from(self.limits.executor_cores.max(1));
        cores.div_ceil(per).min(u64::from(u32::MAX)) as u32
    }

    /// A new target from the demand now.
    pub fn update(&mut self, demand: Demand, now: Instant) -> u32 {
        let needed = self.needed(demand).clamp(self.limits.min, self.limits.max);
        if demand.pending_cores == 0 {
            self.backlog_since = None;
            self.next_raise = None;
            self.to_add = 1;
        } else if self.backlog_since.is_none() {
            self.backlog_since = Some(now);
            self.next_raise = Some(now + self.limits.backlog_timeout);
        }
        if self.next_raise.is_some_and(|at| now >= at) && self.target < needed {
            self.target = (self.target.saturating_add(self.to_add)).min(needed);
            self.to_add = self.to_add.saturating_mul(2);
            self.next_raise = Some(now + self.limits.backlog_timeout);
        }
        if self.target > needed {
            self.target = needed;
        }
        self.target
    }

    /// When `update` may next raise the target, for the caller's timer.
    pub fn next_raise(&self) -> Option<Instant> {
        self.next_raise
    }

    /// Of `idle` (executors with nothing running or queued, and for how long), those to
    /// remove: idle past the timeout, as many as `live` exceeds the target, longest
    /// idle first.
    pub fn removals(&self, live: u32, idle: &[(ExecutorId, Duration)]) -> Vec<ExecutorId> {
        let excess = live.saturating_sub(self.target.max(self.limits.min)) as usize;
        let mut candidates: Vec<&(ExecutorId, Duration)> = idle
            .iter()
            .filter(|(_, for_)| *for_ >= self.limits.idle_timeout)
            .collect();
        candidates.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        candidates
            .into_iter()
            .take(excess)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> AllocationLimits {
        AllocationLimits {
            min: 0,
            max: 6,
            initial: 0,
            executor_cores: 1,
            backlog_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(60),
        }
    }

    fn pending(n: u64) -> Demand {
        Demand {
            pending_cores: n,
            running_cores: 0,
        }
    }

    #[test]
    fn a_backlog_raises_the_target_doubling_each_round_up_to_the_need_and_the_max() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut a = Allocation::new(limits());
        assert_eq!(
            a.update(pending(2000), t0),
            0,
            "not before the backlog timeout"
        );
        assert_eq!(a.next_raise(), Some(t0 + s));
        assert_eq!(a.update(pending(2000), t0 + s), 1);
        assert_eq!(
            a.update(pending(2000), t0 + s + s / 2),
            1,
            "one raise a round"
        );
        assert_eq!(a.update(pending(2000), t0 + 2 * s), 3);
        assert_eq!(
            a.update(pending(2000), t0 + 3 * s),
            6,
            "4 more, capped by max"
        );
        assert_eq!(a.update(pending(2000), t0 + 4 * s), 6);
        // The backlog gone, running tasks hold what they use.
        let running = Demand {
            pending_cores: 0,
            running_cores: 4,
        };
        assert_eq!(a.update(running, t0 + 5 * s), 4);
        assert_eq!(a.update(Demand::default(), t0 + 6 * s), 0);
        assert_eq!(a.next_raise(), None);
    }

    #[test]
    fn the_target_never_passes_what_the_tasks_can_use() {
        let t0 = Instant::now();
        let mut a = Allocation::new(AllocationLimits {
            executor_cores: 4,
            max: 100,
            ..limits()
        });
        for i in 1..10 {
            a.update(pending(9), t0 + Duration::from_secs(i));
        }
        assert_eq!(a.target(), 3, "9 one-core tasks fill 3 four-core executors");
    }

    #[test]
    fn idle_executors_above_the_target_go_longest_idle_first_never_below_min() {
        let a = Allocation::new(AllocationLimits {
            min: 1,
            initial: 1,
            ..limits()
        });
        let idle = [
            (ExecutorId("exec-1".into()), Duration::from_secs(61)),
            (ExecutorId("exec-2".into()), Duration::from_secs(90)),
            (ExecutorId("exec-3".into()), Duration::from_secs(59)),
        ];
        // Four live, target 1 (the min): three could go, but exec-3 is not idle long enough.
        let gone = a.removals(4, &idle);
        let ids: Vec<&str> = gone.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(ids, ["exec-2", "exec-1"]);
        // Two live: only one above the min.
        assert_eq!(a.removals(2, &idle).len(), 1);
        assert!(a.removals(1, &idle).is_empty());
    }

    #[test]
    fn initial_is_held_to_the_limits() {
        let a = Allocation::new(AllocationLimits {
            min: 2,
            max: 4,
            initial: 9,
            ..limits()
        });
        assert_eq!(a.target(), 4);
        let a = Allocation::new(AllocationLimits {
            min: 2,
            max: 4,
            initial: 0,
            ..limits()
        });
        assert_eq!(a.target(), 2);
    }
}
