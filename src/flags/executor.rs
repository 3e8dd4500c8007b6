//! The flags of an executor process and of the compiler subprocess it starts. Apart
//! from the driver's because an executor is another process, configured only from these
//! and from what the driver pushes at registration.

use std::path::PathBuf;
use std::time::Duration;

use flint_executor::ExecutorOptions;
use flint_executor::compiler::CompilerMode;
use flint_executor::ends::Budgets;
use flint_fetch_cache::FetchOptions;
use flint_protocol::ExecutorId;

#[derive(clap::Args, Clone, Debug)]
pub struct CompileArgs {
    #[arg(long)]
    pub slots: u32,
    #[arg(long)]
    pub max_memory_bytes: usize,
    #[arg(long)]
    pub fuel: bool,
    /// For the engine of deterministic tasks.
    #[arg(long)]
    pub deterministic: bool,
    #[arg(long)]
    pub out: PathBuf,
    pub input: PathBuf,
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
    /// A file holding the cluster secret (its first line), readable by its owner only:
    /// how a batch scheduler's job gets it without it showing in the job's command line
    /// or environment (`scontrol show job`, `ps`).
    #[arg(
        long,
        env = "FLINT_CLUSTER_SECRET_FILE",
        conflicts_with = "cluster_secret"
    )]
    cluster_secret_file: Option<PathBuf>,
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
    /// With --driver-loss-grace-ms 0: how long to keep trying to get back to a lost
    /// driver (its tasks killed at once) before exiting (code 5).
    #[arg(long, env = "FLINT_RECONNECT_TIMEOUT_MS", default_value_t = 300_000)]
    reconnect_timeout_ms: u64,
    /// How long tasks keep running after the driver is lost, while it is sought again
    /// (every 250 ms at most): a driver back in time (a restarted one too) adopts them
    /// and gets their ends. Past it they are killed and the executor exits (code 5).
    /// 0: kill them at once and seek the driver for --reconnect-timeout-ms.
    #[arg(long, env = "FLINT_DRIVER_LOSS_GRACE_MS", default_value_t = 600_000)]
    driver_loss_grace_ms: u64,
    /// Memory for task ends the driver has not yet made durable (kept through its
    /// absence and until it acknowledges them). Past it, ends spill to disk.
    #[arg(long, env = "FLINT_END_BUFFER_BYTES", default_value_t = Budgets::default().memory_bytes)]
    end_buffer_bytes: u64,
    /// Disk (under the work dir's ends/ and blocks-held/) for the ends that do not fit
    /// in memory and for large results kept while the driver is away. With both full,
    /// tasks wait to report their ends until the driver acknowledges some.
    #[arg(long, env = "FLINT_END_SPILL_BYTES", default_value_t = Budgets::default().disk_bytes)]
    end_spill_bytes: u64,
}

impl ExecutorArgs {
    /// The runtime's worker threads: one per core offered, no more than the host has.
    pub fn runtime_threads(&self) -> usize {
        let host = std::thread::available_parallelism().map_or(1, usize::from);
        (self.cores as usize).clamp(1, host)
    }

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
            cluster_secret: match &self.cluster_secret_file {
                Some(path) => Some(read_secret_file(path)?),
                None => self.cluster_secret,
            },
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            reconnect_timeout: Duration::from_millis(self.reconnect_timeout_ms),
            driver_loss_grace: Duration::from_millis(self.driver_loss_grace_ms),
            end_budgets: Budgets {
                memory_bytes: self.end_buffer_bytes,
                disk_bytes: self.end_spill_bytes,
            },
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

/// The secret in `path`'s first line. A file others may read is refused, as ssh refuses
/// such a key: the secret would be anyone's on the node.
fn read_secret_file(path: &std::path::Path) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("--cluster-secret-file {shown}: {e}"))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        anyhow::bail!(
            "--cluster-secret-file {shown} is readable by others (mode {mode:o}); \
             it must be readable by its owner only (chmod 600)"
        );
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--cluster-secret-file {shown}: {e}"))?;
    let secret = text.lines().next().unwrap_or("").trim_end();
    if secret.is_empty() {
        anyhow::bail!("--cluster-secret-file {shown} is empty");
    }
    Ok(secret.to_owned())
}
