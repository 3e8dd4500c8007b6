//! What one task costs the executor, against what wasmtime itself costs, measured in
//! one run so that the ratio means something on a noisy machine.
//!
//! ```sh
//! cargo bench -p flint-executor --bench task_cost -- [--tasks N] [--rounds R] [--module testkit.wasm] [--component testkit-p2.wasm] [--floats]
//! ```
//!
//! - floor: a fresh `Store` + instantiate from a cached `InstancePre` + `_start` of a
//!   no-op module, on the executor's own engine (pooling with keep-resident memory and
//!   pagemap_scan, epoch interruption, store limits): the least any executor can pay.
//! - runner: the same no-op task through `TaskRunner` (launch, the task thread, WASI
//!   context with capped pipes, env and argv, its usage measured, status update back):
//!   what Flint pays; and again on an engine that meters fuel (`--fuel` executors, where
//!   `"accounting": "exact"` jobs run).
//! - compile vs disk cache: a module compiled from scratch against the same module
//!   loaded from the verified on-disk artifact by a new executor (a restart).
//! - floats (`--floats`): a task of 10 million iterations of f64, f32 and f32x4
//!   arithmetic (`relaxed_madd` among it), plain and deterministic (on the engine of
//!   deterministic tasks): what a float-heavy guest pays for the settings that make its
//!   results the same on every host.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_executor::compiler::{CompilerMode, ModuleCompiler, Source};
use flint_executor::local::LocalRunner;
use flint_executor::sandbox::{self, Compiled, EngineKind, Sandbox, SandboxConfig};
use flint_protocol::Digest;
use wasmtime::{Linker, Module, Store, StoreLimitsBuilder};

const NOOP: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

/// Multiply-adds, divisions and square roots in f64, f32 and f32x4, 10 million times; the
/// results are stored so that none of it is dead.
const FLOATS: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "_start")
    (local $i i32) (local $x f64) (local $y f64) (local $a f32) (local $b f32)
    (local $v v128) (local $w v128)
    (local.set $x (f64.const 1.5))
    (local.set $a (f32.const 1.5))
    (local.set $v (v128.const f32x4 1 2 3 4))
    (local.set $w (v128.const f32x4 1 2 3 4))
    (loop $next
      (local.set $x (f64.add (f64.mul (local.get $x) (f64.const 0.9999999)) (f64.const 1e-7)))
      (local.set $y (f64.add (local.get $y)
        (f64.div (f64.sqrt (local.get $x)) (f64.add (local.get $x) (f64.const 1)))))
      (local.set $a (f32.add (f32.mul (local.get $a) (f32.const 0.999)) (f32.const 0.001)))
      (local.set $b (f32.add (local.get $b) (f32.div (local.get $a) (f32.const 3))))
      (local.set $v (f32x4.add (f32x4.mul (local.get $v) (v128.const f32x4 0.999 0.999 0.999 0.999))
        (v128.const f32x4 0.001 0.001 0.001 0.001)))
      (local.set $w (f32x4.relaxed_madd (local.get $w) (v128.const f32x4 0.999 0.999 0.999 0.999)
        (v128.const f32x4 0.001 0.001 0.001 0.001)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $next (i32.lt_u (local.get $i) (i32.const 10000000))))
    (f64.store (i32.const 0) (local.get $y))
    (f32.store (i32.const 8) (local.get $b))
    (v128.store (i32.const 16) (local.get $v))
    (v128.store (i32.const 32) (local.get $w))))"#;

