//! The executor's one egress client: a pooled reqwest client on a runtime of its own,
//! and one pool per thread for requests sent on the caller's runtime (`inline.rs`).
//!
//! Why a runtime of its own: a pooled hyper connection is driven by a task on the
//! runtime that opened it. Opened from a task thread's current_thread runtime, it would
//! run only while that thread sat in `block_on`, and another task's request reusing it
//! would stall; opened on the executor's backend runtime, heartbeats would queue behind
//! guests' downloads. So a request [`EgressClient::send_within`] is spawned here, and the
//! caller only awaits its handle, from whatever runtime it is on. A caller that keeps to
//! one thread and runs its runtime after a dropped request ([`super::close_abandoned`])
//! sends with [`EgressClient::send_here`] instead, without the two hand-offs.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::task::JoinHandle;

use super::budget::ByteBudget;
use super::exchange::{EgressError, EgressRequest, EgressResponse, exchange, prepare};
use super::inline;
use super::policy::EgressPolicy;
use super::resolver::{GuardedResolver, Lookup, SystemLookup};

/// Idle connections kept per host: enough for a burst of tasks calling one service,
/// bounded so that a guest cannot make the executor hold sockets open without end.
const IDLE_PER_HOST: usize = 32;

/// One per executor process: a pooled reqwest client on its own small multi-thread runtime
/// (threads `flint-egress`), no proxy from the environment, redirects never followed (a 3xx goes
/// back to the guest), DNS answers checked by a resolver that refuses special-purpose addresses
/// the operator did not list exactly (so the check is at connect time, after resolution).
pub struct EgressClient {
    /// Which client a thread's pool belongs to (`inline.rs`): unique in the process.
    id: u64,
    /// `None` only while dropping: a runtime dropped inside another runtime panics, so
    /// it is shut down in the background instead.
    runtime: Option<tokio::runtime::Runtime>,
    lookup: Arc<dyn Lookup>,
    pool: Mutex<Option<Pool>>,
}

/// The reqwest client for one set of operator-listed addresses. A connection is only
/// reused under the address check it was opened with: an operator's list is the
/// executor's, so in practice there is one, built on first use (it reads the system's
/// TLS roots once).
struct Pool {
    exact: Arc<[IpAddr]>,
    client: reqwest::Client,
}

impl EgressClient {
    pub fn new() -> io::Result<Arc<EgressClient>> {
        EgressClient::with_lookup(Arc::new(SystemLookup))
    }

    /// With the answers of `lookup` in place of the system's resolver (tests script
    /// them to rebind a name).
    pub(crate) fn with_lookup(lookup: Arc<dyn Lookup>) -> io::Result<Arc<EgressClient>> {
        // One worker: a request's work is a few microseconds between waits, and a second
        // worker only stole tasks across cores (0.28x of a native client's rate in `flint
        // bench --egress` with two, 0.32x with one, on 2 cores).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("flint-egress")
            .enable_all()
            .build()?;
        static CLIENTS: AtomicU64 = AtomicU64::new(0);
        Ok(Arc::new(EgressClient {
            id: CLIENTS.fetch_add(1, Ordering::Relaxed),
            runtime: Some(runtime),
            lookup,
            pool: Mutex::new(None),
        }))
    }

    /// Judges the request with `policy`, then sends it on the client's runtime. Callable from any
    /// runtime (a task thread's current_thread runtime included); dropping the future aborts the
    /// request (the spawned work is aborted, the connection closed).
    pub async fn send(
        &self,
        policy: &EgressPolicy,
        request: EgressRequest,
        max_bytes: u64,
    ) -> Result<EgressResponse, EgressError> {
        let budget = Arc::new(ByteBudget::new(max_bytes));
        self.send_within(policy, request, budget).await
    }

    /// [`EgressClient::send`] within a budget that other requests may be taking from
    /// at the same time (a task's requests in flight at once).
    pub async fn send_within(
        &self,
        policy: &EgressPolicy,
        request: EgressRequest,
        budget: Arc<ByteBudget>,
    ) -> Result<EgressResponse, EgressError> {
        let prepared = prepare(policy, request, budget)?;
        let client = self.client_for(policy.operator_addresses())?;
        let runtime = self
            .runtime
            .as_ref()
            .expect("the runtime is only taken when the client is dropped");
        let request = AbortOnDrop(runtime.spawn(exchange(client, prepared)));
        match request.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(EgressError::Io(
                "the egress runtime shut down with the request in flight".to_owned(),
                Default::default(),
            )),
        }
    }

    /// [`EgressClient::send_within`] on the caller's own runtime, with the calling
    /// thread's pool: no hand-off to the client's runtime and back. Dropping the future
    /// aborts the request, but its connection is closed only when the caller's runtime
    /// next runs: a caller on a current_thread runtime awaits
    /// [`super::close_abandoned`] after dropping one (what `inline.rs` says).
    pub async fn send_here(
        &self,
        policy: &EgressPolicy,
        request: EgressRequest,
        budget: Arc<ByteBudget>,
    ) -> Result<EgressResponse, EgressError> {
        let prepared = prepare(policy, request, budget)?;
        let client = inline::client(self.id, policy.operator_addresses(), |exact| {
            self.build(exact, inline::IDLE_PER_HOST)
        })?;
        inline::exchange_here(client, prepared).await
    }

    fn client_for(&self, exact: Vec<IpAddr>) -> Result<reqwest::Client, EgressError> {
        let mut pool = self.pool.lock().expect("egress pool lock poisoned");
        if let Some(pool) = pool.as_ref().filter(|pool| *pool.exact == *exact) {
            return Ok(pool.client.clone());
        }
        let exact: Arc<[IpAddr]> = exact.into();
        let client = self.build(exact.clone(), IDLE_PER_HOST)?;
        // Replaced, not kept beside: requests in flight hold their own handle on the old
        // one, and its idle connections close with it.
        *pool = Some(Pool {
            exact,
            client: client.clone(),
        });
        Ok(client)
    }

    /// A reqwest client whose resolver lets through the special-purpose addresses in
    /// `exact` only, with no proxy and no redirects.
    fn build(
        &self,
        exact: Arc<[IpAddr]>,
        idle_per_host: usize,
    ) -> Result<reqwest::Client, EgressError> {
        let resolver = GuardedResolver::new(self.lookup.clone(), exact);
        reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(resolver))
            .pool_max_idle_per_host(idle_per_host)
            .build()
            .map_err(|e| {
                EgressError::Io(
                    format!("building the egress client: {e}"),
                    Default::default(),
                )
            })
    }
}

impl Drop for EgressClient {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A spawned request that is aborted when its caller stops waiting for it: dropping
/// `send`'s future drops the request on the egress runtime, and hyper closes a
/// connection whose response nobody will read.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
