//! The command line of `flint`: the subcommands and the flags of the long-running ones
//! (driver, executor, the compiler subprocess), each flag with its `FLINT_*` variable and
//! its default, turned here into the typed configs the libraries take. The client
//! commands' flags live beside their commands (`submit.rs`, `jobs.rs`, `bench/args.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use flint_driver::DriverConfig;
use flint_driver::scheduler::speculation::SpeculationConfig;
use flint_executor::ExecutorOptions;
use flint_executor::compiler::CompilerMode;
use flint_fetch_cache::FetchOptions;
use flint_protocol::ExecutorId;

use crate::{bench, dev, jobs, submit};

#[derive(Parser)]
#[command(
    name = "flint",
    version,
    about = "Run WebAssembly tasks on a cluster of sandboxed executors"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the driver's many flags cost nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Run a local cluster: the driver plus N executor processes.
    Dev(dev::DevArgs),
    /// Run the driver alone (with `--cluster-manager`, it launches its executors).
    Driver(DriverCommand),
    /// Run one executor (Spark's CoarseGrainedExecutorBackend arguments).
    #[command(after_help = EXECUTOR_EXIT_CODES)]
    Executor(ExecutorArgs),
    /// Run a standalone worker: it offers this host's cores and memory to a driver with
    /// `--cluster-manager standalone` and launches the executors it asks for.
    #[command(after_help = WORKER_EXIT_CODES)]
    Worker(crate::worker::WorkerArgs),
    /// Upload a module, submit a job with one task per input, and print the results.
    Submit(submit::SubmitArgs),
    /// A job's state, counts and failed tasks.
    Status(jobs::StatusArgs),
    /// A job's results, in task order (or one file per task with --out).
    Results(jobs::ResultsArgs),
    /// A task's log (its stderr).
    Logs(jobs::LogsArgs),
    /// Kill a job: pending tasks never start, running ones stop.
    Kill(jobs::KillArgs),
    /// Delete finished jobs with their results, logs and blocks.
    Delete(jobs::DeleteArgs),
    /// The executors, their cores and state; `decommission ID`, `kill ID`.
    Executors(jobs::ExecutorsArgs),
    /// The standalone workers, their cores, memory and executors.
    Workers(jobs::WorkersArgs),
    /// Print a shell completion script: `flint completions bash > /etc/bash_completion.d/flint`,
    /// `flint completions zsh > "${fpath[1]}/_flint"`, `flint completions fish >
    /// ~/.config/fish/completions/flint.fish`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Start a local cluster and measure throughput and latency of no-op tasks.
    Bench(bench::BenchArgs),
    /// Compile a module for an executor's engine (run by executors, killed at their
    /// compile time limit). Exits 65 when the module is not valid wasm.
    #[command(hide = true)]
    CompileModule(CompileArgs),
    /// Simulated executors for `flint bench --simulated-executors` (started by it).
    #[command(hide = true)]
    SimulateExecutors(bench::SimulateArgs),
}

#[derive(clap::Args, Clone, Debug)]
pub struct CompileArgs {
    #[arg(long)]
    pub slots: u32,
    #[arg(long)]
    pub max_memory_bytes: usize,
    #[arg(long)]
    pub fuel: bool,
    #[arg(long)]
    pub out: PathBuf,
    pub input: PathBuf,
}

// StopExecutor is handled by executors but not sent by the driver yet: it will be with
// decommission (issue 16).
const WORKER_EXIT_CODES: &str = "Exit codes:
  0  stopped (SIGTERM); its executors are stopped too
  1  could not start (work dir)
  2  bad command line
  3  the driver refused the registration (duplicate worker id, wrong secret, version
     mismatch, a driver without --cluster-manager standalone)";

