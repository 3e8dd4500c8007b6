//! A driver's settings: what `flint driver` and `flint dev` parse from their flags, with
//! the defaults of `flint_protocol::defaults`.

use std::path::PathBuf;
use std::time::Duration;

use flint_protocol::defaults;

use crate::scheduler::SchedulingConfig;
use crate::store::blocks::DRIVER_BLOCK_STORE;

/// Settings of one driver, validated by whoever parsed them.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub data_dir: PathBuf,
    pub app_id: String,
    /// Required in every executor's hello when set, and accepted (besides the API
    /// token) on module and file downloads.
    pub cluster_secret: Option<String>,
    /// Bearer token every API request must carry when set (`/healthz`,
    /// `/v1/openapi.json`, the web UI's page `/ui` and `GET /`, its redirect, excepted).
    pub api_token: Option<String>,
    /// Timeouts and concurrency of the HTTP edge.
    pub edge: EdgeLimits,
    pub heartbeat_interval: Duration,
    /// How often offers are made even when nothing happened (Spark's revive interval).
    pub revive_interval: Duration,
    /// An executor silent for longer than this is lost (its connection is dropped and
    /// its tasks run elsewhere).
    pub executor_timeout: Duration,
    /// Origins executors may fetch from besides the driver (`--fetch-allow`).
    pub fetch_allow: Vec<String>,
    /// Origins tasks may call (`--egress-allow`): the ceiling over every tenant's and
    /// job's `network.allow`; empty, egress is off.
    pub egress_allow: Vec<String>,
    /// Bytes of recorded responses (deterministic attempts' tapes) one job may keep in
    /// the driver's block store (`--egress-record-max-bytes`).
    pub egress_record_max_bytes: u64,
    /// `driver` or an object store URL (`--block-store`).
    pub block_store: String,
    /// Results larger than this go to the block store.
    pub inline_result_bytes: u64,
    /// Exclusion, locality wait and speculation.
    pub scheduling: SchedulingConfig,
    /// Event streams (`GET /v1/jobs/{id}/events`) open at once; more get 503.
    pub max_event_streams: usize,
    /// The base URL executors reach the HTTP API at (module, file and block
    /// downloads and uploads), when the listen address is not it (`--advertise-url`).
    pub advertise_url: Option<String>,
    /// Task and job ends are group-committed to the job store at most this often
    /// (`--commit-interval-ms`).
    pub commit_interval: Duration,
    /// After a restart, how long the jobs restored with unfinished tasks wait for the
    /// executors the last driver knew to come back with what they still run, before
    /// those tasks are launched again elsewhere (`--adopt-wait-ms`).
    pub adopt_wait: Duration,
    /// On a clean stop, tell every executor (and worker) the driver is gone for good, so
    /// that they stop (`--stop-executors-on-exit`); otherwise they keep running their
    /// tasks for their grace, for the next driver to adopt (an upgrade, a restart).
    pub stop_executors_on_exit: bool,
    /// Finished jobs older than this are deleted with everything they own
    /// (`--job-retention`); `None` keeps them forever.
    pub job_retention: Option<Duration>,
    /// Uploads no stored job names are deleted once older than this (`--blob-retention`);
    /// `None` keeps them forever.
    pub blob_retention: Option<Duration>,
    /// Most bytes the data dir may hold (modules, files, the driver's own blocks, the
    /// job store) before uploads and submissions are refused; 0: no quota
    /// (`--data-dir-max-bytes`).
    pub data_dir_max_bytes: u64,
    /// Who launches executors (`--cluster-manager`), and how many of what shape.
    pub allocation: AllocationConfig,
    /// A file of object-store credentials pushed to executors, re-read when it
    /// changes (`--executor-credentials`).
    pub executor_credentials: Option<PathBuf>,
    /// The tenants file (`--tenants`), read again when it changes; `None`: no tenants,
    /// every caller with the token is the admin.
    pub tenants: Option<PathBuf>,
}

/// The cluster managers the driver can ask for executors (`--cluster-manager`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterManagerKind {
    /// Executor processes on the driver's own host, children of the driver.
    Local,
    /// Executor processes started by `flint worker`s, which register with the driver.
    Standalone,
    /// Executor pods the driver creates through the Kubernetes API.
    Kubernetes,
    /// Executor batch jobs the driver submits to Slurm.
    Slurm,
}

impl ClusterManagerKind {
    pub fn name(self) -> &'static str {
        match self {
            ClusterManagerKind::Local => "local",
            ClusterManagerKind::Standalone => "standalone",
            ClusterManagerKind::Kubernetes => "kubernetes",
            ClusterManagerKind::Slurm => "slurm",
        }
    }
}