struct Args {
    tasks: usize,
    rounds: usize,
    module: Option<PathBuf>,
    component: Option<PathBuf>,
    floats: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        tasks: 20_000,
        rounds: 5,
        module: None,
        component: None,
        floats: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--tasks" => args.tasks = it.next().and_then(|n| n.parse().ok()).expect("--tasks N"),
            "--rounds" => args.rounds = it.next().and_then(|n| n.parse().ok()).expect("--rounds N"),
            "--module" => args.module = it.next().map(PathBuf::from),
            "--component" => args.component = it.next().map(PathBuf::from),
            "--floats" => args.floats = true,
            // cargo bench passes --bench; anything else is a mistake worth hearing about.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

fn config() -> SandboxConfig {
    SandboxConfig {
        slots: 1,
        max_memory_bytes: 256 << 20,
        fuel: false,
    }
}

/// Bare wasmtime: the same engine, a minimal WASI context, limits and an epoch deadline.
fn floor_per_task(tasks: usize) -> Duration {
    struct Ctx {
        wasi: wasmtime_wasi::p1::WasiP1Ctx,
        limits: wasmtime::StoreLimits,
    }
    let engine = sandbox::engine(config()).unwrap();
    let module = Module::new(&engine, wat::parse_str(NOOP).unwrap()).unwrap();
    let mut linker = Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |c: &mut Ctx| &mut c.wasi).unwrap();
    let pre = linker.instantiate_pre(&module).unwrap();
    let run = || {
        let ctx = Ctx {
            wasi: wasmtime_wasi::WasiCtxBuilder::new().build_p1(),
            limits: StoreLimitsBuilder::new()
                .memory_size(256 << 20)
                .trap_on_grow_failure(true)
                .build(),
        };
        let mut store = Store::new(&engine, ctx);
        store.limiter(|c| &mut c.limits);
        store.set_epoch_deadline(1_000_000);
        let instance = pre.instantiate(&mut store).unwrap();
        let start = instance
            .get_typed_func::<(), ()>(&mut store, "_start")
            .unwrap();
        start.call(&mut store, ()).unwrap();
    };
    time_per(tasks, run)
}

/// The executor's own per-task path, one task thread, module already compiled, status
/// updates consumed as the executor's connection writer does (park, then drain).
fn runner_per_task(tasks: usize, wasm: &[u8], sandbox: Arc<Sandbox>) -> Duration {
    let mut runner = LocalRunner::new(sandbox, config(), 1, wasm, vec!["noop".into()]).unwrap();
    runner.throughput(tasks as u32).unwrap() / tasks as u32
}

/// `Sandbox::run` alone: the WASI context, pipes and limits Flint sets up, without the
/// task thread hand-off or the status message.
fn sandbox_run_per_task(tasks: usize, sandbox: &Sandbox, compiled: &Compiled) -> Duration {
    sandbox_run_seeded(tasks, sandbox, compiled, None)
}

/// [`sandbox_run_per_task`] of a deterministic task (with `seed`) or a plain one.
fn sandbox_run_seeded(
    tasks: usize,
    sandbox: &Sandbox,
    compiled: &Compiled,
    seed: Option<[u8; 32]>,
) -> Duration {
    let args = ["bench", "noop"];
    let kill = sandbox::Kill::new();
    time_per(tasks, || {
        let report = sandbox.run(
            compiled,
            sandbox::TaskRun {
                args: &args,
                env: &[],
                task: sandbox::TaskEnv {
                    job: "bench",
                    index: 0,
                    count: 1,
                    attempt: 1,
                },
                stdin: Vec::new(),
                memory_bytes: 256 << 20,
                timeout: Duration::from_secs(60),
                max_output_bytes: 1 << 20,
                max_log_bytes: 1 << 20,
                kill: kill.clone(),
                fuel: None,
                seed,
                files_dir: None,
                result_target: None,
                egress: sandbox::Egress::default(),
            },
        );
        assert!(report.outcome.is_ok());
    })
}

fn time_per(n: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..n / 10 {
        f();
    }
    let started = Instant::now();
    for _ in 0..n {
        f();
    }
    started.elapsed() / n as u32
}

fn compile_vs_disk_cache(module: &PathBuf) -> (Duration, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let digest = Digest::of(&std::fs::read(module).unwrap());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let load = |expect: Source| {
        // A new sandbox and compiler each time: nothing is shared but the directory, as
        // after an executor restart.
        let sandbox = Arc::new(Sandbox::new(config()).unwrap());
        let compiler = ModuleCompiler::new(
            sandbox,
            config(),
            dir.path().to_owned(),
            CompilerMode::InProcess,
        )
        .unwrap();
        let started = Instant::now();
        let (_, source) = runtime
            .block_on(compiler.load(digest, module, EngineKind::Native))
            .unwrap();
        let took = started.elapsed();
        assert_eq!(source, expect);
        took
    };
    let compile = load(Source::Compiled);
    let mut cached: Vec<Duration> = (0..20).map(|_| load(Source::DiskCache)).collect();
    cached.sort();
    (compile, cached[cached.len() / 2])
}

