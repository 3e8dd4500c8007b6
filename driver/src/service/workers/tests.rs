//! The worker registry's own rules: names and limits, placement by free cores, one live
//! worker per id.

use super::*;

#[test]
fn bad_names_are_refused_and_lost_workers_are_forgotten_oldest_first() {
    let workers = Workers::default();
    let (notify, _heard) = mpsc::unbounded_channel();
    workers.attach(notify, (1, 256));
    let (outbox, _sent) = mpsc::unbounded_channel();
    let register = |r: WorkerRegistration| {
        workers.register(r, outbox.clone(), "flint", Duration::from_secs(1))
    };
    for bad in ["", "a b", "tab\t", &"x".repeat(254)] {
        let why = register(registration(bad, 1, 1024)).unwrap_err();
        assert!(why.contains("MAX_WORKER_NAME_BYTES"), "{why}");
    }
    let mut long_host = registration("ok", 1, 1024);
    long_host.host = "h".repeat(300);
    assert!(register(long_host).unwrap_err().contains("host"));
    for n in 0..LOST_WORKERS_KEPT + 10 {
        let id = format!("w{n:04}");
        let generation = register(registration(&id, 1, 1024)).unwrap();
        workers.lost(&id, generation, "gone");
    }
    let listed = workers.lock().workers.len();
    assert_eq!(listed, LOST_WORKERS_KEPT);
    assert!(
        !workers.lock().workers.contains_key("w0000"),
        "oldest lost first"
    );
    assert!(
        workers
            .lock()
            .workers
            .contains_key(&format!("w{:04}", LOST_WORKERS_KEPT + 9))
    );
}

#[test]
fn past_max_workers_a_new_worker_is_refused_naming_the_limit_and_a_live_one_may_come_back() {
    let workers = Workers::default();
    let (notify, _heard) = mpsc::unbounded_channel();
    workers.attach(notify, (1, 256));
    let (outbox, _sent) = mpsc::unbounded_channel();
    let register = |r: WorkerRegistration| {
        workers.register(r, outbox.clone(), "flint", Duration::from_secs(1))
    };
    for n in 0..MAX_WORKERS {
        register(registration(&format!("w{n}"), 1, 1024)).unwrap();
    }
    let why = register(registration("one-too-many", 1, 1024)).unwrap_err();
    assert!(why.contains("MAX_WORKERS 10000"), "{why}");
    assert!(why.contains("10000 live workers"), "{why}");
    // The same process registering again (a reconnect) is not a new worker.
    register(registration("w7", 1, 1024)).unwrap();
    // One lost makes room again.
    let generation = register(registration("w8", 1, 1024)).unwrap();
    workers.lost("w8", generation, "gone");
    register(registration("one-too-many", 1, 1024)).unwrap();
}

fn registration(id: &str, cores: u32, memory_mb: u64) -> WorkerRegistration {
    WorkerRegistration {
        worker_id: id.into(),
        host: format!("{id}.local"),
        cores,
        memory_mb,
        pid: 7,
        executors: Vec::new(),
    }
}

fn placement(n: u32, cores: u32, memory_mb: u64) -> Placement {
    Placement {
        executor: ExecutorId(format!("exec-{n}")),
        app_id: "flint".into(),
        cores,
        memory_mb,
    }
}

/// Registers `r` as the app "flint" does, with a one-second heartbeat.
fn join(
    workers: &Workers,
    r: WorkerRegistration,
    outbox: mpsc::UnboundedSender<DriverToWorker>,
) -> Result<u64, String> {
    workers.register(r, outbox, "flint", Duration::from_secs(1))
}

/// Worker `by` (id, generation) reports that `executor` exited with `code`.
fn exited(workers: &Workers, by: (&str, u64), executor: &str, code: i32) {
    let state = WorkerExecutorState::Exited(flint_protocol::exit::ProcessExit::Code(code));
    let message = WorkerMessage::ExecutorStateChanged {
        executor_id: ExecutorId(executor.into()),
        state,
    };
    workers.message(by.0, by.1, message);
}

