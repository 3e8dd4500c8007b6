//! One attempt, start to end, as its phases: the engine it may run on, the guest's
//! world (WASI context, limits), the call bounded by deadline and kill, the one outcome
//! it is classified into, and the report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_fetch_cache::egress::close_abandoned;
use flint_protocol::{FailureKind, TaskFailure, Usage};
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store, StoreLimitsBuilder};
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};
use wasmtime_wasi_http::WasiHttpCtx;

use super::config::{self, INSTANCES_PER_TASK, MEMORIES_PER_TASK, TABLE_ELEMENTS, TABLES_PER_TASK};
use super::determinism::{self, VirtualClock};
use super::egress::{self, EgressCtx, EgressHooks};
use super::files::FixedFiles;
use super::spent::Spent;
use super::stop::{Ended, Stop, bounded, on_task_runtime};
use super::{
    Compiled, ComponentCtx, EngineKind, Kill, MAX_RANDOM_BYTES, ModuleCtx, RunReport, Sandbox,
    TaskRun,
};
use crate::outcome::{RunLimitsText, TaskLimiter, classify, run_limits_text};
use crate::pipes::{CappedPipe, Overflow};
use crate::results::{ResultPipe, ResultTarget, Stopped};

/// What the guest's world is made of before its store exists.
struct World {
    wasi: WasiCtxBuilder,
    limits: TaskLimiter,
    clock: Option<VirtualClock>,
    deadline: Instant,
    egress: EgressCtx,
}

/// Where the guest's output goes.
struct Pipes {
    stdout: ResultPipe,
    stderr: CappedPipe,
}

impl Sandbox {
    /// Runs one attempt to its end. Blocks the calling thread, which must have a stack of
    /// at least [`super::TASK_THREAD_STACK`].
    pub fn run(&self, compiled: &Compiled, mut run: TaskRun<'_>) -> RunReport {
        let engine = match self.engine_to_run(compiled, &run) {
            Ok(engine) => engine,
            Err(failure) => return RunReport::refused(failure),
        };
        let deadline = Instant::now() + run.timeout;
        // Moved out, not copied: an input may be megabytes.
        let stdin = std::mem::take(&mut run.stdin);
        let target = run.result_target.take();
        let pipes = Pipes::for_attempt(&run, target, deadline);
        let memory_bytes = run.memory_bytes.min(self.config.max_memory_bytes);
        let egress = EgressCtx::new(std::mem::take(&mut run.egress), deadline, &run.kill)
            .recorded(run.seed.is_some());
        let world = match world(
            compiled,
            &run,
            stdin,
            &pipes,
            memory_bytes,
            deadline,
            egress,
        ) {
            Ok(world) => world,
            Err(failure) => return RunReport::refused(failure),
        };
        let began = Instant::now();
        let (ended, spent) = {
            // Deadlines and kills are seen at epoch ticks: they run while guest code can.
            let _ticking = config::ticking();
            self.call(engine, compiled, world, &run)
        };
        let wall = began.elapsed();
        // Only a failure needs the limits as text: a success does not format them.
        let limits_text =
            || run_limits_text(memory_bytes, run.timeout, run.max_output_bytes, run.fuel);
        let outcome = outcome(ended, &spent, &pipes.stdout, &run, limits_text);
        report(outcome, spent, wall, pipes, &run)
    }

    /// The engine `compiled` belongs to, if this attempt may run on it here.
    fn engine_to_run(
        &self,
        compiled: &Compiled,
        run: &TaskRun<'_>,
    ) -> Result<&Engine, TaskFailure> {
        let linked = self.linked(EngineKind::of(run.seed.is_some()))?;
        if !Engine::same(&linked.engine, compiled.engine()) {
            return Err(TaskFailure::new(
                FailureKind::HostError,
                "the module was compiled for the other engine (deterministic tasks have their own)",
            ));
        }
        if run.fuel.is_some() && !self.config.fuel {
            // The driver places budgeted tasks only on metering executors; should one
            // arrive here anyway, another executor can run it.
            return Err(TaskFailure::new(
                FailureKind::HostError,
                "the task has a fuel budget but this executor does not meter fuel (--fuel)",
            ));
        }
        Ok(&linked.engine)
    }

