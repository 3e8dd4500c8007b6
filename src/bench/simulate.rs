//! Simulated executors for `flint bench --simulated-executors`: each speaks the real
//! protocol over its own TCP connection (hello, `RetrieveConfig`, `RegisterExecutor`,
//! `DefineJob` / `LaunchTask` in, `StatusUpdate` / `Heartbeat` out) and ends every launch
//! at once with an empty result, or after `--task-us`. No wasm, no fetches, no task
//! threads: what is left to measure is the driver. Many run in one process on one
//! runtime thread (a thousand fit on this machine), started by the bench as
//! `flint simulate-executors` child processes so that the driver's CPU is its own
//! ([`spawn`], which `scale` and `tenants` share).

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use flint_protocol::codec::{FrameCodec, write_batched};
use flint_protocol::{
    DriverMessage, ExecutorId, ExecutorMessage, Hello, HelloReply, JobId, TaskId, TaskResult,
    TaskStatus,
};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::Framed;

use super::args::BenchArgs;
use crate::dev::Cluster;

/// `flint simulate-executors` (hidden: the bench starts it).
#[derive(clap::Args, Clone, Debug)]
pub struct SimulateArgs {
    /// `HOST:PORT` of the driver's executor listener.
    #[arg(long)]
    pub driver: String,
    /// Executors in this process.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub executors: u32,
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub cores: u32,
    /// Their ids are `sim-<N>` from this N on.
    #[arg(long, default_value_t = 0)]
    pub first_id: u32,
    /// How long each task "runs" before its status is sent; 0 answers at once.
    #[arg(long, default_value_t = 0)]
    pub task_us: u64,
    /// The cluster secret, when the driver wants one.
    #[arg(long, env = "FLINT_CLUSTER_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
}

