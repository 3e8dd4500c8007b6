//! `flint bench --at-rest`: what a cluster holds when it does nothing, and what the CLI
//! costs a script, for one or more flint binaries, round by round in turn so that they
//! share the machine's noise (issue 44). Each binary's `flint dev --executors 2 --cores 1`
//! (real processes, as a user starts them):
//!
//! 1. the resident sets of the driver and both executors `--at-rest-settle-ms` after both
//!    registered (VmRSS, and its anonymous and file-backed parts);
//! 2. against that warm cluster, the median of `--at-rest-runs` runs each of `flint
//!    --version`, `flint status JOB` and `flint submit --wait` of one testkit `noop` task
//!    (each a process started and waited for), and of the same submission made over
//!    HTTP from this process (submit with `?wait`, list the tasks, read each result):
//!    with the module named by its id, and with the module's file uploaded first;
//! 3. one job of `--tasks` `noop` tasks, then the resident sets again
//!    `--at-rest-settle-ms` after it ended.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flint_protocol::api::{ExecutorState, InputSpec, JobSpec, JobState};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::args::BenchArgs;
use super::procfs::{cpu_model, num_cpus};
use crate::client::Client;

/// One process's resident set, in KiB, as `/proc/PID/status` gives it, and its
/// proportional set size (`smaps_rollup`): each page shared with other processes (the
/// binary's, the libraries') counted as its share. RSS is the measure; PSS is
/// what the processes cost together.
#[derive(Clone, Copy, Default)]
struct Resident {
    total: u64,
    anon: u64,
    file: u64,
    pss: u64,
}

