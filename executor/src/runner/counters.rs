//! What a runner counts: its heartbeat's figures, and the CPU time of its task threads
//! (per attempt for its usage, in total for the heartbeat).

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use flint_protocol::messages::Heartbeat;

use super::TaskRunner;

impl TaskRunner {
    pub fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            running: self.attempts_in_flight() as u32,
            modules_compiled: self.modules_compiled.load(Ordering::Relaxed),
            module_cache_hits: self.module_cache_hits.load(Ordering::Relaxed),
            fetch_hits: self.fetch_hits.load(Ordering::Relaxed),
            fetch_misses: self.fetch_misses.load(Ordering::Relaxed),
            compile_cache_hits: self.compile_cache_hits.load(Ordering::Relaxed),
            task_cpu_us: self.task_cpu_us(),
            bytes_fetched: self.bytes_fetched.load(Ordering::Relaxed),
            result_bytes: self.result_bytes.load(Ordering::Relaxed),
            tasks_completed: self.tasks_completed.load(Ordering::Relaxed),
        }
    }

    /// CPU time of the task threads since they started, in microseconds; 0 where the
    /// kernel does not say (no `/proc`, no schedstat).
    fn task_cpu_us(&self) -> u64 {
        let threads = self
            .task_threads
            .lock()
            .expect("task threads lock poisoned")
            .clone();
        threads
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
            .sum::<u64>()
            / 1_000
    }
}

thread_local! {
    /// The task thread's CPU time when its previous attempt was measured.
    static LAST_CPU_US: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// The CPU time the calling task thread had since its previous attempt was measured (or
/// since it started, which calls this once first): the attempt's instantiation, run and
/// the small bookkeeping around it. One clock read per attempt, not two: a read is a system call
/// (`CLOCK_THREAD_CPUTIME_ID` has no vDSO path), about a third of a microsecond here,
/// and a no-op attempt costs the runner about 4 (BENCHMARKS.md, "Accounting"). A thread
/// waiting for work gains no CPU time, so the attempts of a thread add up to its CPU time.
pub(super) fn cpu_since_last_attempt() -> u64 {
    let now = thread_cpu_us();
    let last = LAST_CPU_US.with(|last| last.replace(Some(now)));
    now.saturating_sub(last.unwrap_or(now))
}

/// CPU time the calling thread has had, in microseconds.
pub(super) fn thread_cpu_us() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    match unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } {
        0 => now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000,
        _ => 0,
    }
}

/// The calling thread's schedstat file, by its own id (`/proc/thread-self` names the
/// thread as `<pid>/task/<tid>`).
pub(super) fn thread_schedstat() -> Option<PathBuf> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    let path = std::path::Path::new("/proc").join(link).join("schedstat");
    path.exists().then_some(path)
}
