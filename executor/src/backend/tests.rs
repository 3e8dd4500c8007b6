//! The executor against a fake driver on loopback that speaks the protocol: what a lost
//! connection does to running tasks and their ends, with and without a grace.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use flint_protocol::codec::FrameCodec;
use flint_protocol::handshake::welcome;
use flint_protocol::messages::{ExecutorConfig, Heartbeat};
use flint_protocol::{
    Digest, DriverMessage, ExecutorId, ExecutorMessage, FailureKind, HeldAttempt, JobId,
    JobTemplate, ModuleRef, Resources, TaskInput, TaskLaunch, TaskStatus,
};
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tokio_util::codec::Framed;

use super::*;
use crate::sandbox::tests::sleeper;

type DriverSide = Framed<TcpStream, FrameCodec<ExecutorMessage, DriverMessage>>;

/// One executor, its work dir, and the listener it dials.
struct Fixture {
    dir: tempfile::TempDir,
    listener: TcpListener,
    stop: Option<oneshot::Sender<()>>,
    executor: JoinHandle<anyhow::Result<ExitReason>>,
}

/// Modules by the job key that runs them.
const QUICK: u64 = 1;
const SLEEP_2S: u64 = 2;
const FOREVER: u64 = 3;

impl Fixture {
    async fn start(grace: Duration) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("modules")).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let options = options(listener.local_addr().unwrap(), dir.path(), grace);
        let (stop, stopped) = oneshot::channel::<()>();
        let executor = tokio::spawn(run(options, async move {
            let _ = stopped.await;
        }));
        Fixture {
            dir,
            listener,
            stop: Some(stop),
            executor,
        }
    }

    fn modules(&self) -> PathBuf {
        self.dir.path().join("modules")
    }

    async fn accept(&self) -> DriverSide {
        let (stream, _) = timeout(Duration::from_secs(10), self.listener.accept())
            .await
            .expect("the executor dials in time")
            .unwrap();
        welcome(stream, None).await.unwrap()
    }

    /// Answers the registration with `generation`; the attempts the executor listed.
    async fn register(&self, conn: &mut DriverSide, generation: u64) -> Vec<HeldAttempt> {
        assert_eq!(next(conn).await, ExecutorMessage::RetrieveConfig);
        let allow = url::Url::from_directory_path(self.modules()).unwrap();
        let config = ExecutorConfig {
            app_id: "app".into(),
            heartbeat_interval_ms: 50,
            max_log_bytes: 1 << 20,
            driver_http_url: "http://127.0.0.1:9".into(),
            fetch_allow: vec![allow.to_string()],
            egress_allow: Vec::new(),
            block_store: "driver".into(),
            inline_result_bytes: 1 << 20,
            credentials_pushed: false,
        };
        conn.send(DriverMessage::ExecutorConfig(config))
            .await
            .unwrap();
        let ExecutorMessage::RegisterExecutor { attempts, .. } = next(conn).await else {
            panic!("expected RegisterExecutor");
        };
        let registered = DriverMessage::RegisteredExecutor { generation };
        conn.send(registered).await.unwrap();
        attempts
    }

    /// Launches task 0 of the job of `key` (its module one of the consts above).
    async fn launch(&self, conn: &mut DriverSide, key: u64) {
        let wat = match key {
            QUICK => sleeper(0),
            SLEEP_2S => sleeper(2_000_000_000),
            _ => sleeper(u64::MAX),
        };
        let wasm = wat::parse_str(&wat).unwrap();
        let path = self.modules().join(format!("{key}.wasm"));
        std::fs::write(&path, &wasm).unwrap();
        let template = JobTemplate {
            key,
            job: JobId(format!("job-{key}")),
            task_count: 1,
            name: "test".into(),
            module: ModuleRef {
                digest: Some(Digest::of(&wasm)),
                url: url::Url::from_file_path(&path).unwrap().to_string(),
                timestamp_ms: 1,
                size: None,
            },
            files: vec![],
            args: vec![],
            env: vec![],
            resources: Resources::default(),
            network: None,
            determinism: None,
        };
        let launch = TaskLaunch {
            job: key,
            index: 0,
            attempt: 1,
            generation: 1,
            args: vec![],
            env: vec![],
            input: TaskInput::Inline(Vec::new()),
            resources: None,
            pins: None,
        };
        conn.send(DriverMessage::DefineJob(Box::new(template)))
            .await
            .unwrap();
        conn.send(DriverMessage::LaunchTask(Box::new(launch)))
            .await
            .unwrap();
    }

    /// Stops the executor and waits for it.
    async fn stop(mut self) -> ExitReason {
        let _ = self.stop.take().unwrap().send(());
        self.exit().await
    }

    async fn exit(self) -> ExitReason {
        timeout(Duration::from_secs(10), self.executor)
            .await
            .expect("the executor exits in time")
            .unwrap()
            .unwrap()
    }
}

