//! The driver's own settings (listeners, auth, limits, scheduling, retention), each flag
//! with its `FLINT_*` variable. Apart from the executors it launches because `flint dev`
//! and `flint bench` run a driver with these same flags but launch executors their own way.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use flint_driver::DriverConfig;
use flint_driver::scheduler::speculation::SpeculationConfig;

#[derive(clap::Args, Clone, Debug)]
pub struct DriverArgs {
    /// Address of the HTTP API (port 0 picks a free port).
    #[arg(long, env = "FLINT_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// Address executors connect to (port 0 picks a free port).
    #[arg(long, env = "FLINT_EXECUTOR_LISTEN", default_value = "127.0.0.1:7071")]
    pub executor_listen: SocketAddr,
    /// The HTTP API's URL as executors reach it, for module, file and block transfers
    /// (default: the --listen address, or this host's name when that is 0.0.0.0 or ::).
    #[arg(long, env = "FLINT_ADVERTISE_URL", value_parser = parse_http_url)]
    pub advertise_url: Option<String>,
    /// Where modules and state are kept.
    #[arg(long, env = "FLINT_DATA_DIR", default_value = "./flint-data")]
    pub data_dir: PathBuf,
    /// The application's name: executors launched for it carry it (their work dirs are
    /// `DATA/work/<app-id>/<executor-id>/`), and an executor of another app is refused.
    #[arg(long, env = "FLINT_APP_ID", default_value = "flint",
          value_parser = parse_app_id)]
    pub app_id: String,
    /// Secret every executor must present (in its hello, and on module and file
    /// downloads). Required, with --token, when a listener is beyond loopback.
    #[arg(long, env = "FLINT_CLUSTER_SECRET", hide_env_values = true)]
    pub cluster_secret: Option<String>,
    /// Object-store credentials for executors, pushed to them at registration and
    /// again whenever this file changes: JSON in the AWS credential_process format
    /// (`{"Version": 1, "AccessKeyId": .., "SecretAccessKey": .., "SessionToken": ..}`).
    /// Executors then sign S3 requests with these, not their own environment.
    #[arg(long, env = "FLINT_EXECUTOR_CREDENTIALS")]
    pub executor_credentials: Option<PathBuf>,
    /// Bearer token every API request must carry (`/healthz`, `/v1/openapi.json` and the
    /// web UI's page `/ui`, which asks for it, excepted). Required, with
    /// --cluster-secret, when a listener is beyond loopback.
    #[arg(long, env = "FLINT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Tenants sharing the driver, each with its tokens (as SHA-256 hashes: `flint
    /// hash-token`), weight, priority cap and limits: TOML, or YAML for a .yaml/.yml
    /// name (see the README's "Tenants"). Read again when it changes. A tenant sees
    /// only its own jobs and uploads; the --token is the admin's, who sees all.
    #[arg(long, env = "FLINT_TENANTS")]
    pub tenants: Option<PathBuf>,
    /// Listen beyond loopback without a token or cluster secret: anyone who can reach
    /// the ports can run code on the executors and read every result.
    #[arg(long, env = "FLINT_INSECURE")]
    pub insecure: bool,
    /// A connection that has not sent a whole request head within this long is closed.
    #[arg(long, env = "FLINT_HEADER_READ_TIMEOUT_MS", default_value_t = flint_protocol::defaults::HEADER_READ_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_ms: u64,
    /// A request body that pauses for longer than this fails with 408.
    #[arg(long, env = "FLINT_BODY_IDLE_TIMEOUT_MS", default_value_t = flint_protocol::defaults::BODY_IDLE_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub body_idle_timeout_ms: u64,
    /// Requests served at once; more are answered 503 with `Retry-After`.
    #[arg(long, env = "FLINT_MAX_CONCURRENT_REQUESTS", default_value_t = flint_protocol::defaults::MAX_CONCURRENT_REQUESTS as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_concurrent_requests: u64,
    /// Job event streams (`GET /v1/jobs/{id}/events`) served at once; more are answered
    /// 503 with `Retry-After`. Not counted among --max-concurrent-requests.
    #[arg(long, env = "FLINT_MAX_EVENT_STREAMS", default_value_t = flint_protocol::defaults::MAX_EVENT_STREAMS as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_event_streams: u64,
    /// An executor silent for this long (no heartbeat, no frame) is lost and its tasks
    /// run elsewhere.
    #[arg(long, env = "FLINT_EXECUTOR_TIMEOUT_MS", default_value_t = flint_protocol::defaults::EXECUTOR_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(100..))]
    pub executor_timeout_ms: u64,
    /// Origins executors may fetch from besides the driver, comma-separated:
    /// `http://127.0.0.1:8000`, `https://data.example.com`, `file:///srv/data`. Without
    /// it, only public http(s) addresses are fetched (loopback, link-local and private
    /// ones are refused).
    #[arg(long, env = "FLINT_FETCH_ALLOW", value_delimiter = ',')]
    pub fetch_allow: Vec<String>,
    /// Origins tasks may call over HTTP, comma-separated: `https://api.example.com`,
    /// `https://*.example.org:8443`, `http://127.0.0.1:8080`. The ceiling over every
    /// tenant's `egress_allow` and job's `network.allow`; without it no task may make a
    /// request. A loopback, link-local or private address is reached only where it is
    /// listed itself (by IP), never through a name that resolves to it.
    #[arg(long, env = "FLINT_EGRESS_ALLOW", value_delimiter = ',')]
    pub egress_allow: Vec<String>,
    /// Bytes of recorded responses one job may keep: each deterministic attempt's tape
    /// of what its requests were answered, stored beside its results for `flint
    /// replay`. A tape past it is refused and its attempt fails as host_error naming
    /// this flag. Counted over the tapes uploaded to the driver (with an s3 block store
    /// executors write tapes themselves, each bounded by its attempt's max_bytes).
    #[arg(long, env = "FLINT_EGRESS_RECORD_MAX_BYTES", default_value_t = flint_protocol::defaults::EGRESS_RECORD_MAX_BYTES_PER_JOB)]
    pub egress_record_max_bytes: u64,
    /// Where results larger than --inline-result-bytes are kept: `driver` (the data
    /// dir; executors upload to the driver) or `s3://bucket/prefix` (executors write
    /// there directly; endpoint and credentials from the AWS_* environment of the
    /// driver and every executor).
    #[arg(long, env = "FLINT_BLOCK_STORE", default_value = "driver")]
    pub block_store: String,
    /// Results up to this size travel inline with the task's status.
    #[arg(long, env = "FLINT_INLINE_RESULT_BYTES", default_value_t = flint_protocol::defaults::INLINE_RESULT_BYTES)]
    pub inline_result_bytes: u64,
    /// How long a job's tasks wait for a free core on an executor that already ran its
    /// module before taking one on another executor (0: never wait).
    #[arg(long, env = "FLINT_LOCALITY_WAIT_MS", default_value_t = flint_protocol::defaults::LOCALITY_WAIT_MS,
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub locality_wait_ms: u64,
    /// Which job gets cores first: `fifo`, the oldest job until it has nothing pending;
    /// or `fair`, the job with the fewest running tasks (Spark's FAIR mode, equal
    /// weights), so that jobs running side by side share the cluster.
    #[arg(long, env = "FLINT_SCHEDULING_MODE", value_enum, default_value_t = SchedulingModeArg::Fifo)]
    pub scheduling_mode: SchedulingModeArg,
    /// With tenants: a tenant held below its fair share of the cores, with tasks
    /// waiting, for this long gets cores back by force: the youngest attempts of the
    /// tenant furthest over its share are killed (never taking it below its own share)
    /// and run again later, as `preempted` (no failure counted). Off when not given.
    #[arg(long, env = "FLINT_PREEMPTION_TIMEOUT_MS",
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub preemption_timeout_ms: Option<u64>,
    /// Copy slow tasks: once --speculation-quantile of a job's tasks have succeeded, a
    /// task running longer than --speculation-multiplier times their median run time
    /// (and at least 100 ms) gets a second attempt on another executor; the first to
    /// succeed wins and the other is killed.
    #[arg(long, env = "FLINT_SPECULATION")]
    pub speculation: bool,
    /// 1-core tasks launched to each executor beyond its free cores and queued there, so
    /// that a task thread finds its next task waiting (0: launch only onto free cores).
    #[arg(long, env = "FLINT_LAUNCH_AHEAD", default_value_t = flint_protocol::defaults::LAUNCH_AHEAD,
          value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub launch_ahead: u32,
    /// The deepest the queue of --launch-ahead grows once the jobs with work are known to
    /// run short tasks: as many as fit in --queue-budget-us of their run time per core.
    #[arg(long, env = "FLINT_LAUNCH_AHEAD_MAX", default_value_t = flint_protocol::defaults::LAUNCH_AHEAD_MAX,
          value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub launch_ahead_max: u32,
    /// Run time of work (microseconds per core, from the jobs' average task run time)
    /// queued ahead on an executor; bounds what a task queued behind a straggler waits.
    #[arg(long, env = "FLINT_QUEUE_BUDGET_US", default_value_t = flint_protocol::defaults::QUEUE_BUDGET_US,
          value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    pub queue_budget_us: u64,
    /// How often the job store commits finished tasks, at most (group commit). After a
    /// crash, tasks that ended within the last interval run again; 0 commits as soon as
    /// the previous commit is done, which costs a sync per handful of short tasks.
    #[arg(long, env = "FLINT_COMMIT_INTERVAL_MS", default_value_t = flint_protocol::defaults::COMMIT_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub commit_interval_ms: u64,
    /// After a restart, how long the restored jobs' unfinished tasks wait for the
    /// executors the last driver knew to register again with what they still run
    /// (adopted, not launched twice); the wait ends as soon as all are back. Tasks of
    /// executors that do not come back run again after it. 0: no wait.
    #[arg(long, env = "FLINT_ADOPT_WAIT_MS", default_value_t = flint_protocol::defaults::ADOPT_WAIT_MS,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub adopt_wait_ms: u64,
    /// On SIGTERM or Ctrl-C, tell the executors and workers that dialled in that the
    /// driver is gone for good, so that they stop. Without it they keep running their
    /// tasks (for their --driver-loss-grace-ms) for the next driver on this data dir to
    /// adopt: a restart or an upgrade loses no work. Executors the driver's own cluster
    /// manager launched as its children (`--cluster-manager local`) stop with it either way.
    #[arg(long, env = "FLINT_STOP_EXECUTORS_ON_EXIT")]
    pub stop_executors_on_exit: bool,
    /// Finished jobs are deleted this long after they ended, with their task records,
    /// results, logs and blocks (e.g. `7d`, `12h`, `30s`); `0` keeps them forever.
    #[arg(long, env = "FLINT_JOB_RETENTION", default_value = "7d", value_parser = parse_retention)]
    pub job_retention: Retention,
    /// Uploaded modules and files that no kept job names are deleted once this old
    /// (e.g. `1d`); `0` keeps them forever.
    #[arg(long, env = "FLINT_BLOB_RETENTION", default_value = "1d", value_parser = parse_retention)]
    pub blob_retention: Retention,
    /// Most bytes the data dir may hold (modules, files, blocks kept by the driver, the
    /// job store); uploads that would pass it and submissions once it is reached get 507
    /// `storage_full`. Results of jobs already accepted are stored whatever it says.
    /// 0: no quota.
    #[arg(long, env = "FLINT_DATA_DIR_MAX_BYTES", default_value_t = flint_protocol::defaults::DATA_DIR_MAX_BYTES)]
    pub data_dir_max_bytes: u64,
    /// A decommissioned executor (`POST /v1/executors/{id}/decommission`) still running
    /// tasks this long after is stopped: those attempts are killed and run again
    /// elsewhere, not counted as failures.
    #[arg(long, env = "FLINT_DECOMMISSION_TIMEOUT_MS", default_value_t = flint_protocol::defaults::DECOMMISSION_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub decommission_timeout_ms: u64,
    /// With --speculation: the fraction of a job's tasks that must have succeeded before
    /// any of its tasks is copied.
    #[arg(long, env = "FLINT_SPECULATION_QUANTILE", default_value_t = SpeculationConfig::default().quantile,
          value_parser = parse_quantile)]
    pub speculation_quantile: f64,
    /// With --speculation: how many times the succeeded tasks' median run time a task
    /// must have run to be copied.
    #[arg(long, env = "FLINT_SPECULATION_MULTIPLIER", default_value_t = SpeculationConfig::default().multiplier,
          value_parser = parse_multiplier)]
    pub speculation_multiplier: f64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedulingModeArg {
    Fifo,
    Fair,
}

