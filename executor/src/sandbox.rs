//! The wasmtime side: one engine per executor, compiling modules and components, and
//! running one task attempt in a fresh `Store`, classified into exactly one outcome.
//!
//! Every bound is ours to set (wasmtime bounds nothing by default): memory through the
//! store's limiter, wall-clock time and kills through epoch interruption, stdout through a
//! capped pipe that traps, stderr through a capped pipe that truncates. Preview-1 core
//! modules and preview-2 command components run under the same guest ABI.
//!
//! Guests run on wasmtime's async support, driven by a small runtime of the task thread's
//! own: an epoch interrupt stops a guest that computes, but a guest blocked in a host call
//! (a sleep in `poll_oneoff`, a p2 pollable on a clock) never reaches the next epoch
//! check, so the attempt is also raced against its deadline and its kill, and the loser's
//! future (with the host call's) is dropped. The engine's features and sizes come from
//! `flint_module_rules`, the same rules the driver checks uploads with.
//!
//! [`config`] holds the engine's configuration (shared with the compiler
//! subprocess), [`stop`] how an attempt is killed or cut off at its deadline.

mod config;
mod determinism;
mod engines;
mod files;
mod link;
mod p1_files;
mod p2_files;
mod spent;
mod stop;
mod store;

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use flint_protocol::{FailureKind, TaskFailure, TaskResult, Usage};
use wasmtime::component::{Component, ResourceTable};
use wasmtime::{Engine, InstancePre, Linker, Module, Precompiled, StoreLimitsBuilder};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

pub use self::config::{
    EPOCH_TICK, EngineKind, MAX_WASM_STACK, SandboxConfig, TASK_THREAD_STACK, engine, engine_for,
    precompile,
};
use self::config::{INSTANCES_PER_TASK, MEMORIES_PER_TASK, TABLE_ELEMENTS, TABLES_PER_TASK};
use self::determinism::VirtualClock;
pub use self::determinism::{EPOCH, fixed_times};
use self::engines::Linked;
use self::files::FixedFiles;
use self::link::{link_component, link_module};
use self::spent::Spent;
use self::stop::{Ended, bounded, on_task_runtime};
pub use self::stop::{Kill, helper_cpu_us, thread_cpu_us};
use crate::outcome::{TaskLimiter, classify, run_limits_text};
use crate::pipes::{CappedPipe, Overflow};
use crate::results::{ResultPipe, ResultTarget};

/// Random bytes one `random_get` / `get-random-bytes` call may ask for.
pub const MAX_RANDOM_BYTES: u64 = 4 << 20;

/// Store state of a preview-1 task.
pub struct ModuleCtx {
    wasi: WasiP1Ctx,
    limits: TaskLimiter,
    /// A deterministic task's clock, which its `poll_oneoff` moves.
    clock: Option<VirtualClock>,
    files: FixedFiles,
}

/// Store state of a preview-2 component task.
pub struct ComponentCtx {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: TaskLimiter,
    files: FixedFiles,
}

impl WasiView for ComponentCtx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Anything a task's store holds limits in.
trait Limited: 'static {
    fn limits(&mut self) -> &mut TaskLimiter;
}

impl Limited for ModuleCtx {
    fn limits(&mut self) -> &mut TaskLimiter {
        &mut self.limits
    }
}

impl Limited for ComponentCtx {
    fn limits(&mut self) -> &mut TaskLimiter {
        &mut self.limits
    }
}

/// A compiled and linked task, ready to instantiate cheaply for every attempt.
pub enum Compiled {
    /// A core module that cannot block in a host call: it imports no `poll_oneoff`, and
    /// every other p1 call it can make returns in bounded time (stdin is in memory, its
    /// files are regular, results give up at the deadline, random bytes are capped). It
    /// runs on the plain synchronous path, a third cheaper per task than the async one.
    Module(InstancePre<ModuleCtx>),
    /// A core module that can wait (in `poll_oneoff`): it runs on the async path, raced
    /// against its deadline and kill.
    WaitingModule(InstancePre<ModuleCtx>),
    Component(CommandPre<ComponentCtx>),
}

