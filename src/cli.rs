//! The command line of `flint`: the subcommands, each handing its flags to the module
//! that runs it. The one module that names every command; none of them names it, and the
//! flags they share live in `flags`, which names none of them.

use clap::{Parser, Subcommand};

use crate::flags::{CompileArgs, DriverCommand, ExecutorArgs};
use crate::{bench, dev, graph, jobs, replay, submit, worker};

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
    Worker(worker::WorkerArgs),
    /// Upload a module, submit a job with one task per input, and print the results.
    Submit(submit::SubmitArgs),
    /// A job's state, counts and failed tasks.
    Status(jobs::StatusArgs),
    /// Graphs of jobs submitted in one request: `submit FILE`, `status`, `kill`, `delete`.
    Graph(graph::GraphArgs),
    /// A job's results, in task order (or one file per task with --out).
    Results(jobs::ResultsArgs),
    /// A task's log (its stderr).
    Logs(jobs::LogsArgs),
    /// Run one attempt of a task again here, with no cluster, in the same sandbox, and
    /// say whether it did the same thing (exit 0) or not (exit 3).
    Replay(replay::ReplayArgs),
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
    /// Print a token's hash as a tenants file holds it (`sha256:<hex>`): the token is
    /// read from standard input (one line), so it stays out of the shell's history.
    HashToken,
    /// Start a local cluster and measure throughput and latency of no-op tasks.
    ///
    /// The figures go to standard output. The cluster's driver runs in this process and
    /// logs warnings only (to standard error), so that its line per job does not bury
    /// them: `FLINT_LOG=info` (or any filter) shows its log, `2>FILE` keeps it.
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
  5  the driver was lost and could not be reached again within --driver-loss-grace-ms
     (its tasks kept running meanwhile, then were killed), or within
     --reconnect-timeout-ms with a grace of 0";
