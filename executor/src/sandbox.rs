//! The wasmtime side: one engine per executor, compiling modules, and running one task
//! attempt in a fresh `Store`, classified into exactly one outcome.
//!
//! Every bound is ours to set (wasmtime bounds nothing by default): memory through the
//! store's limiter, wall-clock time and kills through epoch interruption, stdout through a
//! capped pipe that traps, stderr through a capped pipe that truncates.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flint_protocol::{FailureKind, TaskFailure, TaskResult};
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, InstancePre, Linker, Module,
    PoolingAllocationConfig, ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder, Trap,
    UpdateDeadline,
};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;

use crate::pipes::{CappedPipe, Overflow};

/// How often the epoch advances: the granularity of timeouts and kills.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);
/// Wasm stack a guest may use; task threads get [`TASK_THREAD_STACK`] so that a guest
/// overflowing it traps cleanly instead of overflowing the host thread.
pub const MAX_WASM_STACK: usize = 1 << 20;
pub const TASK_THREAD_STACK: usize = 8 << 20;

/// Per-store state.
pub struct TaskCtx {
    wasi: WasiP1Ctx,
    limits: TaskLimiter,
}

/// A compiled module, ready to instantiate cheaply for every task.
pub type Compiled = InstancePre<TaskCtx>;

pub struct Sandbox {
    engine: Engine,
    linker: Linker<TaskCtx>,
    max_memory_bytes: usize,
    _ticker: EpochTicker,
}

/// What one attempt is given and allowed.
pub struct TaskRun<'a> {
    pub args: &'a [String],
    pub env: &'a [(String, String)],
    pub stdin: Vec<u8>,
    pub memory_bytes: usize,
    pub timeout: Duration,
    pub max_output_bytes: usize,
    pub max_log_bytes: usize,
    /// Set by KillTask; the next epoch tick interrupts the guest.
    pub kill: Arc<AtomicBool>,
}

pub struct RunReport {
    pub outcome: Result<TaskResult, TaskFailure>,
    pub log: Vec<u8>,
    pub log_truncated: bool,
}

/// Instances, memories and tables one task may create. A preview-1 module needs one
/// instance and one memory; the margins leave room for components, which link several
/// core instances. The pooling allocator is sized from these times the task slots.
const INSTANCES_PER_TASK: u32 = 16;
const MEMORIES_PER_TASK: u32 = 4;
const TABLES_PER_TASK: u32 = 8;
const TABLE_ELEMENTS: usize = 100_000;
/// Linear memory a finished task leaves mapped for the next one in its slot; with
/// pagemap_scan only the pages the guest dirtied are reset.
const KEEP_RESIDENT_BYTES: usize = 1 << 20;

/// What the engine is sized for.
#[derive(Clone, Copy, Debug)]
pub struct SandboxConfig {
    /// Tasks that may run at once (the executor's cores).
    pub slots: u32,
    /// Largest linear memory any task may have; a task asking for more is held to this.
    pub max_memory_bytes: usize,
}

/// The engine every task of an executor runs in. The compiler subprocess builds its
/// engine from the same function, so that the artifacts it writes load here.
pub fn engine(sandbox: SandboxConfig) -> anyhow::Result<Engine> {
    let slots = sandbox.slots.max(1);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_core_instances(slots * INSTANCES_PER_TASK)
        .total_memories(slots * MEMORIES_PER_TASK)
        .total_tables(slots * TABLES_PER_TASK)
        .total_component_instances(slots)
        .max_memory_size(sandbox.max_memory_bytes)
        .table_elements(TABLE_ELEMENTS)
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(KEEP_RESIDENT_BYTES)
        .pagemap_scan(Enabled::Auto);
    let mut config = Config::new();
    config
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK);
    Ok(Engine::new(&config)?)
}

/// Compiles `wasm` to an artifact for [`engine`]`(sandbox)`; what the compiler
/// subprocess runs. An error is the module's fault (it is not valid wasm).
pub fn precompile(engine: &Engine, wasm: &[u8]) -> Result<Vec<u8>, String> {
    engine
        .precompile_module(wasm)
        .map_err(|e| format!("invalid module: {e:#}"))
}

