//! The executor's connection to the driver (Spark's CoarseGrainedExecutorBackend).

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flint_fetch_cache::{FetchCache, FetchOptions};
use flint_protocol::codec::{FrameCodec, write_batched};
use flint_protocol::handshake::{HelloError, greet};
use flint_protocol::messages::ExecutorConfig;
use flint_protocol::{DriverMessage, ExecutorId, ExecutorMessage, JobTemplate, TaskDescription};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::Framed;

use crate::blocks::BlockClient;
use crate::compiler::{CompilerMode, ModuleCompiler};
use crate::runner::{RunnerSettings, TaskRunner};
use crate::sandbox::{Sandbox, SandboxConfig};

/// How an executor is started: Spark's CoarseGrainedExecutorBackend arguments.
#[derive(Clone, Debug)]
pub struct ExecutorOptions {
    /// `HOST:PORT` of the driver's executor listener.
    pub driver_addr: String,
    pub executor_id: ExecutorId,
    pub cores: u32,
    pub hostname: String,
    /// Spark's application id, sent with the registration; the driver ignores it until
    /// it has a cluster manager (issue 16).
    pub app_id: Option<String>,
    pub work_dir: PathBuf,
    pub cluster_secret: Option<String>,
    /// How long to keep trying to reach the driver at start.
    pub connect_timeout: Duration,
    /// How long to keep trying to get back to the driver after losing it.
    pub reconnect_timeout: Duration,
    /// Largest linear memory a task may have here, whatever its job asks for.
    pub max_memory_bytes: usize,
    /// Meter fuel, so that tasks with fuel budgets can run here.
    pub fuel: bool,
    /// The fetch cache's limits (its URL policy comes from the driver's config).
    pub fetch: FetchOptions,
    pub compiler: CompilerMode,
}

/// Why an executor stopped. Each has its own process exit code (see `exit_code`), which
/// `flint dev` reports and the README documents.
#[derive(Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// StopExecutor, Shutdown, or a signal: a clean stop.
    Stopped,
    /// The driver refused the registration (duplicate id, bad secret, version mismatch).
    RegistrationRefused(String),
    /// The driver could not be reached at start.
    DriverUnreachable(String),
    /// The connection to the driver broke and it could not be reached again within the
    /// reconnect timeout.
    DriverLost(String),
}

impl ExitReason {
    pub const CODE_REGISTRATION_REFUSED: i32 = flint_protocol::exit::REGISTRATION_REFUSED;
    pub const CODE_DRIVER_UNREACHABLE: i32 = flint_protocol::exit::DRIVER_UNREACHABLE;
    pub const CODE_DRIVER_LOST: i32 = flint_protocol::exit::DRIVER_LOST;

    pub fn exit_code(&self) -> i32 {
        match self {
            ExitReason::Stopped => flint_protocol::exit::STOPPED,
            ExitReason::RegistrationRefused(_) => Self::CODE_REGISTRATION_REFUSED,
            ExitReason::DriverUnreachable(_) => Self::CODE_DRIVER_UNREACHABLE,
            ExitReason::DriverLost(_) => Self::CODE_DRIVER_LOST,
        }
    }
}

type Connection = Framed<TcpStream, FrameCodec<DriverMessage, ExecutorMessage>>;

