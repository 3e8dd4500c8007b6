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
//!    HTTP from this process (upload the module, submit with `?wait`, list the tasks);
//! 3. one job of `--tasks` `noop` tasks, then the resident sets again
//!    `--at-rest-settle-ms` after it ended.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flint_protocol::api::{ExecutorState, InputSpec, JobSpec, JobState};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::args::BenchArgs;
use super::procfs::{cpu_model, num_cpus};
use crate::client::Client;

/// One process's resident set, in KiB, as `/proc/PID/status` gives it.
#[derive(Clone, Copy, Default)]
struct Resident {
    total: u64,
    anon: u64,
    file: u64,
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
        Ok(Resident {
            total: field("VmRSS:")?,
            anon: field("RssAnon:")?,
            file: field("RssFile:")? + field("RssShmem:")?,
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
    let mut together = driver.total;
    for (i, pid) in executors.iter().enumerate() {
        let executor = Resident::of(*pid)?;
        together += executor.total;
        line.push_str(&format!(", executor {} {}", i + 1, executor.show()));
    }
    Ok(format!("{:.1} MiB together: {line}", mib(together)))
}

pub async fn run(args: &BenchArgs, wasm: Vec<u8>, module: &Path) -> anyhow::Result<()> {
    let binaries = match args.at_rest_binary.is_empty() {
        true => vec![std::env::current_exe().context("finding this binary")?],
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
    let runs = args.at_rest_runs;
    let module = module.to_str().context("the module's path is not UTF-8")?;
    let submit = [
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
    ];
    // One submission first: the executors compile the module once, outside the figures.
    let job = run_cli(flint, &["submit", "--driver", url, module, "--arg", "noop"]).await?;
    let job = job.trim().to_owned();
    run_cli(flint, &submit).await?;

    let mut version = Vec::new();
    let mut status = Vec::new();
    let mut cli_submit = Vec::new();
    let mut http = Vec::new();
    let client = Client::new(url);
    for _ in 0..runs {
        version.push(timed(run_cli(flint, &["--version"])).await?);
        status.push(timed(run_cli(flint, &["status", "--driver", url, &job])).await?);
        cli_submit.push(timed(run_cli(flint, &submit)).await?);
        http.push(timed(http_submit(&client, wasm)).await?);
    }
    let (version, status, cli_submit, http) = (
        median(version),
        median(status),
        median(cli_submit),
        median(http),
    );
    Ok(format!(
        "CLI p50: --version {:.2} ms, status {:.2} ms, submit --wait {:.2} ms against {:.2} ms over HTTP ({:+.2} ms)",
        ms(version),
        ms(status),
        ms(cli_submit),
        ms(http),
        ms(cli_submit) - ms(http)
    ))
}

/// What `flint submit --wait` does, from this process over one kept connection.
async fn http_submit(client: &Client, wasm: &[u8]) -> anyhow::Result<String> {
    let module = client.upload_module(wasm.to_vec()).await?;
    let spec = JobSpec {
        name: Some("testkit.wasm".into()),
        module: module.id.to_string(),
        args: vec!["noop".into()],
        inputs: Some(vec![InputSpec::Text(String::new())]),
        ..JobSpec::default()
    };
    let view = client.submit(&spec, Some(Duration::from_secs(60))).await?;
    if view.state != JobState::Succeeded {
        bail!("a one-task job over HTTP ended {}", view.state.as_str());
    }
    client.tasks(&view.id.0).await?;
    Ok(String::new())
}

async fn run_cli(flint: &Path, argv: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(flint)
        .args(argv)
        .env_remove("FLINT_LOG")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .with_context(|| format!("running flint {}", argv.join(" ")))?;
    if !out.status.success() {
        bail!(
            "flint {} exited {}: {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
