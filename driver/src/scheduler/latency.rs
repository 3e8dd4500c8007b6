//! Launch-to-status times: from the change that launched an attempt to the change that
//! took its status, both by the scheduler's clock. The wire both ways, the executor's
//! queue and run, and the driver's own reading and batching are all in it; the scale
//! benchmark (`flint bench --simulated-executors`) reads its quantiles and `/metrics`
//! exports it as a histogram.

use std::time::Duration;

/// Buckets per power of two: each is at most 1/8 of its lower edge wide.
const SUB: u64 = 8;
/// Enough for about 2^40 us (12 days); longer ones share the last bucket.
const BUCKETS: usize = 8 * 39;

/// Upper bounds of the buckets `/metrics` shows, in microseconds.
pub const EXPORTED_US: [u64; 14] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
    10_000_000, 60_000_000,
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Log-linear buckets (HDR histogram's layout, 3 bits of precision), for quantiles.
    counts: Vec<u64>,
    /// Per exported bound (not cumulative), plus one past the last.
    exported: [u64; EXPORTED_US.len() + 1],
    total: u64,
    sum_us: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: vec![0; BUCKETS],
            exported: [0; EXPORTED_US.len() + 1],
            total: 0,
            sum_us: 0,
        }
    }
}

fn bucket(us: u64) -> usize {
    if us < SUB {
        return us as usize;
    }
    let octave = u64::from(63 - us.leading_zeros());
    let sub = (us >> (octave - 3)) - SUB;
    ((SUB * (octave - 2) + sub) as usize).min(BUCKETS - 1)
}

/// The smallest value of bucket `b`.
fn lower_edge(b: usize) -> u64 {
    let b = b as u64;
    if b < SUB {
        return b;
    }
    (SUB + b % SUB) << (b / SUB + 2 - 3)
}

impl LatencyHistogram {
    pub fn record(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(us)] += 1;
        let exported = EXPORTED_US
            .iter()
            .position(|&bound| us <= bound)
            .unwrap_or(EXPORTED_US.len());
        self.exported[exported] += 1;
        self.total += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn sum(&self) -> Duration {
        Duration::from_micros(self.sum_us)
    }

    /// Counts per exported bound, cumulative as Prometheus wants them, then the total.
    pub fn exported_cumulative(&self) -> impl Iterator<Item = (Option<u64>, u64)> + '_ {
        let bounds = EXPORTED_US.iter().map(|&b| Some(b)).chain([None]);
        bounds.zip(&self.exported).scan(0, |sum, (bound, &n)| {
            *sum += n;
            Some((bound, *sum))
        })
    }

    /// The `q` quantile (0 to 1) of what was recorded since `earlier` (a copy taken
    /// before), as the upper edge of its bucket: never lower than the true value, at most
    /// an eighth above it. `None` when nothing was recorded in between.
    pub fn quantile_since(&self, earlier: &LatencyHistogram, q: f64) -> Option<Duration> {
        let total = self.total - earlier.total;
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, (now, before)) in self.counts.iter().zip(&earlier.counts).enumerate() {
            seen += now - before;
            if seen >= rank {
                return Some(Duration::from_micros(lower_edge(b + 1)));
            }
        }
        Some(Duration::from_micros(lower_edge(BUCKETS)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_at_most_an_eighth_wide() {
        for b in 0..BUCKETS - 1 {
            let (low, high) = (lower_edge(b), lower_edge(b + 1));
            assert!(high > low, "bucket {b}");
            assert_eq!(bucket(low), b, "lower edge of {b}");
            assert_eq!(bucket(high - 1), b, "upper end of {b}");
            if low >= SUB {
                assert!((high - low) * 8 <= low, "bucket {b} [{low}, {high})");
            }
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_bound_the_true_value_from_above_within_an_eighth() {
        let mut h = LatencyHistogram::default();
        let before = h.clone();
        assert_eq!(h.quantile_since(&before, 0.5), None);
        // 1..=1000 us: the true p50 is 500 us, p99 990 us.
        for us in 1..=1000 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile_since(&before, 0.5).unwrap().as_micros() as f64;
        let p99 = h.quantile_since(&before, 0.99).unwrap().as_micros() as f64;
        assert!((500.0..=500.0 * 1.125).contains(&p50), "{p50}");
        assert!((990.0..=990.0 * 1.125).contains(&p99), "{p99}");
        // Only what came after the copy counts.
        let mid = h.clone();
        for _ in 0..10 {
            h.record(Duration::from_millis(40));
        }
        let p50 = h.quantile_since(&mid, 0.5).unwrap();
        assert!(p50 >= Duration::from_millis(40) && p50 <= Duration::from_millis(45));
        assert_eq!(h.count(), 1010);
        let cumulative: Vec<_> = h.exported_cumulative().collect();
        assert_eq!(cumulative[0], (Some(100), 100));
        assert_eq!(cumulative[3], (Some(1_000), 1000));
        assert_eq!(cumulative[8], (Some(50_000), 1010));
        assert_eq!(cumulative.last(), Some(&(None, 1010)));
    }
}