    /// Instantiates and runs the guest in a fresh store, bounded by its deadline and kill.
    fn call(
        &self,
        engine: &Engine,
        compiled: &Compiled,
        world: World,
        run: &TaskRun<'_>,
    ) -> (Ended, Spent) {
        let World {
            mut wasi,
            limits,
            clock,
            deadline,
            egress,
        } = world;
        let (kill, metered) = (&run.kill, self.config.fuel);
        match compiled {
            // Not inside the task runtime: the sync WASI calls enter one of their own.
            Compiled::Module(pre) => {
                let ctx = ModuleCtx {
                    wasi: wasi.build_p1(),
                    limits,
                    clock,
                    files: FixedFiles::default(),
                    egress,
                };
                self.run_module(pre, ctx, deadline, kill, run.fuel)
            }
            Compiled::WaitingModule(pre) => {
                let ctx = ModuleCtx {
                    wasi: wasi.build_p1(),
                    limits,
                    clock,
                    files: FixedFiles::default(),
                    egress,
                };
                let mut store = self.store(engine, ctx, deadline, kill, run.fuel);
                let call = async {
                    let instance = pre.instantiate_async(&mut store).await?;
                    let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
                    start.call_async(&mut store, ()).await
                };
                let ended = on_task_runtime(async {
                    let ended = bounded(call, deadline, kill).await;
                    // A request the race dropped left its connection to this runtime,
                    // which runs again only at the thread's next task.
                    close_abandoned().await;
                    ended
                });
                (ended, Spent::of(&mut store, metered))
            }
            Compiled::Component(pre) => {
                let ctx = ComponentCtx {
                    wasi: wasi.build(),
                    table: ResourceTable::new(),
                    limits,
                    files: FixedFiles::default(),
                    http: WasiHttpCtx::new(),
                    hooks: EgressHooks::new(egress),
                };
                let store = self.store(engine, ctx, deadline, kill, run.fuel);
                on_task_runtime(run_component(pre, store, deadline, kill, metered))
            }
        }
    }
}

/// Runs a component to its end, bounded by its deadline and kill, and drops its store on
/// the task runtime, which then runs what the drop aborted: a request in flight is a
/// task of this runtime (wasi-http spawns it, the store's table owns it), and an aborted
/// task is dropped, its connection closed, only when its runtime next runs it, which on
/// an idle task thread is not before its next task.
async fn run_component(
    pre: &CommandPre<ComponentCtx>,
    mut store: Store<ComponentCtx>,
    deadline: Instant,
    kill: &Kill,
    metered: bool,
) -> (Ended, Spent) {
    // What outlives attempts on this runtime: the connections that modules' requests
    // left in the thread's pool (`Call::run_here`), idle; a component's are the client's.
    let before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let call = async {
        let command = pre.instantiate_async(&mut store).await?;
        // `run` returning its error variant is how a component's main fails.
        command
            .wasi_cli_run()
            .call_run(&mut store)
            .await?
            .map_err(|()| wasmtime_wasi::I32Exit(1).into())
    };
    let ended = bounded(call, deadline, kill).await;
    let spent = Spent::of(&mut store, metered);
    drop(store);
    run_aborted(before).await;
    (ended, spent)
}

/// Lets this runtime run the tasks a store's drop aborted. A turn of the runtime runs a
/// bounded number of tasks, so it takes turns until no more are left than the `before`
/// the attempt (the thread's idle pooled connections, which only close during it), or a
/// number of them enough for far more requests than a task may have in flight: a task
/// that outlives its store would be a bug to find, not a reason to hold the thread.
async fn run_aborted(before: usize) {
    const TURNS: usize = 64;
    let metrics = tokio::runtime::Handle::current().metrics();
    for _ in 0..TURNS {
        if metrics.num_alive_tasks() <= before {
            return;
        }
        tokio::task::yield_now().await;
    }
}

impl Pipes {
    fn for_attempt(run: &TaskRun<'_>, target: Option<ResultTarget>, deadline: Instant) -> Self {
        let stopped: Stopped = {
            let kill = run.kill.clone();
            Arc::new(move || kill.is_killed() || Instant::now() >= deadline)
        };
        Pipes {
            stdout: ResultPipe::new(run.max_output_bytes, target, stopped),
            stderr: CappedPipe::new(run.max_log_bytes, Overflow::Truncate),
        }
    }
}

/// The guest's WASI context, store limits and egress.
fn world(
    compiled: &Compiled,
    run: &TaskRun<'_>,
    stdin: Vec<u8>,
    pipes: &Pipes,
    memory_bytes: usize,
    deadline: Instant,
    egress: EgressCtx,
) -> Result<World, TaskFailure> {
    let clock = run.seed.map(|_| VirtualClock::default());
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdin(MemoryInputPipe::new(stdin))
        .stdout(pipes.stdout.clone())
        .stderr(pipes.stderr.clone())
        .args(run.args);
    determinism::environ(&mut wasi, run.env, &run.task, clock.is_some());
    if let (Some(seed), Some(clock)) = (run.seed, &clock) {
        determinism::apply(&mut wasi, seed, clock);
    }
    let sync_module = matches!(compiled, Compiled::Module(_))
        || (clock.is_some() && matches!(compiled, Compiled::WaitingModule(_)));
    wasi
        // One `random_get` is a host call no deadline can cut short: a small cap
        // keeps each one to milliseconds (past it the call traps).
        .max_random_size(MAX_RANDOM_BYTES)
        // Off where a guest can wait: with it on, wasmtime-wasi sleeps a lone
        // relative clock subscription of `poll_oneoff` in `std::thread::sleep`, where
        // no deadline or kill can reach it (a guest slept 2^64-1 ns past its kill).
        // File reads then go to the runtime's blocking pool, and a stopped attempt
        // leaves them behind. A module without `poll_oneoff` reads its files inline.
        .allow_blocking_current_thread(sync_module);
    if let Some(dir) = run.files_dir
        && let Err(e) = wasi.preopened_dir(dir, "/files", FsPerms::ReadOnly)
    {
        return Err(TaskFailure::new(
            FailureKind::HostError,
            format!("mounting the job's files from {}: {e:#}", dir.display()),
        ));
    }
    Ok(World {
        wasi,
        limits: limiter(memory_bytes),
        clock,
        deadline,
        egress,
    })
}

