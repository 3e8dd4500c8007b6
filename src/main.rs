//! `flint`: one binary for the driver, the executors, the local dev cluster and the
//! client commands. The subcommands are declared in `cli` and the long-running ones'
//! flags in `flags` (clap, each with a `FLINT_*` variable), parsed once here and handed
//! down as typed configs; libraries never read the environment. This file only
//! dispatches: each command lives in its own module, and no module names this file.

mod bench;
mod cli;
mod client;
mod dev;
mod flags;
mod follow;
mod graph;
mod jobs;
mod progress;
mod replay;
mod rest;
mod shutdown;
mod submit;
mod worker;

use clap::{ArgMatches, CommandFactory, FromArgMatches};
use flint_executor::ExitReason;

use crate::cli::{Cli, Command};
use crate::flags::{CompileArgs, DriverCommand, ExecutorArgs};
use crate::shutdown::shutdown_signal;

// The task threads free on one thread what the runtime allocated on another (statuses,
// results, task descriptions); mimalloc's per-thread heaps make that cheap where glibc's
// arenas contend. task_cost measures the runner with the same allocator.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc asks for transparent huge pages on its arenas and hands unused 64 KiB
/// slices back to the kernel a second later; touching such a range again faults in a whole
/// 2 MiB page, zeroed. With the driver's and executors' message churn that zeroing was a
/// tenth of all CPU in `flint bench` (clear_page_erms under do_huge_pmd_anonymous_page),
/// so Flint's processes (and the executors they start, which inherit it) opt out. The
/// allocator's first arena, made before `main`, is kept off huge pages by mimalloc's
/// `no_thp` (Cargo.toml); this covers kernels set to THP `always` from here on.
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process's memory map.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        // Kernels without THP refuse it; nothing to turn off there.
        tracing::debug!("PR_SET_THP_DISABLE: {}", std::io::Error::last_os_error());
    }
}

/// The compiler subprocess: no runtime, no logging, one job.
fn compile_module(args: CompileArgs) -> i32 {
    let config = flint_executor::sandbox::SandboxConfig {
        slots: args.slots,
        max_memory_bytes: args.max_memory_bytes,
        fuel: args.fuel,
    };
    let result = std::fs::read(&args.input)
        .map_err(|e| (1, format!("reading {}: {e}", args.input.display())))
        .and_then(|wasm| {
            let kind = flint_executor::sandbox::EngineKind::of(args.deterministic);
            let engine = flint_executor::sandbox::engine_for(config, kind)
                .map_err(|e| (1, format!("{e:#}")))?;
            flint_executor::sandbox::precompile(&engine, &wasm)
                .map_err(|m| (flint_executor::compiler::EXIT_INVALID_MODULE, m))
        })
        .and_then(|artifact| {
            std::fs::write(&args.out, artifact)
                .map_err(|e| (1, format!("writing {}: {e}", args.out.display())))
        });
    match result {
        Ok(()) => 0,
        Err((code, message)) => {
            eprintln!("{message}");
            code
        }
    }
}

fn main() {
    no_transparent_huge_pages();
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::CompileModule(args) => std::process::exit(compile_module(args)),
        Command::SimulateExecutors(args) => std::process::exit(bench::simulate::run(args)),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "flint", &mut std::io::stdout());
            return;
        }
        Command::HashToken => {
            let mut token = String::new();
            if std::io::stdin().read_line(&mut token).is_err() || token.trim().is_empty() {
                eprintln!("flint hash-token: give the token on standard input");
                std::process::exit(2);
            }
            println!(
                "{}",
                flint_driver::tenants::hash_token(token.trim_end_matches(['\r', '\n']))
            );
            return;
        }
        _ => {}
    }
    // The services log what they do; a client command, or a benchmark (whose in-process
    // driver would log every job it runs between its figures), logs warnings only
    // unless FLINT_LOG asks for more.
    let service = matches!(
        cli.command,
        Command::Dev(_) | Command::Driver(_) | Command::Executor(_) | Command::Worker(_)
    );
    let quiet = !service;
    // wasmtime-wasi opens a span on every preview-1 call a guest makes, at `info` (its
    // `#[instrument]`'s default level), and the log formats its arguments on the task
    // thread: a per-task cost for spans that nothing of ours logs inside. FLINT_LOG can
    // still ask for them.
    init_tracing(if quiet {
        "warn"
    } else {
        "info,wasmtime_wasi=warn"
    });
    if service {
        rest::keep_lean();
    }
    let runtime = runtime_for(&cli.command);
    let code = runtime.block_on(run(cli, &matches));
    // Task threads and the epoch ticker are plain threads; exit without waiting for them.
    std::process::exit(code);
}

