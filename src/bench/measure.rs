//! The measurements: throughput and latency of no-op tasks against the executor-only
//! floor, large results through the block store, and the driver's memory per pending
//! task. Each prints its figures in the shape BENCHMARKS.md quotes.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flint_protocol::api::{ExecutorState, InputSpec, JobSpec, JobState, TaskView};

use super::NOOP_WASM;
use super::args::BenchArgs;
use super::procfs::{CpuTimes, cpu_model, num_cpus, process_cpu, resident_bytes};
use crate::client::Client;
use crate::dev::Cluster;

/// The no-op figures of one module on one cluster: the whole system's and, in the same
/// run, the executor-only floor's.
pub struct NoopFigures {
    pub warm: Duration,
    pub warm_tasks: u32,
    pub elapsed: Duration,
    pub rate: f64,
    pub cpu_per_task: f64,
    /// Submit-to-result of single-task jobs, sorted.
    pub latencies: Vec<Duration>,
    pub threads: usize,
    pub local_rate: f64,
    /// Launch-to-status of one task through the executor's task runner alone, sorted.
    pub local_trips: Vec<Duration>,
}

/// The `p` quantile (0 to 1) of sorted durations.
pub fn quantile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

pub async fn throughput_and_latency(
    args: &BenchArgs,
    cluster: &Cluster,
    wasm: Vec<u8>,
) -> anyhow::Result<()> {
    let f = noop_figures(args, cluster, wasm).await?;
    println!(
        "flint bench: {} executor(s) x {} core(s), {}",
        args.executors,
        args.cores,
        args.module.as_ref().map_or_else(
            || format!("the built-in no-op module ({} bytes)", NOOP_WASM.len()),
            |m| format!("{} noop", m.display())
        )
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    println!(
        "  warm-up (compile + {} tasks): {:.1} ms",
        f.warm_tasks,
        ms(f.warm)
    );
    println!(
        "  throughput: {} tasks in {:.3} s = {:.0} tasks/s; executor-only floor ({} task thread(s) in-process): {:.0} tasks/s, {:.1}x the whole system",
        args.tasks,
        f.elapsed.as_secs_f64(),
        f.rate,
        f.threads,
        f.local_rate,
        f.local_rate / f.rate
    );
    println!(
        "  CPU of Flint's processes (driver and client, executors) in the throughput job: {:.1} us per task",
        f.cpu_per_task * 1e6
    );
    println!(
        "  single-task job submit-to-result latency over {} jobs: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        f.latencies.len(),
        ms(quantile(&f.latencies, 0.50)),
        ms(quantile(&f.latencies, 0.99)),
        ms(f.latencies.last().copied().unwrap_or_default())
    );
    println!(
        "  executor-only floor, launch to status of one task: p50 {:.3} ms, p99 {:.3} ms",
        ms(quantile(&f.local_trips, 0.50)),
        ms(quantile(&f.local_trips, 0.99))
    );
    Ok(())
}

/// Measures [`NoopFigures`]: a warm-up job, the throughput job of `--tasks`, then
/// `--latency-jobs` single-task jobs one after another, then the same module through
/// the executor's task runner in this process.
pub async fn noop_figures(
    args: &BenchArgs,
    cluster: &Cluster,
    wasm: Vec<u8>,
) -> anyhow::Result<NoopFigures> {
    let client = Client::new(&cluster.http_url);
    wait_for_executors(args, cluster).await?;
    let module = client.upload_module(wasm.clone()).await?;
    let job = |n: usize| JobSpec {
        name: Some("bench".into()),
        module: module.id.to_string(),
        args: vec!["noop".into()],
        inputs: Some(vec![InputSpec::Text(String::new()); n]),
        ..JobSpec::default()
    };
    let wait = Some(Duration::from_secs(600));

    // Warm-up: every executor compiles the module once; that cost is not what we measure.
    let warm_tasks = args.executors * args.cores * 4;
    let warm = Instant::now();
    let view = client.submit(&job(warm_tasks as usize), wait).await?;
    ensure_succeeded(view.state, "warm-up")?;
    let warm = warm.elapsed();

    // CPU time as well as wall time: on a shared, noisy machine the CPU Flint's
    // processes spend per task moves far less between runs than tasks per second.
    let pids: Vec<u32> = std::iter::once(std::process::id())
        .chain(client.executors().await?.items.iter().filter_map(|e| e.pid))
        .collect();
    let cpu_before = process_cpu(&pids);
    let t0 = Instant::now();
    let view = client.submit(&job(args.tasks), wait).await?;
    ensure_succeeded(view.state, "throughput job")?;
    let elapsed = t0.elapsed();
    let cpu_per_task = (process_cpu(&pids) - cpu_before) / args.tasks as f64;

    let mut latencies = Vec::with_capacity(args.latency_jobs);
    for _ in 0..args.latency_jobs {
        let t = Instant::now();
        let view = client.submit(&job(1), wait).await?;
        latencies.push(t.elapsed());
        ensure_succeeded(view.state, "latency job")?;
    }
    latencies.sort();

    // The executor-only floor in the same run: the same module through the executor's
    // task runner in this process, with as many task threads as the cluster has cores,
    // no driver, no network. What the whole system is measured against.
    let threads = (args.executors * args.cores) as usize;
    let (tasks, jobs) = (args.tasks as u32, args.latency_jobs);
    let (local_elapsed, mut local_trips) = tokio::task::spawn_blocking(move || {
        let config = flint_executor::sandbox::SandboxConfig {
            slots: threads as u32,
            max_memory_bytes: (crate::flags::MAX_MEMORY_MB as usize) << 20,
            fuel: false,
        };
        let sandbox = std::sync::Arc::new(flint_executor::sandbox::Sandbox::new(config)?);
        let mut local = flint_executor::local::LocalRunner::new(
            sandbox,
            config,
            threads,
            &wasm,
            vec!["noop".into()],
        )?;
        local.throughput(tasks.min(1000))?; // warm-up
        anyhow::Ok((local.throughput(tasks)?, local.round_trips(jobs)?))
    })
    .await??;
    local_trips.sort();
    Ok(NoopFigures {
        warm,
        warm_tasks,
        elapsed,
        rate: args.tasks as f64 / elapsed.as_secs_f64(),
        cpu_per_task,
        latencies,
        threads,
        local_rate: args.tasks as f64 / local_elapsed.as_secs_f64(),
        local_trips,
    })
}

pub(super) async fn wait_for_executors(args: &BenchArgs, cluster: &Cluster) -> anyhow::Result<()> {
    wait_for_alive(cluster, args.executors as usize, Duration::from_secs(30)).await
}

/// Waits until `n` executors are alive in the driver.
pub(super) async fn wait_for_alive(
    cluster: &Cluster,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let alive = cluster.driver.read(|s| {
            s.executors
                .values()
                .filter(|e| e.state == ExecutorState::Alive)
                .count()
        });
        if alive == n {
            return Ok(());
        }
        if started.elapsed() > timeout {
            bail!("only {alive} of {n} executors registered within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Large results from the tasks to the client: the job's wall time (guests writing,
/// executors hashing and streaming to the driver, the driver writing its data dir),
/// then every result fetched over HTTP at once, and only then hashed here and checked
/// against the driver's digests (so that the fetch is timed as a client that keeps the
/// bytes sees it, and the raw loopback copy of `flint bench --floor` does the same).
/// The baseline is a plain write of the same bytes in 1 MiB pieces to a file in the
/// same data dir, timed without and then with fsync: the block store does not fsync
/// (it writes through object_store's local file system), so the fair comparison is
/// the first.
pub struct ResultFigures {
    pub tasks: usize,
    pub total: u64,
    pub written: Duration,
    pub synced: Duration,
    pub produced: Duration,
    pub produced_busy: f64,
    pub produced_cpu: f64,
    pub read: Duration,
    pub read_busy: f64,
    pub read_cpu: f64,
}

impl ResultFigures {
    pub fn gbs(&self, d: Duration) -> f64 {
        self.total as f64 / d.as_secs_f64() / 1e9
    }
}

pub async fn results(
    args: &BenchArgs,
    cluster: &Cluster,
    wasm: Vec<u8>,
    mib: usize,
    data_dir: &Path,
) -> anyhow::Result<()> {
    let f = result_figures(args, cluster, wasm, mib, data_dir).await?;
    println!(
        "flint bench --results-mib {mib}: {} tasks x {mib} MiB = {} MiB, {} executor(s) x {} core(s), block store: {}",
        f.tasks,
        f.total >> 20,
        args.executors,
        args.cores,
        args.block_store
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    println!(
        "  raw write of {} MiB to the data dir's file system: {:.2} GB/s without fsync, {:.2} GB/s with it",
        f.total >> 20,
        f.gbs(f.written),
        f.gbs(f.synced)
    );
    println!(
        "  tasks -> block store (job wall time): {:.3} s = {:.2} GB/s, CPUs {:.0} % busy, Flint's processes used {:.2} CPU s",
        f.produced.as_secs_f64(),
        f.gbs(f.produced),
        f.produced_busy * 100.0,
        f.produced_cpu
    );
    println!(
        "  block store -> client ({} concurrent GETs, hashed after): {:.3} s = {:.2} GB/s, CPUs {:.0} % busy, Flint's processes used {:.2} CPU s",
        f.tasks,
        f.read.as_secs_f64(),
        f.gbs(f.read),
        f.read_busy * 100.0,
        f.read_cpu
    );
    println!(
        "  end to end: {:.3} s = {:.2} GB/s",
        (f.produced + f.read).as_secs_f64(),
        f.gbs(f.produced + f.read)
    );
    Ok(())
}

/// Measures [`ResultFigures`] for `--result-tasks` tasks of `mib` MiB each.
pub async fn result_figures(
    args: &BenchArgs,
    cluster: &Cluster,
    wasm: Vec<u8>,
    mib: usize,
    data_dir: &Path,
) -> anyhow::Result<ResultFigures> {
    let client = Client::new(&cluster.http_url);
    wait_for_executors(args, cluster).await?;
    let module = client.upload_module(wasm).await?;
    let wait = Some(Duration::from_secs(600));
    let spec = |task_args: Vec<String>, n: usize| JobSpec {
        name: Some("bench-results".into()),
        module: module.id.to_string(),
        args: task_args,
        inputs: Some(vec![InputSpec::Text(String::new()); n]),
        ..JobSpec::default()
    };
    let warm = client
        .submit(
            &spec(vec!["noop".into()], args.executors as usize * 2),
            wait,
        )
        .await?;
    ensure_succeeded(warm.state, "warm-up")?;
    let total = (args.result_tasks * mib) as u64 * 1024 * 1024;

    // The baseline, on the same file system as the block store.
    let (written, synced) = raw_write(data_dir.join("bench-raw-write"), total).await?;

    let pids: Vec<u32> = std::iter::once(std::process::id())
        .chain(client.executors().await?.items.iter().filter_map(|e| e.pid))
        .collect();
    let t = Instant::now();
    let cpu = CpuTimes::now()?;
    let ours = process_cpu(&pids);
    let view = client
        .submit(
            &spec(
                vec!["print".into(), (mib << 20).to_string()],
                args.result_tasks,
            ),
            wait,
        )
        .await?;
    ensure_succeeded(view.state, "results job")?;
    let produced = t.elapsed();
    let produced_busy = cpu.busy_since()?;
    let produced_cpu = process_cpu(&pids) - ours;
    let tasks = client.tasks(&view.id.0).await?;

    let (read, read_busy, read_cpu) = read_results(cluster, &view.id.0, &tasks, &pids).await?;
    Ok(ResultFigures {
        tasks: tasks.len(),
        total,
        written,
        synced,
        produced,
        produced_busy,
        produced_cpu,
        read,
        read_busy,
        read_cpu,
    })
}

/// `total` bytes written to a file at `path` (then removed) in MiB pieces: the time to
/// write them, and to write and sync them.
async fn raw_write(path: std::path::PathBuf, total: u64) -> anyhow::Result<(Duration, Duration)> {
    let (written, synced) = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
        use std::io::Write;
        let piece = vec![0x5au8; 1 << 20];
        let mut file = std::fs::File::create(&path)?;
        let t = Instant::now();
        for _ in 0..total >> 20 {
            file.write_all(&piece)?;
        }
        let written = t.elapsed();
        file.sync_all()?;
        let synced = t.elapsed();
        std::fs::remove_file(&path)?;
        Ok((written, synced))
    })
    .await??;
    Ok((written, synced))
}

/// Every task's result of `job` fetched at once, each checked against its size and
/// digest: how long that took, how busy the CPUs were, and the CPU time `pids` used.
async fn read_results(
    cluster: &Cluster,
    job: &str,
    tasks: &[TaskView],
    pids: &[u32],
) -> anyhow::Result<(Duration, f64, f64)> {
    use futures_util::StreamExt;
    use sha2::Digest as _;

    let http = reqwest::Client::builder().no_proxy().build()?;
    let t = Instant::now();
    let fetches = tasks.iter().map(|task| {
        let url = format!(
            "{}/v1/jobs/{job}/tasks/{}/result",
            cluster.http_url, task.index
        );
        let http = http.clone();
        tokio::spawn(async move {
            let response = http.get(url).send().await?.error_for_status()?;
            let mut body = response.bytes_stream();
            let mut chunks = Vec::new();
            while let Some(chunk) = body.next().await {
                chunks.push(chunk?);
            }
            anyhow::Ok(chunks)
        })
    });
    let cpu = CpuTimes::now()?;
    let ours = process_cpu(pids);
    let fetched = futures_util::future::join_all(fetches).await;
    let read = t.elapsed();
    let read_busy = cpu.busy_since()?;
    let read_cpu = process_cpu(pids) - ours;
    for (task, got) in tasks.iter().zip(fetched) {
        let chunks = got??;
        let mut hasher = sha2::Sha256::new();
        chunks.iter().for_each(|c| hasher.update(c));
        let size: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        let sha = hex::encode(hasher.finalize());
        let expected = task.result.as_ref().context("a result")?;
        if size != expected.size || sha != expected.sha256 {
            bail!(
                "task {}: got {size} bytes hashing to {sha}, the driver says {expected:?}",
                task.index
            );
        }
    }
    Ok((read, read_busy, read_cpu))
}

/// The driver's memory per pending task: resident set size before and after one job of
/// `tasks` no-op tasks is accepted, with freed heap handed back to the system before each
/// reading so that what the request parsing used and dropped is not counted.
pub async fn pending_memory(cluster: &Cluster, wasm: Vec<u8>, tasks: usize) -> anyhow::Result<()> {
    let client = Client::new(&cluster.http_url);
    let module = client.upload_module(wasm).await?;
    let before = resident_bytes()?;
    let spec = JobSpec {
        name: Some("pending".into()),
        module: module.id.to_string(),
        args: vec!["noop".into()],
        inputs: Some(vec![InputSpec::Text(String::new()); tasks]),
        ..JobSpec::default()
    };
    let t0 = Instant::now();
    let view = client.submit(&spec, None).await?;
    let accepted = t0.elapsed();
    drop(spec);
    let pending = cluster
        .driver
        .read(|s| s.jobs.get(&view.id).map(|j| j.counts().pending));
    if pending != Some(tasks as u32) {
        bail!("expected {tasks} pending tasks, the driver has {pending:?}");
    }
    let after = resident_bytes()?;
    let grown = after.saturating_sub(before);
    println!("flint bench --pending-memory: one job of {tasks} no-op tasks, no executors");
    println!(
        "  accepted in {:.2} s; driver resident set {:.1} MiB -> {:.1} MiB: {:.0} bytes per pending task",
        accepted.as_secs_f64(),
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        grown as f64 / tasks as f64
    );
    Ok(())
}

pub(super) fn ensure_succeeded(state: JobState, what: &str) -> anyhow::Result<()> {
    if state != JobState::Succeeded {
        bail!("{what} ended {state:?}");
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
