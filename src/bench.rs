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

/// `(module (memory (export "memory") 1) (func (export "_start")))`, assembled.
const NOOP_WASM: &[u8] = &[
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version 1
    0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // types: () -> ()
    0x03, 0x02, 0x01, 0x00, // functions: one of type 0
    0x05, 0x03, 0x01, 0x00, 0x01, // memories: one of 1 page
    0x07, 0x13, 0x02, // exports: two
    0x06, b'm', b'e', b'm', b'o', b'r', b'y', 0x02, 0x00, // "memory", memory 0
    0x06, b'_', b's', b't', b'a', b'r', b't', 0x00, 0x00, // "_start", function 0
    0x0a, 0x04, 0x01, 0x02, 0x00, 0x0b, // code: one body, no locals, end
];

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// The task: the testkit guest (guest-examples/testkit built for wasm32-wasip1),
    /// run as `noop`, or any module. Without it, a minimal core module whose `_start`
    /// returns at once (the WAT no-op of the task_cost bench's floor), which measures
    /// Flint rather than a guest's start-up. `--results-mib` needs testkit.
    #[arg(long)]
    module: Option<PathBuf>,
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
    /// The driver's `--launch-ahead`.
    #[arg(long, default_value_t = flint_protocol::defaults::LAUNCH_AHEAD)]
    launch_ahead: u32,
    /// The driver's `--launch-ahead-max`.
    #[arg(long, default_value_t = flint_protocol::defaults::LAUNCH_AHEAD_MAX)]
    launch_ahead_max: u32,
    /// The driver's `--commit-interval-ms`.
    #[arg(long, default_value_t = flint_protocol::defaults::COMMIT_INTERVAL_MS)]
    commit_interval_ms: u64,
    /// Instead of the throughput and latency figures: start a driver with no executors,
    /// submit one job of this many no-op tasks (all stay pending) and print the driver's
    /// resident memory per pending task.
    #[arg(long, value_name = "TASKS")]
    pending_memory: Option<usize>,
    /// Instead: the large-result path's throughput. One job of `--result-tasks` tasks
    /// each writing this many MiB (testkit `print`) through the block store in the
    /// driver's data dir, then every result streamed to this client and hashed; printed
    /// next to a plain write of as many bytes to a file on the same file system.
    #[arg(long, value_name = "MIB")]
    results_mib: Option<usize>,
    #[arg(long, default_value_t = 8)]
    result_tasks: usize,
    /// The driver's `--block-store` for `--results-mib`: `driver` (uploads through the
    /// driver), or `local` for a directory beside the data dir that the executors, on
    /// this machine, write themselves (`file://`), or any object store URL.
    #[arg(long, default_value = "driver")]
    block_store: String,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let wasm = match &args.module {
        Some(path) => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        None if args.results_mib.is_some() => {
            bail!("--results-mib needs --module testkit.wasm (its `print` writes the results)")
        }
        None => NOOP_WASM.to_vec(),
    };
    let data_dir = tempfile::tempdir()?;
    let block_store = match args.block_store.as_str() {
        "local" => {
            let dir = data_dir.path().join("local-blocks");
            std::fs::create_dir_all(&dir)?;
            format!("file://{}", dir.display())
        }
        other => other.to_owned(),
    };
    let dev = DevArgs {
        executors: if args.pending_memory.is_some() {
            0
        } else {
            args.executors
        },
        driver: DriverArgs {
            listen: "127.0.0.1:0".parse()?,
            executor_listen: "127.0.0.1:0".parse()?,
            advertise_url: None,
            data_dir: data_dir.path().to_owned(),
            cluster_secret: None,
            token: None,
            insecure: false,
            header_read_timeout_ms: flint_protocol::defaults::HEADER_READ_TIMEOUT_MS,
            body_idle_timeout_ms: flint_protocol::defaults::BODY_IDLE_TIMEOUT_MS,
            max_concurrent_requests: flint_protocol::defaults::MAX_CONCURRENT_REQUESTS as u64,
            max_event_streams: flint_protocol::defaults::MAX_EVENT_STREAMS as u64,
            executor_timeout_ms: flint_protocol::defaults::EXECUTOR_TIMEOUT_MS,
            fetch_allow: Vec::new(),
            block_store,
            inline_result_bytes: flint_protocol::defaults::INLINE_RESULT_BYTES,
            locality_wait_ms: flint_protocol::defaults::LOCALITY_WAIT_MS,
            scheduling_mode: crate::SchedulingModeArg::Fifo,
            speculation: false,
            launch_ahead: args.launch_ahead,
            launch_ahead_max: args.launch_ahead_max,
            queue_budget_us: flint_protocol::defaults::QUEUE_BUDGET_US,
            commit_interval_ms: args.commit_interval_ms,
            speculation_quantile: 0.75,
            speculation_multiplier: 1.5,
        },
        cores: args.cores,
        executor_args: Vec::new(),
    };
    let cluster = Cluster::start(&dev).await?;
    let result = match (args.pending_memory, args.results_mib) {
        (Some(tasks), _) => measure_pending(&cluster, wasm, tasks).await,
        (None, Some(mib)) => measure_results(&args, &cluster, wasm, mib, data_dir.path()).await,
        (None, None) => measure(&args, &cluster, wasm).await,
    };
    cluster.stop().await?;
    result
}