#[test]
fn executors_spread_by_free_cores_and_only_where_they_fit() {
    let workers = Workers::default();
    let (notify, mut heard) = mpsc::unbounded_channel();
    let (outbox, _sent) = mpsc::unbounded_channel();
    // Without the standalone cluster manager attached, a worker is refused.
    let refused = join(&workers, registration("a", 2, 4096), outbox.clone()).unwrap_err();
    assert!(
        refused.contains("--cluster-manager standalone"),
        "{refused}"
    );
    workers.attach(notify, (1, 256));
    let (out_a, mut sent_a) = mpsc::unbounded_channel();
    let (out_b, mut sent_b) = mpsc::unbounded_channel();
    let ga = join(&workers, registration("a", 2, 4096), out_a).unwrap();
    join(&workers, registration("b", 3, 1024), out_b).unwrap();
    assert!(matches!(
        heard.try_recv().unwrap(),
        WorkerEvent::Registered { .. }
    ));
    // b has more free cores; once it has fewer, a.
    assert_eq!(workers.place(&placement(1, 1, 512)).as_deref(), Some("b"));
    assert_eq!(workers.place(&placement(2, 1, 512)).as_deref(), Some("a"));
    assert_eq!(workers.place(&placement(3, 1, 512)).as_deref(), Some("b"));
    // b's memory is used up; a still fits.
    assert_eq!(workers.place(&placement(4, 1, 512)).as_deref(), Some("a"));
    assert_eq!(workers.place(&placement(5, 1, 512)), None, "nothing fits");
    assert_eq!(workers.place(&placement(5, 1, 0)).as_deref(), Some("b"));
    // An exit frees what it held; a kill goes to its worker.
    exited(&workers, ("a", ga), "exec-2", 0);
    // A report on an executor placed elsewhere (exec-1 is on b) is ignored.
    while heard.try_recv().is_ok() {}
    exited(&workers, ("a", ga), "exec-1", 1);
    assert!(
        heard.try_recv().is_err(),
        "a speaks only for its own executors"
    );
    assert!(workers.kill(&ExecutorId("exec-4".into())));
    assert!(
        !workers.kill(&ExecutorId("exec-2".into())),
        "exited already"
    );
    assert_eq!(workers.place(&placement(6, 1, 512)).as_deref(), Some("a"));
    let mut launched_on_a = Vec::new();
    while let Ok(m) = sent_a.try_recv() {
        launched_on_a.push(m);
    }
    assert!(matches!(
        launched_on_a[0],
        DriverToWorker::RegisteredWorker { .. }
    ));
    assert!(launched_on_a.contains(&DriverToWorker::KillExecutor {
        executor_id: ExecutorId("exec-4".into())
    }));
    assert!(sent_b.try_recv().is_ok());
    // A lost worker takes its executors with it.
    while heard.try_recv().is_ok() {}
    workers.lost("a", ga, "connection closed");
    match heard.try_recv().unwrap() {
        WorkerEvent::Lost {
            worker, executors, ..
        } => {
            assert_eq!(worker, "a");
            let ids: Vec<&str> = executors.iter().map(|e| e.0.as_str()).collect();
            assert_eq!(ids, ["exec-4", "exec-6"]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        workers.place(&placement(7, 2, 0)),
        None,
        "a is gone, b is full"
    );
    let views = workers.views();
    assert_eq!(views[0].state, "lost");
    assert_eq!(views[0].lost_reason.as_deref(), Some("connection closed"));
}

#[test]
fn a_second_live_worker_of_one_id_is_refused_and_the_same_process_replaces_itself() {
    let workers = Workers::default();
    let (notify, _heard) = mpsc::unbounded_channel();
    workers.attach(notify, (1, 256));
    let (out, _rx) = mpsc::unbounded_channel();
    let first = workers
        .register(
            registration("a", 2, 0),
            out.clone(),
            "flint",
            Duration::from_secs(1),
        )
        .unwrap();
    let mut other = registration("a", 2, 0);
    other.pid = 8;
    let refused = workers
        .register(other, out.clone(), "flint", Duration::from_secs(1))
        .unwrap_err();
    assert!(refused.contains("already registered"), "{refused}");
    let again = workers
        .register(
            registration("a", 2, 0),
            out,
            "flint",
            Duration::from_secs(1),
        )
        .unwrap();
    assert!(again > first);
    // The old generation's messages and loss are ignored.
    workers.lost("a", first, "stale");
    assert_eq!(workers.views()[0].state, "alive");
}

/// After a driver restart a worker lists the executors it kept: they hold their room on
/// it before anything else is placed there, and their exits are the worker's to report.
#[test]
fn the_executors_a_worker_lists_hold_their_room_at_once() {
    let workers = Workers::default();
    let (notify, mut heard) = mpsc::unbounded_channel();
    workers.attach(notify, (1, 256));
    let (out, _sent) = mpsc::unbounded_channel();
    let mut kept = registration("a", 2, 1024);
    kept.executors = vec![ExecutorId("exec-1".into())];
    let generation = join(&workers, kept, out).unwrap();
    assert!(matches!(
        heard.try_recv().unwrap(),
        WorkerEvent::Registered { reported, .. } if reported == [ExecutorId("exec-1".into())]
    ));
    let view = &workers.views()[0];
    assert_eq!((view.free_cores, view.free_memory_mb), (1, 768), "{view:?}");
    assert_eq!(workers.place(&placement(2, 1, 256)).as_deref(), Some("a"));
    assert_eq!(workers.place(&placement(3, 1, 256)), None, "full");
    exited(&workers, ("a", generation), "exec-1", 0);
    assert!(matches!(
        heard.try_recv().unwrap(),
        WorkerEvent::ExecutorState { executor, .. } if executor.0 == "exec-1"
    ));
    assert_eq!(workers.place(&placement(3, 1, 256)).as_deref(), Some("a"));
}
