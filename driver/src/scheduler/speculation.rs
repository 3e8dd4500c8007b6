//! Speculative execution (Spark's `spark.speculation`), off unless asked for: a task
//! running far longer than its finished siblings gets a second attempt elsewhere, and
//! whichever finishes first wins. Here: when a task is slow enough, and the tick's look
//! for such tasks ([`ClusterState::speculate`]); the copy is placed as a constrained task
//! barred from where the task runs (see `policy`).

use std::collections::HashMap;
use std::time::Duration;

use flint_protocol::api::TaskState;
use flint_protocol::{JobId, TaskId};

use super::{Action, ClusterState};

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

impl ClusterState {
    /// Finds running tasks slow enough to copy (see [`SpeculationConfig`]) and launches
    /// copies where cores are free. Nothing when speculation is off.
    pub fn speculate(&mut self) -> Vec<Action> {
        let Some(config) = self.config.speculation else {
            return Vec::new();
        };
        let now = self.now;
        // Attempts that have run long enough to be worth a look, by job.
        let mut slow: HashMap<JobId, Vec<(u32, Duration)>> = HashMap::new();
        let mut copies: HashMap<&TaskId, usize> = HashMap::new();
        for e in self.executors.values() {
            for (task, running) in &e.running {
                *copies.entry(task).or_default() += 1;
                let ran = now.saturating_duration_since(running.since);
                if ran > config.min_runtime {
                    slow.entry(task.job.clone())
                        .or_default()
                        .push((task.index, ran));
                }
            }
        }
        let copies: HashMap<TaskId, usize> =
            copies.into_iter().map(|(t, n)| (t.clone(), n)).collect();
        let mut any = false;
        for (job_id, attempts) in slow {
            let Some(job) = self.jobs.get_mut(&job_id).filter(|j| !j.state.is_final()) else {
                continue;
            };
            let mut durations: Vec<Duration> = job
                .tasks
                .iter()
                .filter(|t| t.state == TaskState::Succeeded)
                .filter_map(|t| Some(t.finished_at_us?.saturating_sub(t.started_at_us?)))
                .map(Duration::from_micros)
                .collect();
            let Some(threshold) = config.threshold(job.tasks.len(), &mut durations) else {
                continue;
            };
            for (index, ran) in attempts {
                let task_id = TaskId {
                    job: job_id.clone(),
                    index,
                };
                if ran > threshold
                    && copies.get(&task_id) == Some(&1)
                    && job.tasks[index as usize].state == TaskState::Running
                    && !job.speculative.contains(&index)
                {
                    tracing::info!(task = %task_id, ?ran, ?threshold, "speculating a slow task");
                    job.speculative.push(index);
                    any = true;
                }
            }
            if any && !self.queue.contains(&job_id) {
                self.queue.push_back(job_id);
            }
        }
        if any { self.make_offers() } else { Vec::new() }
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
