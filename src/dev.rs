//! `flint dev`: a local cluster in one command. The driver runs in this process with the
//! `local` cluster manager, which starts each executor as a child process (its work dir
//! `DATA/work/<app-id>/<executor-id>/` holding its stdout and stderr, its exit shown by
//! `/v1/executors`) and replaces one that exits unasked. Nothing outlives the cluster:
//! children get SIGKILL from the kernel if this process dies (PR_SET_PDEATHSIG), and are
//! stopped on Ctrl-C/SIGTERM.

use std::sync::Arc;

use anyhow::Context;
use flint_driver::config::ClusterManagerKind;
use flint_driver::{Driver, Listeners};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::flags::{DriverArgs, SupervisionArgs};

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
    #[command(flatten)]
    pub supervision: SupervisionArgs,
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
    /// The driver's executor listener.
    pub executors_addr: std::net::SocketAddr,
    pub driver: Arc<Driver>,
    stop: oneshot::Sender<()>,
    driver_task: JoinHandle<anyhow::Result<()>>,
}

impl Cluster {
    /// A driver whose `local` cluster manager keeps `--executors` executor processes.
    pub async fn start(args: &DevArgs) -> anyhow::Result<Cluster> {
        let mut config = args.driver.config()?;
        let allocation = &mut config.allocation;
        allocation.cluster_manager = Some(ClusterManagerKind::Local);
        allocation.initial_executors = args.executors;
        allocation.executor_cores = args.cores;
        allocation.executor_args = args.executor_args.clone();
        allocation.executor_binary =
            Some(std::env::current_exe().context("locating the flint binary")?);
        args.supervision.apply(allocation);
        let listeners = bind(&args.driver).await?;
        let http_addr = listeners.http.local_addr()?;
        let executors_addr = listeners.executors.local_addr()?;
        let driver = Driver::new(config, http_addr)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let driver_task = tokio::spawn(flint_driver::run(driver.clone(), listeners, async {
            let _ = stopped.await;
        }));
        Ok(Cluster {
            http_url: format!("http://{http_addr}"),
            executors_addr,
            driver,
            stop,
            driver_task,
        })
    }

    /// Stops the driver, which tells executors to shut down and kills those that do
    /// not within its grace.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.driver_task.await.context("driver task panicked")?
    }
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let cluster = Cluster::start(&args).await?;
    println!(
        "flint dev: {} executor(s) x {} core(s); submit with `flint submit --driver {} MODULE.wasm`; web UI at {}/ui",
        args.executors, args.cores, cluster.http_url, cluster.http_url
    );
    crate::shutdown::shutdown_signal().await;
    cluster.stop().await
}
