//! Executors as Slurm batch jobs, under `--cluster-manager slurm`. Apart from the other
//! cluster managers' flags because a site's Slurm settings (partition, account, time
//! limit, the shared paths) are theirs alone.

use std::path::PathBuf;
use std::time::Duration;

/// Executor jobs, under `--cluster-manager slurm`.
#[derive(clap::Args, Clone, Debug)]
pub struct SlurmArgs {
    /// The partition executor jobs are submitted to (sbatch --partition; default: the
    /// cluster's default partition).
    #[arg(long, env = "FLINT_SLURM_PARTITION")]
    pub slurm_partition: Option<String>,
    /// The account executor jobs are charged to (sbatch --account).
    #[arg(long, env = "FLINT_SLURM_ACCOUNT")]
    pub slurm_account: Option<String>,
    /// Each executor job's time limit, in Slurm's format (sbatch --time: MINUTES,
    /// MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS...; default: the partition's).
    /// An executor that reaches it is replaced, not counted as a failure.
    #[arg(long, env = "FLINT_SLURM_TIME_LIMIT")]
    pub slurm_time_limit: Option<String>,
    /// One more sbatch argument, as sbatch takes it (repeatable): `--slurm-extra=--qos=short`.
    #[arg(long = "slurm-extra", allow_hyphen_values = true)]
    pub slurm_extra: Vec<String>,
    /// The flint binary executor jobs run, on a path every node sees (a shared
    /// filesystem; default: this binary's own path).
    #[arg(long, env = "FLINT_SLURM_FLINT_PATH")]
    pub slurm_flint_path: Option<PathBuf>,
    /// Where executor jobs' scripts, logs and the cluster secret's file go, on a
    /// filesystem every node shares (default: DATA_DIR/work).
    #[arg(long, env = "FLINT_SLURM_WORK_DIR")]
    pub slurm_work_dir: Option<PathBuf>,
    /// What executor jobs dial: `flint://HOST:PORT`, a name the compute nodes resolve
    /// (default: the executor listener's address, 127.0.0.1 when it listens on all).
    #[arg(long, env = "FLINT_SLURM_DRIVER_URL")]
    pub slurm_driver_url: Option<String>,
    /// How often the driver asks Slurm about its executor jobs (one squeue call each
    /// time, whatever their number; a busy slurmctld's users are asked to poll gently).
    #[arg(long, env = "FLINT_SLURM_POLL_INTERVAL_MS", default_value_t = flint_protocol::defaults::SLURM_POLL_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(100..))]
    pub slurm_poll_interval_ms: u64,
}

impl SlurmArgs {
    pub(super) fn config(&self) -> flint_driver::config::SlurmConfig {
        flint_driver::config::SlurmConfig {
            partition: self.slurm_partition.clone(),
            account: self.slurm_account.clone(),
            time_limit: self.slurm_time_limit.clone(),
            extra: self.slurm_extra.clone(),
            flint_path: self.slurm_flint_path.clone(),
            work_dir: self.slurm_work_dir.clone(),
            driver_url: self.slurm_driver_url.clone(),
            poll_interval: Duration::from_millis(self.slurm_poll_interval_ms),
        }
    }
}
