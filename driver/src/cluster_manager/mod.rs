//! Cluster managers: what launches executors for the driver, and the loop that keeps as
//! many as it wants.
//!
//! The seam is Spark's `ExternalClusterManager` with its scheduler backend's
//! `doRequestTotalExecutors` / `doKillExecutors`, per executor: [`ClusterManager::launch`]
//! asks for one executor of a shape, [`ClusterManager::kill`] ends one now, and what
//! becomes of each comes back as an [`ExecutorEvent`] (launched, failed to launch,
//! exited with its code or signal, lost with its host). The driver's side — ids, the
//! target, replacements, backoff, the failure limit — is [`supervisor::Supervisor`], the
//! same whoever launches. That an executor *started* the driver learns from its
//! registration, not from the manager.
//!
//! `local` ([`local::LocalManager`]) starts executor processes on the driver's host;
//! `standalone` ([`standalone::StandaloneManager`]) has `flint worker`s start them;
//! `kubernetes` ([`kubernetes::KubernetesManager`]) creates executor pods.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_protocol::ExecutorId;
use flint_protocol::api::{AllocationView, ExecutorState};
use flint_protocol::exit::ProcessExit;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::ClusterManagerKind;
use crate::scheduler::LaunchedBy;
use crate::service::{AllocationCommand, Driver};

pub mod allocation;
pub mod kubernetes;
pub mod local;
pub mod runner;
pub mod standalone;
pub mod supervisor;

use allocation::{Allocation, AllocationLimits, Demand};
use supervisor::Supervisor;

/// One executor asked of a cluster manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchRequest {
    pub id: ExecutorId,
    pub app_id: String,
    pub cores: u32,
    pub memory_mb: u64,
}

/// What a cluster manager heard of an executor it was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecutorEvent {
    /// Its process runs (or its pod was created): `pid` on its host, `log` where its
    /// stderr can be read by the driver, `worker` the host it runs on.
    Launched {
        id: ExecutorId,
        worker: Option<String>,
        pid: Option<u32>,
        log: Option<PathBuf>,
    },
    /// It could not be started at all.
    LaunchFailed { id: ExecutorId, reason: String },
    /// Its process ended; `cause` when its launcher knows more than the exit code
    /// (the kubelet's `OOMKilled`).
    Exited {
        id: ExecutorId,
        exit: ProcessExit,
        cause: Option<String>,
    },
    /// Its host went away with it; how it ended is not known.
    Lost { id: ExecutorId, reason: String },
}

/// Where launched executors dial and what they present.
#[derive(Clone, Debug)]
pub struct Dial {
    /// `flint://HOST:PORT` of the driver's executor port.
    pub driver_url: String,
    pub cluster_secret: Option<String>,
}

pub trait ClusterManager: Send + Sync {
    fn name(&self) -> &'static str;
    /// Starts one executor; its fate comes back as events.
    fn launch(&self, request: LaunchRequest);
    /// Ends one executor now (SIGKILL, pod deletion).
    fn kill(&self, id: &ExecutorId);
    /// Stops every executor it launched: asked first (SIGTERM: a clean stop), killed
    /// once `grace` has passed.
    fn stop(&self, grace: Duration) -> BoxFuture<'_, ()>;
    /// Whether its executors can outlive the driver (on workers, in pods): then ids go
    /// on across driver restarts instead of starting again at `exec-1`.
    fn executors_outlive_driver(&self) -> bool {
        false
    }
    /// Why a launched executor has not started yet, when the manager can tell (a
    /// pod's scheduler or kubelet reason): said when it is given up on.
    fn pending_reason(&self, _id: &ExecutorId) -> Option<String> {
        None
    }
}

/// The configured cluster manager, and the receiver of its events.
pub async fn start(
    kind: ClusterManagerKind,
    driver: &Arc<Driver>,
    dial: Dial,
    work_root: PathBuf,
) -> anyhow::Result<(
    Arc<dyn ClusterManager>,
    mpsc::UnboundedReceiver<ExecutorEvent>,
)> {
    let allocation = &driver.config.allocation;
    let (events, received) = mpsc::unbounded_channel();
    let manager: Arc<dyn ClusterManager> = match kind {
        ClusterManagerKind::Kubernetes => {
            let Some(config) = &allocation.kubernetes else {
                anyhow::bail!("--cluster-manager kubernetes needs --k8s-image");
            };
            Arc::new(
                kubernetes::KubernetesManager::start(
                    config,
                    &driver.config.app_id,
                    &dial,
                    allocation.decommission_timeout,
                    events,
                )
                .await?,
            )
        }
        ClusterManagerKind::Standalone => {
            Arc::new(standalone::StandaloneManager::start(driver.clone(), events))
        }
        ClusterManagerKind::Local => {
            let exe = match &allocation.executor_binary {
                Some(exe) => exe.clone(),
                None => std::env::current_exe()?,
            };
            Arc::new(local::LocalManager::new(
                exe,
                allocation.executor_args.clone(),
                dial,
                work_root,
                events,
            ))
        }
    };
    Ok((manager, received))
}

