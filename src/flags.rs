//! The command line of `flint`: the subcommands and the flags of the long-running ones
//! (driver, executor, the compiler subprocess), each flag with its `FLINT_*` variable and
//! its default, turned here into the typed configs the libraries take. The client
//! commands' flags live beside their commands (`submit.rs`, `jobs.rs`, `bench/args.rs`).
//!
//! [`driver`] holds the driver's own flags, [`allocation`] those of the executors it
//! launches, [`executor`] an executor's and its compiler subprocess's; this file joins
//! the first two into `flint driver`'s command.

mod allocation;
mod driver;
mod executor;

use std::time::Duration;

use clap::{Parser, Subcommand};
use flint_driver::DriverConfig;

pub use self::allocation::SupervisionArgs;
use self::allocation::{AllocationArgs, ClusterManagerArg};
pub use self::driver::DriverArgs;
pub use self::executor::{CompileArgs, ExecutorArgs, MAX_MEMORY_MB};
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

/// `flint driver`: the driver's settings and the executors it launches.
#[derive(clap::Args, Clone, Debug)]
pub struct DriverCommand {
    #[command(flatten)]
    pub driver: DriverArgs,
    #[command(flatten)]
    pub allocation: AllocationArgs,
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