fn limiter(memory_bytes: usize) -> TaskLimiter {
    TaskLimiter {
        inner: StoreLimitsBuilder::new()
            .memory_size(memory_bytes)
            .instances(INSTANCES_PER_TASK as usize)
            .memories(MEMORIES_PER_TASK as usize)
            .tables(TABLES_PER_TASK as usize)
            .table_elements(TABLE_ELEMENTS)
            .trap_on_grow_failure(true)
            .build(),
        memory_bytes,
        memory_used: 0,
        memory_peak: 0,
        memory_limit_hit: false,
    }
}

/// The one outcome the attempt is classified into.
fn outcome(
    ended: Ended,
    spent: &Spent,
    stdout: &ResultPipe,
    run: &TaskRun<'_>,
    limits_text: impl Fn() -> RunLimitsText,
) -> Result<(), TaskFailure> {
    // Decided by the host whatever the guest did after (it was stopped).
    if let Some(failure) = &spent.egress.failure {
        return Err(failure.clone());
    }
    // A synchronous call that waits stops the guest with an error of its own: the
    // same stop as the async path's race, not a trap.
    let ended = match ended {
        Ended::Returned(Err(e)) => match egress::stopped(&e) {
            Some(Stop::Killed) => Ended::Killed,
            Some(Stop::Deadline) => Ended::Deadline,
            None => Ended::Returned(Err(e)),
        },
        ended => ended,
    };
    let blocked_in = match spent.egress.blocked {
        true => "an outbound request",
        false => "a host call",
    };
    let result = match ended {
        Ended::Returned(result) => result,
        Ended::Killed if spent.egress.blocked => {
            let message = format!("killed (blocked in {blocked_in})");
            return Err(TaskFailure::new(FailureKind::Killed, message));
        }
        Ended::Killed => return Err(TaskFailure::new(FailureKind::Killed, "killed")),
        Ended::Deadline => {
            return Err(TaskFailure::new(
                FailureKind::Timeout,
                format!(
                    "ran past its {} time limit (blocked in {blocked_in})",
                    limits_text().timeout()
                ),
            ));
        }
    };
    match result {
        Ok(()) => Ok(()),
        // Stopped inside a write that waited on the block store.
        Err(_) if stdout.was_stopped() => Err(match run.kill.is_killed() {
            true => TaskFailure::new(FailureKind::Killed, "killed"),
            false => TaskFailure::new(
                FailureKind::Timeout,
                format!(
                    "ran past its {} time limit (writing its result)",
                    limits_text().timeout()
                ),
            ),
        }),
        Err(_) if let Some(why) = stdout.store_failure() => Err(TaskFailure::new(
            FailureKind::HostError,
            format!("storing the result: {why}"),
        )),
        Err(e) => classify(
            e,
            spent.memory_limit_hit,
            stdout.overflowed(),
            run.kill.is_killed(),
            &limits_text(),
        ),
    }
}

fn report(
    outcome: Result<(), TaskFailure>,
    spent: Spent,
    wall: Duration,
    pipes: Pipes,
    run: &TaskRun<'_>,
) -> RunReport {
    let Pipes { stdout, stderr } = pipes;
    let (mut log, log_truncated) = stderr.into_contents();
    if log_truncated {
        // Whoever reads the log must see that it is not the whole story.
        log.extend_from_slice(
            format!("\n[flint: log truncated at {} bytes]\n", run.max_log_bytes).as_bytes(),
        );
    }
    let output_bytes = stdout.written();
    let outcome = match outcome {
        Ok(()) => stdout.into_result(),
        Err(failure) => {
            stdout.abort();
            Err(failure)
        }
    };
    let fuel_given = run.fuel.unwrap_or(u64::MAX);
    RunReport {
        outcome,
        log,
        log_truncated,
        usage: Usage {
            fuel: spent.fuel.map(|left| fuel_given.saturating_sub(left)),
            wall_us: wall.as_micros() as u64,
            peak_memory_bytes: spent.memory_peak as u64,
            output_bytes,
            egress_requests: spent.egress.requests,
            egress_bytes_sent: spent.egress.bytes_sent,
            egress_bytes_received: spent.egress.bytes_received,
            ..Usage::default()
        },
        pins: None,
        egress_denied: spent.egress.denied,
        egress_tape: spent.egress.tape,
    }
}
