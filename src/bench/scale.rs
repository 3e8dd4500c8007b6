//! `flint bench --simulated-executors 2,20,200,1000`: the driver alone at scale. For each
//! size a fresh driver (in this process, as `flint dev` runs it) and simulated executors
//! in child processes (see [`super::simulate`]); one warm-up job, then one job of
//! `--simulated-tasks` tasks. The driver's CPU is this process's (the bench's own client
//! is in it too: building and sending one job's JSON, a few ms of the total); the
//! simulators' is printed beside it.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flint_protocol::api::{InputSpec, JobSpec};

use super::NOOP_WASM;
use super::args::BenchArgs;
use super::measure::{ensure_succeeded, wait_for_alive};
use super::procfs::{cpu_model, num_cpus, process_cpu, resident_bytes};
use super::simulate;
use crate::client::Client;
use crate::dev::Cluster;
use flint_driver::scheduler::latency::LatencyHistogram;

/// One size's figures.
struct Row {
    executors: u32,
    tasks_per_s: f64,
    driver_cpu_us: f64,
    simulators_cpu_us: f64,
    p50: Duration,
    p99: Duration,
    /// Launch-to-status and submit-to-result of single-task jobs, one after another.
    idle_p50: Duration,
    idle_p99: Duration,
    round_trip_p50: Duration,
    round_trip_p99: Duration,
    bytes_per_executor: f64,
    registered_in: Duration,
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    if let [executors] = args.simulated_executors[..] {
        let row = one_size(args, executors)
            .await
            .with_context(|| format!("{executors} simulated executors"))?;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "  {:>5} executors: {:>8.0} tasks/s, driver CPU {:.2} us/task (simulators {:.2}), launch-to-status in the job p50 {:.2} ms p99 {:.2} ms; {} single-task jobs: launch-to-status p50 {:.3} ms p99 {:.3} ms, submit-to-result p50 {:.2} ms p99 {:.2} ms; driver memory {:.1} KiB/executor, registered in {:.2} s",
            row.executors,
            row.tasks_per_s,
            row.driver_cpu_us,
            row.simulators_cpu_us,
            ms(row.p50),
            ms(row.p99),
            args.latency_jobs,
            ms(row.idle_p50),
            ms(row.idle_p99),
            ms(row.round_trip_p50),
            ms(row.round_trip_p99),
            row.bytes_per_executor / 1024.0,
            row.registered_in.as_secs_f64(),
        );
        return Ok(());
    }
    println!(
        "flint bench: the driver with simulated executors of {} cores, {} tasks per job{}",
        args.cores,
        args.simulated_tasks,
        simulate::task_length(args),
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    // Each size in a process of its own: the memory one size's job freed would
    // otherwise be reused by the next and hide what its executors cost.
    let exe = std::env::current_exe().context("locating the flint binary")?;
    let mut rates = Vec::new();
    for &executors in &args.simulated_executors {
        let output = tokio::process::Command::new(&exe)
            .args(argv_for(std::env::args().skip(1), executors))
            .stderr(Stdio::inherit())
            .output()
            .await
            .context("running one size of the bench")?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        // The figures, not the driver's own lines (its addresses).
        for line in stdout.lines().filter(|l| l.starts_with("  ")) {
            println!("{line}");
        }
        if !output.status.success() {
            bail!(
                "{executors} simulated executors: the bench exited {}",
                output.status
            );
        }
        let rate = stdout
            .split_once(" executors: ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|rate| rate.parse::<f64>().ok())
            .context("no tasks/s in the size's output")?;
        rates.push((executors, rate));
    }
    if let (Some(first), Some(last)) = (rates.first(), rates.last())
        && rates.len() > 1
    {
        println!(
            "  {} executors run at {:.0} % of the rate at {}",
            last.0,
            100.0 * last.1 / first.1,
            first.0
        );
    }
    Ok(())
}

/// This bench's own arguments with one size instead of the list.
fn argv_for(args: impl Iterator<Item = String>, executors: u32) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip_value = false;
    for arg in args {
        if skip_value {
            skip_value = false;
        } else if arg == "--simulated-executors" {
            skip_value = true;
        } else if !arg.starts_with("--simulated-executors=") {
            out.push(arg);
        }
    }
    out.push(format!("--simulated-executors={executors}"));
    out
}