/// Runs the executors on a single-threaded runtime until the driver stops them all (or
/// the connections close): one core's worth of load generator at most.
pub fn run(args: SimulateArgs) -> i32 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the simulator's runtime");
    let result: anyhow::Result<()> = runtime.block_on(async {
        let mut executors = tokio::task::JoinSet::new();
        for n in args.first_id..args.first_id + args.executors {
            let args = args.clone();
            executors.spawn(async move {
                let id = ExecutorId(format!("sim-{n}"));
                simulated_executor(&args, id.clone())
                    .await
                    .with_context(|| format!("simulated executor {id}"))
            });
        }
        let mut first_error = None;
        while let Some(done) = executors.join_next().await {
            if let Err(e) = done
                .context("a simulated executor panicked")
                .and_then(|r| r)
            {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("flint simulate-executors: {e:#}");
            1
        }
    }
}

/// `flint simulate-executors` processes with `executors` executors between them, dialing
/// `cluster`'s executor listener (with `secret`, when it wants one).
pub(super) fn spawn(
    args: &BenchArgs,
    cluster: &Cluster,
    executors: u32,
    secret: Option<&str>,
) -> anyhow::Result<Vec<tokio::process::Child>> {
    let exe = std::env::current_exe().context("locating the flint binary")?;
    let processes = args.simulator_processes.min(executors);
    let mut simulators = Vec::new();
    let mut first_id = 0;
    for p in 0..processes {
        // Spread as evenly as whole executors allow.
        let share = executors / processes + u32::from(p < executors % processes);
        let mut command = tokio::process::Command::new(&exe);
        command
            .arg("simulate-executors")
            .arg(format!("--driver={}", cluster.executors_addr))
            .arg(format!("--executors={share}"))
            .arg(format!("--cores={}", args.cores))
            .arg(format!("--first-id={first_id}"))
            .arg(format!("--task-us={}", args.simulated_task_us))
            .env_remove("FLINT_CLUSTER_SECRET")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(secret) = secret {
            command.arg(format!("--secret={secret}"));
        }
        simulators.push(
            command
                .spawn()
                .context("starting flint simulate-executors")?,
        );
        first_id += share;
    }
    Ok(simulators)
}

/// How long a simulated task runs, for the heading.
pub(super) fn task_length(args: &BenchArgs) -> String {
    match args.simulated_task_us {
        0 => ", each ended at once".to_owned(),
        us => format!(", each ended after {us} us"),
    }
}

type Connection = Framed<TcpStream, FrameCodec<DriverMessage, ExecutorMessage>>;

async fn simulated_executor(args: &SimulateArgs, id: ExecutorId) -> anyhow::Result<()> {
    let (conn, heartbeat_every) = register(args, &id).await?;
    let (outbox, mut outbox_rx) = mpsc::unbounded_channel();
    let (sink, mut stream) = conn.split();
    let writer = write_batched(sink, &mut outbox_rx);
    tokio::pin!(writer);
    let mut jobs: HashMap<u64, JobId> = HashMap::new();
    let mut tick = tokio::time::interval(heartbeat_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let task_time = Duration::from_micros(args.task_us);
    // Attempts sleeping out their `--task-us`, so that heartbeats can count them.
    let running = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    // Ends are numbered as a real executor's are, so that the driver acknowledges them
    // as it would (the acknowledgements are read and ignored: nothing is kept here).
    let seq = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let numbered = |seq: &std::sync::atomic::AtomicU64, status| ExecutorMessage::StatusUpdate {
        seq: seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
        status,
    };
    loop {
        tokio::select! {
            // Every frame already read first: the statuses they make go out together
            // once the connection has nothing more, one write instead of one each.
            biased;
            message = stream.next() => match message {
                Some(Ok(DriverMessage::DefineJob(template))) => {
                    jobs.insert(template.key, template.job.clone());
                }
                Some(Ok(DriverMessage::LaunchTask(launch))) => {
                    let Some(job) = jobs.get(&launch.job) else {
                        bail!("launched a task of job key {} never defined", launch.job);
                    };
                    let started = now_us();
                    let status = move |finished_at_us| TaskStatus {
                        task: TaskId { job: job.clone(), index: launch.index },
                        attempt: launch.attempt,
                        generation: launch.generation,
                        end: flint_protocol::TaskEnd {
                            started_at_us: started,
                            finished_at_us,
                            outcome: Ok(TaskResult::Inline(Vec::new())),
                            log: Vec::new(),
                            log_truncated: false,
                            usage: Default::default(),
                            pins: None,
                            memory_mb: None,
                            egress_denied: Vec::new(),
                        },
                    };
                    if task_time.is_zero() {
                        let _ = outbox.send(numbered(&seq, status(started)));
                    } else {
                        let status = status(started + args.task_us);
                        let (outbox, running, seq) = (outbox.clone(), running.clone(), seq.clone());
                        running.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::spawn(async move {
                            tokio::time::sleep(task_time).await;
                            running.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                            let _ = outbox.send(numbered(&seq, status));
                        });
                    }
                }
                Some(Ok(DriverMessage::ForgetJob { key })) => {
                    jobs.remove(&key);
                }
                // Attempts end at once; a kill finds nothing left to stop.
                Some(Ok(DriverMessage::KillTask { .. } | DriverMessage::EndsDurable { .. })) => {}
                Some(Ok(DriverMessage::StopExecutor | DriverMessage::Shutdown)) | None => {
                    return Ok(());
                }
                Some(Ok(other)) => bail!("unexpected message after registration: {other:?}"),
                Some(Err(e)) => bail!("reading from the driver: {e}"),
            },
            _ = tick.tick() => {
                let heartbeat = flint_protocol::messages::Heartbeat {
                    running: running.load(std::sync::atomic::Ordering::Relaxed),
                    ..Default::default()
                };
                let _ = outbox.send(ExecutorMessage::Heartbeat(heartbeat));
            }
            () = &mut writer => bail!("writing to the driver failed"),
        }
    }
}

async fn register(args: &SimulateArgs, id: &ExecutorId) -> anyhow::Result<(Connection, Duration)> {
    let stream = TcpStream::connect(&args.driver)
        .await
        .with_context(|| format!("connecting to {}", args.driver))?;
    let _ = stream.set_nodelay(true);
    let mut hello = Framed::new(stream, FrameCodec::<HelloReply, Hello>::default());
    hello.send(Hello::new(args.secret.clone())).await?;
    match hello.next().await {
        Some(Ok(HelloReply {
            accepted: Ok(()), ..
        })) => {}
        other => bail!("hello refused: {other:?}"),
    }
    let mut conn: Connection = hello.map_codec(|c| c.retype());
    conn.send(ExecutorMessage::RetrieveConfig).await?;
    let config = match conn.next().await {
        Some(Ok(DriverMessage::ExecutorConfig(config))) => config,
        other => bail!("expected ExecutorConfig, got {other:?}"),
    };
    conn.send(ExecutorMessage::RegisterExecutor {
        executor_id: id.clone(),
        hostname: "simulated".into(),
        cores: args.cores,
        app_id: Some(config.app_id.clone()),
        pid: std::process::id(),
        meters_fuel: false,
        attempts: Vec::new(),
    })
    .await?;
    match conn.next().await {
        Some(Ok(DriverMessage::RegisteredExecutor { .. })) => {}
        other => bail!("expected RegisteredExecutor, got {other:?}"),
    }
    Ok((
        conn,
        Duration::from_millis(config.heartbeat_interval_ms.max(10)),
    ))
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