/// Runs an executor until the driver stops it, the connection breaks, or `shutdown`
/// resolves. Infrastructure failures (cannot build the engine, the work dir) are errors.
pub async fn run(
    options: ExecutorOptions,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<ExitReason> {
    let sandbox_config = SandboxConfig {
        slots: options.cores,
        max_memory_bytes: options.max_memory_bytes,
        fuel: options.fuel,
    };
    let sandbox = Arc::new(Sandbox::new(sandbox_config)?);
    let compiler = ModuleCompiler::new(
        sandbox.clone(),
        sandbox_config,
        options.work_dir.join("compiled"),
        options.compiler.clone(),
    )?;
    let fetcher = FetchCache::open(options.work_dir.join("cache"), options.fetch.clone())?;

    tokio::pin!(shutdown);
    let mut conn = match connect(&options, options.connect_timeout).await {
        Ok(conn) => conn,
        Err(reason) => return Ok(reason),
    };
    let config = match register(&mut conn, &options).await {
        Ok(config) => config,
        Err(reason) => return Ok(reason),
    };
    // The fetch policy refuses loopback and private addresses unless told otherwise: what
    // the operator allows is told here, for every fetch.
    for origin in &config.fetch_allow {
        if let Err(e) = fetcher.allow_origin(origin) {
            anyhow::bail!("the driver's fetch allow-list has a bad entry {origin:?}: {e}");
        }
    }
    // The driver (often on one of those addresses) is reachable only for what it handed
    // out itself: a job's URL pointing at it is judged like any other URL, so that the
    // executor's credentials never fetch what a job could not (a confused deputy).
    if let Err(e) = fetcher.trust_origin(&config.driver_http_url) {
        anyhow::bail!(
            "the driver's HTTP address {:?} is not an origin: {e}",
            config.driver_http_url
        );
    }
    // Modules and files come from the driver, which wants the cluster secret for them;
    // the fetch cache sends it only with the driver's own refs, to its origin.
    if let Some(secret) = &options.cluster_secret
        && let Err(e) = fetcher.set_bearer(&config.driver_http_url, secret)
    {
        anyhow::bail!(
            "the driver's HTTP address {:?} is not an origin: {e}",
            config.driver_http_url
        );
    }
    // Results kept in a bucket are other tasks' inputs: that bucket may be read too, but
    // only for the refs the driver made (a job naming another job's block by its bucket
    // URL is refused unless the operator allowed the bucket).
    if let Ok(url) = url::Url::parse(&config.block_store)
        && url.scheme() == "s3"
        && let Some(bucket) = url.host_str()
        && let Err(e) = fetcher.trust_origin(&format!("s3://{bucket}"))
    {
        anyhow::bail!("the driver's block store {:?}: {e}", config.block_store);
    }
    let blocks = BlockClient::new(
        &config.block_store,
        &config.driver_http_url,
        options.cluster_secret.clone(),
        tokio::runtime::Handle::current(),
    )
    .map_err(|e| anyhow::anyhow!("the driver's block store {:?}: {e}", config.block_store))?;

    // One channel for the executor's life: statuses of attempts that end while the
    // driver is away wait in it and go out on the next connection (the driver ignores
    // those of a lost generation).
    let (updates_tx, mut updates_rx) = mpsc::unbounded_channel();
    let runner = TaskRunner::start(
        sandbox,
        fetcher,
        compiler,
        RunnerSettings {
            files_root: options.work_dir.join("files"),
            threads: options.cores as usize,
            max_log_bytes: usize::try_from(config.max_log_bytes).unwrap_or(usize::MAX),
            blocks: Some(Arc::new(blocks)),
            inline_result_bytes: usize::try_from(config.inline_result_bytes).unwrap_or(usize::MAX),
        },
        updates_tx.clone(),
    );
    let heartbeats = tokio::spawn(heartbeat_loop(
        runner.clone(),
        updates_tx,
        Duration::from_millis(config.heartbeat_interval_ms.max(10)),
    ));
    let reason = loop {
        let why = match serve(conn, &runner, &mut updates_rx, &mut shutdown).await {
            ExitReason::DriverLost(why) => why,
            other => break other,
        };
        // The driver runs again elsewhere whatever was running here.
        runner.kill_all();
        tracing::warn!(why, "lost the driver; reconnecting");
        let reconnected = tokio::select! {
            result = reconnect(&options) => result,
            () = &mut shutdown => Err(ExitReason::Stopped),
        };
        conn = match reconnected {
            Ok(conn) => conn,
            Err(reason) => break reason,
        };
    };
    heartbeats.abort();
    Ok(reason)
}

/// One connection's life: launches and kills in, statuses and heartbeats out, until the
/// driver stops this executor, the connection breaks, or `shutdown` resolves.
async fn serve(
    conn: Connection,
    runner: &Arc<TaskRunner>,
    updates: &mut mpsc::UnboundedReceiver<ExecutorMessage>,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> ExitReason {
    let (sink, mut stream) = conn.split();
    let writer = write_batched(sink, updates);
    tokio::pin!(writer);
    // The jobs the driver defined on this connection; a new connection starts empty.
    let mut jobs: HashMap<u64, Arc<JobTemplate>, foldhash::fast::RandomState> = HashMap::default();
    let reason = loop {
        tokio::select! {
            message = stream.next() => match message {
                Some(Ok(DriverMessage::DefineJob(template))) => {
                    jobs.insert(template.key, Arc::from(template));
                }
                Some(Ok(DriverMessage::LaunchTask(launch))) => match jobs.get(&launch.job) {
                    Some(job) => runner.launch(TaskDescription::new(job.clone(), *launch)),
                    // The driver defines a job before its first launch on a connection,
                    // and the status of this attempt could not even name its task: the
                    // connection is out of step, and a new one starts clean.
                    None => {
                        break ExitReason::DriverLost(format!(
                            "the driver launched a task of job key {} it never defined",
                            launch.job
                        ));
                    }
                },
                Some(Ok(DriverMessage::ForgetJob { key })) => {
                    jobs.remove(&key);
                }
                Some(Ok(DriverMessage::KillTask { task, attempt, reason })) => {
                    tracing::info!(task = %task, attempt, reason, "killing task");
                    runner.kill(&task, attempt);
                }
                Some(Ok(DriverMessage::UpdateCredentials(credentials))) => {
                    if let Some(s3) = credentials.s3 {
                        tracing::info!(access_key_id = s3.access_key_id, "object-store credentials from the driver");
                        flint_fetch_cache::stores::set_pushed_credentials(
                            s3.access_key_id,
                            s3.secret_access_key,
                            s3.session_token,
                        );
                    }
                }
                // Decommissioned, or killed by its cluster manager's driver.
                Some(Ok(DriverMessage::StopExecutor)) => {
                    tracing::info!("driver asked this executor to stop");
                    break ExitReason::Stopped;
                }
                Some(Ok(DriverMessage::Shutdown)) => {
                    tracing::info!("driver is shutting down");
                    break ExitReason::Stopped;
                }
                Some(Ok(other)) => {
                    tracing::warn!(?other, "unexpected message after registration");
                }
                Some(Err(e)) => break ExitReason::DriverLost(format!("reading from driver: {e}")),
                None => break ExitReason::DriverLost("driver closed the connection".into()),
            },
            () = &mut writer => break ExitReason::DriverLost("writing to the driver failed".into()),
            () = &mut *shutdown => break ExitReason::Stopped,
        }
    };
    if reason == ExitReason::Stopped {
        // Kill what runs and let the kills' statuses reach the driver if it is still
        // there (a lost driver re-queues them anyway); a stuck socket does not hold the
        // exit up for long.
        runner.kill_all();
        let drained = async {
            while runner.attempts_in_flight() > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            tokio::select! {
                () = &mut writer => {}
                () = drained => {}
            }
        })
        .await;
        let _ = tokio::time::timeout(Duration::from_millis(50), &mut writer).await;
    }
    reason
}

/// Connects and registers again after losing the driver, for as long as
/// `reconnect_timeout` allows; the driver sees a new generation. A driver that is just
/// dying or just starting may reset connections or close them mid-handshake: anything
/// but a refusal is tried again.
async fn reconnect(options: &ExecutorOptions) -> Result<Connection, ExitReason> {
    let deadline = tokio::time::Instant::now() + options.reconnect_timeout;
    let mut backoff = Backoff::until(deadline);
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let why = match connect(options, remaining).await {
            Ok(mut conn) => match register(&mut conn, options).await {
                Ok(_) => return Ok(conn),
                Err(ExitReason::RegistrationRefused(why)) => {
                    return Err(ExitReason::RegistrationRefused(why));
                }
                Err(other) => format!("{other:?}"),
            },
            Err(ExitReason::RegistrationRefused(why)) => {
                return Err(ExitReason::RegistrationRefused(why));
            }
            Err(other) => format!("{other:?}"),
        };
        if !backoff.wait().await {
            return Err(ExitReason::DriverLost(format!("reconnecting: {why}")));
        }
    }
}

