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
            api_token: None,
            edge: EdgeLimits::default(),
            heartbeat_interval: Duration::from_millis(defaults::HEARTBEAT_INTERVAL_MS),
            revive_interval: Duration::from_secs(1),
            executor_timeout: Duration::from_millis(defaults::EXECUTOR_TIMEOUT_MS),
            fetch_allow: Vec::new(),
            block_store: DRIVER_BLOCK_STORE.into(),
            inline_result_bytes: defaults::INLINE_RESULT_BYTES,
            scheduling: SchedulingConfig::default(),
            max_event_streams: defaults::MAX_EVENT_STREAMS,
            advertise_url: None,
            commit_interval: Duration::from_millis(defaults::COMMIT_INTERVAL_MS),
            job_retention: Some(Duration::from_secs(defaults::JOB_RETENTION_SECS)),
            blob_retention: Some(Duration::from_secs(defaults::BLOB_RETENTION_SECS)),
            data_dir_max_bytes: defaults::DATA_DIR_MAX_BYTES,
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
