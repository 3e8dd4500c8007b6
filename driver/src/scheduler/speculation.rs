//! Speculative execution (Spark's `spark.speculation`), off unless asked for: a task
//! running far longer than its finished siblings gets a second attempt elsewhere, and
//! whichever finishes first wins.

use std::time::Duration;

/// When a running task is slow enough to copy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpeculationConfig {
    /// Fraction of a job's tasks that must have succeeded before any of its tasks is
    /// copied (Spark's `spark.speculation.quantile`, 0.75).
    pub quantile: f64,
    /// How many times the median of the succeeded tasks' run times a task must have
    /// run to be copied (Spark's `spark.speculation.multiplier`, 1.5).
    pub multiplier: f64,
    /// Tasks that have run less than this are never copied (Spark's
    /// `spark.speculation.minTaskRuntime`, 100 ms).
    pub min_runtime: Duration,
    /// How often running tasks are checked (Spark's `spark.speculation.interval`).
    pub interval: Duration,
}

impl Default for SpeculationConfig {
    fn default() -> Self {
        SpeculationConfig {
            quantile: 0.75,
            multiplier: 1.5,
            min_runtime: Duration::from_millis(100),
            interval: Duration::from_millis(100),
        }
    }
}

impl SpeculationConfig {
    /// How long a task of a job may run before it is copied: `None` while too few of
    /// the job's `total` tasks have succeeded. `durations` are the succeeded tasks' run
    /// times (reordered).
    pub fn threshold(&self, total: usize, durations: &mut [Duration]) -> Option<Duration> {
        let needed = ((self.quantile * total as f64).floor() as usize).max(1);
        if durations.is_empty() || durations.len() < needed {
            return None;
        }
        let middle = durations.len() / 2;
        let (_, median, _) = durations.select_nth_unstable(middle);
        Some(median.mul_f64(self.multiplier).max(self.min_runtime))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn no_threshold_until_the_quantile_of_tasks_has_succeeded() {
        let config = SpeculationConfig::default();
        assert_eq!(config.threshold(8, &mut ms(&[400; 5])), None);
        assert_eq!(
            config.threshold(8, &mut ms(&[400, 200, 400, 900, 400, 400])),
            Some(Duration::from_millis(600))
        );
    }

    #[test]
    fn fast_siblings_give_the_minimum_run_time() {
        let config = SpeculationConfig::default();
        assert_eq!(
            config.threshold(4, &mut ms(&[1, 1, 2])),
            Some(config.min_runtime)
        );
        assert_eq!(config.threshold(4, &mut []), None);
    }
}
