//! `flint worker`: Spark's standalone Worker. It registers its cores and memory with the
//! driver (over the executor port, with the cluster secret), launches `flint executor`
//! processes when the driver asks, each in `WORK/<app-id>/<executor-id>/` with its
//! `stdout` and `stderr`, reports each one running, exited (code or signal) or failed to
//! launch, kills them when asked, and removes app dirs older than `--cleanup-ttl` that
//! nothing runs in. When it loses the driver it keeps its executors (they reconnect on
//! their own, and keep their tasks) and registers again, saying which still run: a
//! restarted driver adopts them. The driver's Shutdown, sent by one stopped with
//! `--stop-executors-on-exit`, stops them. Its executors die with it
//! (PR_SET_PDEATHSIG): a lost worker's executors are lost.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use flint_driver::cluster_manager::runner::{ExecutorCommand, spawn_executor};
use flint_protocol::codec::FrameCodec;
use flint_protocol::exit::ProcessExit;
use flint_protocol::handshake::{HelloError, greet};
use flint_protocol::messages::{
    DriverToWorker, WorkerExecutorState, WorkerMessage, WorkerRegistration,
};
use flint_protocol::{ExecutorId, ExecutorMessage};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::Framed;

#[derive(clap::Args, Clone, Debug)]
pub struct WorkerArgs {
    /// The driver's executor address: `flint://HOST:PORT` or `HOST:PORT`.
    #[arg(long, env = "FLINT_DRIVER_URL")]
    pub driver_url: String,
    /// Cores this worker offers: the executors placed on it hold at most this many.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub cores: u32,
    /// Memory this worker offers, in MiB (each executor sets aside its
    /// --executor-memory-mb of it).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub memory_mb: u64,
    /// Where executors' work dirs go: `DIR/<app-id>/<executor-id>/`.
    #[arg(long)]
    pub work_dir: PathBuf,
    /// The host name its executors report (default: this machine's host name).
    #[arg(long)]
    pub host: Option<String>,
    /// This worker's id (default: `worker-<start time>-<host>-<pid>`, unique per process,
    /// as Spark's; a fixed id is for a worker that should be known by name).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// Secret the driver requires (passed on to the executors).
    #[arg(long, env = "FLINT_CLUSTER_SECRET", hide_env_values = true)]
    pub cluster_secret: Option<String>,
    /// App dirs under --work-dir that nothing runs in and that have not changed for this
    /// long are removed (Spark's spark.worker.cleanup.appDataTtl).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub cleanup_ttl: Duration,
    /// An extra argument for every executor, e.g. `--executor-arg=--max-memory-mb=512`.
    #[arg(long = "executor-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub executor_args: Vec<String>,
}

/// `worker-<UTC start time>-<host>-<pid>`: two workers on one host (Spark runs several)
/// never share it, and a restarted worker registers as a new one rather than as the
/// one it replaces (the driver refuses an id that a live worker holds).
fn default_id(host: &str) -> String {
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let started: String = started.chars().filter(char::is_ascii_digit).collect();
    // A long --host still leaves an id the driver accepts (MAX_WORKER_NAME_BYTES, 253).
    let mut end = host.len().min(200);
    while !host.is_char_boundary(end) {
        end -= 1;
    }
    format!("worker-{started}-{}-{}", &host[..end], std::process::id())
}

/// A refused registration: the same code an executor exits with.
const EXIT_REFUSED: i32 = flint_protocol::exit::REGISTRATION_REFUSED;

type Connection = Framed<TcpStream, FrameCodec<DriverToWorker, WorkerMessage>>;

struct Running {
    app_id: String,
    signals: mpsc::UnboundedSender<i32>,
}

struct Worker {
    args: WorkerArgs,
    exe: PathBuf,
    driver_addr: String,
    driver_url: String,
    host: String,
    id: String,
    running: HashMap<ExecutorId, Running>,
    exits: mpsc::UnboundedSender<(ExecutorId, ProcessExit)>,
}