impl Resident {
    fn of(pid: u32) -> anyhow::Result<Resident> {
        let path = format!("/proc/{pid}/status");
        let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse().ok())
                .with_context(|| format!("no {name} in {path}"))
        };
        let rollup = format!("/proc/{pid}/smaps_rollup");
        let rollup =
            std::fs::read_to_string(&rollup).with_context(|| format!("reading {rollup}"))?;
        let pss = rollup
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no Pss in /proc/{pid}/smaps_rollup"))?;
        Ok(Resident {
            total: field("VmRSS:")?,
            anon: field("RssAnon:")?,
            file: field("RssFile:")? + field("RssShmem:")?,
            pss,
        })
    }

    fn show(self) -> String {
        format!(
            "{:.1} MiB (anon {:.1}, file {:.1})",
            mib(self.total),
            mib(self.anon),
            mib(self.file)
        )
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The driver's and each executor's resident set, and their sum.
fn cluster_line(driver: u32, executors: &[u32]) -> anyhow::Result<String> {
    let driver = Resident::of(driver)?;
    let mut line = format!("driver {}", driver.show());
    let (mut together, mut pss) = (driver.total, driver.pss);
    for (i, pid) in executors.iter().enumerate() {
        let executor = Resident::of(*pid)?;
        (together, pss) = (together + executor.total, pss + executor.pss);
        line.push_str(&format!(", executor {} {}", i + 1, executor.show()));
    }
    Ok(format!(
        "{:.1} MiB together (PSS {:.1}): {line}",
        mib(together),
        mib(pss)
    ))
}

pub async fn run(args: &BenchArgs, wasm: Vec<u8>, module: &Path) -> anyhow::Result<()> {
    let binaries = match args.at_rest_binary.is_empty() {
        // The CLI users run: `flint` beside this engine (it starts the services
        // through the engine, and runs the client commands itself).
        true => vec![
            std::env::current_exe()
                .context("finding this binary")?
                .with_file_name("flint"),
        ],
        false => args.at_rest_binary.clone(),
    };
    println!(
        "flint bench --at-rest: {} cpus, {}; a driver and 2 executors x 1 core, {} no-op tasks, {} ms settled, median of {} CLI runs",
        num_cpus(),
        cpu_model(),
        args.tasks,
        args.at_rest_settle_ms,
        args.at_rest_runs
    );
    for round in 1..=args.at_rest_rounds {
        println!("round {round}");
        for binary in &binaries {
            println!("  {}", binary.display());
            measure(args, binary, &wasm, module)
                .await
                .with_context(|| format!("measuring {}", binary.display()))?;
        }
    }
    Ok(())
}

async fn measure(args: &BenchArgs, flint: &Path, wasm: &[u8], module: &Path) -> anyhow::Result<()> {
    let settle = Duration::from_millis(args.at_rest_settle_ms);
    let data = tempfile::tempdir()?;
    let mut dev = tokio::process::Command::new(flint)
        .args(["dev", "--executors", "2", "--cores", "1"])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--executor-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(data.path())
        .env_remove("FLINT_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting flint dev")?;
    let driver_pid = dev.id().context("flint dev has no pid")?;
    let url = http_url(dev.stdout.take().context("no stdout")?).await?;
    let client = Client::new(&url);
    let executors = alive_executors(&client).await?;

    tokio::time::sleep(settle).await;
    println!(
        "    at rest after start:  {}",
        cluster_line(driver_pid, &executors)?
    );
    println!("    {}", after_rest(&client).await?);

    let cli = cli_figures(args, flint, &url, wasm, module).await?;
    println!("    {cli}");

    let spec = JobSpec {
        name: Some("at-rest".into()),
        module: client.upload_module(wasm.to_vec()).await?.id.to_string(),
        args: vec!["noop".into()],
        inputs: Some(vec![InputSpec::Text(String::new()); args.tasks]),
        ..JobSpec::default()
    };
    let t0 = Instant::now();
    let view = client
        .submit(&spec, Some(Duration::from_secs(3600)))
        .await?;
    if view.state != JobState::Succeeded {
        bail!("the {}-task job ended {}", args.tasks, view.state.as_str());
    }
    let elapsed = t0.elapsed();
    // The job's record stays (retention); what is measured is what its work left.
    tokio::time::sleep(settle).await;
    println!(
        "    at rest after {} tasks ({:.0} tasks/s): {}",
        args.tasks,
        args.tasks as f64 / elapsed.as_secs_f64(),
        cluster_line(driver_pid, &executors)?
    );
    // SAFETY: kill sends SIGTERM to the process we started and still hold.
    unsafe { libc::kill(driver_pid as i32, libc::SIGTERM) };
    let _ = tokio::time::timeout(Duration::from_secs(30), dev.wait()).await;
    Ok(())
}

/// The first request to a cluster at rest (its code mapped back as it runs) against
/// the next ones.
async fn after_rest(client: &Client) -> anyhow::Result<String> {
    let first = timed(client.executors()).await?;
    let mut next = Vec::new();
    for _ in 0..10 {
        next.push(timed(client.executors()).await?);
    }
    Ok(format!(
        "first request at rest (GET /v1/executors): {:.2} ms, the next ten p50 {:.2} ms",
        ms(first),
        ms(median(next))
    ))
}

async fn http_url(stdout: tokio::process::ChildStdout) -> anyhow::Result<String> {
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(url) = line.strip_prefix("http: ") {
                return Ok(url.to_owned());
            }
        }
        bail!("flint dev ended before it printed its address")
    })
    .await
    .context("flint dev printed no address in 30 s")??;
    // Keep reading (and dropping) what it prints, so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(found)
}

