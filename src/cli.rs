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

/// The client commands `flint` runs itself, by name.
pub const CLIENT_COMMANDS: [&str; 9] = [
    "submit",
    "status",
    "graph",
    "results",
    "logs",
    "kill",
    "delete",
    "executors",
    "workers",
];

/// A client command's subcommand built alone, its flags as the whole tree has them
/// (the same derive), without its help text: what `flint` parses a client command
/// with. Building the whole tree (every service's flags) was a third of the page
/// faults of a client command's start. Help and errors take the whole tree.
pub fn client_subcommand(name: &str) -> Option<clap::Command> {
    use clap::Args;
    let name = CLIENT_COMMANDS.into_iter().find(|known| *known == name)?;
    let command = clap::Command::new(name);
    Some(match name {
        "submit" => submit::SubmitArgs::augment_args(command),
        "status" => jobs::StatusArgs::augment_args(command),
        "graph" => graph::GraphArgs::augment_args(command),
        "results" => jobs::ResultsArgs::augment_args(command),
        "logs" => jobs::LogsArgs::augment_args(command),
        "kill" => jobs::KillArgs::augment_args(command),
        "delete" => jobs::DeleteArgs::augment_args(command),
        "executors" => jobs::ExecutorsArgs::augment_args(command),
        "workers" => jobs::WorkersArgs::augment_args(command),
        _ => return None,
    })
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Everything of an argument that parsing reads, as text.
    fn shape(arg: &clap::Arg) -> String {
        format!(
            "{} long={:?} short={:?} aliases={:?} env={:?} defaults={:?} required={} \
             num_args={:?} action={:?} values={:?} global={} last={} trailing={}",
            arg.get_id(),
            arg.get_long(),
            arg.get_short(),
            arg.get_all_aliases(),
            arg.get_env(),
            arg.get_default_values(),
            arg.is_required_set(),
            arg.get_num_args(),
            arg.get_action(),
            arg.get_possible_values()
                .iter()
                .map(|v| v.get_name().to_owned())
                .collect::<Vec<_>>(),
            arg.is_global_set(),
            arg.is_last_set(),
            arg.is_trailing_var_arg_set(),
        )
    }

    /// A command's arguments and its subcommands', recursively, with its groups.
    fn shapes(command: &clap::Command, out: &mut Vec<String>) {
        let name = command.get_name();
        out.extend(
            command
                .get_arguments()
                .map(|a| format!("{name}: {}", shape(a))),
        );
        out.extend(command.get_groups().map(|g| {
            format!(
                "{name}: group {} {:?} required={}",
                g.get_id(),
                g.get_args().collect::<Vec<_>>(),
                g.is_required_set(),
            )
        }));
        for sub in command.get_subcommands() {
            shapes(sub, out);
        }
    }

    #[test]
    fn each_client_command_alone_parses_as_the_whole_tree_does() {
        let mut full = Cli::command();
        full.build();
        let whole: Vec<&str> = full
            .get_subcommands()
            .map(clap::Command::get_name)
            .collect();
        for name in CLIENT_COMMANDS {
            assert!(whole.contains(&name), "{name} is no subcommand");
            let mut alone =
                clap::Command::new("flint").subcommand(client_subcommand(name).unwrap());
            alone.build();
            let (mut expected, mut got) = (Vec::new(), Vec::new());
            shapes(full.find_subcommand(name).unwrap(), &mut expected);
            shapes(alone.find_subcommand(name).unwrap(), &mut got);
            // The whole tree's help and version flags are clap's own, added by build.
            assert_eq!(got, expected, "{name}");
            assert!(!expected.is_empty(), "{name}");
        }
        assert!(client_subcommand("driver").is_none());
    }
}