impl Compiled {
    /// The engine it was compiled for and linked in.
    pub fn engine(&self) -> &Engine {
        match self {
            Compiled::Module(pre) | Compiled::WaitingModule(pre) => pre.module().engine(),
            Compiled::Component(pre) => pre.engine(),
        }
    }
}

pub struct Sandbox {
    native: Linked,
    /// Deterministic tasks' engine (see [`EngineKind`]), made on first use.
    deterministic: OnceLock<Result<Linked, String>>,
    config: SandboxConfig,
}

/// What one attempt is given and allowed.
pub struct TaskRun<'a> {
    pub args: &'a [&'a str],
    /// The job's and the task's variables (never `FLINT_*`: those come from `task`).
    pub env: &'a [(&'a str, &'a str)],
    pub task: TaskEnv<'a>,
    pub stdin: Vec<u8>,
    pub memory_bytes: usize,
    pub timeout: Duration,
    pub max_output_bytes: usize,
    pub max_log_bytes: usize,
    /// Set by KillTask; the next epoch tick interrupts the guest, and one blocked in a
    /// host call is dropped at once.
    pub kill: Arc<Kill>,
    /// Fuel budget; only on an engine that meters fuel.
    pub fuel: Option<u64>,
    /// A deterministic task's seed ([`flint_protocol::Determinism::task_seed`]): a
    /// virtual clock, seeded random, no `FLINT_JOB_ID` or `FLINT_ATTEMPT`.
    pub seed: Option<[u8; 32]>,
    /// The job's files, mounted read-only at `/files`.
    pub files_dir: Option<&'a Path>,
    /// Where the result goes once it outgrows the inline limit; without one, the whole
    /// result (up to `max_output_bytes`) stays in memory.
    pub result_target: Option<ResultTarget>,
}

/// Who the attempt is, as the guest sees it in its `FLINT_*` variables.
#[derive(Clone, Copy)]
pub struct TaskEnv<'a> {
    pub job: &'a str,
    pub index: u32,
    pub count: u32,
    pub attempt: u32,
}

pub struct RunReport {
    pub outcome: Result<TaskResult, TaskFailure>,
    pub log: Vec<u8>,
    pub log_truncated: bool,
    /// What the guest used, as far as the sandbox sees it: fuel (on an engine that
    /// meters it), wall time, peak memory and output. The caller adds CPU time, input and
    /// fetched bytes.
    pub usage: Usage,
    /// For a deterministic task, the digests of what it ran (set by the runner, which
    /// knows where its module and files came from).
    pub pins: Option<Box<flint_protocol::Pins>>,
}

/// Lets a p1 guest exit with any code: wasmtime-wasi traps on an exit status of 126 or
/// more (POSIX shells reserve them), but a guest's exit code is its own to choose.
fn any_exit_code(linker: &mut Linker<ModuleCtx>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "proc_exit",
        |code: i32| -> wasmtime::Result<()> { Err(wasmtime_wasi::I32Exit(code).into()) },
    )?;
    Ok(())
}

impl Sandbox {
    pub fn new(sandbox: SandboxConfig) -> anyhow::Result<Self> {
        Ok(Sandbox {
            native: Linked::new(sandbox, EngineKind::Native)?,
            deterministic: OnceLock::new(),
            config: sandbox,
        })
    }

    /// The engine of `kind` and its linkers.
    fn linked(&self, kind: EngineKind) -> Result<&Linked, TaskFailure> {
        match kind {
            EngineKind::Native => Ok(&self.native),
            EngineKind::Deterministic => (self.deterministic)
                .get_or_init(|| Linked::new(self.config, kind).map_err(|e| format!("{e:#}")))
                .as_ref()
                .map_err(|e| {
                    let message = format!("making the deterministic tasks' engine: {e}");
                    TaskFailure::new(FailureKind::HostError, message)
                }),
        }
    }

