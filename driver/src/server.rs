//! Where the driver's parts are joined: the HTTP API and the executor listener served
//! side by side, the revive loop that drives the scheduler's timers, and the order of a
//! clean stop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cluster_manager::{self, Dial};
use crate::service::Driver;

/// How long executors a cluster manager launched get to stop at the driver's stop
/// before they are killed.
const EXECUTOR_STOP_GRACE: Duration = Duration::from_secs(5);

/// The address launched executors dial: the listener's, or loopback when it listens
/// on every address.
fn dial_addr(listening: std::net::SocketAddr) -> std::net::SocketAddr {
    let mut addr = listening;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}

/// Both listeners of a driver, bound before it runs so callers learn the ports.
pub struct Listeners {
    pub http: TcpListener,
    pub executors: TcpListener,
}

/// Serves the API and the executor port until `shutdown` resolves, then tells executors
/// to stop.
pub async fn run(
    driver: Arc<Driver>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    // Dropping `run` (its caller gone) stops the listeners too, as a stop would.
    let _stop_on_drop = stop.clone().drop_guard();
    let executor_addr = listeners.executors.local_addr()?;
    let executor_server = tokio::spawn(crate::executor_port::serve(
        listeners.executors,
        driver.clone(),
        stop.clone(),
    ));
    let reviver = tokio::spawn(revive_loop(driver.clone()));
    let sampler = tokio::spawn(history_loop(driver.clone()));
    let retention = driver
        .config
        .sweep_interval()
        .map(|every| tokio::spawn(retention_loop(driver.clone(), every)));
    let tenants = match &driver.config.tenants {
        Some(path) => {
            driver.set_tenants(crate::tenants::Tenants::read(path)?);
            let watched = driver.clone();
            Some(crate::tenants::watch(path.clone(), move |t| {
                watched.set_tenants(t)
            }))
        }
        None => None,
    };
    let credentials = match &driver.config.executor_credentials {
        Some(path) => Some(crate::credentials::watch(&driver, path.clone())?),
        None => None,
    };
    // Its own token: supervision ends before executors are told to stop, so that none
    // of their exits is taken for one to replace.
    let supervision = CancellationToken::new();
    let _supervision_on_drop = supervision.clone().drop_guard();
    let mut manager = match driver.config.allocation.cluster_manager {
        Some(kind) => {
            let dial = Dial {
                driver_url: format!("flint://{}", dial_addr(executor_addr)),
                cluster_secret: driver.config.cluster_secret.clone(),
            };
            let work_root = driver.config.data_dir.join("work");
            let (manager, events) = cluster_manager::start(kind, &driver, dial, work_root).await?;
            let supervisor = tokio::spawn(cluster_manager::supervise(
                driver.clone(),
                manager.clone(),
                events,
                supervision.clone(),
            ));
            Some((manager, supervisor))
        }
        None => None,
    };
    let app = crate::http::router(driver.clone());
    let limits = driver.config.edge.clone();
    let http = tokio::spawn({
        let stop = stop.clone();
        async move { crate::http::edge::serve(listeners.http, app, &limits, stop).await }
    });
    shutdown.await;
    tracing::info!("driver shutting down");
    supervision.cancel();
    if let Some((_, supervisor)) = &mut manager {
        let _ = supervisor.await;
    }
    // Left to reconnect, executors keep their tasks running for the next driver on this
    // data dir, which adopts them (an upgrade, a restart); told, they stop.
    if driver.config.stop_executors_on_exit {
        driver.shutdown_executors();
        driver.cluster.workers.shutdown();
        // The Shutdown is only queued: wait for the executors to take it and hang up.
        // A process that exits first drops the connections with the message unsent (seen
        // on a loaded machine: the executor then reconnects for its whole grace).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while driver.linked_executors() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    stop.cancel();
    reviver.abort();
    sampler.abort();
    if let Some(retention) = retention {
        retention.abort();
    }
    if let Some(credentials) = credentials {
        credentials.abort();
    }
    if let Some(tenants) = tenants {
        tenants.abort();
    }
    // Give the Shutdown messages a moment to leave before connections are dropped.
    let _ = tokio::time::timeout(Duration::from_secs(2), executor_server).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), http).await;
    // Stopping for good, what the cluster manager launched and the Shutdown did not stop
    // (still starting, or stuck) is stopped now, killed past the grace; coming back,
    // what can outlive the driver (pods, workers' executors) is left to the next one.
    if let Some((manager, _)) = manager {
        let departure = match driver.config.stop_executors_on_exit {
            true => cluster_manager::Departure::ForGood,
            false => cluster_manager::Departure::ComingBack,
        };
        manager.stop(EXECUTOR_STOP_GRACE, departure).await;
    }
    // Ends waiting for the next group commit are kept: after a clean stop no finished
    // task runs again.
    let store = driver.clone();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::task::spawn_blocking(move || store.flush_store()),
    )
    .await;
    Ok(())
}

/// A sample of the cluster (and of each tenant's part) every second, for
/// `GET /v1/cluster/history`.
async fn history_loop(driver: Arc<Driver>) {
    let mut tick = tokio::time::interval(crate::history::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = std::time::SystemTime::now();
        let sample = driver.read(|s| crate::history::sample(s, now));
        let tenants = driver.tenants.get();
        driver
            .cluster
            .history
            .record(sample, tenants.iter().map(|t| &t.name));
    }
}

/// Deletes what retention says is old enough, every `every` (a first round at start).
async fn retention_loop(driver: Arc<Driver>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (jobs, blobs) = driver.sweep().await;
        if jobs + blobs > 0 {
            tracing::info!(jobs, blobs, "retention deleted old jobs and unused uploads");
        }
    }
}

/// Periodic offers (Spark's revive), the heartbeat deadline, the end of locality waits
/// and the search for slow tasks to copy. Checked a few times per timeout, so a silent
/// executor is lost within about 1.25 timeouts.
async fn revive_loop(driver: Arc<Driver>) {
    let scheduling = &driver.config.scheduling;
    let mut every = driver
        .config
        .revive_interval
        .min(driver.config.executor_timeout / 4);
    if !scheduling.locality_wait.is_zero() {
        every = every.min(scheduling.locality_wait.max(Duration::from_millis(10)));
    }
    if let Some(speculation) = scheduling.speculation {
        every = every.min(speculation.interval.max(Duration::from_millis(10)));
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let timeout = driver.config.executor_timeout;
        let (expired, given_up) = driver.apply(|s| {
            let (expired, actions) = s.tick(timeout);
            ((expired, s.take_given_up()), actions)
        });
        for id in given_up {
            driver.executor_left(&id);
        }
        for (id, generation) in expired {
            tracing::warn!(executor = %id, generation, ?timeout, "no heartbeat; executor lost");
            driver.executor_left(&id);
            driver.drop_link(&id, generation);
            driver.release_lost(&id);
        }
    }
}