pub async fn run(args: WorkerArgs) -> anyhow::Result<i32> {
    let host = match &args.host {
        Some(h) => h.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".into()),
    };
    let driver_addr = args
        .driver_url
        .strip_prefix("flint://")
        .unwrap_or(&args.driver_url)
        .trim_end_matches('/')
        .to_owned();
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("creating {}", args.work_dir.display()))?;
    let (exits, mut exited) = mpsc::unbounded_channel();
    let mut worker = Worker {
        id: args.worker_id.clone().unwrap_or_else(|| default_id(&host)),
        exe: std::env::current_exe().context("locating the flint binary")?,
        driver_url: format!("flint://{driver_addr}"),
        driver_addr,
        host,
        args,
        running: HashMap::new(),
        exits,
    };
    let mut shutdown = std::pin::pin!(crate::shutdown::shutdown_signal());
    let mut backoff = Duration::from_millis(100);
    let mut cleanup = tokio::time::interval(
        (worker.args.cleanup_ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(1800)),
    );
    loop {
        let connected = tokio::select! {
            connected = worker.connect() => connected,
            () = &mut shutdown => break,
        };
        let (mut conn, every) = match connected {
            Ok(connected) => connected,
            Err(Failure::Refused(reason)) => {
                eprintln!("flint worker: the driver refused this worker: {reason}");
                worker.stop_all().await;
                return Ok(EXIT_REFUSED);
            }
            Err(Failure::Unreachable(reason)) => {
                tracing::warn!(reason, ?backoff, "cannot reach the driver; retrying");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = &mut shutdown => break,
                }
                // Its executors are waited for by a restarted driver: it is back soon.
                let cap = match worker.running.is_empty() {
                    true => Duration::from_secs(5),
                    false => Duration::from_secs(1),
                };
                backoff = (backoff * 2).min(cap);
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        tracing::info!(
            worker = worker.id,
            driver = worker.driver_url,
            "registered with driver"
        );
        let ended = match worker
            .serve(&mut conn, every, &mut exited, &mut cleanup, &mut shutdown)
            .await
        {
            Session::Lost(reason) => reason,
            Session::Shutdown => {
                worker.stop_all().await;
                return Ok(0);
            }
        };
        tracing::warn!(
            reason = ended,
            "lost the driver; registering again when it is back"
        );
        // Exits while away are not reported: the next registration lists what runs.
        while let Ok((id, _)) = exited.try_recv() {
            worker.running.remove(&id);
        }
    }
    worker.stop_all().await;
    Ok(0)
}

enum Failure {
    Refused(String),
    Unreachable(String),
}

/// How a registered session with the driver ended.
enum Session {
    Lost(String),
    Shutdown,
}

impl Worker {
    /// Obeys the driver's orders and reports executor exits and heartbeats until the
    /// connection is lost or the worker is asked to shut down.
    async fn serve(
        &mut self,
        conn: &mut Connection,
        every: Duration,
        exited: &mut mpsc::UnboundedReceiver<(ExecutorId, ProcessExit)>,
        cleanup: &mut tokio::time::Interval,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Session {
        let mut heartbeat = tokio::time::interval(every);
        let failed = || Session::Lost("writing to the driver failed".to_owned());
        loop {
            tokio::select! {
                frame = conn.next() => match frame {
                    Some(Ok(order)) => {
                        if let Some(update) = self.obey(order)
                            && conn.send(update).await.is_err()
                        {
                            return failed();
                        }
                    }
                    Some(Err(e)) => return Session::Lost(format!("reading from the driver: {e}")),
                    None => return Session::Lost("the driver closed the connection".to_owned()),
                },
                Some((id, exit)) = exited.recv() => {
                    self.running.remove(&id);
                    tracing::info!(executor = %id, exit = exit.describe(), "executor exited");
                    let update = WorkerMessage::ExecutorStateChanged {
                        executor_id: id,
                        state: WorkerExecutorState::Exited(exit),
                    };
                    if conn.send(update).await.is_err() {
                        return failed();
                    }
                }
                _ = heartbeat.tick() => {
                    if conn.send(WorkerMessage::Heartbeat).await.is_err() {
                        return failed();
                    }
                }
                _ = cleanup.tick() => self.clean_old_apps(),
                () = &mut *shutdown => return Session::Shutdown,
            }
        }
    }
}

impl Worker {
    /// Connects, says hello and registers: the connection and the heartbeat interval
    /// the driver wants.
    async fn connect(&self) -> Result<(Connection, Duration), Failure> {
        let unreachable = |e: String| Failure::Unreachable(e);
        let stream = TcpStream::connect(&self.driver_addr)
            .await
            .map_err(|e| unreachable(format!("connecting to {}: {e}", self.driver_addr)))?;
        let _ = stream.set_nodelay(true);
        let mut conn: Framed<TcpStream, FrameCodec<DriverToWorker, ExecutorMessage>> =
            greet(stream, self.args.cluster_secret.clone())
                .await
                .map_err(|e| match e {
                    HelloError::Refused(reason) => Failure::Refused(reason),
                    broken @ HelloError::Broken(_) => unreachable(broken.to_string()),
                })?;
        let registration = WorkerRegistration {
            worker_id: self.id.clone(),
            host: self.host.clone(),
            cores: self.args.cores,
            memory_mb: self.args.memory_mb,
            pid: std::process::id(),
            executors: self.running.keys().cloned().collect(),
        };
        conn.send(ExecutorMessage::RegisterWorker(Box::new(registration)))
            .await
            .map_err(|e| unreachable(format!("registering: {e}")))?;
        let mut conn: Connection = conn.map_codec(|c| c.retype());
        match conn.next().await {
            Some(Ok(DriverToWorker::RegisteredWorker {
                heartbeat_interval_ms,
                ..
            })) => Ok((conn, Duration::from_millis(heartbeat_interval_ms.max(10)))),
            Some(Ok(DriverToWorker::RegisterWorkerFailed { reason })) => {
                Err(Failure::Refused(reason))
            }
            Some(Ok(other)) => Err(unreachable(format!(
                "unexpected at registration: {other:?}"
            ))),
            Some(Err(e)) => Err(unreachable(format!("registering: {e}"))),
            None => Err(unreachable("closed during registration".into())),
        }
    }

