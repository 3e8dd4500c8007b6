//! `flint bench`: starts a local cluster and measures the whole path (HTTP submit,
//! scheduling, the executor wire, wasmtime, results) with no-op tasks of the testkit guest.
//! The numbers go to BENCHMARKS.md.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flint_protocol::api::{ExecutorState, InputSpec, JobSpec, JobState};

use crate::DriverArgs;
use crate::client::Client;
use crate::dev::{Cluster, DevArgs};

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// The testkit guest (guest-examples/testkit built for wasm32-wasip1).
    #[arg(long)]
    module: PathBuf,
    #[arg(long, default_value_t = 2)]
    executors: u32,
    #[arg(long, default_value_t = 1)]
    cores: u32,
    /// No-op tasks in the throughput job.
    #[arg(long, default_value_t = 20_000)]
    tasks: usize,
    /// Single-task jobs submitted one after another for the latency figures.
    #[arg(long, default_value_t = 500)]
    latency_jobs: usize,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let wasm = std::fs::read(&args.module)
        .with_context(|| format!("reading {}", args.module.display()))?;
    let data_dir = tempfile::tempdir()?;
    let dev = DevArgs {
        driver: DriverArgs {
            listen: "127.0.0.1:0".parse()?,
            executor_listen: "127.0.0.1:0".parse()?,
            data_dir: data_dir.path().to_owned(),
            cluster_secret: None,
            token: None,
            insecure: false,
            header_read_timeout_ms: flint_protocol::defaults::HEADER_READ_TIMEOUT_MS,
            body_idle_timeout_ms: flint_protocol::defaults::BODY_IDLE_TIMEOUT_MS,
            max_concurrent_requests: flint_protocol::defaults::MAX_CONCURRENT_REQUESTS as u64,
            executor_timeout_ms: flint_protocol::defaults::EXECUTOR_TIMEOUT_MS,
            fetch_allow: Vec::new(),
        },
        executors: args.executors,
        cores: args.cores,
        executor_args: Vec::new(),
    };
    let cluster = Cluster::start(&dev).await?;
    let result = measure(&args, &cluster, wasm).await;
    cluster.stop().await?;
    result
}

async fn measure(args: &BenchArgs, cluster: &Cluster, wasm: Vec<u8>) -> anyhow::Result<()> {
    let client = Client::new(&cluster.http_url);
    let started = Instant::now();
    loop {
        let alive = cluster.driver.read(|s| {
            s.executors
                .values()
                .filter(|e| e.state == ExecutorState::Alive)
                .count()
        });
        if alive == args.executors as usize {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!(
                "only {alive} of {} executors registered within 30 s",
                args.executors
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let module = client.upload_module(wasm).await?;
    let job = |n: usize| JobSpec {
        name: Some("bench".into()),
        module: module.id.to_string(),
        args: vec!["noop".into()],
        inputs: Some(vec![InputSpec::Text(String::new()); n]),
        ..JobSpec::default()
    };
    let wait = Some(Duration::from_secs(600));

    // Warm-up: every executor compiles the module once; that cost is not what we measure.
    let warm = Instant::now();
    let view = client
        .submit(
            &job(args.executors as usize * args.cores as usize * 4),
            wait,
        )
        .await?;
    ensure_succeeded(view.state, "warm-up")?;
    let warm = warm.elapsed();

    let t0 = Instant::now();
    let view = client.submit(&job(args.tasks), wait).await?;
    ensure_succeeded(view.state, "throughput job")?;
    let elapsed = t0.elapsed();

    let mut latencies = Vec::with_capacity(args.latency_jobs);
    for _ in 0..args.latency_jobs {
        let t = Instant::now();
        let view = client.submit(&job(1), wait).await?;
        latencies.push(t.elapsed());
        ensure_succeeded(view.state, "latency job")?;
    }
    latencies.sort();
    let pct = |p: f64| {
        let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies.get(i).copied().unwrap_or_default()
    };

    println!(
        "flint bench: {} executor(s) x {} core(s), testkit noop",
        args.executors, args.cores
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    println!(
        "  warm-up (compile + {} tasks): {:.1} ms",
        args.executors * args.cores * 4,
        ms(warm)
    );
    println!(
        "  throughput: {} tasks in {:.3} s = {:.0} tasks/s",
        args.tasks,
        elapsed.as_secs_f64(),
        args.tasks as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  single-task job submit-to-result latency over {} jobs: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        latencies.len(),
        ms(pct(0.50)),
        ms(pct(0.99)),
        ms(latencies.last().copied().unwrap_or_default())
    );
    Ok(())
}

fn ensure_succeeded(state: JobState, what: &str) -> anyhow::Result<()> {
    if state != JobState::Succeeded {
        bail!("{what} ended {state:?}");
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown cpu".into())
}
