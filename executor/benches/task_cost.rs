//! What one task costs the executor, against what wasmtime itself costs, measured in
//! one run so that the ratio means something on a noisy machine.
//!
//! ```sh
//! cargo bench -p flint-executor --bench task_cost -- [--tasks N] [--rounds R] [--module testkit.wasm] [--component testkit-p2.wasm]
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

struct Args {
    tasks: usize,
    rounds: usize,
    module: Option<PathBuf>,
    component: Option<PathBuf>,
}

fn parse_args() -> Args {
    let mut args = Args {
        tasks: 20_000,
        rounds: 5,
        module: None,
        component: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--tasks" => args.tasks = it.next().and_then(|n| n.parse().ok()).expect("--tasks N"),
            "--rounds" => args.rounds = it.next().and_then(|n| n.parse().ok()).expect("--rounds N"),
            "--module" => args.module = it.next().map(PathBuf::from),
            "--component" => args.component = it.next().map(PathBuf::from),
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
                seed: None,
                files_dir: None,
                result_target: None,
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