/// The float task, plain and deterministic, interleaved: medians in ms per task.
fn floats(sandbox: &Sandbox, rounds: usize) -> (f64, f64) {
    let wasm = wat::parse_str(FLOATS).unwrap();
    let native = sandbox.compile(&wasm).unwrap();
    let fixed = (sandbox.compile_for(&wasm, EngineKind::Deterministic)).unwrap();
    let (mut plain, mut deterministic) = (Vec::new(), Vec::new());
    for _ in 0..rounds.max(5) {
        plain.push(sandbox_run_seeded(3, sandbox, &native, None));
        deterministic.push(sandbox_run_seeded(3, sandbox, &fixed, Some([7; 32])));
    }
    let median = |mut r: Vec<Duration>| {
        r.sort();
        r[r.len() / 2].as_secs_f64() * 1e3
    };
    (median(plain), median(deterministic))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let args = parse_args();
    println!(
        "task_cost: {} no-op tasks per measurement, median of {} interleaved rounds, 1 task thread",
        args.tasks, args.rounds
    );
    // Rounds interleave the measurements, so that a noisy second on this shared machine
    // lands on all of them alike; each figure is the median of its rounds.
    let sandbox = Arc::new(Sandbox::new(config()).unwrap());
    let wasm = wat::parse_str(NOOP).unwrap();
    let metered = Arc::new(
        Sandbox::new(SandboxConfig {
            fuel: true,
            ..config()
        })
        .unwrap(),
    );
    let mut rounds: [Vec<Duration>; 4] = Default::default();
    for _ in 0..args.rounds {
        rounds[0].push(floor_per_task(args.tasks));
        let compiled = sandbox.compile(&wasm).unwrap();
        rounds[1].push(sandbox_run_per_task(args.tasks, &sandbox, &compiled));
        rounds[2].push(runner_per_task(args.tasks, &wasm, sandbox.clone()));
        rounds[3].push(runner_per_task(args.tasks, &wasm, metered.clone()));
    }
    let [floor, run_only, runner, runner_fuel] = rounds.map(|mut r| {
        r.sort();
        r[r.len() / 2]
    });
    let ratio = |d: Duration| d.as_secs_f64() / floor.as_secs_f64();
    println!(
        "  p1 no-op, wasmtime floor:              {:6.1} us/task",
        us(floor)
    );
    for (what, d) in [
        ("Sandbox::run:              ", run_only),
        ("TaskRunner:                ", runner),
        ("TaskRunner, fuel metered:  ", runner_fuel),
    ] {
        println!(
            "  p1 no-op, {what}  {:6.1} us/task  {:.2}x floor",
            us(d),
            ratio(d)
        );
    }
    if let Some(component) = &args.component {
        let wasm = std::fs::read(component).unwrap();
        let runner = runner_per_task(args.tasks, &wasm, sandbox.clone());
        println!(
            "  p2 testkit noop component, runner, consumer parked: {:.1} us/task",
            us(runner)
        );
    }
    if args.floats {
        let (plain, deterministic) = floats(&sandbox, args.rounds);
        println!(
            "  floats, 10M iterations: plain {plain:.1} ms/task, deterministic {deterministic:.1} ms/task"
        );
    }
    if let Some(module) = &args.module {
        let (compile, cached) = compile_vs_disk_cache(module);
        println!(
            "  {}: compile {:.1} ms, load from disk cache after restart {:.3} ms, {:.0}x faster",
            module.file_name().unwrap().to_string_lossy(),
            compile.as_secs_f64() * 1e3,
            cached.as_secs_f64() * 1e3,
            compile.as_secs_f64() / cached.as_secs_f64()
        );
    }
}