const EXECUTOR_EXIT_CODES: &str = "Exit codes:
  0  stopped (StopExecutor, Shutdown, SIGTERM)
  1  could not start (engine, work dir)
  2  bad command line
  3  the driver refused the registration (duplicate id, wrong secret, version mismatch)
  4  the driver could not be reached
  5  the driver was lost and could not be reached again within --reconnect-timeout-ms";

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
        self.check_auth()?;
        let mut config = DriverConfig::new(self.data_dir.clone());
        config.app_id = self.app_id.clone();
        config.advertise_url = self.advertise_url.clone();
        config.cluster_secret = self.cluster_secret.clone();
        config.executor_credentials = self.executor_credentials.clone();
        config.api_token = self.token.clone();
        config.edge = flint_driver::config::EdgeLimits {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            body_idle_timeout: Duration::from_millis(self.body_idle_timeout_ms),
            max_concurrent_requests: self.max_concurrent_requests as usize,
        };
        config.max_event_streams = self.max_event_streams as usize;
        config.executor_timeout = Duration::from_millis(self.executor_timeout_ms);
        config.fetch_allow = self.fetch_allow.clone();
        config.block_store = self.block_store.clone();
        config.inline_result_bytes = self.inline_result_bytes;
        config.scheduling.locality_wait = Duration::from_millis(self.locality_wait_ms);
        config.scheduling.mode = match self.scheduling_mode {
            SchedulingModeArg::Fifo => flint_driver::scheduler::SchedulingMode::Fifo,
            SchedulingModeArg::Fair => flint_driver::scheduler::SchedulingMode::Fair,
        };
        config.scheduling.launch_ahead = self.launch_ahead;
        config.scheduling.launch_ahead_max = self.launch_ahead_max;
        config.scheduling.queue_budget = Duration::from_micros(self.queue_budget_us);
        config.commit_interval = Duration::from_millis(self.commit_interval_ms);
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
        if self.token.is_some() && self.cluster_secret.is_none() {
            anyhow::bail!(
                "--token needs a --cluster-secret too (FLINT_CLUSTER_SECRET): executors download modules and files with it"
            );
        }
        let exposed = [self.listen, self.executor_listen]
            .into_iter()
            .find(|addr| !addr.ip().is_loopback());
        if let Some(addr) = exposed
            && !self.insecure
            && (self.token.is_none() || self.cluster_secret.is_none())
        {
            anyhow::bail!(
                "refusing to listen on {addr} (beyond loopback) without auth: give --token and --cluster-secret \
                 (FLINT_TOKEN, FLINT_CLUSTER_SECRET), or --insecure to run open to anyone who can reach it"
            );
        }
        Ok(())
    }
}

