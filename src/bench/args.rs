//! `flint bench`'s flags, and the local cluster they describe: built by `flint dev`'s own
//! parser, so that every driver and executor setting the bench does not name has the
//! default a user's cluster has.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, FromArgMatches};

use crate::dev::DevArgs;

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// The task: the testkit guest (guest-examples/testkit built for wasm32-wasip1),
    /// run as `noop`, or any module. Without it, a minimal core module whose `_start`
    /// returns at once (the WAT no-op of the task_cost bench's floor), which measures
    /// Flint rather than a guest's start-up. `--results-mib` needs testkit.
    #[arg(long)]
    pub module: Option<PathBuf>,
    #[arg(long, default_value_t = 2)]
    pub executors: u32,
    #[arg(long, default_value_t = 1)]
    pub cores: u32,
    /// No-op tasks in the throughput job.
    #[arg(long, default_value_t = 20_000)]
    pub tasks: usize,
    /// Single-task jobs submitted one after another for the latency figures.
    #[arg(long, default_value_t = 500)]
    pub latency_jobs: usize,
    /// The driver's `--launch-ahead`.
    #[arg(long, default_value_t = flint_protocol::defaults::LAUNCH_AHEAD)]
    pub launch_ahead: u32,
    /// The driver's `--launch-ahead-max`.
    #[arg(long, default_value_t = flint_protocol::defaults::LAUNCH_AHEAD_MAX)]
    pub launch_ahead_max: u32,
    /// The driver's `--commit-interval-ms`.
    #[arg(long, default_value_t = flint_protocol::defaults::COMMIT_INTERVAL_MS)]
    pub commit_interval_ms: u64,
    /// Instead of the throughput and latency figures: start a driver with no executors,
    /// submit one job of this many no-op tasks (all stay pending) and print the driver's
    /// resident memory per pending task.
    #[arg(long, value_name = "TASKS")]
    pub pending_memory: Option<usize>,
    /// Instead: the large-result path's throughput. One job of `--result-tasks` tasks
    /// each writing this many MiB (testkit `print`) through the block store in the
    /// driver's data dir, then every result streamed to this client and hashed; printed
    /// next to a plain write of as many bytes to a file on the same file system.
    #[arg(long, value_name = "MIB")]
    pub results_mib: Option<usize>,
    #[arg(long, default_value_t = 8)]
    pub result_tasks: usize,
    /// The driver's `--block-store` for `--results-mib`: `driver` (uploads through the
    /// driver), or `local` for a directory beside the data dir that the executors, on
    /// this machine, write themselves (`file://`), or any object store URL.
    #[arg(long, default_value = "driver")]
    pub block_store: String,
}

impl BenchArgs {
    /// The `flint dev` cluster to measure, on free loopback ports with its state in
    /// `data_dir`: what `flint dev` would run given the bench's driver flags. The
    /// environment is not read (a `FLINT_TOKEN` meant for another driver would lock this
    /// one's client out); every flag the bench does not set keeps its default.
    pub fn dev_args(&self, data_dir: &Path) -> anyhow::Result<DevArgs> {
        let block_store = match self.block_store.as_str() {
            "local" => {
                let dir = data_dir.join("local-blocks");
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                format!("file://{}", dir.display())
            }
            other => other.to_owned(),
        };
        let executors = match self.pending_memory {
            Some(_) => 0,
            None => self.executors,
        };
        let argv: Vec<String> = [
            "flint-bench",
            "--listen",
            "127.0.0.1:0",
            "--executor-listen",
            "127.0.0.1:0",
        ]
        .into_iter()
        .map(String::from)
        .chain([
            "--data-dir".into(),
            data_dir.display().to_string(),
            format!("--block-store={block_store}"),
            format!("--launch-ahead={}", self.launch_ahead),
            format!("--launch-ahead-max={}", self.launch_ahead_max),
            format!("--commit-interval-ms={}", self.commit_interval_ms),
            format!("--executors={executors}"),
            format!("--cores={}", self.cores),
        ])
        .collect();
        parse_dev_args(&argv)
    }
}

/// `flint dev`'s flags parsed from `argv` alone, with no `FLINT_*` variable read.
fn parse_dev_args(argv: &[String]) -> anyhow::Result<DevArgs> {
    let command = DevArgs::augment_args(clap::Command::new("flint-bench"))
        .mut_args(|arg| arg.env(None::<&'static str>));
    let matches = command
        .try_get_matches_from(argv)
        .context("the bench's cluster flags")?;
    Ok(DevArgs::from_arg_matches(&matches)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn bench(argv: &[&str]) -> BenchArgs {
        Bench::parse_from(std::iter::once("bench").chain(argv.iter().copied())).args
    }

    #[test]
    fn the_cluster_has_the_bench_flags_and_flint_devs_defaults_for_the_rest() {
        let data = tempfile::tempdir().unwrap();
        let dev = bench(&["--launch-ahead", "5", "--cores", "3"])
            .dev_args(data.path())
            .unwrap();
        assert_eq!((dev.executors, dev.cores), (2, 3));
        assert_eq!(dev.driver.launch_ahead, 5);
        assert_eq!(dev.driver.listen.port(), 0);
        assert_eq!(dev.driver.data_dir, data.path());
        let config = dev.driver.config().unwrap();
        assert_eq!(config.scheduling.speculation, None);
        let speculation = flint_driver::scheduler::speculation::SpeculationConfig::default();
        assert_eq!(dev.driver.speculation_quantile, speculation.quantile);
        assert_eq!(dev.driver.speculation_multiplier, speculation.multiplier);
        let defaults = flint_driver::DriverConfig::new(data.path().to_owned());
        assert_eq!(config.inline_result_bytes, defaults.inline_result_bytes);
        assert_eq!(config.executor_timeout, defaults.executor_timeout);
        assert_eq!(config.max_event_streams, defaults.max_event_streams);

        let dev = bench(&["--pending-memory", "10"])
            .dev_args(data.path())
            .unwrap();
        assert_eq!(dev.executors, 0);
    }

    #[test]
    fn the_environment_does_not_reach_the_bench_cluster() {
        // SAFETY: no other test in this binary reads FLINT_LOCALITY_WAIT_MS.
        unsafe { std::env::set_var("FLINT_LOCALITY_WAIT_MS", "1234") };
        let dev = parse_dev_args(&["flint-bench".into()]);
        unsafe { std::env::remove_var("FLINT_LOCALITY_WAIT_MS") };
        assert_eq!(
            dev.unwrap().driver.locality_wait_ms,
            flint_protocol::defaults::LOCALITY_WAIT_MS
        );
    }
}
