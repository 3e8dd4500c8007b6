//! `flint dev`: a local cluster in one command. The driver runs in this process; each
//! executor is a child process started the way Spark's Worker starts executors through
//! ExecutorRunner: its own work dir holding its stdout and stderr, its exit code logged
//! and shown by `/v1/executors`. Nothing outlives the cluster: children get SIGKILL from
//! the kernel if this process dies (PR_SET_PDEATHSIG), and are stopped on Ctrl-C/SIGTERM.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flint_driver::{Driver, Listeners};
use flint_protocol::ExecutorId;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::flags::DriverArgs;

#[derive(clap::Args, Clone, Debug)]
pub struct DevArgs {
    #[command(flatten)]
    pub driver: DriverArgs,
    /// Executor processes to start.
    #[arg(long, env = "FLINT_EXECUTORS", default_value_t = 2)]
    pub executors: u32,
    /// Cores (task threads) per executor.
    #[arg(long, env = "FLINT_CORES", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub cores: u32,
    /// An extra argument for every executor, e.g. `--executor-arg=--compile-timeout-ms=500`.
    #[arg(long = "executor-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub executor_args: Vec<String>,
}

pub async fn bind(args: &DriverArgs) -> anyhow::Result<Listeners> {
    let http = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding the HTTP API to {}", args.listen))?;
    let executors = TcpListener::bind(args.executor_listen)
        .await
        .with_context(|| format!("binding the executor port to {}", args.executor_listen))?;
    println!("http: http://{}", http.local_addr()?);
    println!("executors: {}", executors.local_addr()?);
    Ok(Listeners { http, executors })
}

pub struct Cluster {
    pub http_url: String,
    pub driver: Arc<Driver>,
    stop: oneshot::Sender<()>,
    driver_task: JoinHandle<anyhow::Result<()>>,
    executors: Vec<ExecutorProcess>,
}

struct ExecutorProcess {
    id: ExecutorId,
    pid: Option<u32>,
    monitor: JoinHandle<()>,
}

impl Cluster {
    pub async fn start(args: &DevArgs) -> anyhow::Result<Cluster> {
        let config = args.driver.config()?;
        let listeners = bind(&args.driver).await?;
        let http_addr = listeners.http.local_addr()?;
        let executor_addr = listeners.executors.local_addr()?;
        let driver = Driver::new(config, http_addr)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let driver_task = tokio::spawn(flint_driver::run(driver.clone(), listeners, async {
            let _ = stopped.await;
        }));
        let exe = std::env::current_exe().context("locating the flint binary")?;
        let work_root = args.driver.data_dir.join("work");
        let mut executors = Vec::new();
        for n in 1..=args.executors {
            let id = ExecutorId(format!("exec-{n}"));
            let work_dir = work_root.join(&id.0);
            let process = spawn_executor(
                &exe,
                &id,
                &executor_addr.to_string(),
                &work_dir,
                args,
                driver.clone(),
            )
            .with_context(|| format!("starting executor {id}"))?;
            executors.push(process);
        }
        Ok(Cluster {
            http_url: format!("http://{http_addr}"),
            driver,
            stop,
            driver_task,
            executors,
        })
    }

    /// Stops the driver (which tells executors to shut down), then makes sure every
    /// child has exited.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        let driver_result = self.driver_task.await;
        for mut process in self.executors {
            let waited = tokio::time::timeout(Duration::from_secs(5), &mut process.monitor).await;
            if waited.is_err() {
                tracing::warn!(executor = %process.id, "executor did not stop; killing it");
                if let Some(pid) = process.pid {
                    // SAFETY: plain syscall on a pid we started and have not yet reaped
                    // (its monitor task is still waiting on it).
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                let _ = process.monitor.await;
            }
        }
        driver_result.context("driver task panicked")?
    }
}

fn spawn_executor(
    exe: &Path,
    id: &ExecutorId,
    driver_addr: &str,
    work_dir: &Path,
    args: &DevArgs,
    driver: Arc<Driver>,
) -> anyhow::Result<ExecutorProcess> {
    std::fs::create_dir_all(work_dir)
        .with_context(|| format!("creating {}", work_dir.display()))?;
    let stdout = std::fs::File::create(work_dir.join("stdout"))?;
    let stderr = std::fs::File::create(work_dir.join("stderr"))?;
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("executor")
        .args(["--driver-url", &format!("flint://{driver_addr}")])
        .args(["--executor-id", &id.0])
        .args(["--cores", &args.cores.to_string()])
        .args(["--hostname", "127.0.0.1"])
        .arg("--work-dir")
        .arg(work_dir)
        .args(&args.executor_args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .kill_on_drop(true);
    if let Some(secret) = &args.driver.cluster_secret {
        command.env("FLINT_CLUSTER_SECRET", secret);
    }
    // SAFETY: prctl is async-signal-safe, which is all that may run between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    let pid = child.id();
    tracing::info!(executor = %id, pid, work_dir = %work_dir.display(), "started executor");
    driver
        .executor_logs
        .set(id.clone(), work_dir.join("stderr"));
    let monitor_id = id.clone();
    let monitor = tokio::spawn(async move {
        let code = match child.wait().await {
            Ok(status) => {
                tracing::info!(executor = %monitor_id, %status, "executor exited");
                status.code()
            }
            Err(e) => {
                tracing::warn!(executor = %monitor_id, error = %e, "waiting for executor");
                None
            }
        };
        driver.executor_exited(&monitor_id, code);
    });
    Ok(ExecutorProcess {
        id: id.clone(),
        pid,
        monitor,
    })
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let cluster = Cluster::start(&args).await?;
    println!(
        "flint dev: {} executor(s) x {} core(s); submit with `flint submit --driver {} MODULE.wasm`; web UI at {}/ui",
        args.executors, args.cores, cluster.http_url, cluster.http_url
    );
    crate::shutdown_signal().await;
    cluster.stop().await
}