/// `flint driver`: the driver's settings and the executors it launches.
#[derive(clap::Args, Clone, Debug)]
pub struct DriverCommand {
    #[command(flatten)]
    pub driver: DriverArgs,
    #[command(flatten)]
    pub allocation: AllocationArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterManagerArg {
    /// Executor processes on this host, children of the driver.
    Local,
    /// Executor processes started by `flint worker`s that register with the driver.
    Standalone,
    /// Executor pods the driver creates through the Kubernetes API (--k8s-*).
    Kubernetes,
}

/// Executors the driver launches through a cluster manager.
#[derive(clap::Args, Clone, Debug)]
pub struct AllocationArgs {
    /// Who launches executors. Without it, executors that dial in on their own (`flint
    /// executor --driver-url`) are all there is.
    #[arg(long, env = "FLINT_CLUSTER_MANAGER", value_enum)]
    pub cluster_manager: Option<ClusterManagerArg>,
    /// Executors launched at start and kept running (one that exits unasked is
    /// replaced); with --max-executors, where dynamic allocation starts (default: 2, or
    /// --min-executors with --max-executors).
    #[arg(long, env = "FLINT_INITIAL_EXECUTORS",
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub initial_executors: Option<u32>,
    /// Dynamic allocation: executors follow the work, between --min-executors and this.
    #[arg(long, env = "FLINT_MAX_EXECUTORS",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_executors: Option<u32>,
    /// Dynamic allocation's floor: idle executors above it are decommissioned.
    #[arg(long, env = "FLINT_MIN_EXECUTORS", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub min_executors: u32,
    /// Tasks pending this long ask for more executors, 1 then 2, 4, ... a round.
    #[arg(long, env = "FLINT_SCHEDULER_BACKLOG_TIMEOUT_MS", default_value_t = flint_protocol::defaults::SCHEDULER_BACKLOG_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub scheduler_backlog_timeout_ms: u64,
    /// Executors idle (nothing running or queued) this long above --min-executors are
    /// decommissioned.
    #[arg(long, env = "FLINT_EXECUTOR_IDLE_TIMEOUT_MS", default_value_t = flint_protocol::defaults::EXECUTOR_IDLE_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub executor_idle_timeout_ms: u64,
    /// Cores (task threads) of each executor launched.
    #[arg(long, env = "FLINT_EXECUTOR_CORES", default_value_t = flint_protocol::defaults::EXECUTOR_CORES,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub executor_cores: u32,
    /// Memory of each executor launched, in MiB: what a worker or pod sets aside for it
    /// (under `local`, not limited).
    #[arg(long, env = "FLINT_EXECUTOR_MEMORY_MB", default_value_t = flint_protocol::defaults::EXECUTOR_MEMORY_MB,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub executor_memory_mb: u64,
    #[command(flatten)]
    pub supervision: SupervisionArgs,
    #[command(flatten)]
    pub kubernetes: KubernetesArgs,
}

/// Executor pods, under `--cluster-manager kubernetes`.
#[derive(clap::Args, Clone, Debug)]
pub struct KubernetesArgs {
    /// The image executor pods run (this binary's; `scripts/image` builds it).
    #[arg(long, env = "FLINT_K8S_IMAGE")]
    pub k8s_image: Option<String>,
    /// The namespace executor pods are created in (default: the kubeconfig context's,
    /// or the driver pod's own).
    #[arg(long, env = "FLINT_K8S_NAMESPACE")]
    pub k8s_namespace: Option<String>,
    #[arg(long, env = "FLINT_K8S_IMAGE_PULL_POLICY",
          value_parser = ["Always", "IfNotPresent", "Never"])]
    pub k8s_image_pull_policy: Option<String>,
    /// A Pod (YAML or JSON) executor pods are made from: its container `flint-executor`
    /// (or its first) gets the image, environment and resources; the rest is kept.
    #[arg(long, env = "FLINT_K8S_POD_TEMPLATE")]
    pub k8s_pod_template: Option<std::path::PathBuf>,
    /// The driver's own pod (from the downward API): it owns its executors' pods, so
    /// that Kubernetes deletes them with it.
    #[arg(long, env = "FLINT_K8S_DRIVER_POD")]
    pub k8s_driver_pod: Option<String>,
    /// What executor pods dial: `flint://SERVICE.NAMESPACE.svc:PORT` (default: the
    /// executor listener's address).
    #[arg(long, env = "FLINT_K8S_DRIVER_URL")]
    pub k8s_driver_url: Option<String>,
    /// `SECRET:KEY`: the Secret holding --cluster-secret, which executor pods read it
    /// from (it is never written into a pod spec).
    #[arg(long, env = "FLINT_K8S_CLUSTER_SECRET_REF", value_parser = parse_secret_ref)]
    pub k8s_cluster_secret_ref: Option<(String, String)>,
    /// Executor pods created at a time (Spark's spark.kubernetes.allocation.batch.size).
    #[arg(long, env = "FLINT_K8S_ALLOCATION_BATCH_SIZE", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub k8s_allocation_batch_size: u32,
    /// The pause between batches of pod creations.
    #[arg(
        long,
        env = "FLINT_K8S_ALLOCATION_BATCH_DELAY_MS",
        default_value_t = 1000
    )]
    pub k8s_allocation_batch_delay_ms: u64,
    /// Memory a pod asks for beyond --executor-memory-mb, as a fraction of it ...
    #[arg(long, env = "FLINT_K8S_MEMORY_OVERHEAD_FACTOR", default_value_t = 0.10,
          value_parser = parse_overhead_factor)]
    pub k8s_memory_overhead_factor: f64,
    /// ... and at least this much (the executor process and its compiler subprocess).
    #[arg(long, env = "FLINT_K8S_MIN_MEMORY_OVERHEAD_MB", default_value_t = 384)]
    pub k8s_min_memory_overhead_mb: u64,
    /// The kubeconfig to reach the API with (default: KUBECONFIG, ~/.kube/config, or
    /// the pod's service account).
    #[arg(long, env = "FLINT_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

impl KubernetesArgs {
    fn config(&self) -> anyhow::Result<Option<flint_driver::config::KubernetesConfig>> {
        let Some(image) = &self.k8s_image else {
            return Ok(None);
        };
        Ok(Some(flint_driver::config::KubernetesConfig {
            namespace: self.k8s_namespace.clone(),
            image: image.clone(),
            image_pull_policy: self.k8s_image_pull_policy.clone(),
            pod_template: self.k8s_pod_template.clone(),
            driver_pod: self.k8s_driver_pod.clone(),
            driver_url: self.k8s_driver_url.clone(),
            cluster_secret_ref: self.k8s_cluster_secret_ref.clone(),
            batch_size: self.k8s_allocation_batch_size,
            batch_delay: Duration::from_millis(self.k8s_allocation_batch_delay_ms),
            memory_overhead_factor: self.k8s_memory_overhead_factor,
            min_memory_overhead_mb: self.k8s_min_memory_overhead_mb,
            kubeconfig: self.kubeconfig.clone(),
        }))
    }
}

fn parse_secret_ref(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((name, key)) if !name.is_empty() && !key.is_empty() => {
            Ok((name.to_owned(), key.to_owned()))
        }
        _ => Err(format!("{s:?}: expected SECRET:KEY")),
    }
}