fn parse_http_url(s: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(s).map_err(|e| format!("{s}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("{s}: an http:// or https:// URL with a host"));
    }
    Ok(s.trim_end_matches('/').to_owned())
}

/// A retention: `None` is forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention(pub Option<Duration>);

fn parse_retention(s: &str) -> Result<Retention, String> {
    if s.trim() == "0" {
        return Ok(Retention(None));
    }
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Ok(Retention(None)),
        Ok(d) => Ok(Retention(Some(d))),
        Err(e) => Err(format!(
            "{s:?}: {e} (a duration such as 7d, 12h or 30s, or 0 to keep forever)"
        )),
    }
}

fn parse_quantile(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(q) if (0.0..=1.0).contains(&q) => Ok(q),
        _ => Err(format!("{s:?} is not a fraction between 0 and 1")),
    }
}

/// An app id names a directory: letters, digits, `-`, `_` and `.`, not `.` or `..`.
fn parse_app_id(s: &str) -> Result<String, String> {
    let fits = !s.is_empty()
        && s.len() <= 64
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    match fits {
        true => Ok(s.to_owned()),
        false => Err(format!(
            "{s:?}: an app id is 1 to 64 letters, digits, '-', '_' or '.' (it names a directory)"
        )),
    }
}

fn parse_multiplier(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(m) if (1.0..=1000.0).contains(&m) => Ok(m),
        _ => Err(format!("{s:?} is not a number between 1 and 1000")),
    }
}

