//! What a runner counts: its heartbeat's figures, and the CPU time of its task threads
//! (per attempt for its usage, in total for the heartbeat).

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use flint_protocol::messages::Heartbeat;

use super::TaskRunner;
use crate::sandbox;

impl TaskRunner {
    pub fn heartbeat(&self) -> Heartbeat {
        let ends = self.ends.figures();
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
            ends_held: ends.held,
            ends_memory_bytes: ends.memory_bytes,
            ends_disk_bytes: ends.disk_bytes,
            ends_peak_memory_bytes: ends.peak_memory_bytes,
            ends_peak_disk_bytes: ends.peak_disk_bytes,
            ends_waited: ends.waited,
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

/// The CPU time of one attempt, from its own start to its own end, on every thread that
/// worked for it: the task thread, and the helper threads of the task thread's own
/// runtime, where a guest's file reads go when it may wait (`allow_blocking_current_thread`
/// off). The time between attempts (reporting one, waiting for the next) is nobody's.
/// Two clock reads per attempt on the task thread (a system call each: about a third of
/// a microsecond here); the helpers' clocks are read only once the thread has started any.
pub(super) struct AttemptCpu {
    thread_us: u64,
    helpers_us: u64,
}

impl AttemptCpu {
    pub(super) fn start() -> Self {
        AttemptCpu {
            thread_us: sandbox::thread_cpu_us(),
            helpers_us: sandbox::helper_cpu_us(),
        }
    }

    /// The CPU time spent since [`AttemptCpu::start`], in microseconds.
    pub(super) fn spent_us(&self) -> u64 {
        let thread = sandbox::thread_cpu_us().saturating_sub(self.thread_us);
        let helpers = sandbox::helper_cpu_us().saturating_sub(self.helpers_us);
        thread + helpers
    }
}

/// The calling thread's schedstat file, by its own id (`/proc/thread-self` names the
/// thread as `<pid>/task/<tid>`).
pub(super) fn thread_schedstat() -> Option<PathBuf> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    let path = std::path::Path::new("/proc").join(link).join("schedstat");
    path.exists().then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Burns `us` of this thread's CPU time.
    fn spin(us: u64) {
        let from = sandbox::thread_cpu_us();
        while sandbox::thread_cpu_us() < from + us {}
    }

    #[test]
    fn an_attempt_is_billed_from_its_own_start_to_its_own_end() {
        // The work before it (the last attempt's tail, its report) is not its.
        spin(60_000);
        let cpu = AttemptCpu::start();
        spin(20_000);
        let spent = cpu.spent_us();
        assert!((20_000..60_000).contains(&spent), "{spent} us");
    }
}