fn parse_overhead_factor(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=10.0).contains(&f) => Ok(f),
        _ => Err(format!("{s:?}: a fraction from 0 to 10")),
    }
}

/// When the driver stops replacing executors that fail.
#[derive(clap::Args, Clone, Debug)]
pub struct SupervisionArgs {
    /// Stop launching executors at this many unclean exits (not asked for, not code 0)
    /// within --executor-failures-interval-ms (default: twice the executors wanted, at
    /// least 3, as Spark's spark.executor.maxNumFailures).
    #[arg(long, env = "FLINT_MAX_EXECUTOR_FAILURES",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_executor_failures: Option<u32>,
    /// How long an executor's failure counts towards --max-executor-failures.
    #[arg(long, env = "FLINT_EXECUTOR_FAILURES_INTERVAL_MS", default_value_t = flint_protocol::defaults::EXECUTOR_FAILURES_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub executor_failures_interval_ms: u64,
    /// A launched executor that has not registered this long after its launch is killed
    /// and counted as a failure.
    #[arg(long, env = "FLINT_EXECUTOR_LAUNCH_TIMEOUT_MS", default_value_t = flint_protocol::defaults::EXECUTOR_LAUNCH_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub executor_launch_timeout_ms: u64,
    /// The program the `local` cluster manager starts executors with, given `executor
    /// --driver-url ...` as its arguments (default: this flint binary); e.g. a wrapper
    /// that sets limits and `exec`s flint.
    #[arg(long, env = "FLINT_EXECUTOR_BINARY")]
    pub executor_binary: Option<std::path::PathBuf>,
}

impl SupervisionArgs {
    pub fn apply(&self, allocation: &mut flint_driver::config::AllocationConfig) {
        allocation.max_executor_failures = self.max_executor_failures;
        allocation.executor_failures_interval =
            Duration::from_millis(self.executor_failures_interval_ms);
        allocation.executor_launch_timeout = Duration::from_millis(self.executor_launch_timeout_ms);
        if let Some(binary) = &self.executor_binary {
            allocation.executor_binary = Some(binary.clone());
        }
    }
}

impl DriverCommand {
    pub fn config(&self) -> anyhow::Result<DriverConfig> {
        let mut config = self.driver.config()?;
        let a = &self.allocation;
        let allocation = &mut config.allocation;
        allocation.cluster_manager = a.cluster_manager.map(|kind| match kind {
            ClusterManagerArg::Local => flint_driver::config::ClusterManagerKind::Local,
            ClusterManagerArg::Standalone => flint_driver::config::ClusterManagerKind::Standalone,
            ClusterManagerArg::Kubernetes => flint_driver::config::ClusterManagerKind::Kubernetes,
        });
        allocation.kubernetes = a.kubernetes.config()?;
        if a.cluster_manager == Some(ClusterManagerArg::Kubernetes)
            && allocation.kubernetes.is_none()
        {
            anyhow::bail!(
                "--cluster-manager kubernetes needs --k8s-image (the image executor pods run)"
            );
        }
        if let Some(max) = a.max_executors {
            if a.min_executors > max {
                anyhow::bail!(
                    "--min-executors ({}) is above --max-executors ({max})",
                    a.min_executors
                );
            }
            allocation.dynamic = Some(flint_driver::config::DynamicAllocation {
                min_executors: a.min_executors,
                max_executors: max,
                backlog_timeout: Duration::from_millis(a.scheduler_backlog_timeout_ms),
                idle_timeout: Duration::from_millis(a.executor_idle_timeout_ms),
            });
        }
        allocation.initial_executors = match (a.initial_executors, a.max_executors) {
            (Some(n), _) => n,
            (None, Some(_)) => a.min_executors,
            (None, None) => flint_protocol::defaults::INITIAL_EXECUTORS,
        };
        allocation.executor_cores = a.executor_cores;
        allocation.executor_memory_mb = a.executor_memory_mb;
        a.supervision.apply(allocation);
        Ok(config)
    }
}

/// `flint executor --max-memory-mb`'s default; `flint bench`'s in-process floor runs
/// with the same limit.
pub const MAX_MEMORY_MB: u32 = 4096;