    pub fn engine(&self, kind: EngineKind) -> Result<&Engine, TaskFailure> {
        self.linked(kind).map(|linked| &linked.engine)
    }

    /// The largest linear memory any task may have here.
    pub fn max_memory_bytes(&self) -> usize {
        self.config.max_memory_bytes
    }

    /// [`Sandbox::compile_for`] the engine of tasks that are not deterministic.
    pub fn compile(&self, wasm: &[u8]) -> Result<Compiled, TaskFailure> {
        self.compile_for(wasm, EngineKind::Native)
    }

    /// Compiles and links in this process. Slow (milliseconds to seconds) and unbounded:
    /// the executor compiles in a subprocess it can stop (see `compiler`); this is for
    /// embedding and benchmarks.
    pub fn compile_for(&self, wasm: &[u8], kind: EngineKind) -> Result<Compiled, TaskFailure> {
        let artifact = precompile(self.engine(kind)?, wasm)
            .map_err(|m| TaskFailure::new(FailureKind::InvalidModule, m))?;
        // SAFETY: the artifact was produced by this engine a moment ago.
        unsafe { self.load_artifact(&artifact, kind) }
    }

    /// Loads and links a compiled artifact into the engine of `kind`.
    ///
    /// # Safety
    ///
    /// `artifact` must come from [`precompile`] for an engine with that engine's
    /// configuration: wasmtime trusts it completely.
    pub unsafe fn load_artifact(
        &self,
        artifact: &[u8],
        kind: EngineKind,
    ) -> Result<Compiled, TaskFailure> {
        let linked = self.linked(kind)?;
        let host = |e: wasmtime::Error| {
            TaskFailure::new(
                FailureKind::HostError,
                format!("loading compiled code: {e:#}"),
            )
        };
        match Engine::detect_precompiled(artifact) {
            Some(Precompiled::Module) => {
                // SAFETY: forwarded from this function's contract.
                let module =
                    unsafe { Module::deserialize(&linked.engine, artifact) }.map_err(host)?;
                link_module(linked, &module)
            }
            Some(Precompiled::Component) => {
                // SAFETY: forwarded from this function's contract.
                let component =
                    unsafe { Component::deserialize(&linked.engine, artifact) }.map_err(host)?;
                link_component(linked, &component)
            }
            None => Err(TaskFailure::new(
                FailureKind::HostError,
                "not a compiled artifact of this wasmtime",
            )),
        }
    }