/// Keeps the target of executors launched until `stop`: launches what is due, hands
/// each event to the driver's state, replaces what exits unasked.
pub async fn supervise(
    driver: Arc<Driver>,
    manager: Arc<dyn ClusterManager>,
    mut events: mpsc::UnboundedReceiver<ExecutorEvent>,
    stop: CancellationToken,
) {
    let allocation = &driver.config.allocation;
    let (commands, mut commanded) = mpsc::unbounded_channel();
    driver.set_commands(commands);
    let counter = driver.config.data_dir.join("work").join(NEXT_EXECUTOR_FILE);
    let mut supervisor = Supervisor::new(
        allocation.initial_executors,
        allocation.max_failures(),
        allocation.executor_failures_interval,
        match manager.executors_outlive_driver() {
            true => read_counter(&counter),
            false => 1,
        },
    );
    let mut dynamic = allocation.dynamic.map(|d| Dynamic {
        allocation: Allocation::new(AllocationLimits {
            min: d.min_executors,
            max: d.max_executors,
            initial: allocation.initial_executors,
            executor_cores: allocation.executor_cores,
            backlog_timeout: d.backlog_timeout,
            idle_timeout: d.idle_timeout,
        }),
        idle_since: HashMap::new(),
        every: (d.backlog_timeout / 4).clamp(Duration::from_millis(10), Duration::from_millis(250)),
    });
    if let Some(d) = &dynamic {
        supervisor.set_target(d.allocation.target());
    }
    loop {
        let now = Instant::now();
        if let Some(d) = &mut dynamic {
            d.follow(&driver, &mut supervisor, now);
        }
        let due = supervisor.launches_due(now);
        if !due.is_empty()
            && manager.executors_outlive_driver()
            && let Err(e) = write_counter(&counter, supervisor.next_id())
        {
            tracing::warn!(error = %e, path = %counter.display(), "saving the next executor id");
        }
        for id in due {
            tracing::info!(executor = %id, cluster_manager = manager.name(), "launching executor");
            manager.launch(LaunchRequest {
                id,
                app_id: driver.config.app_id.clone(),
                cores: allocation.executor_cores,
                memory_mb: allocation.executor_memory_mb,
            });
        }
        let timeout = allocation.executor_launch_timeout;
        let registered = |id: &ExecutorId| {
            driver.read(|s| {
                s.executors
                    .get(id)
                    .is_some_and(|e| e.state != ExecutorState::Launching)
            })
        };
        for id in supervisor.overdue(now, timeout, registered) {
            let mut why = format!(
                "did not register within {} ms of its launch (--executor-launch-timeout-ms)",
                timeout.as_millis()
            );
            if let Some(pending) = manager.pending_reason(&id) {
                why = format!("{why}: {pending}");
            }
            tracing::warn!(executor = %id, why, "killing executor");
            manager.kill(&id);
            driver.executor_gone(&id, Some(("launch_timeout", &why)));
            if let Some(why) = supervisor.gone(&id, Some(&why), now) {
                tracing::error!(reason = why, "executor supervision gave up");
            }
        }
        driver.set_allocation(view(&mut supervisor, manager.name(), now));
        let wake = [supervisor.next_wake(now), supervisor.next_overdue(timeout)]
            .into_iter()
            .flatten()
            .min();
        tokio::select! {
            event = events.recv() => match event {
                Some(event) => on_event(&driver, manager.name(), &mut supervisor, event),
                None => return,
            },
            Some(command) = commanded.recv() => match command {
                AllocationCommand::Kill(id) => {
                    tracing::info!(executor = %id, "killing executor, as asked");
                    supervisor.asked_to_stop(&id);
                    manager.kill(&id);
                }
            },
            () = sleep_until(wake) => {}
            () = tick(dynamic.as_ref().map(|d| d.every)) => {}
            () = stop.cancelled() => return,
        }
    }
}

