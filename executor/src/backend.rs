//! The executor's connection to the driver (Spark's CoarseGrainedExecutorBackend), and
//! how it outlives one: a lost driver is sought again ([`link`]) while tasks keep
//! running for the driver-loss grace; ends wait in the end buffer and go out on the next
//! connection, after a registration that lists every attempt held here; the ends the
//! buffer cannot send as they are (spilled, or their block held) go through the
//! connection's [`backlog`].

mod backlog;
mod link;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flint_fetch_cache::egress::AllowList;
use flint_fetch_cache::{FetchCache, FetchOptions};
use flint_protocol::codec::{FrameCodec, write_batched};
use flint_protocol::messages::ExecutorConfig;
use flint_protocol::{DriverMessage, ExecutorId, ExecutorMessage, JobTemplate, TaskDescription};
use futures_util::StreamExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::Framed;

use self::link::{Backoff, connect, reconnect, register};
use crate::blocks::BlockClient;
use crate::compiler::{CompilerMode, ModuleCompiler};
use crate::ends::{Budgets, EndBuffer};
use crate::runner::{DriverLink, RunnerSettings, TaskRunner};
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
    /// With no driver-loss grace: how long to keep trying to get back to the driver
    /// after losing it (its tasks killed at once).
    pub reconnect_timeout: Duration,
    /// How long tasks keep running without a driver while it is sought again; past it
    /// they are killed and the executor exits (`DriverLost`). Zero: kill them at once
    /// and seek the driver for `reconnect_timeout`.
    pub driver_loss_grace: Duration,
    /// What the end buffer may hold in memory and on disk.
    pub end_budgets: Budgets,
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
    /// driver-loss grace (or the reconnect timeout, with no grace).
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

/// What outlives a connection: the tasks, their ends, the block client.
struct Session {
    runner: Arc<TaskRunner>,
    ends: Arc<EndBuffer>,
    blocks: Arc<BlockClient>,
    heartbeat_every: Duration,
    /// Published for fetches from the driver, which wait out its restart.
    link: tokio::sync::watch::Sender<DriverLink>,
}

/// Runs an executor until the driver stops it, the driver is lost for good, or
/// `shutdown` resolves. Infrastructure failures (cannot build the engine, the work dir)
/// are errors.
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
    // A new process is a new executor to the driver: ends an earlier one held are gone.
    let ends = EndBuffer::open(options.work_dir.join("ends"), options.end_budgets)?;

    tokio::pin!(shutdown);
    let mut conn = match connect(&options, options.connect_timeout, Backoff::SLOW_CAP).await {
        Ok(conn) => conn,
        Err(reason) => return Ok(reason),
    };
    let config = match register(&mut conn, &options, &Vec::new).await {
        Ok(config) => config,
        Err(reason) => return Ok(reason),
    };
    configure_fetches(&fetcher, &config, &options)?;
    let egress_allow = egress_ceiling(&config)?;
    let blocks = BlockClient::new(
        &config.block_store,
        &config.driver_http_url,
        options.cluster_secret.clone(),
        tokio::runtime::Handle::current(),
        options.work_dir.join("blocks-held"),
    )
    .map_err(|e| anyhow::anyhow!("the driver's block store {:?}: {e}", config.block_store))?;
    let blocks = Arc::new(blocks);
    let link = tokio::sync::watch::Sender::new(DriverLink::default());
    let runner = TaskRunner::start(
        sandbox,
        fetcher,
        compiler,
        RunnerSettings {
            files_root: options.work_dir.join("files"),
            threads: options.cores as usize,
            max_log_bytes: usize::try_from(config.max_log_bytes).unwrap_or(usize::MAX),
            blocks: Some(blocks.clone()),
            inline_result_bytes: usize::try_from(config.inline_result_bytes).unwrap_or(usize::MAX),
            driver_link: Some(link.subscribe()),
            egress_allow,
        },
        ends.clone(),
    );
    let session = Session {
        runner,
        ends,
        blocks,
        heartbeat_every: Duration::from_millis(config.heartbeat_interval_ms.max(10)),
        link,
    };
    loop {
        let why = match serve(conn, &session, &mut shutdown).await {
            ExitReason::DriverLost(why) => why,
            other => return Ok(other),
        };
        conn = match regain(&options, &session, why, &mut shutdown).await {
            Ok(conn) => conn,
            Err(reason) => return Ok(reason),
        };
    }
}

