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
//! Executors can outlive the driver (on workers, in pods): a driver that stops to come
//! back ([`Departure::ComingBack`], the default) leaves them running, and the next one
//! on its data dir takes them as its own ([`ExecutorEvent::Adopted`]): pods of its app
//! are found when its manager starts, a worker's executors when the worker registers
//! again, and until then those the last run had registered are waited for
//! (`--adopt-wait-ms`) instead of replaced.
//!
//! `local` ([`local::LocalManager`]) starts executor processes on the driver's host;
//! `standalone` ([`standalone::StandaloneManager`]) has `flint worker`s start them;
//! `kubernetes` ([`kubernetes::KubernetesManager`]) creates executor pods; `slurm`
//! ([`slurm::SlurmManager`]) submits executor batch jobs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flint_protocol::ExecutorId;
use flint_protocol::exit::ProcessExit;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use crate::config::ClusterManagerKind;
use crate::service::Driver;

pub mod allocation;
pub mod kubernetes;
pub mod local;
pub mod runner;
pub mod slurm;
pub mod standalone;
mod supervise;
pub mod supervisor;

pub use supervise::supervise;

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
    /// Its process runs, or its resource manager has it (a pod queued or created, a
    /// batch job submitted): `pid` on its host, `log` where its stderr can be read by
    /// the driver, `worker` the host it runs on.
    Launched {
        id: ExecutorId,
        worker: Option<String>,
        pid: Option<u32>,
        log: Option<PathBuf>,
    },
    /// An executor of an earlier run of the driver, found still running (a pod of the
    /// app, an executor a worker lists when it registers again): this run's from now on,
    /// and not launched again. Its tasks are adopted when it registers.
    Adopted {
        id: ExecutorId,
        worker: Option<String>,
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

/// Why the driver stops, which decides what becomes of the executors it launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Departure {
    /// For good (`--stop-executors-on-exit`): its executors stop with it.
    ForGood,
    /// To come back (a restart, an upgrade, a rollout): executors that can outlive the
    /// driver are left running for the next one on its data dir to adopt.
    ComingBack,
}

pub trait ClusterManager: Send + Sync {
    fn name(&self) -> &'static str;
    /// Starts one executor; its fate comes back as events.
    fn launch(&self, request: LaunchRequest);
    /// Ends one executor now (SIGKILL, pod deletion).
    fn kill(&self, id: &ExecutorId);
    /// Stops working for the driver. [`Departure::ForGood`]: every executor it launched
    /// is stopped, asked first (SIGTERM: a clean stop), killed once `grace` has passed.
    /// [`Departure::ComingBack`]: those that can outlive the driver are left running.
    fn stop(&self, grace: Duration, departure: Departure) -> BoxFuture<'_, ()>;
    /// Whether its executors can outlive the driver (on workers, in pods): then ids go
    /// on across driver restarts instead of starting again at `exec-1`.
    fn executors_outlive_driver(&self) -> bool {
        false
    }
    /// Whether it hears of executors of an earlier driver run only later, once their
    /// hosts are back (workers registering again): then those the last run had
    /// registered are waited for, `--adopt-wait-ms`, before others replace them.
    fn finds_executors_late(&self) -> bool {
        false
    }
    /// Why a launched executor has not started yet, when the manager can tell (a
    /// pod's scheduler or kubelet reason): said when it is given up on.
    fn pending_reason(&self, _id: &ExecutorId) -> Option<String> {
        None
    }
    /// Why its resource manager has not started this executor yet (its launch refused
    /// for now by a quota, a pod not scheduled, a batch job queued), or `None` once it
    /// has (and always, where launching is starting a process). While it waits, the
    /// launch timeout does not run: it is back-pressure, given up on without a failure
    /// after `--executor-pending-timeout-ms`.
    fn waiting(&self, _id: &ExecutorId) -> Option<String> {
        None
    }
    /// How long an executor may wait for its resource manager unless
    /// `--executor-pending-timeout-ms` says: long enough for a cluster autoscaler to add
    /// a node.
    fn default_pending_timeout(&self) -> Duration {
        Duration::from_millis(flint_protocol::defaults::EXECUTOR_PENDING_TIMEOUT_MS)
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
                kubernetes::KubernetesManager::start_in(
                    config,
                    &driver.config.app_id,
                    &dial,
                    allocation.decommission_timeout,
                    Some(&work_root),
                    events,
                )
                .await?,
            )
        }
        ClusterManagerKind::Slurm => {
            let config = allocation.slurm.clone().unwrap_or_default();
            Arc::new(
                slurm::SlurmManager::start(
                    &config,
                    &driver.config.app_id,
                    &dial,
                    &work_root,
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