/// The pids of the two executors once both are registered.
async fn alive_executors(client: &Client) -> anyhow::Result<Vec<u32>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = client.executors().await?;
        let alive: Vec<u32> = list
            .items
            .iter()
            .filter(|e| e.state == ExecutorState::Alive)
            .filter_map(|e| e.pid)
            .collect();
        if alive.len() == 2 {
            return Ok(alive);
        }
        if Instant::now() > deadline {
            bail!("2 executors not alive after 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn cli_figures(
    args: &BenchArgs,
    flint: &Path,
    url: &str,
    wasm: &[u8],
    module: &Path,
) -> anyhow::Result<String> {
    let path = module.to_str().context("the module's path is not UTF-8")?;
    let client = Client::new(url);
    let id = client.upload_module(wasm.to_vec()).await?.id.to_string();
    let submit = |module: &str| -> Vec<String> {
        [
            "submit",
            "--driver",
            url,
            "--wait",
            "--progress",
            "off",
            module,
            "--arg",
            "noop",
            "--input-text",
            "",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let (by_id, by_path) = (submit(&id), submit(path));
    // One submission first: the executors compile the module once, outside the figures.
    let job = run_cli(flint, &["submit", "--driver", url, &id, "--arg", "noop"]).await?;
    let job = job.trim().to_owned();
    run_cli(flint, &by_id).await?;

    let mut figures = vec![Vec::new(); 6];
    for _ in 0..args.at_rest_runs {
        figures[0].push(timed(run_cli(flint, &["--version"])).await?);
        figures[1].push(timed(run_cli(flint, &["status", "--driver", url, &job])).await?);
        figures[2].push(timed(run_cli(flint, &by_id)).await?);
        figures[3].push(timed(http_submit(&client, Err(&id))).await?);
        figures[4].push(timed(run_cli(flint, &by_path)).await?);
        figures[5].push(timed(http_submit(&client, Ok(wasm))).await?);
    }
    let p50: Vec<f64> = figures.into_iter().map(|f| ms(median(f))).collect();
    Ok(format!(
        "CLI p50: --version {:.2} ms, status {:.2} ms; submit --wait by module id {:.2} ms against {:.2} ms over HTTP ({:+.2} ms), with the module's upload {:.2} against {:.2} ms ({:+.2} ms)",
        p50[0],
        p50[1],
        p50[2],
        p50[3],
        p50[2] - p50[3],
        p50[4],
        p50[5],
        p50[4] - p50[5]
    ))
}

/// What `flint submit --wait` does, from this process over one kept connection: the
/// module uploaded (`Ok`) or named by its id (`Err`), the job submitted with `?wait`,
/// its tasks listed and each result read.
async fn http_submit(client: &Client, module: Result<&[u8], &str>) -> anyhow::Result<()> {
    let module = match module {
        Ok(wasm) => client.upload_module(wasm.to_vec()).await?.id.to_string(),
        Err(id) => id.to_owned(),
    };
    let spec = JobSpec {
        name: Some("testkit".into()),
        module,
        args: vec!["noop".into()],
        inputs: Some(vec![InputSpec::Text(String::new())]),
        ..JobSpec::default()
    };
    let view = client.submit(&spec, Some(Duration::from_secs(30))).await?;
    if view.state != JobState::Succeeded {
        bail!("a one-task job over HTTP ended {}", view.state.as_str());
    }
    for task in client.tasks(&view.id.0).await? {
        if task.result.is_some() {
            client.result(&view.id.0, task.index).await?;
        }
    }
    Ok(())
}

async fn run_cli(flint: &Path, argv: &[impl AsRef<OsStr>]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(flint)
        .args(argv)
        .env_remove("FLINT_LOG")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .with_context(|| format!("running flint {}", shown(argv)))?;
    if !out.status.success() {
        bail!(
            "flint {} exited {}: {}",
            shown(argv),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn shown(argv: &[impl AsRef<OsStr>]) -> String {
    let words: Vec<_> = argv.iter().map(|a| a.as_ref().to_string_lossy()).collect();
    words.join(" ")
}

async fn timed<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    work.await?;
    Ok(t0.elapsed())
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `--at-rest-binary`'s paths, checked before a cluster starts.
pub fn check_binaries(binaries: &[PathBuf]) -> anyhow::Result<()> {
    for binary in binaries {
        if !binary.is_file() {
            bail!("--at-rest-binary {}: no such file", binary.display());
        }
    }
    Ok(())
}