/// Executors the driver launches and keeps: with no cluster manager, executors that
/// dial in on their own are all there is.
#[derive(Clone, Debug)]
pub struct AllocationConfig {
    pub cluster_manager: Option<ClusterManagerKind>,
    /// Executors kept running (`--initial-executors`): one that exits unasked is
    /// replaced.
    pub initial_executors: u32,
    /// Cores (task threads) of each executor launched (`--executor-cores`).
    pub executor_cores: u32,
    /// Memory of each executor launched, in MiB (`--executor-memory-mb`): what a worker
    /// or a pod sets aside for it; under `local` only passed on.
    pub executor_memory_mb: u64,
    /// At this many unclean exits within `executor_failures_interval` the driver stops
    /// launching (`--max-executor-failures`; default, as Spark's: twice the executors
    /// wanted, at least 3).
    pub max_executor_failures: Option<u32>,
    pub executor_failures_interval: Duration,
    /// A launched executor not registered this long after is killed and counted as a
    /// failure (`--executor-launch-timeout-ms`).
    pub executor_launch_timeout: Duration,
    /// A launched executor its resource manager has not started this long after is
    /// given up on, not as a failure (`--executor-pending-timeout-ms`; `None`: the
    /// manager's own default, [`crate::cluster_manager::ClusterManager::default_pending_timeout`]).
    pub executor_pending_timeout: Option<Duration>,
    /// A decommissioned executor still running tasks this long after is stopped, its
    /// attempts killed and run again elsewhere (`--decommission-timeout-ms`).
    pub decommission_timeout: Duration,
    /// Executors follow the work between a minimum and a maximum (`--max-executors`).
    pub dynamic: Option<DynamicAllocation>,
    /// The `flint` binary executors are started from (`local`), and extra arguments for
    /// each (`flint dev --executor-arg`).
    pub executor_binary: Option<PathBuf>,
    pub executor_args: Vec<String>,
    /// The `kubernetes` cluster manager's settings (`--k8s-*`).
    pub kubernetes: Option<KubernetesConfig>,
    /// The `slurm` cluster manager's settings (`--slurm-*`).
    pub slurm: Option<SlurmConfig>,
}

/// Executor batch jobs (`--cluster-manager slurm`).
#[derive(Clone, Debug)]
pub struct SlurmConfig {
    /// `sbatch --partition`, `--account`, `--time` (Slurm's format), when given.
    pub partition: Option<String>,
    pub account: Option<String>,
    pub time_limit: Option<String>,
    /// More sbatch arguments, as given.
    pub extra: Vec<String>,
    /// The flint binary executor jobs run, on a path the nodes share (default: the
    /// driver's own).
    pub flint_path: Option<PathBuf>,
    /// Executor jobs' scripts, logs and secret file, on a filesystem the nodes share
    /// (default: the driver's work root).
    pub work_dir: Option<PathBuf>,
    /// `flint://HOST:PORT` the executor jobs dial (default: the executor listener's).
    pub driver_url: Option<String>,
    /// One squeue call per interval.
    pub poll_interval: Duration,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            partition: None,
            account: None,
            time_limit: None,
            extra: Vec::new(),
            flint_path: None,
            work_dir: None,
            driver_url: None,
            poll_interval: Duration::from_millis(defaults::SLURM_POLL_INTERVAL_MS),
        }
    }
}

/// Executor pods (`--cluster-manager kubernetes`).
#[derive(Clone, Debug)]
pub struct KubernetesConfig {
    /// Where executor pods go (default: the kubeconfig context's, or the driver pod's).
    pub namespace: Option<String>,
    pub image: String,
    pub image_pull_policy: Option<String>,
    /// A Pod (YAML or JSON) the executor pods are made from, as Spark's
    /// `podTemplateFile`.
    pub pod_template: Option<PathBuf>,
    /// The driver's own pod: the owner of its executors' pods.
    pub driver_pod: Option<String>,
    /// `flint://HOST:PORT` the executor pods dial (default: the executor listener's).
    pub driver_url: Option<String>,
    /// The Secret and key executors read the cluster secret from.
    pub cluster_secret_ref: Option<(String, String)>,
    /// Pods created at a time, and the pause between batches (Spark's
    /// `allocation.batch.size` / `batch.delay`).
    pub batch_size: u32,
    pub batch_delay: Duration,
    /// Memory asked for beyond the executor's (`max(memory x factor, min)`).
    pub memory_overhead_factor: f64,
    pub min_memory_overhead_mb: u64,
    /// Without it: `KUBECONFIG`, `~/.kube/config`, or the pod's service account.
    pub kubeconfig: Option<PathBuf>,
}