fn options(addr: SocketAddr, work_dir: &Path, grace: Duration) -> ExecutorOptions {
    ExecutorOptions {
        driver_addr: addr.to_string(),
        executor_id: ExecutorId("exec-1".into()),
        cores: 2,
        hostname: "test".into(),
        app_id: None,
        work_dir: work_dir.join("work"),
        cluster_secret: None,
        connect_timeout: Duration::from_secs(5),
        reconnect_timeout: Duration::from_secs(5),
        driver_loss_grace: grace,
        end_budgets: Budgets::default(),
        max_memory_bytes: 64 << 20,
        fuel: false,
        fetch: FetchOptions::default(),
        compiler: CompilerMode::InProcess,
    }
}

async fn next(conn: &mut DriverSide) -> ExecutorMessage {
    timeout(Duration::from_secs(10), conn.next())
        .await
        .expect("a message in time")
        .expect("the connection is open")
        .unwrap()
}

/// The next task end, heartbeats skipped.
async fn next_end(conn: &mut DriverSide) -> (u64, TaskStatus) {
    loop {
        if let ExecutorMessage::StatusUpdate { seq, status } = next(conn).await {
            return (seq, status);
        }
    }
}

/// Waits for a heartbeat that `want`s.
async fn heartbeat_where(conn: &mut DriverSide, want: impl Fn(&Heartbeat) -> bool) {
    loop {
        if let ExecutorMessage::Heartbeat(beat) = next(conn).await
            && want(&beat)
        {
            return;
        }
    }
}