#[derive(clap::Args, Clone, Debug)]
pub struct ExecutorArgs {
    /// The driver's executor address: `flint://HOST:PORT` or `HOST:PORT`.
    #[arg(long, env = "FLINT_DRIVER_URL")]
    driver_url: String,
    #[arg(long, env = "FLINT_EXECUTOR_ID")]
    executor_id: String,
    /// Task threads, and the cores this executor offers.
    #[arg(long, env = "FLINT_CORES", value_parser = clap::value_parser!(u32).range(1..=1024))]
    cores: u32,
    /// Host name reported to the driver (default: the address it sees).
    #[arg(long, env = "FLINT_HOSTNAME", default_value = "")]
    hostname: String,
    /// The application this executor serves (Spark's --app-id): a driver of another app
    /// refuses its registration (exit code 3).
    #[arg(long, env = "FLINT_APP_ID")]
    app_id: Option<String>,
    /// Cache and scratch space (default: ./flint-work/<executor id>).
    #[arg(long, env = "FLINT_WORK_DIR")]
    work_dir: Option<PathBuf>,
    #[arg(long, env = "FLINT_CLUSTER_SECRET", hide_env_values = true)]
    cluster_secret: Option<String>,
    /// Largest linear memory of any task here (jobs asking for more get this much).
    #[arg(long, env = "FLINT_MAX_MEMORY_MB", default_value_t = MAX_MEMORY_MB,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_memory_mb: u32,
    /// Memory set aside for this executor's tasks (a pod's or a worker's share): each
    /// task's linear memory is held to this divided by --cores, so that tasks on every
    /// core at once fit in it.
    #[arg(long, env = "FLINT_MEMORY_MB", value_parser = clap::value_parser!(u64).range(1..))]
    memory_mb: Option<u64>,
    /// Meter wasm work with fuel, so that tasks with `resources.fuel` budgets can run
    /// here (about 12 % slower on tight compute loops).
    #[arg(long, env = "FLINT_FUEL")]
    fuel: bool,
    /// Longest a module may take to compile before its tasks fail as `compile_limit`.
    #[arg(long, env = "FLINT_COMPILE_TIMEOUT_MS", default_value_t = 30_000)]
    compile_timeout_ms: u64,
    /// Largest module, file or `url` input one fetch may bring in; past it the task fails
    /// as `fetch_error` naming the limit.
    #[arg(long, env = "FLINT_FETCH_MAX_BYTES", default_value_t = FetchOptions::default().max_bytes)]
    fetch_max_bytes: u64,
    /// Longest one fetch (resolving, connecting and the transfer) may take.
    #[arg(long, env = "FLINT_FETCH_TIMEOUT_MS", default_value_t = FetchOptions::default().timeout.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    fetch_timeout_ms: u64,
    /// Bytes the fetch cache keeps on disk before evicting the least recently used.
    #[arg(long, env = "FLINT_FETCH_CACHE_BYTES", default_value_t = FetchOptions::default().max_cache_bytes)]
    fetch_cache_bytes: u64,
    /// How long to keep trying to reach the driver at start, in milliseconds.
    #[arg(long, env = "FLINT_CONNECT_TIMEOUT_MS", default_value_t = 10_000)]
    connect_timeout_ms: u64,
    /// How long to keep trying to get back to a lost driver before exiting (code 5).
    #[arg(long, env = "FLINT_RECONNECT_TIMEOUT_MS", default_value_t = 300_000)]
    reconnect_timeout_ms: u64,
}

impl ExecutorArgs {
    pub fn options(self) -> anyhow::Result<ExecutorOptions> {
        let driver_addr = self
            .driver_url
            .strip_prefix("flint://")
            .unwrap_or(&self.driver_url)
            .to_owned();
        let work_dir = self
            .work_dir
            .unwrap_or_else(|| PathBuf::from("flint-work").join(&self.executor_id));
        Ok(ExecutorOptions {
            driver_addr,
            executor_id: ExecutorId(self.executor_id),
            cores: self.cores,
            hostname: self.hostname,
            app_id: self.app_id,
            work_dir,
            cluster_secret: self.cluster_secret,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            reconnect_timeout: Duration::from_millis(self.reconnect_timeout_ms),
            max_memory_bytes: match self.memory_mb {
                Some(total) => {
                    (total / u64::from(self.cores)).clamp(1, u64::from(self.max_memory_mb)) as usize
                }
                None => self.max_memory_mb as usize,
            } << 20,
            fuel: self.fuel,
            fetch: FetchOptions {
                max_bytes: self.fetch_max_bytes,
                timeout: Duration::from_millis(self.fetch_timeout_ms),
                max_cache_bytes: self.fetch_cache_bytes,
                ..FetchOptions::default()
            },
            compiler: CompilerMode::Subprocess {
                program: std::env::current_exe()?,
                args: vec!["compile-module".into()],
                timeout: Duration::from_millis(self.compile_timeout_ms),
            },
        })
    }
}