impl DriverArgs {
    pub fn config(&self) -> anyhow::Result<DriverConfig> {
        // Checked here so that a typo stops the driver, not every executor.
        flint_fetch_cache::UrlPolicy::parse_allow_list(&self.fetch_allow.join(","))
            .map_err(|e| anyhow::anyhow!("--fetch-allow: {e}"))?;
        flint_fetch_cache::egress::AllowList::parse(&self.egress_allow)
            .map_err(|e| anyhow::anyhow!("--egress-allow: {e}"))?;
        self.check_auth()?;
        let mut config = DriverConfig::new(self.data_dir.clone());
        config.app_id = self.app_id.clone();
        config.advertise_url = self.advertise_url.clone();
        config.cluster_secret = self.cluster_secret.clone();
        config.executor_credentials = self.executor_credentials.clone();
        config.api_token = self.token.clone();
        config.tenants = self.tenants.clone();
        config.edge = flint_driver::config::EdgeLimits {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            body_idle_timeout: Duration::from_millis(self.body_idle_timeout_ms),
            max_concurrent_requests: self.max_concurrent_requests as usize,
        };
        config.max_event_streams = self.max_event_streams as usize;
        config.executor_timeout = Duration::from_millis(self.executor_timeout_ms);
        config.fetch_allow = self.fetch_allow.clone();
        config.egress_allow = self.egress_allow.clone();
        config.egress_record_max_bytes = self.egress_record_max_bytes;
        config.block_store = self.block_store.clone();
        config.inline_result_bytes = self.inline_result_bytes;
        config.scheduling.locality_wait = Duration::from_millis(self.locality_wait_ms);
        config.scheduling.mode = match self.scheduling_mode {
            SchedulingModeArg::Fifo => flint_driver::scheduler::SchedulingMode::Fifo,
            SchedulingModeArg::Fair => flint_driver::scheduler::SchedulingMode::Fair,
        };
        config.scheduling.preemption = self.preemption_timeout_ms.map(Duration::from_millis);
        config.scheduling.launch_ahead = self.launch_ahead;
        config.scheduling.launch_ahead_max = self.launch_ahead_max;
        config.scheduling.queue_budget = Duration::from_micros(self.queue_budget_us);
        config.commit_interval = Duration::from_millis(self.commit_interval_ms);
        config.adopt_wait = Duration::from_millis(self.adopt_wait_ms);
        config.stop_executors_on_exit = self.stop_executors_on_exit;
        config.job_retention = self.job_retention.0;
        config.blob_retention = self.blob_retention.0;
        config.data_dir_max_bytes = self.data_dir_max_bytes;
        config.allocation.decommission_timeout =
            Duration::from_millis(self.decommission_timeout_ms);
        config.scheduling.speculation = self.speculation.then(|| SpeculationConfig {
            quantile: self.speculation_quantile,
            multiplier: self.speculation_multiplier,
            ..SpeculationConfig::default()
        });
        Ok(config)
    }