impl Default for AllocationConfig {
    fn default() -> Self {
        AllocationConfig {
            cluster_manager: None,
            initial_executors: defaults::INITIAL_EXECUTORS,
            executor_cores: defaults::EXECUTOR_CORES,
            executor_memory_mb: defaults::EXECUTOR_MEMORY_MB,
            max_executor_failures: None,
            executor_failures_interval: Duration::from_millis(
                defaults::EXECUTOR_FAILURES_INTERVAL_MS,
            ),
            executor_launch_timeout: Duration::from_millis(defaults::EXECUTOR_LAUNCH_TIMEOUT_MS),
            executor_pending_timeout: None,
            decommission_timeout: Duration::from_millis(defaults::DECOMMISSION_TIMEOUT_MS),
            dynamic: None,
            executor_binary: None,
            executor_args: Vec::new(),
            kubernetes: None,
            slurm: None,
        }
    }
}

/// Dynamic allocation's bounds and clocks (Spark's `spark.dynamicAllocation.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DynamicAllocation {
    pub min_executors: u32,
    pub max_executors: u32,
    /// Tasks pending this long ask for more executors (`--scheduler-backlog-timeout-ms`).
    pub backlog_timeout: Duration,
    /// Executors idle this long above the minimum go (`--executor-idle-timeout-ms`).
    pub idle_timeout: Duration,
}

impl AllocationConfig {
    /// Spark's default: twice the most executors wanted, at least 3.
    pub fn max_failures(&self) -> u32 {
        let most = match self.dynamic {
            Some(d) => d.max_executors,
            None => self.initial_executors,
        };
        self.max_executor_failures
            .unwrap_or_else(|| (2 * most).max(3))
    }
}

impl DriverConfig {
    /// How often retention looks for what to delete: a tenth of the shorter retention,
    /// between a second and a minute.
    pub fn sweep_interval(&self) -> Option<Duration> {
        let shortest = [self.job_retention, self.blob_retention]
            .into_iter()
            .flatten()
            .min()?;
        Some((shortest / 10).clamp(Duration::from_secs(1), Duration::from_secs(60)))
    }

    pub fn new(data_dir: PathBuf) -> Self {
        DriverConfig {
            data_dir,
            app_id: "flint".into(),
            cluster_secret: None,
            executor_credentials: None,
            tenants: None,
            api_token: None,
            edge: EdgeLimits::default(),
            heartbeat_interval: Duration::from_millis(defaults::HEARTBEAT_INTERVAL_MS),
            revive_interval: Duration::from_secs(1),
            executor_timeout: Duration::from_millis(defaults::EXECUTOR_TIMEOUT_MS),
            fetch_allow: Vec::new(),
            egress_allow: Vec::new(),
            egress_record_max_bytes: defaults::EGRESS_RECORD_MAX_BYTES_PER_JOB,
            block_store: DRIVER_BLOCK_STORE.into(),
            inline_result_bytes: defaults::INLINE_RESULT_BYTES,
            scheduling: SchedulingConfig::default(),
            max_event_streams: defaults::MAX_EVENT_STREAMS,
            advertise_url: None,
            commit_interval: Duration::from_millis(defaults::COMMIT_INTERVAL_MS),
            adopt_wait: Duration::from_millis(defaults::ADOPT_WAIT_MS),
            stop_executors_on_exit: false,
            job_retention: Some(Duration::from_secs(defaults::JOB_RETENTION_SECS)),
            blob_retention: Some(Duration::from_secs(defaults::BLOB_RETENTION_SECS)),
            data_dir_max_bytes: defaults::DATA_DIR_MAX_BYTES,
            allocation: AllocationConfig::default(),
        }
    }
}

/// Bounds of the HTTP edge; the defaults are in `flint_protocol::defaults`.
#[derive(Clone, Debug)]
pub struct EdgeLimits {
    pub header_read_timeout: Duration,
    pub body_idle_timeout: Duration,
    pub max_concurrent_requests: usize,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        use flint_protocol::defaults;
        EdgeLimits {
            header_read_timeout: Duration::from_millis(defaults::HEADER_READ_TIMEOUT_MS),
            body_idle_timeout: Duration::from_millis(defaults::BODY_IDLE_TIMEOUT_MS),
            max_concurrent_requests: defaults::MAX_CONCURRENT_REQUESTS,
        }
    }
}