async fn measure(args: &BenchArgs, cluster: &Cluster, wasm: Vec<u8>) -> anyhow::Result<()> {
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
    let warm = Instant::now();
    let view = client
        .submit(
            &job(args.executors as usize * args.cores as usize * 4),
            wait,
        )
        .await?;
    ensure_succeeded(view.state, "warm-up")?;
    let warm = warm.elapsed();

    // CPU time as well as wall time: on a shared, noisy machine the CPU Flint's
    // processes spend per task moves far less between runs than tasks per second.
    let pids: Vec<u32> = std::iter::once(std::process::id())
        .chain(client.executors().await?.iter().filter_map(|e| e.pid))
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
    let pct = |p: f64| {
        let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies.get(i).copied().unwrap_or_default()
    };

    // The executor-only floor in the same run: the same module through the executor's
    // task runner in this process, with as many task threads as the cluster has cores,
    // no driver, no network. What the whole system is measured against.
    let threads = (args.executors * args.cores) as usize;
    let (tasks, jobs) = (args.tasks as u32, args.latency_jobs);
    let (local_elapsed, mut local_trips) = tokio::task::spawn_blocking(move || {
        let config = flint_executor::sandbox::SandboxConfig {
            slots: threads as u32,
            max_memory_bytes: 4096 << 20,
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
    let local_pct = |p: f64| {
        let i = ((local_trips.len() as f64 - 1.0) * p).round() as usize;
        local_trips.get(i).copied().unwrap_or_default()
    };
    let rate = args.tasks as f64 / elapsed.as_secs_f64();
    let local_rate = args.tasks as f64 / local_elapsed.as_secs_f64();

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
        args.executors * args.cores * 4,
        ms(warm)
    );
    println!(
        "  throughput: {} tasks in {:.3} s = {:.0} tasks/s; executor-only floor ({threads} task thread(s) in-process): {:.0} tasks/s, {:.1}x the whole system",
        args.tasks,
        elapsed.as_secs_f64(),
        rate,
        local_rate,
        local_rate / rate
    );
    println!(
        "  CPU of Flint's processes (driver and client, executors) in the throughput job: {:.1} us per task",
        cpu_per_task * 1e6
    );
    println!(
        "  single-task job submit-to-result latency over {} jobs: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        latencies.len(),
        ms(pct(0.50)),
        ms(pct(0.99)),
        ms(latencies.last().copied().unwrap_or_default())
    );
    println!(
        "  executor-only floor, launch to status of one task: p50 {:.3} ms, p99 {:.3} ms",
        ms(local_pct(0.50)),
        ms(local_pct(0.99))
    );
    Ok(())
}

async fn wait_for_executors(args: &BenchArgs, cluster: &Cluster) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let alive = cluster.driver.read(|s| {
            s.executors
                .values()
                .filter(|e| e.state == ExecutorState::Alive)
                .count()
        });
        if alive == args.executors as usize {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!(
                "only {alive} of {} executors registered within 30 s",
                args.executors
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Large results from the tasks to the client: the job's wall time (guests writing,
/// executors hashing and streaming to the driver, the driver hashing and writing its
/// data dir), then every result fetched over HTTP at once and hashed here. The
/// baseline is a plain write of the same bytes in 1 MiB pieces to a file in the same
/// data dir, timed without and then with fsync: the block store does not fsync (it
/// writes through object_store's local file system), so the fair comparison is the
/// first.
async fn measure_results(
    args: &BenchArgs,
    cluster: &Cluster,
    wasm: Vec<u8>,
    mib: usize,
    data_dir: &std::path::Path,
) -> anyhow::Result<()> {
    use futures_util::StreamExt;
    use sha2::Digest as _;

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
    let gbs = |d: Duration| total as f64 / d.as_secs_f64() / 1e9;

    // The baseline, on the same file system as the block store.
    let path = data_dir.join("bench-raw-write");
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

    let pids: Vec<u32> = std::iter::once(std::process::id())
        .chain(client.executors().await?.iter().filter_map(|e| e.pid))
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

    let http = reqwest::Client::builder().no_proxy().build()?;
    let t = Instant::now();
    let fetches = tasks.iter().map(|task| {
        let url = format!(
            "{}/v1/jobs/{}/tasks/{}/result",
            cluster.http_url, view.id, task.index
        );
        let http = http.clone();
        tokio::spawn(async move {
            let response = http.get(url).send().await?.error_for_status()?;
            let mut body = response.bytes_stream();
            let mut hasher = sha2::Sha256::new();
            let mut size = 0u64;
            while let Some(chunk) = body.next().await {
                let chunk = chunk?;
                size += chunk.len() as u64;
                hasher.update(&chunk);
            }
            anyhow::Ok((size, hex::encode(hasher.finalize())))
        })
    });
    let cpu = CpuTimes::now()?;
    let ours = process_cpu(&pids);
    let fetched = futures_util::future::join_all(fetches).await;
    let read = t.elapsed();
    let read_busy = cpu.busy_since()?;
    let read_cpu = process_cpu(&pids) - ours;
    for (task, got) in tasks.iter().zip(fetched) {
        let (size, sha) = got??;
        let expected = task.result.as_ref().context("a result")?;
        if size != expected.size || sha != expected.sha256 {
            bail!(
                "task {}: got {size} bytes hashing to {sha}, the driver says {expected:?}",
                task.index
            );
        }
    }
    println!(
        "flint bench --results-mib {mib}: {} tasks x {mib} MiB = {} MiB, {} executor(s) x {} core(s), block store: {}",
        args.result_tasks,
        total >> 20,
        args.executors,
        args.cores,
        args.block_store
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    println!(
        "  raw write of {} MiB to the data dir's file system: {:.2} GB/s without fsync, {:.2} GB/s with it",
        total >> 20,
        gbs(written),
        gbs(synced)
    );
    println!(
        "  tasks -> block store (job wall time): {:.3} s = {:.2} GB/s, CPUs {:.0} % busy, Flint's processes used {:.2} CPU s",
        produced.as_secs_f64(),
        gbs(produced),
        produced_busy * 100.0,
        produced_cpu
    );
    println!(
        "  block store -> client ({} concurrent GETs, hashed): {:.3} s = {:.2} GB/s, CPUs {:.0} % busy, Flint's processes used {:.2} CPU s",
        tasks.len(),
        read.as_secs_f64(),
        gbs(read),
        read_busy * 100.0,
        read_cpu
    );
    println!(
        "  end to end: {:.3} s = {:.2} GB/s",
        (produced + read).as_secs_f64(),
        gbs(produced + read)
    );
    Ok(())
}

/// The driver's memory per pending task: resident set size before and after one job of
/// `tasks` no-op tasks is accepted, with freed heap handed back to the system before each
/// reading so that what the request parsing used and dropped is not counted.
async fn measure_pending(cluster: &Cluster, wasm: Vec<u8>, tasks: usize) -> anyhow::Result<()> {
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

/// CPU seconds (user + system) the given processes used so far; on a shared machine
/// this, unlike wall time, does not grow with other people's load.
fn process_cpu(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .map(|stat| {
            // Fields after the command name (which may hold spaces): utime and stime are
            // the 12th and 13th of them.
            let rest = stat.rsplit(')').next().unwrap_or("");
            let fields: Vec<u64> = rest
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|f| f.parse().ok())
                .collect();
            fields.iter().sum::<u64>() as f64 / hz
        })
        .sum()
}

/// The whole machine's CPU time from /proc/stat, to tell a phase bound by the CPUs
/// (every process here, and anyone else's) from one waiting on something else.
struct CpuTimes {
    busy: u64,
    total: u64,
}

impl CpuTimes {
    fn now() -> anyhow::Result<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .context("an empty /proc/stat")?
            .split_whitespace()
            .skip(1)
            .filter_map(|t| t.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
        let total: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        Ok(CpuTimes {
            busy: total - idle,
            total,
        })
    }

    /// The share of the machine's CPU time that was busy since `self`.
    fn busy_since(&self) -> anyhow::Result<f64> {
        let now = CpuTimes::now()?;
        let total = now.total.saturating_sub(self.total).max(1);
        Ok(now.busy.saturating_sub(self.busy) as f64 / total as f64)
    }
}

/// This process's resident set, after returning freed heap pages to the system.
fn resident_bytes() -> anyhow::Result<u64> {
    // SAFETY: malloc_trim only releases free memory at the top of glibc's heaps.
    unsafe { libc::malloc_trim(0) };
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .context("parsing /proc/self/statm")?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    Ok(pages * page)
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

#[cfg(test)]
mod tests {
    use super::NOOP_WASM;

    #[test]
    fn the_built_in_noop_module_runs_through_the_task_runner() {
        let config = flint_executor::sandbox::SandboxConfig {
            slots: 1,
            max_memory_bytes: 64 << 20,
            fuel: false,
        };
        let sandbox = std::sync::Arc::new(flint_executor::sandbox::Sandbox::new(config).unwrap());
        let mut local =
            flint_executor::local::LocalRunner::new(sandbox, config, 1, NOOP_WASM, Vec::new())
                .unwrap();
        local.throughput(10).unwrap();
        assert_eq!(local.round_trips(3).unwrap().len(), 3);
    }
}