    /// Auth is on whenever a listener is reachable from other hosts; off on loopback
    /// unless asked for, so `flint dev` works without setup.
    fn check_auth(&self) -> anyhow::Result<()> {
        for (flag, value) in [
            ("--token", &self.token),
            ("--cluster-secret", &self.cluster_secret),
        ] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                anyhow::bail!("{flag} is empty");
            }
        }
        if (self.token.is_some() || self.tenants.is_some()) && self.cluster_secret.is_none() {
            anyhow::bail!(
                "--token and --tenants need a --cluster-secret too (FLINT_CLUSTER_SECRET): executors download modules and files with it"
            );
        }
        if let Some(path) = &self.tenants {
            // A bad file stops the start here, not at the first request.
            flint_driver::tenants::Tenants::read(path)?;
        }
        let exposed = [self.listen, self.executor_listen]
            .into_iter()
            .find(|addr| !addr.ip().is_loopback());
        if let Some(addr) = exposed
            && !self.insecure
            && ((self.token.is_none() && self.tenants.is_none()) || self.cluster_secret.is_none())
        {
            anyhow::bail!(
                "refusing to listen on {addr} (beyond loopback) without auth: give --token and --cluster-secret \
                 (FLINT_TOKEN, FLINT_CLUSTER_SECRET), or --insecure to run open to anyone who can reach it"
            );
        }
        Ok(())
    }
}
