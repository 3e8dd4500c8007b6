//! The engine's configuration: the pooling allocator sized from the module rules the driver
//! checks uploads with, the stacks, epoch interruption, and the ticker that drives it.
//! Apart from running tasks because the compiler subprocess builds its engine from this
//! alone (its artifacts must load in the executor's engine), and it runs no guest.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use flint_module_rules::{FEATURES, Limits};
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, WasmFeatures,
};

/// How often the epoch advances: the granularity of timeouts and kills.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);
/// Wasm stack a guest may use; task threads get [`TASK_THREAD_STACK`] so that a guest
/// overflowing it traps cleanly instead of overflowing the host thread.
pub const MAX_WASM_STACK: usize = 1 << 20;
pub const TASK_THREAD_STACK: usize = 8 << 20;

/// Instances, memories and tables one task may create (the README's "16 / 4 / 8, table
/// elements 100,000"), one module may define, and the driver checks uploads against. A
/// preview-1 module needs one instance and one memory; the margins leave room for
/// components, which link several core instances. The pooling allocator is sized from
/// these times the task slots.
const RULES: Limits = Limits::DEFAULT;
pub(super) const INSTANCES_PER_TASK: u32 = RULES.instances;
pub(super) const MEMORIES_PER_TASK: u32 = RULES.memories;
pub(super) const TABLES_PER_TASK: u32 = RULES.tables;
pub(super) const TABLE_ELEMENTS: usize = RULES.table_elements as usize;
/// Fiber stack of a running guest: its wasm stack and the host calls it makes.
const ASYNC_STACK: usize = MAX_WASM_STACK + (1 << 20);
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
    /// Meter wasm work with fuel, so that tasks can have deterministic budgets. Costs
    /// about 12 % on tight compute loops (BENCHMARKS.md), so executors opt in.
    pub fuel: bool,
}

/// Which of an executor's two engines a module is compiled for and a task runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// Every task but deterministic ones: the host's own float code.
    Native,
    /// Deterministic tasks: every NaN an operation makes is the canonical one, and
    /// relaxed SIMD takes its deterministic lowering, so that a replay on another CPU
    /// computes the same bits. Float-heavy code runs up to about 3x slower
    /// (BENCHMARKS.md), which is why the other tasks do not share it.
    Deterministic,
}

impl EngineKind {
    pub fn of(deterministic: bool) -> EngineKind {
        match deterministic {
            true => EngineKind::Deterministic,
            false => EngineKind::Native,
        }
    }
}

/// The engine most tasks of an executor run in: [`engine_for`] `Native`.
pub fn engine(sandbox: SandboxConfig) -> anyhow::Result<Engine> {
    engine_for(sandbox, EngineKind::Native)
}

/// An engine of an executor. The compiler subprocess builds its engine from the same
/// function, so that the artifacts it writes load here.
pub fn engine_for(sandbox: SandboxConfig, kind: EngineKind) -> anyhow::Result<Engine> {
    let slots = sandbox.slots.max(1);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_core_instances(slots * INSTANCES_PER_TASK)
        .total_memories(slots * MEMORIES_PER_TASK)
        .total_tables(slots * TABLES_PER_TASK)
        .total_component_instances(slots)
        // A guest runs on one fiber at a time (instantiation, then `_start`); the spare
        // covers an attempt's fiber still being returned while the next one starts.
        .total_stacks(slots * 2)
        .max_memories_per_module(MEMORIES_PER_TASK)
        .max_tables_per_module(TABLES_PER_TASK)
        .max_memories_per_component(MEMORIES_PER_TASK)
        .max_tables_per_component(TABLES_PER_TASK)
        .max_core_instances_per_component(INSTANCES_PER_TASK)
        // Twice the rules' bound, so that what the rules accept always fits; the
        // metadata is allocated per instance, not reserved per slot.
        .max_core_instance_size(2 * RULES.instance_bytes as usize)
        .max_component_instance_size(
            2 * (INSTANCES_PER_TASK as usize) * RULES.instance_bytes as usize,
        )
        .max_memory_size(sandbox.max_memory_bytes)
        .table_elements(TABLE_ELEMENTS)
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(KEEP_RESIDENT_BYTES)
        .pagemap_scan(Enabled::Auto);
    let mut config = Config::new();
    config
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
        .epoch_interruption(true)
        .consume_fuel(sandbox.fuel)
        .max_wasm_stack(MAX_WASM_STACK)
        .async_stack_size(ASYNC_STACK)
        // Exactly the proposals the driver accepts at upload, no more and no fewer.
        .wasm_features(WasmFeatures::all(), false)
        .wasm_features(FEATURES, true);
    if kind == EngineKind::Deterministic {
        config
            .relaxed_simd_deterministic(true)
            .cranelift_nan_canonicalization(true);
    }
    Ok(Engine::new(&config)?)
}

/// Compiles `wasm` (a core module or a component) to an artifact for an engine made by
/// [`engine`]; what the compiler subprocess runs. An error is the module's fault.
pub fn precompile(engine: &Engine, wasm: &[u8]) -> Result<Vec<u8>, String> {
    let artifact = if wasmparser::Parser::is_component(wasm) {
        engine.precompile_component(wasm)
    } else {
        engine.precompile_module(wasm)
    };
    artifact.map_err(|e| format!("invalid module: {e:#}"))
}

/// Advances the engine's epoch every [`EPOCH_TICK`] while an attempt runs, until dropped.
/// With none running it waits: an idle executor's ticker woke 500 times a second, about
/// 6 ms of CPU a second for nothing, and kept the process from ever looking idle.
pub(super) struct EpochTicker {
    stop: Arc<AtomicBool>,
}

/// Attempts running in this process, over every engine, and tickers waiting for one.
static GATE: Mutex<Gate> = Mutex::new(Gate {
    running: 0,
    waiting: 0,
});
static STARTED: Condvar = Condvar::new();

struct Gate {
    running: usize,
    waiting: usize,
}

fn gate() -> std::sync::MutexGuard<'static, Gate> {
    GATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Held while an attempt may run guest code: the tickers run.
pub(super) struct Ticking(());

pub(super) fn ticking() -> Ticking {
    let mut gate = gate();
    gate.running += 1;
    // Only a ticker that waits is woken: between back-to-back attempts it is asleep in
    // its tick, and a wake-up would be a system call per attempt for nothing.
    if gate.running == 1 && gate.waiting > 0 {
        STARTED.notify_all();
    }
    Ticking(())
}

impl Drop for Ticking {
    fn drop(&mut self) {
        gate().running -= 1;
    }
}

impl EpochTicker {
    pub(super) fn start(engine: Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_in_thread = stop.clone();
        std::thread::Builder::new()
            .name("flint-epoch".into())
            .spawn(move || {
                while !stop_in_thread.load(Ordering::Relaxed) {
                    wait_for_an_attempt();
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .expect("spawning the epoch thread");
        EpochTicker { stop }
    }
}

/// Returns at once while an attempt runs; otherwise when one starts, or after a second
/// (to see a stop).
fn wait_for_an_attempt() {
    let mut gate = gate();
    if gate.running == 0 {
        gate.waiting += 1;
        let (mut gate, _) = STARTED
            .wait_timeout(gate, Duration::from_secs(1))
            .unwrap_or_else(PoisonError::into_inner);
        gate.waiting -= 1;
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