    /// Carries out one order of the driver's; what to tell it back.
    fn obey(&mut self, order: DriverToWorker) -> Option<WorkerMessage> {
        match order {
            DriverToWorker::LaunchExecutor {
                executor_id,
                app_id,
                cores,
                memory_mb,
            } => {
                let state = match self.launch(&executor_id, &app_id, cores) {
                    Ok(pid) => {
                        tracing::info!(executor = %executor_id, app = app_id, pid, memory_mb,
                            "launched executor");
                        WorkerExecutorState::Running { pid }
                    }
                    Err(e) => {
                        tracing::warn!(executor = %executor_id, error = %format!("{e:#}"),
                            "could not launch executor");
                        WorkerExecutorState::FailedToLaunch(format!("{e:#}"))
                    }
                };
                Some(WorkerMessage::ExecutorStateChanged { executor_id, state })
            }
            DriverToWorker::KillExecutor { executor_id } => {
                if let Some(running) = self.running.get(&executor_id) {
                    tracing::info!(executor = %executor_id, "killing executor");
                    let _ = running.signals.send(libc::SIGKILL);
                }
                None
            }
            DriverToWorker::Shutdown => {
                tracing::info!("the driver is stopping; stopping its executors");
                for running in self.running.values() {
                    let _ = running.signals.send(libc::SIGTERM);
                }
                None
            }
            DriverToWorker::RegisteredWorker { .. }
            | DriverToWorker::RegisterWorkerFailed { .. } => None,
        }
    }

    fn launch(&mut self, id: &ExecutorId, app_id: &str, cores: u32) -> anyhow::Result<u32> {
        if self.running.contains_key(id) {
            anyhow::bail!("executor {id} already runs here");
        }
        let exits = self.exits.clone();
        let monitored = id.clone();
        let started = spawn_executor(
            ExecutorCommand {
                exe: &self.exe,
                driver_url: &self.driver_url,
                id,
                cores,
                app_id,
                hostname: &self.host,
                work_root: &self.args.work_dir,
                extra_args: &self.args.executor_args,
                cluster_secret: self.args.cluster_secret.as_deref(),
            },
            move |exit| {
                let _ = exits.send((monitored, exit));
            },
        )?;
        self.running.insert(
            id.clone(),
            Running {
                app_id: app_id.to_owned(),
                signals: started.signals,
            },
        );
        Ok(started.pid)
    }

    /// SIGTERM to every executor, SIGKILL to those still there 5 s later.
    async fn stop_all(&mut self) {
        for running in self.running.values() {
            let _ = running.signals.send(libc::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !self.running.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.running.retain(|_, r| !r.signals.is_closed());
        }
        for running in self.running.values() {
            let _ = running.signals.send(libc::SIGKILL);
        }
    }

    /// Removes app dirs older than the TTL that no running executor uses.
    fn clean_old_apps(&self) {
        let Ok(entries) = std::fs::read_dir(&self.args.work_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if self.running.values().any(|r| r.app_id == name) || !path.is_dir() {
                continue;
            }
            if older_than(&path, self.args.cleanup_ttl) {
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => tracing::info!(dir = %path.display(), "removed an old app dir"),
                    Err(e) => {
                        tracing::warn!(dir = %path.display(), error = %e, "removing an old app dir")
                    }
                }
            }
        }
    }
}

/// Whether nothing under `dir` (itself, its executor dirs and their logs) changed
/// within `ttl`.
fn older_than(dir: &Path, ttl: Duration) -> bool {
    let Some(cutoff) = SystemTime::now().checked_sub(ttl) else {
        return false;
    };
    let newest = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut paths = vec![dir.to_path_buf()];
    for executor in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        paths.push(executor.path());
        for file in std::fs::read_dir(executor.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            paths.push(file.path());
        }
    }
    paths
        .iter()
        .all(|p| newest(p).is_none_or(|modified| modified < cutoff))
}