async fn one_size(args: &BenchArgs, executors: u32) -> anyhow::Result<Row> {
    let data_dir = tempfile::tempdir()?;
    let cluster = Cluster::start(&args.dev_args(data_dir.path())?).await?;
    let result = measure(args, &cluster, executors).await;
    cluster.stop().await?;
    let (row, mut simulators) = result?;
    for child in &mut simulators {
        // The driver's shutdown ends every simulated executor; a straggler is killed.
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
    Ok(row)
}

async fn measure(
    args: &BenchArgs,
    cluster: &Cluster,
    executors: u32,
) -> anyhow::Result<(Row, Vec<tokio::process::Child>)> {
    let client = Client::new(&cluster.http_url);
    // The driver's memory before any executor: what they add is divided among them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_before = resident_bytes()?;
    let started = Instant::now();
    let simulators = simulate::spawn(args, cluster, executors, None)?;
    wait_for_alive(cluster, executors as usize, Duration::from_secs(60)).await?;
    let registered_in = started.elapsed();
    let pids: Vec<u32> = simulators.iter().filter_map(|c| c.id()).collect();

    let module = client.upload_module(NOOP_WASM.to_vec()).await?;
    let job = |n: usize| JobSpec {
        name: Some("bench-scale".into()),
        module: module.id.to_string(),
        inputs: Some(vec![InputSpec::Text(String::new()); n]),
        ..JobSpec::default()
    };
    let wait = Some(Duration::from_secs(600));
    // Warm-up: every executor gets the job's template and a few launches, the driver's
    // maps and buffers grow to their working size.
    let warm = (executors * args.cores * 4) as usize;
    ensure_succeeded(client.submit(&job(warm), wait).await?.state, "warm-up")?;
    let rss_after = resident_bytes()?;

    let histogram = cluster.driver.read(|s| s.launch_to_status.clone());
    let me = [std::process::id()];
    let (driver_cpu, simulators_cpu) = (process_cpu(&me), process_cpu(&pids));
    // Timed to the job's end in the driver: answering `?wait=` would also read the
    // finished job's million task records back from the store, which is not driving.
    let mut endings = cluster.driver.job_endings();
    endings.borrow_and_update();
    let t0 = Instant::now();
    let tasks = args.simulated_tasks as usize;
    let submitted = client.submit(&job(tasks), None).await?;
    tokio::time::timeout(Duration::from_secs(600), endings.changed())
        .await
        .context("the job did not end within 600 s")??;
    let elapsed = t0.elapsed();
    let driver_cpu = process_cpu(&me) - driver_cpu;
    let simulators_cpu = process_cpu(&pids) - simulators_cpu;
    let id = submitted.id.to_string();
    ensure_succeeded(client.job(&id, wait).await?.state, "the job")?;
    let quantiles = |since: &LatencyHistogram| {
        cluster.driver.read(|s| {
            let h = &s.launch_to_status;
            (
                h.quantile_since(since, 0.50).unwrap_or_default(),
                h.quantile_since(since, 0.99).unwrap_or_default(),
            )
        })
    };
    let (p50, p99) = quantiles(&histogram);

    // The driver's own delay with this many executors connected and heartbeating: one
    // task at a time, so that no queue is in the figure.
    let histogram = cluster.driver.read(|s| s.launch_to_status.clone());
    let mut round_trips = Vec::with_capacity(args.latency_jobs);
    for _ in 0..args.latency_jobs {
        let t = Instant::now();
        ensure_succeeded(
            client.submit(&job(1), wait).await?.state,
            "a single-task job",
        )?;
        round_trips.push(t.elapsed());
    }
    round_trips.sort();
    let pct = |p: f64| {
        let i = ((round_trips.len() as f64 - 1.0) * p).round() as usize;
        round_trips.get(i).copied().unwrap_or_default()
    };
    let (idle_p50, idle_p99) = quantiles(&histogram);
    let row = Row {
        executors,
        tasks_per_s: tasks as f64 / elapsed.as_secs_f64(),
        driver_cpu_us: driver_cpu * 1e6 / tasks as f64,
        simulators_cpu_us: simulators_cpu * 1e6 / tasks as f64,
        p50,
        p99,
        idle_p50,
        idle_p99,
        round_trip_p50: pct(0.50),
        round_trip_p99: pct(0.99),
        bytes_per_executor: rss_after.saturating_sub(rss_before) as f64 / f64::from(executors),
        registered_in,
    };
    Ok((row, simulators))
}

#[cfg(test)]
mod tests {
    use super::argv_for;

    #[test]
    fn each_size_runs_with_the_same_flags_and_one_size() {
        let args = [
            "bench",
            "--cores",
            "8",
            "--simulated-executors",
            "2,20",
            "--simulated-tasks=9",
        ];
        assert_eq!(
            argv_for(args.iter().map(|a| a.to_string()), 20),
            [
                "bench",
                "--cores",
                "8",
                "--simulated-tasks=9",
                "--simulated-executors=20"
            ]
        );
        let args = ["bench", "--simulated-executors=2,20"];
        assert_eq!(
            argv_for(args.iter().map(|a| a.to_string()), 2),
            ["bench", "--simulated-executors=2"]
        );
    }
}
