//! `flint bench --scale-up local,standalone`: how fast dynamic allocation brings
//! executors to a job. A `flint driver` process with `--min-executors 0`, executors
//! launched only for the work (under `standalone` by `flint worker` processes on this
//! host); one job of testkit `sleep` tasks. From the tasks' start times (the executors'
//! clocks, on this machine the bench's own): submission to the first task's start on a
//! freshly launched executor, and to the moment every executor has started one.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use flint_protocol::api::{InputSpec, JobSpec};
use tokio::process::{Child, Command};

use super::args::BenchArgs;
use super::measure::ensure_succeeded;
use super::procfs::{cpu_model, num_cpus};
use super::soak::{driver_command, healthz, serving_at};
use crate::client::Client;

pub async fn run(args: &BenchArgs, wasm: Vec<u8>) -> anyhow::Result<()> {
    println!(
        "flint bench: scale-up from 0 to {} executors of {} core(s), {} tasks of {} ms",
        args.executors, args.cores, args.scale_up_tasks, args.scale_up_task_ms
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    for manager in &args.scale_up {
        one_manager(args, manager, &wasm)
            .await
            .with_context(|| format!("scale-up under {manager}"))?;
    }
    Ok(())
}

async fn one_manager(args: &BenchArgs, manager: &str, wasm: &[u8]) -> anyhow::Result<()> {
    let data_dir = tempfile::tempdir()?;
    let exe = std::env::current_exe().context("locating the flint binary")?;
    let started = Instant::now();
    let mut driver = driver_command()?
        .arg(format!("--cluster-manager={manager}"))
        .args(["--min-executors=0", "--initial-executors=0"])
        .arg(format!("--max-executors={}", args.executors))
        .arg(format!("--executor-cores={}", args.cores))
        .args(&args.driver_args)
        .arg("--data-dir")
        .arg(data_dir.path().join("driver"))
        .env_remove("FLINT_TOKEN")
        .env_remove("FLINT_CLUSTER_SECRET")
        .spawn()
        .context("starting flint driver")?;
    let Some((url, executors_addr)) = serving_at(&mut driver).await else {
        bail!("the driver exited before serving");
    };
    if healthz(&mut driver, &url, started).await?.is_none() {
        bail!("the driver exited before answering /healthz");
    }
    let client = Client::new(&url);
    let mut workers = Vec::new();
    if manager == "standalone" {
        let cores = (args.executors * args.cores).div_ceil(args.workers);
        for w in 0..args.workers {
            let child = Command::new(&exe)
                .args(["worker", "--driver-url"])
                .arg(format!("flint://{executors_addr}"))
                .arg(format!("--cores={cores}"))
                .arg(format!("--memory-mb={}", u64::from(cores) * 1024))
                .arg(format!("--host=bench-worker-{w}"))
                .arg("--work-dir")
                .arg(data_dir.path().join(format!("worker-{w}")))
                .env("FLINT_LOG", "warn")
                .env_remove("FLINT_CLUSTER_SECRET")
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("starting flint worker")?;
            workers.push(child);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while client.workers().await?.len() < args.workers as usize {
            anyhow::ensure!(
                Instant::now() < deadline,
                "workers did not register in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let result = measure(args, manager, &client, wasm).await;
    for child in workers.iter_mut().chain([&mut driver]) {
        stop(child).await;
    }
    result
}

async fn measure(
    args: &BenchArgs,
    manager: &str,
    client: &Client,
    wasm: &[u8],
) -> anyhow::Result<()> {
    let module = client.upload_module(wasm.to_vec()).await?;
    let launched_before = client.executors().await?.items.len();
    anyhow::ensure!(
        launched_before == 0,
        "{launched_before} executors before the job"
    );
    let spec = JobSpec {
        name: Some("bench-scale-up".into()),
        module: module.id.to_string(),
        args: vec!["sleep".into(), args.scale_up_task_ms.to_string()],
        inputs: Some(vec![
            InputSpec::Text(String::new());
            args.scale_up_tasks as usize
        ]),
        ..JobSpec::default()
    };
    let submitted = SystemTime::now();
    let view = client.submit(&spec, None).await?;
    let view = client
        .job(&view.id.to_string(), Some(Duration::from_secs(600)))
        .await?;
    ensure_succeeded(view.state, "the job")?;
    let ended = SystemTime::now();
    // Each executor's first start, in order.
    let mut first_start: BTreeMap<String, SystemTime> = BTreeMap::new();
    for task in client.tasks(&view.id.to_string()).await? {
        let (Some(executor), Some(at)) = (task.executor, task.started_at) else {
            continue;
        };
        let at = humantime::parse_rfc3339(&at).with_context(|| format!("started_at {at:?}"))?;
        let first = first_start.entry(executor.0).or_insert(at);
        *first = (*first).min(at);
    }
    let mut starts: Vec<Duration> = first_start
        .values()
        .map(|at| at.duration_since(submitted).unwrap_or_default())
        .collect();
    starts.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let width = args.executors as usize;
    let full = match starts.get(width - 1) {
        Some(d) => format!("{:.0} ms", ms(*d)),
        None => format!("never ({} of {width} executors ran a task)", starts.len()),
    };
    println!(
        "  {manager:>10}: first task on a launched executor {:.0} ms after submission, all {width} executors running {full}; job {:.2} s",
        ms(starts.first().copied().unwrap_or_default()),
        ended
            .duration_since(submitted)
            .unwrap_or_default()
            .as_secs_f64()
    );
    Ok(())
}

/// SIGTERM, then SIGKILL if it has not exited within 10 s.
async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}
