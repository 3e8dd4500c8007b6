//! The cluster over the last minutes, for the web UI's utilisation chart: one sample a
//! second of the running tasks, busy and total cores, live executors and pending
//! tasks, kept in memory (a ring; a restarted driver starts it afresh).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use flint_protocol::api::{ClusterHistory, ClusterSample, ExecutorState};

use crate::scheduler::ClusterState;

/// How often a sample is taken.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept: 15 minutes of them, about 40 bytes each.
pub const SAMPLES: usize = 900;

#[derive(Default)]
pub struct History {
    samples: Mutex<VecDeque<ClusterSample>>,
}

impl History {
    pub fn record(&self, sample: ClusterSample) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    pub fn view(&self) -> ClusterHistory {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        ClusterHistory {
            interval_ms: INTERVAL.as_millis() as u64,
            samples: samples.iter().copied().collect(),
        }
    }
}

/// The cluster as it is now.
pub fn sample(state: &ClusterState, now: SystemTime) -> ClusterSample {
    let mut s = ClusterSample {
        t_ms: now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        running_tasks: 0,
        busy_cores: 0,
        cores: 0,
        executors: 0,
        pending_tasks: 0,
    };
    for e in state
        .executors
        .values()
        .filter(|e| e.state == ExecutorState::Alive)
    {
        s.executors += 1;
        s.cores += e.cores;
        s.busy_cores += e.cores.saturating_sub(e.free_cores);
        s.running_tasks += e.running.len() as u32;
    }
    s.pending_tasks = state
        .jobs
        .values()
        .filter(|j| !j.state.is_final())
        .map(|j| u64::from(j.counts.pending))
        .sum();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_latest_samples_oldest_first() {
        let history = History::default();
        for t in 0..(SAMPLES as u64 + 5) {
            history.record(ClusterSample {
                t_ms: t,
                running_tasks: 0,
                busy_cores: 0,
                cores: 0,
                executors: 0,
                pending_tasks: 0,
            });
        }
        let view = history.view();
        assert_eq!(view.samples.len(), SAMPLES);
        assert_eq!(view.samples.first().unwrap().t_ms, 5);
        assert_eq!(view.samples.last().unwrap().t_ms, SAMPLES as u64 + 4);
    }
}
