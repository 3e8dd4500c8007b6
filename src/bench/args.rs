//! `flint bench`'s flags, and the local cluster they describe: built by `flint dev`'s own
//! parser, so that every driver and executor setting the bench does not name has the
//! default a user's cluster has, unless `--driver-arg` gives it.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, FromArgMatches};

use crate::dev::DevArgs;
use crate::flags::DriverArgs;

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
    /// Instead: every end-to-end figure next to its floor on this machine, measured in
    /// the same run, with their ratios: no-op throughput against the executor-only
    /// floor (the built-in minimal module and `--module`, a real Rust guest: testkit),
    /// the single-task round trip against the task runner plus two loopback round
    /// trips, and `--result-tasks` results of `--results-mib` (8) MiB served to a client
    /// against a raw loopback copy of the same bytes. Needs `--module testkit.wasm`.
    #[arg(long, conflicts_with_all = ["pending_memory", "soak", "simulated_executors", "scale_up"])]
    pub floor: bool,
    /// The driver's `--block-store` for `--results-mib`: `driver` (uploads through the
    /// driver), or `local` for a directory beside the data dir that the executors, on
    /// this machine, write themselves (`file://`), or any object store URL.
    #[arg(long, default_value = "driver")]
    pub block_store: String,
    /// Instead: a soak. This many jobs of `--soak-tasks` testkit `echo` tasks (needs
    /// `--module testkit.wasm`), each task with its own `--soak-input-bytes` of text,
    /// `--soak-concurrency` jobs in flight; at every tenth of them (and at 1,000) the
    /// driver's resident set, the data dir and the job store on disk.
    #[arg(long, value_name = "JOBS", conflicts_with_all = ["pending_memory", "results_mib"],
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub soak: Option<u64>,
    /// Tasks per soak job.
    #[arg(long, default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub soak_tasks: u32,
    /// Bytes of text each soak task gets as its input (and echoes back as its result).
    #[arg(long, default_value_t = 2048)]
    pub soak_input_bytes: usize,
    /// Jobs in flight at once: each submitted, then waited for until it ends.
    #[arg(long, default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub soak_concurrency: u32,
    /// Instead: the driver alone at scale. For each number in the list (e.g.
    /// `2,20,200,1000`), a fresh driver and that many simulated executors of `--cores`
    /// cores (real protocol, real sockets, every task ended at once or after
    /// `--simulated-task-us`; `flint simulate-executors` processes), one job of
    /// `--simulated-tasks` tasks: tasks/s, the driver's CPU per task, launch-to-status
    /// p50 / p99 and the driver's memory per executor.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',',
          conflicts_with_all = ["pending_memory", "results_mib", "soak"],
          value_parser = clap::value_parser!(u32).range(1..=20_000))]
    pub simulated_executors: Vec<u32>,
    #[arg(long, default_value_t = 500_000,
          value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub simulated_tasks: u32,
    #[arg(long, default_value_t = 0)]
    pub simulated_task_us: u64,
    /// With `--simulated-executors`: the scheduler's fairness between this many tenants
    /// (weights 1, 2, 3, 1, 2, 3, ...; one job of `--simulated-tasks / N` tasks each, all
    /// submitted at once): each tenant's share of the tasks run until the first job
    /// ends, against its weight's share, and the tasks/s against one tenant's job of
    /// `--simulated-tasks` on the same driver.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub tenants: u32,
    /// Processes the simulated executors are spread over (each one runtime thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub simulator_processes: u32,
    /// Instead: scale-up latency under these cluster managers (`local`, `standalone`,
    /// or both, comma-separated). A `flint driver` process with dynamic allocation from
    /// 0 to `--executors` executors of `--cores` cores (under `standalone`, over
    /// `--workers` `flint worker` processes on this host), one job of
    /// `--scale-up-tasks` testkit `sleep` tasks of `--scale-up-task-ms`: the time from
    /// submission to the first task's start on a freshly launched executor, and to
    /// every executor running one. Needs `--module testkit.wasm`.
    #[arg(long, value_name = "MANAGER,...", value_delimiter = ',',
          conflicts_with_all = ["pending_memory", "results_mib", "soak", "simulated_executors"],
          value_parser = ["local", "standalone"])]
    pub scale_up: Vec<String>,
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    #[arg(long, default_value_t = 600)]
    pub scale_up_tasks: u32,
    #[arg(long, default_value_t = 100)]
    pub scale_up_task_ms: u64,
    /// Instead: pipelines (`POST /v1/graphs`). On a local cluster of `--executors` x
    /// `--cores`: a no-op graph of `--graph-maps` maps, `--graph-combines` combines (each
    /// reading its share of the maps' results) and one reduce reading every combine,
    /// against as many tasks in one flat job, alternating, `--graph-rounds` times each;
    /// the driver's memory per waiting task (`--graph-waiting`, drivers of their own
    /// with no executors); and the wordcount graph over `--graph-wordcount-mib` MiB of
    /// generated text against the same two modules run by wasmtime in this process on
    /// as many threads as the cluster has cores. A figure given 0 is left out.
    #[arg(long, conflicts_with_all = ["pending_memory", "results_mib", "soak", "simulated_executors", "scale_up", "floor"])]
    pub graph: bool,
    /// No-op map tasks of `--graph`'s scale graph.
    #[arg(long, default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub graph_maps: u32,
    /// Combine tasks, each reading the results of its share of the maps (an explicit
    /// `tasks` list); one reduce reads every combine's.
    #[arg(long, default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub graph_combines: u32,
    /// Times the graph and the flat job each run, alternating.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub graph_rounds: u32,
    /// Upstream tasks that never run and as many readers, one each, for the driver's
    /// memory per waiting task.
    #[arg(long, default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub graph_waiting: u32,
    /// MiB of generated text the wordcount graph counts (maps -> one reduce).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub graph_wordcount_mib: u32,
    /// Map tasks of the wordcount graph (the text cut into as many slices).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub graph_wordcount_maps: u32,
    /// guest-examples' wordcount built for wasm32-wasip1 (default: where `cargo build
    /// --release` in guest-examples puts it, from the current directory).
    #[arg(long, value_name = "PATH")]
    pub wordcount: Option<PathBuf>,
    /// guest-examples' wordcount-reduce, likewise.
    #[arg(long, value_name = "PATH")]
    pub wordcount_reduce: Option<PathBuf>,
    /// Instead: the work a driver restart loses (issue 41). Twice, with executors that
    /// kill their tasks on losing the driver (`--driver-loss-grace-ms 0`: `before`) and
    /// with the default grace (`after`): a `flint driver` process and `--executors` x
    /// `--cores` `flint executor` processes, one job of testkit `burn` tasks of
    /// `--restart-task-ms` enough to keep every core busy, the driver SIGKILLed and
    /// started again on its data dir every `--restart-interval-ms`, this many times. The
    /// work lost is the executors' task CPU time less every task's succeeded attempt's,
    /// in task-seconds. Needs `--module testkit.wasm`.
    #[arg(long, value_name = "N",
          conflicts_with_all = ["pending_memory", "results_mib", "soak", "simulated_executors", "scale_up", "floor", "graph"],
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub restarts: Option<u32>,
    /// The wall time each `burn` task of `--restarts` computes for.
    #[arg(long, default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub restart_task_ms: u64,
    /// From one kill of the driver to the next; not a multiple of `--restart-task-ms`, so
    /// that kills land at different points of the tasks.
    #[arg(long, default_value_t = 3_000,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub restart_interval_ms: u64,
    /// Instead: outbound HTTP from tasks (issue 42). A keep-alive HTTP server in this
    /// process answers a small fixed body; a local cluster of `--executors` x `--cores`
    /// allowed to call it (`--egress-allow`) runs one job of `--egress-tasks` testkit
    /// `http-get` tasks, one request each; then a pooled native client (reqwest) makes as
    /// many requests with as many in flight as the cluster has cores. Both rates and
    /// their ratio, and a job of as many testkit `noop` tasks for what the request adds
    /// to a task. Needs `--module testkit.wasm`.
    #[arg(long,
          conflicts_with_all = ["pending_memory", "results_mib", "soak", "simulated_executors", "scale_up", "floor", "graph", "restarts"])]
    pub egress: bool,
    /// `--egress`'s native client in a process of its own (the tasks' requests cross a
    /// process boundary to the server; so do these): GETs `--egress-tasks` times with
    /// `--executors` x `--cores` in flight and prints the wall time and each request's,
    /// in ns. Started by `--egress` itself.
    #[arg(long, hide = true, value_name = "URL")]
    pub egress_native_client: Option<String>,
    /// Tasks of `--egress`'s jobs, and requests of its native client.
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub egress_tasks: u32,
    /// Instead: a cluster at rest and the CLI's own cost (`rest`), for each
    /// `--at-rest-binary` (default: this binary), round by round in turn: the resident
    /// sets of a `flint dev` driver and 2 executors x 1 core after start and after a job
    /// of `--tasks` testkit `noop` tasks, and the median time of `flint --version`,
    /// `flint status` and `flint submit --wait` against the same job over HTTP. Needs
    /// `--module testkit.wasm`.
    #[arg(long,
          conflicts_with_all = ["pending_memory", "results_mib", "soak", "simulated_executors", "scale_up", "floor", "graph", "restarts", "egress"])]
    pub at_rest: bool,
    /// A flint binary for `--at-rest` to measure (repeat to compare).
    #[arg(long, value_name = "FLINT", requires = "at_rest")]
    pub at_rest_binary: Vec<PathBuf>,
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub at_rest_rounds: u32,
    /// How long the cluster rests before its memory is read, after start and after the job.
    #[arg(long, default_value_t = 10_000)]
    pub at_rest_settle_ms: u64,
    /// Runs of each CLI command (and of the HTTP submission) whose median is printed.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub at_rest_runs: u32,
    /// A `flint driver` flag for the bench's driver, e.g. `--driver-arg=--job-retention=30s`;
    /// repeatable. The bench's own flags (`--launch-ahead`, ...) cannot be given twice.
    #[arg(long = "driver-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub driver_args: Vec<String>,
}