fn on_event(
    driver: &Driver,
    manager: &'static str,
    supervisor: &mut Supervisor,
    event: ExecutorEvent,
) {
    let now = Instant::now();
    let (id, failure) = match event {
        ExecutorEvent::Launched {
            id,
            worker,
            pid,
            log,
        } => {
            tracing::info!(executor = %id, pid, worker, "executor launched");
            if let Some(log) = log {
                driver.cluster.executor_logs.set(id.clone(), log);
            }
            let by = LaunchedBy {
                cluster_manager: manager,
                worker,
            };
            driver.executor_launched(&id, by, pid);
            return;
        }
        ExecutorEvent::LaunchFailed { id, reason } => {
            tracing::error!(executor = %id, reason, "could not launch executor");
            let failure = format!("could not be launched: {reason}");
            driver.executor_gone(&id, Some(("launch_failed", &failure)));
            (id, Some(failure))
        }
        ExecutorEvent::Exited { id, exit, cause } => {
            let mut description = exit.describe();
            if let Some(cause) = &cause {
                description = format!("{description} ({cause})");
            }
            if exit.is_clean() {
                tracing::info!(executor = %id, exit = description, "executor exited");
            } else {
                tracing::warn!(executor = %id, exit = description, "executor exited");
            }
            driver.executor_exited(&id, exit, cause.as_deref());
            (id, (!exit.is_clean()).then_some(description))
        }
        // Not the executor's doing: replaced, not counted.
        ExecutorEvent::Lost { id, reason } => {
            tracing::warn!(executor = %id, reason, "executor lost with its host");
            driver.executor_gone(&id, Some(("lost", &reason)));
            (id, None)
        }
    };
    if let Some(why) = supervisor.gone(&id, failure.as_deref(), now) {
        tracing::error!(reason = why, "executor supervision gave up");
    }
}

fn view(supervisor: &mut Supervisor, manager: &str, now: Instant) -> AllocationView {
    AllocationView {
        cluster_manager: manager.to_owned(),
        target: supervisor.target(),
        // Counted from the executors' states when the view is read.
        launching: 0,
        running: 0,
        decommissioning: 0,
        idle: 0,
        recent_failures: supervisor.recent_failures(now),
        max_failures: supervisor.max_failures(),
        failures_interval_ms: supervisor.interval().as_millis() as u64,
        backoff_ms: supervisor.backoff_left(now).as_millis() as u64,
        gave_up: supervisor.gave_up().map(str::to_owned),
    }
}

/// The next executor id's number, kept in the data dir across driver restarts.
const NEXT_EXECUTOR_FILE: &str = "next-executor-id";

fn read_counter(path: &std::path::Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1)
}

fn write_counter(path: &std::path::Path, next: u64) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{next}\n"))?;
    std::fs::rename(tmp, path)
}

/// Dynamic allocation's state in the supervising loop: the arithmetic, and since when
/// each launched executor has been idle (sampled every `every`).
struct Dynamic {
    allocation: Allocation,
    idle_since: HashMap<ExecutorId, Instant>,
    every: Duration,
}

impl Dynamic {
    /// Moves the target with the work, and decommissions what has been idle too long
    /// above it (only if still idle under the scheduler's lock).
    fn follow(&mut self, driver: &Driver, supervisor: &mut Supervisor, now: Instant) {
        let ((pending_cores, running_cores), idle) =
            driver.read(|s| (s.demand(), s.idle_launched_executors()));
        let before = supervisor.target();
        let target = self.allocation.update(
            Demand {
                pending_cores,
                running_cores,
            },
            now,
        );
        if target != before {
            tracing::info!(
                from = before,
                to = target,
                pending_cores,
                running_cores,
                "executor target changed"
            );
        }
        supervisor.set_target(target);
        self.idle_since.retain(|id, _| idle.contains(id));
        for id in idle {
            self.idle_since.entry(id).or_insert(now);
        }
        let idle_for: Vec<(ExecutorId, Duration)> = self
            .idle_since
            .iter()
            .map(|(id, since)| (id.clone(), now.saturating_duration_since(*since)))
            .collect();
        for id in self.allocation.removals(supervisor.staying(), &idle_for) {
            if driver.decommission_executor(&id, true).is_ok() {
                tracing::info!(executor = %id, "decommissioning an idle executor");
                supervisor.asked_to_stop(&id);
                self.idle_since.remove(&id);
            }
        }
    }
}

async fn tick(every: Option<Duration>) {
    match every {
        Some(every) => tokio::time::sleep(every).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
