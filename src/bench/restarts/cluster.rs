//! The cluster `--restarts` measures: a `flint driver` process, restarted on the same
//! ports and data dir, and `flint executor` processes that dialled in and outlive it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flint_protocol::api::ExecutorView;
use tokio::process::{Child, Command};

use super::{Mode, START_TIMEOUT, Shape};
use crate::bench::args::BenchArgs;
use crate::bench::soak::{healthz, serving_at};
use crate::client::Client;

/// The driver and the executors, processes of their own, each logging to a file in the
/// mode's directory; killed when dropped.
pub(super) struct Cluster {
    dir: PathBuf,
    exe: PathBuf,
    driver_args: Vec<String>,
    pub(super) url: String,
    listen: String,
    executor_listen: String,
    driver: Child,
    executors: Vec<(String, Child)>,
}

impl Cluster {
    pub(super) async fn start(
        args: &BenchArgs,
        shape: &Shape,
        mode: Mode,
        dir: &Path,
    ) -> anyhow::Result<Cluster> {
        let exe = std::env::current_exe().context("locating the flint binary")?;
        let started = Instant::now();
        let mut driver = spawn_driver(&exe, dir, &args.driver_args, "127.0.0.1:0", "127.0.0.1:0")?;
        let Some((url, executor_listen)) = serving_at(&mut driver).await else {
            bail!("the driver exited before serving");
        };
        let listen = url
            .strip_prefix("http://")
            .context("the driver's URL")?
            .to_owned();
        if healthz(&mut driver, &url, started).await?.is_none() {
            bail!("the driver exited before answering /healthz");
        }
        let mut executors = Vec::new();
        for k in 0..shape.executors {
            let id = format!("exec-{k}");
            let child = Command::new(&exe)
                .args(["executor", "--driver-url"])
                .arg(format!("flint://{executor_listen}"))
                .args(["--executor-id", &id])
                .arg(format!("--cores={}", shape.cores))
                .arg("--work-dir")
                .arg(dir.join(&id))
                .args(mode.executor_flags())
                .env("FLINT_LOG", "info")
                .env_remove("FLINT_CLUSTER_SECRET")
                .stdout(Stdio::null())
                .stderr(log_file(&dir.join(format!("{id}.log")))?)
                .kill_on_drop(true)
                .spawn()
                .context("starting flint executor")?;
            executors.push((id, child));
        }
        Ok(Cluster {
            dir: dir.to_owned(),
            exe,
            driver_args: args.driver_args.clone(),
            url,
            listen,
            executor_listen,
            driver,
            executors,
        })
    }

    /// SIGKILLs the driver, as a crash or the OOM killer ends one, and starts it again at
    /// once on the same ports and data dir: the time until it answers `/healthz`.
    pub(super) async fn restart(&mut self) -> anyhow::Result<Duration> {
        let killed = Instant::now();
        // Reaped too, so that its job store's lock and its ports are free.
        self.driver.kill().await.context("killing the driver")?;
        let (listen, executor_listen) = (&self.listen, &self.executor_listen);
        self.driver = spawn_driver(
            &self.exe,
            &self.dir,
            &self.driver_args,
            listen,
            executor_listen,
        )?;
        let Some((url, executors)) = serving_at(&mut self.driver).await else {
            bail!("the restarted driver exited before serving");
        };
        anyhow::ensure!(
            (&url, &executors) == (&self.url, &self.executor_listen),
            "the restarted driver serves at {url} and {executors}, not where it did"
        );
        match healthz(&mut self.driver, &self.url, killed).await? {
            Some(back) => Ok(back),
            None => bail!("the restarted driver exited before answering /healthz"),
        }
    }

    /// The executors' views once `ready` holds for every one of them (within
    /// [`START_TIMEOUT`]); `what` names the wait in the error.
    pub(super) async fn executors_when(
        &mut self,
        client: &Client,
        what: &str,
        ready: impl Fn(&ExecutorView) -> bool,
    ) -> anyhow::Result<Vec<ExecutorView>> {
        let started = Instant::now();
        loop {
            let ours: Vec<ExecutorView> = (client.executors().await?.items.into_iter())
                .filter(|e| self.executors.iter().any(|(id, _)| *id == e.id.0))
                .collect();
            if ours.len() == self.executors.len() && ours.iter().all(&ready) {
                return Ok(ours);
            }
            for (id, child) in &mut self.executors {
                if let Some(status) = child.try_wait()? {
                    bail!("executor {id} exited ({status})");
                }
            }
            anyhow::ensure!(
                started.elapsed() < START_TIMEOUT,
                "the executors did not {what} within {START_TIMEOUT:?}: {ours:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `flint driver` on these addresses with its state in `dir/driver`, its stdout piped
/// for [`serving_at`] and its log appended to `dir/driver.log`, killed on drop.
fn spawn_driver(
    exe: &Path,
    dir: &Path,
    driver_args: &[String],
    listen: &str,
    executor_listen: &str,
) -> anyhow::Result<Child> {
    Command::new(exe)
        .args([
            "driver",
            "--listen",
            listen,
            "--executor-listen",
            executor_listen,
        ])
        .args(driver_args)
        .arg("--data-dir")
        .arg(dir.join("driver"))
        .env("FLINT_LOG", "info")
        .env_remove("FLINT_TOKEN")
        .env_remove("FLINT_CLUSTER_SECRET")
        .stdout(Stdio::piped())
        .stderr(log_file(&dir.join("driver.log"))?)
        .kill_on_drop(true)
        .spawn()
        .context("starting flint driver")
}

/// A log file, appended to: a restarted driver's log follows the one before.
fn log_file(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}