impl BenchArgs {
    /// The `flint dev` cluster to measure, on free loopback ports with its state in
    /// `data_dir`: what `flint dev` would run given the bench's driver flags. The
    /// environment is not read (a `FLINT_TOKEN` meant for another driver would lock this
    /// one's client out); every flag the bench does not set keeps its default.
    pub fn dev_args(&self, data_dir: &Path) -> anyhow::Result<DevArgs> {
        self.dev_args_with(data_dir, &[])
    }

    /// [`Self::dev_args`] and more `flint dev` flags (`--tenants`, ...).
    pub fn dev_args_with(&self, data_dir: &Path, more: &[String]) -> anyhow::Result<DevArgs> {
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
            None if !self.simulated_executors.is_empty() => 0,
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
        .chain(self.checked_driver_args()?)
        .chain(more.iter().cloned())
        .collect();
        parse_dev_args(&argv)
    }

    /// `--driver-arg`s, refused unless every one is a `flint driver` flag: `flint dev`'s
    /// parser, which gets them, would also take its executor flags.
    fn checked_driver_args(&self) -> anyhow::Result<Vec<String>> {
        let command = DriverArgs::augment_args(clap::Command::new("--driver-arg"))
            .mut_args(|arg| arg.env(None::<&'static str>));
        command
            .try_get_matches_from(
                std::iter::once("--driver-arg").chain(self.driver_args.iter().map(String::as_str)),
            )
            .context("--driver-arg takes `flint driver` flags")?;
        Ok(self.driver_args.clone())
    }

    /// The soak's shape, checked before a cluster starts: `None` without `--soak`.
    pub fn soak(&self) -> anyhow::Result<Option<Soak>> {
        let Some(jobs) = self.soak else {
            return Ok(None);
        };
        if self.module.is_none() {
            bail!("--soak needs --module testkit.wasm (its `echo` runs the tasks)");
        }
        // JSON escapes nothing in the generated text; the rest of a spec is well under this.
        let spec_bytes = self.soak_tasks as usize * (self.soak_input_bytes + 16) + 4096;
        if spec_bytes > flint_protocol::defaults::MAX_JOB_SPEC_BYTES {
            bail!(
                "--soak-tasks {} x --soak-input-bytes {} makes a job spec beyond the driver's {} MiB limit",
                self.soak_tasks,
                self.soak_input_bytes,
                flint_protocol::defaults::MAX_JOB_SPEC_BYTES >> 20
            );
        }
        Ok(Some(Soak {
            jobs,
            tasks: self.soak_tasks,
            input_bytes: self.soak_input_bytes,
            concurrency: self.soak_concurrency,
        }))
    }
}

/// What `--soak` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Soak {
    pub jobs: u64,
    pub tasks: u32,
    pub input_bytes: usize,
    pub concurrency: u32,
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
mod tests;