/// Tells the fetch cache what the driver allows and trusts.
fn configure_fetches(
    fetcher: &FetchCache,
    config: &ExecutorConfig,
    options: &ExecutorOptions,
) -> anyhow::Result<()> {
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
    let driver = &config.driver_http_url;
    if let Err(e) = fetcher.trust_origin(driver) {
        anyhow::bail!("the driver's HTTP address {driver:?} is not an origin: {e}");
    }
    // Modules and files come from the driver, which wants the cluster secret for them;
    // the fetch cache sends it only with the driver's own refs, to its origin.
    if let Some(secret) = &options.cluster_secret
        && let Err(e) = fetcher.set_bearer(driver, secret)
    {
        anyhow::bail!("the driver's HTTP address {driver:?} is not an origin: {e}");
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
    Ok(())
}

/// The operator's ceiling over tasks' outbound HTTP. The driver checked its own flag
/// before handing it out, so a list this executor cannot read is a mismatch between the
/// two builds: refused at start rather than found by the first networked task.
fn egress_ceiling(config: &ExecutorConfig) -> anyhow::Result<Arc<AllowList>> {
    AllowList::parse(&config.egress_allow)
        .map(Arc::new)
        .map_err(|e| anyhow::anyhow!("the driver's egress allow-list (--egress-allow): {e}"))
}

/// After losing the driver: with a grace, tasks keep running while the driver is sought
/// for up to the grace, and are killed only if it is not found; without one, they are
/// killed at once (the driver runs them again elsewhere) and the driver is sought for
/// the reconnect timeout.
async fn regain(
    options: &ExecutorOptions,
    session: &Session,
    why: String,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<Connection, ExitReason> {
    let grace = options.driver_loss_grace;
    let (timeout, cap) = if grace.is_zero() {
        session.runner.kill_all();
        tracing::warn!(why, "lost the driver; killed its tasks, reconnecting");
        (options.reconnect_timeout, Backoff::SLOW_CAP)
    } else {
        let running = session.runner.attempts_in_flight();
        let grace_ms = grace.as_millis() as u64;
        tracing::warn!(
            why,
            running,
            grace_ms,
            "lost the driver; tasks keep running while reconnecting"
        );
        (grace, Backoff::FAST_CAP)
    };
    let attempts = || session.runner.held_attempts();
    let regained = tokio::select! {
        regained = reconnect(options, timeout, cap, &attempts) => regained,
        () = shutdown => Err(ExitReason::Stopped),
    };
    if let Err(reason) = &regained {
        // Whatever ends the executor ends its tasks: nobody would hear of them.
        if session.runner.attempts_in_flight() > 0 {
            tracing::warn!(?reason, "killing the tasks still running");
        }
        session.runner.kill_all();
    }
    regained
}

/// One connection's life: launches, kills and acks in, ends and heartbeats out, until the
/// driver stops this executor, the connection breaks, or `shutdown` resolves.
async fn serve(
    conn: Connection,
    session: &Session,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> ExitReason {
    session.link.send_modify(|l| {
        l.registrations += 1;
        l.connected = true;
    });
    let (sink, mut stream) = conn.split();
    // A channel per connection: what was queued for a broken one (heartbeats above all)
    // dies with it; ends wait in the end buffer instead.
    let (outbox, mut outgoing) = mpsc::unbounded_channel();
    let writer = write_batched(sink, &mut outgoing);
    tokio::pin!(writer);
    session.ends.attach(outbox.clone());
    let backlog = backlog::resend(&session.ends, &session.blocks);
    tokio::pin!(backlog);
    let mut heartbeat = tokio::time::interval(session.heartbeat_every);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The jobs the driver defined on this connection; a new connection starts empty
    // (running attempts keep their own template).
    let mut jobs = Jobs::default();
    let reason = loop {
        tokio::select! {
            message = stream.next() => match message {
                Some(Ok(message)) => {
                    if let Some(reason) = on_message(message, session, &mut jobs) {
                        break reason;
                    }
                }
                Some(Err(e)) => break ExitReason::DriverLost(format!("reading from driver: {e}")),
                None => break ExitReason::DriverLost("driver closed the connection".into()),
            },
            _ = heartbeat.tick() => {
                let _ = outbox.send(ExecutorMessage::Heartbeat(session.runner.heartbeat()));
            }
            () = &mut writer => break ExitReason::DriverLost("writing to the driver failed".into()),
            never = &mut backlog => match never {},
            () = &mut *shutdown => break ExitReason::Stopped,
        }
    };
    if reason == ExitReason::Stopped {
        drain(&session.runner, writer).await;
    }
    session.ends.detach();
    session.link.send_modify(|l| l.connected = false);
    reason
}

type Jobs = HashMap<u64, Arc<JobTemplate>, foldhash::fast::RandomState>;

/// What one message from the driver does; `Some` when the connection is over.
fn on_message(message: DriverMessage, session: &Session, jobs: &mut Jobs) -> Option<ExitReason> {
    match message {
        DriverMessage::DefineJob(template) => {
            jobs.insert(template.key, Arc::from(template));
        }
        DriverMessage::LaunchTask(launch) => match jobs.get(&launch.job) {
            Some(job) => session
                .runner
                .launch(TaskDescription::new(job.clone(), *launch)),
            // The driver defines a job before its first launch on a connection, and the
            // end of this attempt could not even name its task: the connection is out
            // of step, and a new one starts clean.
            None => {
                return Some(ExitReason::DriverLost(format!(
                    "the driver launched a task of job key {} it never defined",
                    launch.job
                )));
            }
        },
        DriverMessage::ForgetJob { key } => {
            jobs.remove(&key);
        }
        // Names the task and attempt, not the generation: it reaches an attempt
        // launched on an earlier connection too.
        DriverMessage::KillTask {
            task,
            attempt,
            reason,
        } => {
            tracing::info!(task = %task, attempt, reason, "killing task");
            session.runner.kill(&task, attempt);
        }
        DriverMessage::EndsDurable { up_to } => session.ends.acknowledge(up_to),
        DriverMessage::UpdateCredentials(credentials) => {
            if let Some(s3) = credentials.s3 {
                tracing::info!(
                    access_key_id = s3.access_key_id,
                    "object-store credentials from the driver"
                );
                flint_fetch_cache::stores::set_pushed_credentials(
                    s3.access_key_id,
                    s3.secret_access_key,
                    s3.session_token,
                );
            }
        }
        // Decommissioned, or killed by its cluster manager's driver.
        DriverMessage::StopExecutor => {
            tracing::info!("driver asked this executor to stop");
            return Some(ExitReason::Stopped);
        }
        DriverMessage::Shutdown => {
            tracing::info!("driver is shutting down");
            return Some(ExitReason::Stopped);
        }
        other => tracing::warn!(?other, "unexpected message after registration"),
    }
    None
}

/// Kills what runs and lets the kills' ends reach the driver if it is still there (a
/// lost driver re-queues them anyway); a stuck socket does not hold the exit up for long.
async fn drain(runner: &TaskRunner, mut writer: impl Future<Output = ()> + Unpin) {
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