impl Sandbox {
    pub fn new(sandbox: SandboxConfig) -> anyhow::Result<Self> {
        let engine = engine(sandbox)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |ctx: &mut TaskCtx| &mut ctx.wasi)?;
        let ticker = EpochTicker::start(engine.clone());
        Ok(Sandbox {
            engine,
            linker,
            max_memory_bytes: sandbox.max_memory_bytes,
            _ticker: ticker,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Compiles and links a module in this process. Slow (milliseconds to seconds) and
    /// unbounded: the executor compiles in a subprocess it can stop (see `compiler`);
    /// this is for embedding and benchmarks.
    pub fn compile(&self, wasm: &[u8]) -> Result<Compiled, TaskFailure> {
        let module = Module::new(&self.engine, wasm).map_err(|e| {
            TaskFailure::new(FailureKind::InvalidModule, format!("invalid module: {e:#}"))
        })?;
        self.link(&module)
    }

    /// Checks that a compiled module is a WASI command and links it against WASI.
    pub fn link(&self, module: &Module) -> Result<Compiled, TaskFailure> {
        if module.get_export("_start").is_none() {
            return Err(TaskFailure::new(
                FailureKind::InvalidModule,
                "module exports no `_start`: it is not a WASI command",
            ));
        }
        self.linker.instantiate_pre(module).map_err(|e| {
            TaskFailure::new(FailureKind::UnknownImport, format!("cannot link: {e:#}"))
        })
    }

    /// Runs one attempt to its end. Blocks the calling thread, which must have a stack of
    /// at least [`TASK_THREAD_STACK`].
    pub fn run(&self, compiled: &Compiled, run: TaskRun<'_>) -> RunReport {
        let stdout = CappedPipe::new(run.max_output_bytes, Overflow::Trap);
        let stderr = CappedPipe::new(run.max_log_bytes, Overflow::Truncate);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdin(MemoryInputPipe::new(run.stdin))
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .args(run.args)
            .envs(run.env)
            .allow_blocking_current_thread(true);
        let memory_bytes = run.memory_bytes.min(self.max_memory_bytes);
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
            memory_limit_hit: false,
        };
        let mut store = Store::new(
            &self.engine,
            TaskCtx {
                wasi: wasi.build_p1(),
                limits,
            },
        );
        store.limiter(|ctx| &mut ctx.limits);
        let deadline = Instant::now() + run.timeout;
        // Runs on every epoch tick the guest sees: go on, or interrupt (the classification
        // below reads the kill flag to tell a kill from a timeout).
        let kill = run.kill.clone();
        store.epoch_deadline_callback(move |_| {
            if kill.load(Ordering::Relaxed) || Instant::now() >= deadline {
                return Ok(UpdateDeadline::Interrupt);
            }
            Ok(UpdateDeadline::Continue(1))
        });
        store.set_epoch_deadline(1);

        let result = compiled
            .instantiate(&mut store)
            .and_then(|instance| instance.get_typed_func::<(), ()>(&mut store, "_start"))
            .and_then(|start| start.call(&mut store, ()));
        let outcome = match result {
            Ok(()) => Ok(()),
            Err(e) => classify(
                e,
                store.data().limits.memory_limit_hit,
                stdout.overflowed(),
                run.kill.load(Ordering::Relaxed),
                &run_limits_text(memory_bytes, run.timeout, run.max_output_bytes),
            ),
        };
        drop(store);
        let (mut log, log_truncated) = stderr.into_contents();
        if log_truncated {
            // Whoever reads the log must see that it is not the whole story.
            log.extend_from_slice(
                format!("\n[flint: log truncated at {} bytes]\n", run.max_log_bytes).as_bytes(),
            );
        }
        RunReport {
            outcome: outcome.map(|()| TaskResult::Inline(stdout.into_contents().0)),
            log,
            log_truncated,
        }
    }
}

struct RunLimitsText {
    memory: String,
    timeout: String,
    output: String,
}

fn run_limits_text(memory: usize, timeout: Duration, output: usize) -> RunLimitsText {
    RunLimitsText {
        memory: format!("{} MiB", memory >> 20),
        timeout: format!("{} ms", timeout.as_millis()),
        output: format!("{output} bytes"),
    }
}

/// Turns whatever ended an attempt into one outcome. The order matters: a limit or kill
/// surfaces as a generic trap or error, so the flags the host set win over the error.
fn classify(
    error: wasmtime::Error,
    memory_limit_hit: bool,
    output_overflowed: bool,
    killed: bool,
    limits: &RunLimitsText,
) -> Result<(), TaskFailure> {
    if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return match exit.0 {
            0 => Ok(()),
            code => Err(TaskFailure {
                kind: FailureKind::Exit,
                message: format!("exited with code {code}"),
                exit_code: Some(code),
            }),
        };
    }
    let failure = |kind, message: String| Err(TaskFailure::new(kind, message));
    let trap = error.downcast_ref::<Trap>().copied();
    if trap == Some(Trap::Interrupt) {
        return if killed {
            failure(FailureKind::Killed, "killed".into())
        } else {
            failure(
                FailureKind::Timeout,
                format!("ran past its {} time limit", limits.timeout),
            )
        };
    }
    if memory_limit_hit {
        return failure(
            FailureKind::MemoryLimit,
            format!("tried to use more than its {} memory limit", limits.memory),
        );
    }
    if output_overflowed {
        return failure(
            FailureKind::OutputLimit,
            format!("wrote more than its {} output limit", limits.output),
        );
    }
    match trap {
        Some(Trap::StackOverflow) => failure(
            FailureKind::StackOverflow,
            "wasm stack overflow (unbounded recursion?)".into(),
        ),
        Some(trap) => failure(FailureKind::Trap, trap.to_string()),
        None => failure(FailureKind::Trap, format!("{error:#}")),
    }
}

/// StoreLimits, plus a record of whether the memory limit was what stopped the guest.
struct TaskLimiter {
    inner: StoreLimits,
    memory_bytes: usize,
    memory_limit_hit: bool,
}

impl ResourceLimiter for TaskLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.memory_limit_hit = true;
        }
        self.inner.memory_growing(current, desired, maximum)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    fn start(engine: Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_in_thread = stop.clone();
        std::thread::Builder::new()
            .name("flint-epoch".into())
            .spawn(move || {
                while !stop_in_thread.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .expect("spawning the epoch thread");
        EpochTicker { stop }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
