//! Prometheus metrics for `GET /metrics` (text format 0.0.4): the scheduler's figures,
//! read from the state at scrape time, plus what only the moment of a task's end knows
//! (its duration, its result size), counted as it happens. Per executor, the figures
//! its heartbeats carry: Spark's ExecutorSource in Prometheus form.
//!
//! Written by hand rather than with `prometheus-client`: that crate encodes OpenMetrics
//! (`application/openmetrics-text`, a closing `# EOF`, its own `_total` and unit rules),
//! which changes the exposition scrapers and `tests/e2e/metrics.rs` read today (text format
//! 0.0.4); and most figures here are read from the state at scrape time, which it would
//! take a custom collector per family to express.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use flint_protocol::api::{AllocationView, ExecutorState, JobState, TaskState};

use crate::scheduler::{ClusterState, Dropped, Task};
use crate::store::Totals;
use crate::store::usage::DataDirUsage;

mod counters;
mod per_tenant;
mod usage;

pub use counters::render_counters;

/// Upper bounds of the task duration buckets, in seconds.
const DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// Counters fed as tasks end; everything else is read from the state when scraped.
#[derive(Default)]
pub struct Metrics {
    /// Per bucket (not cumulative), plus one past the last bound.
    duration_buckets: [AtomicU64; DURATION_BUCKETS.len() + 1],
    duration_sum_us: AtomicU64,
    duration_count: AtomicU64,
    result_bytes: AtomicU64,
    results: AtomicU64,
    jobs_deleted: AtomicU64,
    /// Attempts executors kept through a lost connection or a driver's restart: adopted,
    /// and dropped by reason (in the order of `DROP_REASONS`).
    attempts_adopted: AtomicU64,
    attempts_dropped: [AtomicU64; DROP_REASONS.len()],
}

/// The reasons an attempt listed at registration is dropped, as `/metrics` labels them.
const DROP_REASONS: [Dropped; 6] = [
    Dropped::JobGone,
    Dropped::NoSuchTask,
    Dropped::TaskEnded,
    Dropped::RunsElsewhere,
    Dropped::TaskWaiting,
    Dropped::EndApplied,
];

impl Metrics {
    /// Records a job deleted (by request or by retention).
    pub fn job_deleted(&self) {
        self.jobs_deleted.fetch_add(1, Ordering::Relaxed);
    }

