//! Exclusion on failure (Spark's `excludeOnFailure`): what an executor's own failures
//! say about it. Pure bookkeeping; the state decides what to do with the answers.
//!
//! Only failures of the executor itself count: host errors (its disk, its cache, its
//! process; [`FailureKind::blames_executor`]). A fetch error is the source's fault (the
//! job's URL, its server's answer, its digest, its size) and is retried on the job's own
//! `max_failures` without counting here: otherwise one job naming bad URLs would exclude
//! every executor and fail every job after it. A guest's own failure says nothing about
//! the executor, and a lost executor is gone anyway.
//!
//! [`FailureKind::blames_executor`]: flint_protocol::FailureKind::blames_executor

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use flint_protocol::{ExecutorId, TaskId};

/// The numbers behind exclusion; [`ExclusionConfig::default`] holds the documented ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExclusionConfig {
    /// A task that failed this many times on one executor never runs there again
    /// (Spark's `maxTaskAttemptsPerExecutor`, here 2).
    pub task_failures_per_executor: usize,
    /// An executor on which this many distinct tasks failed within `window` ...
    pub executor_failures: usize,
    pub window: Duration,
    /// ... takes no task at all for this long.
    pub period: Duration,
}

impl Default for ExclusionConfig {
    fn default() -> Self {
        ExclusionConfig {
            task_failures_per_executor: 2,
            executor_failures: 4,
            window: Duration::from_secs(60),
            period: Duration::from_secs(60),
        }
    }
}

/// One executor's recent host errors and the exclusion they earned.
#[derive(Debug, Default)]
pub struct ExecutorHealth {
    recent: VecDeque<(Instant, TaskId)>,
    pub excluded_until: Option<Instant>,
}

impl ExecutorHealth {
    /// Records a failure of `task` at `now`; returns true when it excludes the executor.
    pub fn record_failure(&mut self, config: &ExclusionConfig, task: TaskId, now: Instant) -> bool {
        self.recent
            .retain(|(at, _)| now.saturating_duration_since(*at) <= config.window);
        self.recent.push_back((now, task));
        let mut distinct: Vec<&TaskId> = self.recent.iter().map(|(_, t)| t).collect();
        distinct.sort();
        distinct.dedup();
        if distinct.len() >= config.executor_failures && !self.is_excluded(now) {
            self.excluded_until = Some(now + config.period);
            self.recent.clear();
            return true;
        }
        false
    }

    pub fn is_excluded(&self, now: Instant) -> bool {
        self.excluded_until.is_some_and(|until| now < until)
    }

    /// Failures that still count towards an exclusion.
    pub fn recent_failures(&self, config: &ExclusionConfig, now: Instant) -> usize {
        self.recent
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= config.window)
            .count()
    }
}

/// Whether `executor` failed a task often enough (per `failed_on`, one entry per host
/// error there) to be excluded for it.
pub fn excluded_for_task(
    config: &ExclusionConfig,
    failed_on: &[ExecutorId],
    executor: &ExecutorId,
) -> bool {
    failed_on.iter().filter(|e| *e == executor).count() >= config.task_failures_per_executor
}

#[cfg(test)]
mod tests {
    use flint_protocol::JobId;

    use super::*;

    fn task(index: u32) -> TaskId {
        TaskId {
            job: JobId("j".into()),
            index,
        }
    }

    #[test]
    fn distinct_task_failures_within_the_window_exclude_for_a_period() {
        let config = ExclusionConfig::default();
        let mut health = ExecutorHealth::default();
        let t0 = Instant::now();
        // The same task failing again and again is the task's problem, not the executor's.
        for _ in 0..5 {
            assert!(!health.record_failure(&config, task(0), t0));
        }
        for i in 1..3 {
            assert!(!health.record_failure(&config, task(i), t0));
        }
        assert!(health.record_failure(&config, task(3), t0 + Duration::from_secs(1)));
        assert!(health.is_excluded(t0 + Duration::from_secs(60)));
        assert!(!health.is_excluded(t0 + Duration::from_secs(61)));
    }

    #[test]
    fn failures_older_than_the_window_do_not_count() {
        let config = ExclusionConfig::default();
        let mut health = ExecutorHealth::default();
        let t0 = Instant::now();
        for i in 0..3 {
            health.record_failure(&config, task(i), t0);
        }
        let later = t0 + config.window + Duration::from_secs(1);
        assert!(!health.record_failure(&config, task(3), later));
        assert_eq!(health.recent_failures(&config, later), 1);
    }

    #[test]
    fn a_task_is_excluded_from_an_executor_after_two_failures_there() {
        let config = ExclusionConfig::default();
        let (a, b) = (ExecutorId("a".into()), ExecutorId("b".into()));
        assert!(!excluded_for_task(&config, &[a.clone(), b.clone()], &a));
        assert!(excluded_for_task(&config, &[a.clone(), b, a.clone()], &a));
    }
}