/// The pauses between attempts to reach the driver: 50 ms, doubling up to 1 s, for as
/// long as the next pause ends before the deadline.
struct Backoff {
    next: Duration,
    deadline: tokio::time::Instant,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(1);

    fn until(deadline: tokio::time::Instant) -> Backoff {
        Backoff {
            next: Self::FIRST,
            deadline,
        }
    }

    /// Sleeps before the next attempt; `false` at once, without sleeping, when the
    /// pause would reach the deadline: time to give up.
    async fn wait(&mut self) -> bool {
        match self.next_pause(tokio::time::Instant::now()) {
            Some(pause) => {
                tokio::time::sleep(pause).await;
                true
            }
            None => false,
        }
    }

    fn next_pause(&mut self, now: tokio::time::Instant) -> Option<Duration> {
        let pause = self.next;
        if now + pause >= self.deadline {
            return None;
        }
        self.next = (pause * 2).min(Self::MAX);
        Some(pause)
    }
}

/// Opens a connection and says hello, retrying refused TCP connections (a driver not
/// listening yet) with [`Backoff`] for up to `timeout`.
async fn connect(options: &ExecutorOptions, timeout: Duration) -> Result<Connection, ExitReason> {
    let mut backoff = Backoff::until(tokio::time::Instant::now() + timeout);
    let stream = loop {
        match TcpStream::connect(&options.driver_addr).await {
            Ok(stream) => break stream,
            Err(e) => {
                if !backoff.wait().await {
                    return Err(ExitReason::DriverUnreachable(format!(
                        "cannot connect to the driver at {}: {e}",
                        options.driver_addr
                    )));
                }
            }
        }
    };
    let _ = stream.set_nodelay(true);
    greet(stream, options.cluster_secret.clone())
        .await
        .map_err(|e| match e {
            HelloError::Refused(reason) => ExitReason::RegistrationRefused(reason),
            broken @ HelloError::Broken(_) => ExitReason::DriverUnreachable(broken.to_string()),
        })
}