    /// Runs one attempt to its end. Blocks the calling thread, which must have a stack of
    /// at least [`TASK_THREAD_STACK`].
    pub fn run(&self, compiled: &Compiled, run: TaskRun<'_>) -> RunReport {
        let engine = match self.linked(EngineKind::of(run.seed.is_some())) {
            Ok(linked) if Engine::same(&linked.engine, compiled.engine()) => &linked.engine,
            Ok(_) => {
                return RunReport::refused(TaskFailure::new(
                    FailureKind::HostError,
                    "the module was compiled for the other engine (deterministic tasks have their own)",
                ));
            }
            Err(failure) => return RunReport::refused(failure),
        };
        if run.fuel.is_some() && !self.config.fuel {
            // The driver places budgeted tasks only on metering executors; should one
            // arrive here anyway, another executor can run it.
            return RunReport::refused(TaskFailure::new(
                FailureKind::HostError,
                "the task has a fuel budget but this executor does not meter fuel (--fuel)",
            ));
        }
        let deadline = Instant::now() + run.timeout;
        let stopped: crate::results::Stopped = {
            let kill = run.kill.clone();
            Arc::new(move || kill.is_killed() || Instant::now() >= deadline)
        };
        let stdout = ResultPipe::new(run.max_output_bytes, run.result_target, stopped);
        let stderr = CappedPipe::new(run.max_log_bytes, Overflow::Truncate);
        let clock = run.seed.map(|_| VirtualClock::default());
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdin(MemoryInputPipe::new(run.stdin))
            .stdout(stdout.clone())
            .stderr(stderr.clone())
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
            return RunReport::refused(TaskFailure::new(
                FailureKind::HostError,
                format!("mounting the job's files from {}: {e:#}", dir.display()),
            ));
        }
        let memory_bytes = run.memory_bytes.min(self.config.max_memory_bytes);
        let limits = TaskLimiter {
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
        };
        let kill = &run.kill;
        let metered = self.config.fuel;
        let began = Instant::now();
        let (ended, spent) = match compiled {
            // Not inside the task runtime: the sync WASI calls enter one of their own.
            Compiled::Module(pre) => {
                let ctx = ModuleCtx {
                    wasi: wasi.build_p1(),
                    limits,
                    clock,
                    files: FixedFiles::default(),
                };
                self.run_module(pre, ctx, deadline, kill, run.fuel)
            }
            Compiled::WaitingModule(pre) => {
                let ctx = ModuleCtx {
                    wasi: wasi.build_p1(),
                    limits,
                    clock,
                    files: FixedFiles::default(),
                };
                let mut store = self.store(engine, ctx, deadline, kill, run.fuel);
                let call = async {
                    let instance = pre.instantiate_async(&mut store).await?;
                    let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
                    start.call_async(&mut store, ()).await
                };
                let ended = on_task_runtime(bounded(call, deadline, kill));
                (ended, Spent::of(&mut store, metered))
            }
            Compiled::Component(pre) => {
                let ctx = ComponentCtx {
                    wasi: wasi.build(),
                    table: ResourceTable::new(),
                    limits,
                    files: FixedFiles::default(),
                };
                let mut store = self.store(engine, ctx, deadline, kill, run.fuel);
                let call = async {
                    let command = pre.instantiate_async(&mut store).await?;
                    // `run` returning its error variant is how a component's main fails.
                    command
                        .wasi_cli_run()
                        .call_run(&mut store)
                        .await?
                        .map_err(|()| wasmtime_wasi::I32Exit(1).into())
                };
                let ended = on_task_runtime(bounded(call, deadline, kill));
                (ended, Spent::of(&mut store, metered))
            }
        };
        let wall = began.elapsed();
        let limits_text =
            || run_limits_text(memory_bytes, run.timeout, run.max_output_bytes, run.fuel);
        let result = match ended {
            Ended::Returned(result) => Ok(result),
            Ended::Killed => Err(TaskFailure::new(FailureKind::Killed, "killed")),
            Ended::Deadline => Err(TaskFailure::new(
                FailureKind::Timeout,
                format!(
                    "ran past its {} time limit (blocked in a host call)",
                    limits_text().timeout()
                ),
            )),
        };
        let outcome = match result {
            Err(failure) => Err(failure),
            Ok(Ok(())) => Ok(()),
            // Stopped inside a write that waited on the block store.
            Ok(Err(_)) if stdout.was_stopped() => Err(match run.kill.is_killed() {
                true => TaskFailure::new(FailureKind::Killed, "killed"),
                false => TaskFailure::new(
                    FailureKind::Timeout,
                    format!(
                        "ran past its {} time limit (writing its result)",
                        limits_text().timeout()
                    ),
                ),
            }),
            Ok(Err(_)) if let Some(why) = stdout.store_failure() => Err(TaskFailure::new(
                FailureKind::HostError,
                format!("storing the result: {why}"),
            )),
            Ok(Err(e)) => classify(
                e,
                spent.memory_limit_hit,
                stdout.overflowed(),
                run.kill.is_killed(),
                &limits_text(),
            ),
        };
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
                ..Usage::default()
            },
            pins: None,
        }
    }
}

#[cfg(test)]
#[path = "sandbox_tests.rs"]
mod tests;
