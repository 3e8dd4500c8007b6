//! How an attempt is stopped from outside, and how it is raced against its deadline when
//! it waits in a host call. Apart from running a task because the runner holds the kill
//! flags from launch to status, long before and after a guest runs, and because this is
//! the one place an attempt's futures are driven (on the task thread's own runtime).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// How an attempt is stopped from outside. A computing guest sees the flag at its next
/// epoch check; a guest blocked in a host call never gets there, so the attempt's driver
/// also waits on the wake-up.
#[derive(Debug, Default)]
pub struct Kill {
    flag: AtomicBool,
    wake: tokio::sync::Notify,
}

impl Kill {
    pub fn new() -> Arc<Kill> {
        Arc::new(Kill::default())
    }

    pub fn kill(&self) {
        self.flag.store(true, Ordering::Release);
        // A permit is kept if nobody waits yet, so a kill just before the wait counts.
        self.wake.notify_one();
    }

    pub fn is_killed(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Resolves once the attempt is killed.
    pub async fn killed(&self) {
        while !self.is_killed() {
            self.wake.notified().await;
        }
    }
}

thread_local! {
    /// Drives the guests of one task thread: host calls' futures (timers above all) need
    /// a runtime, and one of the thread's own keeps a guest off the executor's shared
    /// runtime, whose heartbeats must never wait behind a guest.
    static TASK_RUNTIME: tokio::runtime::Runtime = {
        let (started, stopping) = (HELPERS.with(Arc::clone), HELPERS.with(Arc::clone));
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_start(move || started.started())
            .on_thread_stop(move || stopping.stopping())
            .build()
            .expect("building a task thread's runtime")
    };

    /// The helper threads of this task thread's runtime (its blocking pool).
    static HELPERS: Arc<Helpers> = Arc::default();
}

/// The helper threads of one task thread's runtime: a guest that may wait has its file
/// reads done there (see `allow_blocking_current_thread` in `Sandbox::run`), and an
/// attempt is billed for their CPU time as for its own thread's. Only the task thread's
/// attempt uses them (one at a time), so what they do between its start and end is its.
#[derive(Default)]
pub(super) struct Helpers {
    /// Whether any helper ever started: until then an attempt reads no clock of theirs.
    any: AtomicBool,
    clocks: std::sync::Mutex<HelperClocks>,
}

#[derive(Default)]
struct HelperClocks {
    /// The live helpers' CPU clocks, by thread.
    live: Vec<(std::thread::ThreadId, libc::clockid_t)>,
    /// CPU time of the helpers that have exited (the pool lets idle ones go).
    exited_us: u64,
}

impl Helpers {
    /// On a helper thread, as it starts.
    fn started(&self) {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: `pthread_self` is this live thread; `clock` is valid for the call to fill.
        if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } != 0 {
            return;
        }
        self.lock().live.push((std::thread::current().id(), clock));
        self.any.store(true, Ordering::Release);
    }

    /// On a helper thread, as it exits: its clock goes with it, so its time is banked
    /// (under the lock that readers hold while they read the live clocks).
    fn stopping(&self) {
        let spent = thread_cpu_us();
        let id = std::thread::current().id();
        let mut clocks = self.lock();
        clocks.live.retain(|(thread, _)| *thread != id);
        clocks.exited_us += spent;
    }

    fn cpu_us(&self) -> u64 {
        if !self.any.load(Ordering::Acquire) {
            return 0;
        }
        let clocks = self.lock();
        let live: u64 = clocks.live.iter().map(|(_, clock)| cpu_us(*clock)).sum();
        clocks.exited_us + live
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HelperClocks> {
        self.clocks.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The CPU time the calling task thread's helpers have had, in microseconds.
pub fn helper_cpu_us() -> u64 {
    HELPERS.with(|helpers| helpers.cpu_us())
}

/// The CPU time the calling thread has had, in microseconds.
pub fn thread_cpu_us() -> u64 {
    cpu_us(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time on `clock` (a thread's CPU clock), in microseconds; 0 if it cannot be read.
fn cpu_us(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    match unsafe { libc::clock_gettime(clock, &mut now) } {
        0 => now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000,
        _ => 0,
    }
}

/// Drives `future` to its end on this task thread's runtime.
pub(super) fn on_task_runtime<F: Future>(future: F) -> F::Output {
    TASK_RUNTIME.with(|runtime| runtime.block_on(future))
}

/// How an attempt's call ended: on its own (a result, a trap, an exit), or stopped from
/// outside while it waited in a host call.
pub(super) enum Ended {
    Returned(wasmtime::Result<()>),
    Deadline,
    Killed,
}

/// What stopped a call from outside before it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    Deadline,
    Killed,
}

/// Runs `call` until it ends, the deadline passes or the attempt is killed. Only a guest
/// waiting in a host call loses the race: one that computes is interrupted by the epoch
/// and ends on its own. Dropping `call` drops the host call's future with it.
pub(super) async fn bounded(
    call: impl Future<Output = wasmtime::Result<()>>,
    deadline: Instant,
    kill: &Kill,
) -> Ended {
    match raced(call, deadline, kill).await {
        Ok(result) => Ended::Returned(result),
        Err(Stop::Killed) => Ended::Killed,
        Err(Stop::Deadline) => Ended::Deadline,
    }
}

/// [`bounded`] for any future: also what a synchronous host call that waits runs its
/// wait in (see `egress::p1`), since no outer race reaches into a synchronous call.
pub(super) async fn raced<T>(
    call: impl Future<Output = T>,
    deadline: Instant,
    kill: &Kill,
) -> Result<T, Stop> {
    tokio::select! {
        biased;
        result = call => Ok(result),
        () = kill.killed() => Err(Stop::Killed),
        () = tokio::time::sleep_until(deadline.into()) => Err(Stop::Deadline),
    }
}