    /// Records an attempt listed at registration: adopted, or dropped for a reason.
    pub fn attempt_reconciled(&self, dropped: Option<Dropped>) {
        match dropped {
            None => self.attempts_adopted.fetch_add(1, Ordering::Relaxed),
            Some(why) => {
                let at = DROP_REASONS.iter().position(|r| *r == why).unwrap_or(0);
                self.attempts_dropped[at].fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    /// Records a task that reached `succeeded` or `failed`.
    pub fn task_ended(&self, task: &Task) {
        if let (Some(start), Some(end)) = (task.started_at_us, task.finished_at_us) {
            let micros = end.saturating_sub(start);
            let seconds = micros as f64 / 1e6;
            let bucket = DURATION_BUCKETS
                .iter()
                .position(|bound| seconds <= *bound)
                .unwrap_or(DURATION_BUCKETS.len());
            self.duration_buckets[bucket].fetch_add(1, Ordering::Relaxed);
            self.duration_sum_us.fetch_add(micros, Ordering::Relaxed);
            self.duration_count.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(result) = &task.result {
            self.result_bytes.fetch_add(result.len(), Ordering::Relaxed);
            self.results.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The first part of `/metrics`: the scheduler's figures, read from `state` as it is
/// now (the caller holds the scheduler's lock for this part only).
/// `finished` are the stored finished jobs' figures (the state holds live jobs only) and
/// `archive` the finished jobs held in memory: not yet committed, cached, cached bytes.
// `allow`, not `expect`, while the lint is off by default: an unfulfilled expectation
// would itself warn.
#[allow(
    clippy::too_many_lines,
    reason = "a table of metric families, one entry each in the order /metrics lists \
              them: split, it would only be cut at arbitrary rows"
)]
pub fn render_state(
    state: &ClusterState,
    now: Instant,
    finished: &Totals,
    archive: (usize, usize, usize),
) -> String {
    let mut out = String::new();
    {
        let s = state;
        let mut tasks = finished.tasks;
        let mut jobs = finished.jobs;
        // A final job still in the state (its killed attempts stopping) is among the
        // finished ones already.
        for job in s.jobs.values().filter(|j| !j.state.is_final()) {
            let c = job.counts();
            tasks.pending += c.pending;
            tasks.running += c.running;
            tasks.succeeded += c.succeeded;
            tasks.failed += c.failed;
            tasks.killed += c.killed;
            jobs[JobState::ALL
                .iter()
                .position(|s| *s == job.state)
                .expect("every state is in ALL")] += 1;
        }
        family(
            &mut out,
            "flint_tasks",
            "gauge",
            "Tasks of the jobs the driver holds (live, and finished ones kept in the job store), by state.",
        );
        for (state, n) in TaskState::ALL.into_iter().zip([
            tasks.waiting,
            tasks.pending,
            tasks.running,
            tasks.succeeded,
            tasks.failed,
            tasks.killed,
        ]) {
            let _ = writeln!(out, "flint_tasks{{state=\"{}\"}} {n}", state.as_str());
        }
        family(
            &mut out,
            "flint_queue_depth",
            "gauge",
            "Tasks waiting for a core (pending).",
        );
        let _ = writeln!(out, "flint_queue_depth {}", tasks.pending);
        family(
            &mut out,
            "flint_jobs",
            "gauge",
            "Jobs the driver holds (live, and finished ones kept in the job store), by state.",
        );
        for (state, n) in JobState::ALL.into_iter().zip(jobs) {
            let _ = writeln!(out, "flint_jobs{{state=\"{}\"}} {n}", state.as_str());
        }
        family(
            &mut out,
            "flint_finished_jobs_in_memory",
            "gauge",
            "Finished jobs held in memory: `unsaved` until their end is committed, `cached` read or finished recently.",
        );
        let (unsaved, cached, cached_bytes) = archive;
        let _ = writeln!(
            out,
            "flint_finished_jobs_in_memory{{kind=\"unsaved\"}} {unsaved}"
        );
        let _ = writeln!(
            out,
            "flint_finished_jobs_in_memory{{kind=\"cached\"}} {cached}"
        );
        family(
            &mut out,
            "flint_finished_jobs_cache_bytes",
            "gauge",
            "About how many bytes the cache of finished jobs holds.",
        );
        let _ = writeln!(out, "flint_finished_jobs_cache_bytes {cached_bytes}");

        let mut by_state = [0u64; ExecutorState::ALL.len()];
        let (mut cores, mut free) = (0u64, 0u64);
        for e in s.executors.values() {
            by_state[ExecutorState::ALL
                .iter()
                .position(|s| *s == e.state)
                .expect("every state is in ALL")] += 1;
            if e.state == ExecutorState::Alive {
                cores += u64::from(e.cores);
                free += u64::from(e.free_cores);
            }
        }
        family(&mut out, "flint_executors", "gauge", "Executors, by state.");
        for (state, n) in ExecutorState::ALL.into_iter().zip(by_state) {
            let _ = writeln!(out, "flint_executors{{state=\"{}\"}} {n}", state.as_str());
        }
        family(
            &mut out,
            "flint_cores",
            "gauge",
            "Cores of alive executors.",
        );
        let _ = writeln!(out, "flint_cores {cores}");
        family(
            &mut out,
            "flint_cores_free",
            "gauge",
            "Free cores of alive executors.",
        );
        let _ = writeln!(out, "flint_cores_free {free}");

        type Figure = fn(&crate::scheduler::ExecutorData, Instant) -> String;
        let per_executor: [(&str, &str, &str, Figure); 15] = [
            (
                "flint_executor_cores",
                "gauge",
                "An executor's cores.",
                |e, _| e.cores.to_string(),
            ),
            (
                "flint_executor_free_cores",
                "gauge",
                "An executor's free cores, as the scheduler sees them.",
                |e, _| e.free_cores.to_string(),
            ),
            (
                "flint_executor_running_tasks",
                "gauge",
                "Task attempts running or queued on an executor, from its heartbeat.",
                |e, _| e.reported.running.to_string(),
            ),
            (
                "flint_executor_modules_compiled_total",
                "counter",
                "Modules an executor compiled, from its heartbeat.",
                |e, _| e.reported.modules_compiled.to_string(),
            ),
            (
                "flint_executor_module_cache_hits_total",
                "counter",
                "Tasks that found their module already compiled, from an executor's heartbeat.",
                |e, _| e.reported.module_cache_hits.to_string(),
            ),
            (
                "flint_executor_compile_cache_hits_total",
                "counter",
                "Modules an executor loaded compiled from its disk cache instead of compiling them, from its heartbeat.",
                |e, _| e.reported.compile_cache_hits.to_string(),
            ),
            (
                "flint_executor_fetch_cache_hits_total",
                "counter",
                "Fetches (modules, files, inputs) an executor served from its fetch cache, from its heartbeat.",
                |e, _| e.reported.fetch_hits.to_string(),
            ),
            (
                "flint_executor_fetch_cache_misses_total",
                "counter",
                "Fetches an executor had to download, from its heartbeat.",
                |e, _| e.reported.fetch_misses.to_string(),
            ),
            (
                "flint_executor_task_cpu_seconds_total",
                "counter",
                "CPU time of an executor's task threads, from its heartbeat.",
                |e, _| format!("{:.6}", e.reported.task_cpu_us as f64 / 1e6),
            ),
            (
                "flint_executor_fetched_bytes_total",
                "counter",
                "Bytes an executor downloaded into its fetch cache, from its heartbeat.",
                |e, _| e.reported.bytes_fetched.to_string(),
            ),
            (
                "flint_executor_result_bytes_total",
                "counter",
                "Bytes of the results an executor's tasks produced (inline or in blocks), from its heartbeat.",
                |e, _| e.reported.result_bytes.to_string(),
            ),
            (
                "flint_executor_tasks_completed_total",
                "counter",
                "Attempts an executor reported the end of, from its heartbeat.",
                |e, _| e.reported.tasks_completed.to_string(),
            ),
            (
                "flint_executor_ends_held",
                "gauge",
                "Task ends an executor holds until the driver has committed them, from its heartbeat.",
                |e, _| e.reported.ends_held.to_string(),
            ),
            (
                "flint_executor_tasks_finished_total",
                "counter",
                "Task attempts an executor finished.",
                |e, _| e.tasks_finished.to_string(),
            ),
            (
                "flint_executor_heartbeat_age_seconds",
                "gauge",
                "Seconds since an executor's last heartbeat or frame.",
                |e, now| {
                    format!(
                        "{:.3}",
                        now.saturating_duration_since(e.last_heartbeat)
                            .as_secs_f64()
                    )
                },
            ),
        ];
        for (name, kind, help, figure) in per_executor {
            family(&mut out, name, kind, help);
            for (id, e) in &s.executors {
                let _ = writeln!(
                    out,
                    "{name}{{executor=\"{}\"}} {}",
                    escape(&id.0),
                    figure(e, now)
                );
            }
        }
        let h = &s.launch_to_status;
        family(
            &mut out,
            "flint_task_launch_to_status_seconds",
            "histogram",
            "From the scheduler's launch of an attempt to its handling of the attempt's status (the wire both ways, the executor's queue and run).",
        );
        for (bound, n) in h.exported_cumulative() {
            let le = bound.map_or_else(|| "+Inf".to_owned(), |us| (us as f64 / 1e6).to_string());
            let _ = writeln!(
                out,
                "flint_task_launch_to_status_seconds_bucket{{le=\"{le}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "flint_task_launch_to_status_seconds_sum {}",
            h.sum().as_secs_f64()
        );
        let _ = writeln!(
            out,
            "flint_task_launch_to_status_seconds_count {}",
            h.count()
        );
    }
    usage::render(&mut out, state);
    per_tenant::render(&mut out, state);
    out
}

/// The data dir's figure against its quota, appended to `out`. Needs no lock.
/// What the cluster manager is asked for and has, when there is one (dynamic
/// allocation's figures).
pub fn render_allocation(out: &mut String, allocation: Option<&AllocationView>) {
    let Some(a) = allocation else {
        return;
    };
    family(
        out,
        "flint_allocation_executors",
        "gauge",
        "Executors of the driver's cluster manager: wanted (target), launching, running, idle (running, no task), decommissioning.",
    );
    for (kind, n) in [
        ("target", a.target),
        ("launching", a.launching),
        ("running", a.running),
        ("idle", a.idle),
        ("decommissioning", a.decommissioning),
    ] {
        let _ = writeln!(out, "flint_allocation_executors{{kind=\"{kind}\"}} {n}");
    }
    family(
        out,
        "flint_allocation_recent_failures",
        "gauge",
        "Executors that failed within --executor-failures-interval-ms.",
    );
    let _ = writeln!(
        out,
        "flint_allocation_recent_failures {}",
        a.recent_failures
    );
    family(
        out,
        "flint_allocation_gave_up",
        "gauge",
        "1 once the driver stopped launching executors (--max-executor-failures).",
    );
    let _ = writeln!(
        out,
        "flint_allocation_gave_up {}",
        u8::from(a.gave_up.is_some())
    );
}

pub fn render_data_dir(out: &mut String, usage: &DataDirUsage) {
    family(
        out,
        "flint_data_dir_bytes",
        "gauge",
        "Bytes the driver holds in its data dir (modules, files, its own blocks, the job store), as counted against --data-dir-max-bytes.",
    );
    let _ = writeln!(out, "flint_data_dir_bytes {}", usage.used());
    family(
        out,
        "flint_data_dir_max_bytes",
        "gauge",
        "The data dir's quota (--data-dir-max-bytes); 0: none.",
    );
    let _ = writeln!(
        out,
        "flint_data_dir_max_bytes {}",
        usage.limit().unwrap_or(0)
    );
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as the text format wants it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("a\nb"), "a\\nb");
    }
}
