//! The counters fed as things happen (task ends, deletions, adoptions), as `/metrics`
//! lists them after the state's figures.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::{DROP_REASONS, DURATION_BUCKETS, Metrics, family};

/// The rest of `/metrics`, appended to `out`: the counters fed as tasks end, and the job
/// store's group `commits`. Needs no lock.
pub fn render_counters(out: &mut String, metrics: &Metrics, commits: u64) {
    let m = metrics;
    family(
        out,
        "flint_task_duration_seconds",
        "histogram",
        "Guest run time of tasks that succeeded or failed (executor clock).",
    );
    let mut cumulative = 0;
    for (i, bound) in DURATION_BUCKETS.iter().enumerate() {
        cumulative += m.duration_buckets[i].load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "flint_task_duration_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
        );
    }
    cumulative += m.duration_buckets[DURATION_BUCKETS.len()].load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "flint_task_duration_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
    );
    let sum = m.duration_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
    let _ = writeln!(out, "flint_task_duration_seconds_sum {sum}");
    let _ = writeln!(
        out,
        "flint_task_duration_seconds_count {}",
        m.duration_count.load(Ordering::Relaxed)
    );
    family(
        out,
        "flint_result_bytes_total",
        "counter",
        "Bytes of task results received.",
    );
    let _ = writeln!(
        out,
        "flint_result_bytes_total {}",
        m.result_bytes.load(Ordering::Relaxed)
    );
    family(
        out,
        "flint_results_total",
        "counter",
        "Task results received.",
    );
    let _ = writeln!(
        out,
        "flint_results_total {}",
        m.results.load(Ordering::Relaxed)
    );
    family(
        out,
        "flint_job_store_commits_total",
        "counter",
        "Group commits of task and job ends to the job store (at most one per --commit-interval-ms).",
    );
    let _ = writeln!(out, "flint_job_store_commits_total {}", commits);
    family(
        out,
        "flint_jobs_deleted_total",
        "counter",
        "Jobs deleted, by request (DELETE /v1/jobs/{id}) or by --job-retention.",
    );
    let _ = writeln!(
        out,
        "flint_jobs_deleted_total {}",
        m.jobs_deleted.load(Ordering::Relaxed)
    );
    family(
        out,
        "flint_attempts_adopted_total",
        "counter",
        "Attempts an executor kept running through a lost connection or a driver restart, taken back as their tasks' running attempts.",
    );
    let _ = writeln!(
        out,
        "flint_attempts_adopted_total {}",
        m.attempts_adopted.load(Ordering::Relaxed)
    );
    family(
        out,
        "flint_attempts_dropped_total",
        "counter",
        "Attempts an executor listed when it registered again that were killed or whose end was ignored, by reason.",
    );
    for (reason, n) in DROP_REASONS.iter().zip(&m.attempts_dropped) {
        let _ = writeln!(
            out,
            "flint_attempts_dropped_total{{reason=\"{}\"}} {}",
            reason.as_str(),
            n.load(Ordering::Relaxed)
        );
    }
}