/// A client command sends a request or a few and waits: one thread does that, where a
/// multi-threaded runtime would start a worker per CPU first. An executor's runtime
/// carries its wire, fetches and uploads beside task threads of its own, so its
/// workers are sized to the cores it offers, not to the host's (a 1-core executor on a
/// 64-core host would start 64). The driver, the benchmarks and `replay` (whose
/// runtime waits on the guest's thread) take every CPU.
fn runtime_for(command: &Command) -> tokio::runtime::Runtime {
    let mut builder = match command {
        Command::Submit(_)
        | Command::Status(_)
        | Command::Graph(_)
        | Command::Results(_)
        | Command::Logs(_)
        | Command::Kill(_)
        | Command::Delete(_)
        | Command::Executors(_)
        | Command::Workers(_) => tokio::runtime::Builder::new_current_thread(),
        Command::Executor(args) => {
            let mut builder = rest::service_runtime();
            builder.worker_threads(args.runtime_threads());
            builder
        }
        Command::Dev(_) | Command::Driver(_) | Command::Worker(_) => rest::service_runtime(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    builder
        .enable_all()
        .build()
        .expect("building the tokio runtime")
}

async fn run(cli: Cli, matches: &ArgMatches) -> i32 {
    let result = match cli.command {
        Command::Dev(args) => dev::run(args).await.map(|()| 0),
        Command::Driver(args) => run_driver(args).await.map(|()| 0),
        Command::Executor(args) => run_executor(args).await,
        Command::Worker(args) => worker::run(args).await,
        Command::Submit(args) => {
            let sub = matches
                .subcommand_matches("submit")
                .expect("the submit subcommand was parsed");
            submit::run(args, sub).await
        }
        Command::Status(args) => jobs::status(args).await,
        Command::Graph(args) => graph::run(args).await,
        Command::Results(args) => jobs::results(args).await,
        Command::Logs(args) => jobs::logs(args).await,
        Command::Kill(args) => jobs::kill(args).await,
        Command::Replay(args) => replay::run(args).await,
        Command::Delete(args) => jobs::delete(args).await,
        Command::Executors(args) => jobs::executors(args).await,
        Command::Workers(args) => jobs::workers(args).await,
        Command::Bench(args) => bench::run(args).await.map(|()| 0),
        Command::CompileModule(_)
        | Command::SimulateExecutors(_)
        | Command::Completions { .. }
        | Command::HashToken => {
            unreachable!("handled before the runtime starts")
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flint: {e:#}");
            1
        }
    }
}

async fn run_driver(args: DriverCommand) -> anyhow::Result<()> {
    let config = args.config()?;
    let listeners = dev::bind(&args.driver).await?;
    let driver = flint_driver::Driver::new(config, listeners.http.local_addr()?)?;
    flint_driver::run(driver, listeners, shutdown_signal()).await
}

async fn run_executor(args: ExecutorArgs) -> anyhow::Result<i32> {
    let options = args.options()?;
    // On a worker, not in the main thread's block_on: a worker parked in epoll runs the
    // connection it woke for itself, where block_on's future would need that worker to
    // wake the main thread for every frame (a futex call and a context switch, 2 us of
    // a no-op task's 12 in `flint bench`).
    let reason = tokio::spawn(flint_executor::run(options, shutdown_signal())).await??;
    match &reason {
        ExitReason::Stopped => tracing::info!("executor stopped"),
        ExitReason::RegistrationRefused(why) => {
            eprintln!("flint executor: the driver refused this executor: {why}")
        }
        ExitReason::DriverUnreachable(why) | ExitReason::DriverLost(why) => {
            eprintln!("flint executor: {why}")
        }
    }
    Ok(reason.exit_code())
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLINT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