/// (job, ended) of each listed attempt, sorted.
fn listed(attempts: &[HeldAttempt]) -> Vec<(String, bool)> {
    let mut listed: Vec<_> = (attempts.iter())
        .map(|a| (a.task.job.0.clone(), a.ended))
        .collect();
    listed.sort();
    listed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_keeps_running_through_a_lost_connection_and_its_end_reaches_the_next_one() {
    let fixture = Fixture::start(Duration::from_secs(10)).await;
    let mut conn = fixture.accept().await;
    assert_eq!(fixture.register(&mut conn, 1).await, []);
    fixture.launch(&mut conn, SLEEP_2S).await;
    fixture.launch(&mut conn, QUICK).await;
    let (seq, quick) = next_end(&mut conn).await;
    assert_eq!((seq, quick.task.job.0.as_str()), (1, "job-1"));
    // One more heartbeat: the sleeper has surely started.
    heartbeat_where(&mut conn, |_| true).await;
    drop(conn);

    // The driver is back before the end of the quick task was acknowledged.
    let mut conn = fixture.accept().await;
    let attempts = fixture.register(&mut conn, 2).await;
    let expected = [("job-1".to_owned(), true), ("job-2".to_owned(), false)];
    assert_eq!(listed(&attempts), expected, "each attempt once");
    let sleeping = attempts.iter().find(|a| !a.ended).unwrap();
    assert_eq!((sleeping.attempt, sleeping.generation), (1, 1));
    assert!(sleeping.started_at_us > 0, "listed as started");
    assert_eq!(
        next_end(&mut conn).await,
        (1, quick),
        "sent again, same number"
    );
    let (seq, slept) = next_end(&mut conn).await;
    assert_eq!((seq, slept.task.job.0.as_str()), (2, "job-2"));
    assert!(
        slept.end.outcome.is_ok(),
        "ran to its end: {:?}",
        slept.end.outcome
    );

    conn.send(DriverMessage::EndsDurable { up_to: 2 })
        .await
        .unwrap();
    heartbeat_where(&mut conn, |beat| beat.ends_held == 0 && beat.running == 0).await;
    assert_eq!(fixture.stop().await, ExitReason::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_grace_a_lost_driver_has_its_tasks_killed_at_once() {
    let fixture = Fixture::start(Duration::ZERO).await;
    let mut conn = fixture.accept().await;
    fixture.register(&mut conn, 1).await;
    fixture.launch(&mut conn, FOREVER).await;
    heartbeat_where(&mut conn, |beat| beat.running == 1).await;
    drop(conn);
    let lost = Instant::now();

    let mut conn = fixture.accept().await;
    let attempts = fixture.register(&mut conn, 2).await;
    assert_eq!(
        attempts.len(),
        1,
        "listed once, running or ended: {attempts:?}"
    );
    let (seq, killed) = next_end(&mut conn).await;
    assert_eq!(seq, 1);
    let failure = killed.end.outcome.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Killed, "{}", failure.message);
    assert!(lost.elapsed() < Duration::from_secs(5));
    assert_eq!(fixture.stop().await, ExitReason::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_not_back_within_the_grace_ends_the_executor() {
    let fixture = Fixture::start(Duration::from_secs(1)).await;
    let mut conn = fixture.accept().await;
    fixture.register(&mut conn, 1).await;
    fixture.launch(&mut conn, FOREVER).await;
    heartbeat_where(&mut conn, |beat| beat.running == 1).await;
    let Fixture {
        listener,
        stop,
        executor,
        dir,
    } = fixture;
    // The port is closed: every attempt to reach the driver is refused.
    drop((conn, listener));
    let lost = Instant::now();
    let reason = timeout(Duration::from_secs(10), executor).await.unwrap();
    assert!(
        matches!(reason.unwrap().unwrap(), ExitReason::DriverLost(_)),
        "exit code 5"
    );
    // It gives up once its next try (at most 250 ms away) would be past the grace.
    let waited = lost.elapsed();
    assert!(
        waited >= Duration::from_millis(700),
        "kept going for the grace: {waited:?}"
    );
    assert!(waited < Duration::from_secs(3), "not past it: {waited:?}");
    drop((stop, dir));
}

#[test]
fn an_egress_allow_list_the_executor_cannot_read_stops_it_at_start_naming_the_flag() {
    let config = |egress_allow: &[&str]| ExecutorConfig {
        app_id: "app".into(),
        heartbeat_interval_ms: 50,
        max_log_bytes: 1 << 20,
        driver_http_url: "http://127.0.0.1:9".into(),
        fetch_allow: Vec::new(),
        egress_allow: egress_allow.iter().map(|s| s.to_string()).collect(),
        block_store: "driver".into(),
        inline_result_bytes: 1 << 20,
        credentials_pushed: false,
    };
    let why = egress_ceiling(&config(&["ftp://files.example.com"])).unwrap_err();
    let why = format!("{why:#}");
    assert!(why.contains("--egress-allow"), "{why}");
    assert!(why.contains("ftp://files.example.com"), "{why}");
    assert!(egress_ceiling(&config(&[])).unwrap().is_empty());
    let ceiling = egress_ceiling(&config(&["https://api.example.com"])).unwrap();
    assert!(ceiling.admits(&url::Url::parse("https://api.example.com/v1").unwrap()));
}