async fn register(
    conn: &mut Connection,
    options: &ExecutorOptions,
) -> Result<ExecutorConfig, ExitReason> {
    let lost = |e: String| ExitReason::DriverLost(format!("registering: {e}"));
    conn.send(ExecutorMessage::RetrieveConfig)
        .await
        .map_err(|e| lost(e.to_string()))?;
    let config = match conn.next().await {
        Some(Ok(DriverMessage::ExecutorConfig(config))) => config,
        other => return Err(lost(format!("expected ExecutorConfig, got {other:?}"))),
    };
    if config.credentials_pushed {
        // Before any store is made: none may sign with this process's environment.
        flint_fetch_cache::stores::expect_pushed_credentials();
    }
    conn.send(ExecutorMessage::RegisterExecutor {
        executor_id: options.executor_id.clone(),
        hostname: options.hostname.clone(),
        cores: options.cores,
        // The driver drops it until it has a cluster manager (issue 16).
        app_id: options.app_id.clone(),
        pid: std::process::id(),
        meters_fuel: options.fuel,
    })
    .await
    .map_err(|e| lost(e.to_string()))?;
    match conn.next().await {
        Some(Ok(DriverMessage::RegisteredExecutor { generation })) => {
            tracing::info!(executor = %options.executor_id, generation, "registered with driver");
            Ok(config)
        }
        Some(Ok(DriverMessage::RegisterExecutorFailed { reason })) => {
            Err(ExitReason::RegistrationRefused(reason))
        }
        other => Err(lost(format!("expected RegisteredExecutor, got {other:?}"))),
    }
}

async fn heartbeat_loop(
    runner: Arc<TaskRunner>,
    updates: mpsc::UnboundedSender<ExecutorMessage>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if updates
            .send(ExecutorMessage::Heartbeat(runner.heartbeat()))
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    #[test]
    fn backoff_doubles_from_50_ms_to_1_s_and_gives_up_when_a_pause_would_reach_the_deadline() {
        let start = Instant::now();
        let mut backoff = Backoff::until(start + Duration::from_millis(3_550));
        let mut now = start;
        let mut pauses = Vec::new();
        while let Some(pause) = backoff.next_pause(now) {
            pauses.push(pause.as_millis());
            now += pause;
        }
        // 2,550 ms in, a 1 s pause would end exactly at the deadline.
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000]);
        assert_eq!(now - start, Duration::from_millis(2_550));
        let mut backoff = Backoff::until(start + Duration::from_millis(50));
        assert_eq!(backoff.next_pause(start), None);
    }
}
