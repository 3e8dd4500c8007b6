//! Requests sent on the caller's own thread and runtime ([`super::EgressClient::send_here`]):
//! no hand-off to the egress runtime and back, which on a loopback server cost more than
//! the request itself (`flint bench --egress`: 0.32x of a native client with the two
//! hand-offs).
//!
//! The pool is the calling thread's: a hyper connection is driven by a task on the
//! runtime that opened it, and only this thread's requests ever reuse it, so it never
//! waits for a runtime that is not being run (the reason the shared client has a runtime
//! of its own). What the caller owes in return: a current_thread runtime runs its tasks
//! only inside `block_on`, so a request dropped before it ended leaves its connection
//! open until the runtime next runs; [`close_abandoned`] is that run, and a caller that
//! stops requests (a kill, a deadline) awaits it before its thread goes idle.
//!
//! Idle connections are bounded per host and per thread ([`IDLE_PER_HOST`]); they expire
//! (reqwest's 90 s) only while the thread's runtime runs, so a thread that goes idle
//! keeps what its last requests left open, at most that bound per host they called.

use std::cell::{Cell, RefCell};
use std::net::IpAddr;
use std::sync::Arc;

use super::exchange::{EgressError, EgressResponse, Prepared, exchange};

/// Idle connections a thread keeps per host: a task's requests in flight at once (its
/// `max_concurrent`, 4 by default) and some room, times the executor's task threads.
pub(super) const IDLE_PER_HOST: usize = 8;

/// Runtime turns [`close_abandoned`] takes at most: a dropped connection's task ends in
/// one or two, so a task still alive after these is a bug to find, not a reason to hold
/// the thread.
const TURNS: usize = 64;

thread_local! {
    static POOL: RefCell<Option<ThreadPool>> = const { RefCell::new(None) };
    /// A request sent here was dropped before it ended: its connection may be open
    /// until this thread's runtime runs again.
    static ABANDONED: Cell<bool> = const { Cell::new(false) };
}

/// This thread's reqwest client for one client and one set of operator-listed addresses
/// (a connection is only reused under the address check it was opened with).
struct ThreadPool {
    owner: u64,
    exact: Arc<[IpAddr]>,
    client: reqwest::Client,
}

/// This thread's client for `owner`'s requests under `exact`, made with `build` when it
/// has none for them yet (replacing the one it had: in practice an executor has one
/// client and one operator's list, so a thread makes one).
pub(super) fn client(
    owner: u64,
    exact: Vec<IpAddr>,
    build: impl FnOnce(Arc<[IpAddr]>) -> Result<reqwest::Client, EgressError>,
) -> Result<reqwest::Client, EgressError> {
    POOL.with_borrow_mut(|pool| {
        if let Some(pool) = pool
            .as_ref()
            .filter(|pool| pool.owner == owner && *pool.exact == *exact)
        {
            return Ok(pool.client.clone());
        }
        let exact: Arc<[IpAddr]> = exact.into();
        let client = build(exact.clone())?;
        *pool = Some(ThreadPool {
            owner,
            exact,
            client: client.clone(),
        });
        Ok(client)
    })
}

/// Sends `prepared` on the caller's runtime; dropped before it ends, it marks the thread
/// for [`close_abandoned`].
pub(super) async fn exchange_here(
    client: reqwest::Client,
    prepared: Prepared,
) -> Result<EgressResponse, EgressError> {
    let armed = Armed;
    let result = exchange(client, prepared).await;
    std::mem::forget(armed);
    result
}

/// Marks the thread when a request is dropped before its end (forgotten at its end).
struct Armed;

impl Drop for Armed {
    fn drop(&mut self) {
        ABANDONED.set(true);
    }
}

/// Closes the connections of this thread's requests that were dropped before they
/// ended, running the caller's runtime until they are: this thread's pool goes (its idle
/// connections with it, the next request opens new ones), and the runtime takes turns
/// until no task is left on it, the dropped requests' connections' included. Returns at
/// once when no request was dropped.
pub async fn close_abandoned() {
    if !ABANDONED.replace(false) {
        return;
    }
    POOL.take();
    let metrics = tokio::runtime::Handle::current().metrics();
    for _ in 0..TURNS {
        if metrics.num_alive_tasks() == 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
}
