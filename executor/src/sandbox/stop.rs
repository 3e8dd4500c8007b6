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
    static TASK_RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a task thread's runtime");
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

/// Runs `call` until it ends, the deadline passes or the attempt is killed. Only a guest
/// waiting in a host call loses the race: one that computes is interrupted by the epoch
/// and ends on its own. Dropping `call` drops the host call's future with it.
pub(super) async fn bounded(
    call: impl Future<Output = wasmtime::Result<()>>,
    deadline: Instant,
    kill: &Kill,
) -> Ended {
    tokio::select! {
        biased;
        result = call => Ended::Returned(result),
        () = kill.killed() => Ended::Killed,
        () = tokio::time::sleep_until(deadline.into()) => Ended::Deadline,
    }
}
