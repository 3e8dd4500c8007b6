//! The job store on a real redb file: round trips, group commits, reopening.

use flint_protocol::TaskResult;
use flint_protocol::api::{JobState, TaskState};

use super::*;

fn end(attempts: u32, result_bytes: usize) -> TaskEndRecord {
    TaskEndRecord {
        state: TaskState::Succeeded,
        attempts,
        executor: None,
        failure: None,
        started_at_us: Some(1),
        finished_at_us: Some(2),
        result: Some(TaskResult::Inline(vec![attempts as u8; result_bytes])),
        log: Vec::new(),
    }
}

/// Waits for the writer thread's group commits to show `ready`.
fn load_until(store: &JobStore, ready: impl Fn(&[StoredJob]) -> bool) -> Vec<StoredJob> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stored = store.load().unwrap().jobs;
        if ready(&stored) {
            return stored;
        }
        assert!(Instant::now() < deadline, "the ends were never committed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Closes `store` and opens the database at `path` again.
fn reopen(store: JobStore, path: &Path) -> JobStore {
    drop(store);
    // The writer thread lets go of the database once its queue closes.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match JobStore::open(path, Duration::ZERO) {
            Ok(store) => return store,
            Err(e) => assert!(Instant::now() < deadline, "reopen: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn record(id: &str) -> JobRecord {
    crate::store::durable::job_record(&crate::scheduler::tests::job(id, 2, 1))
}

#[test]
fn a_jobs_idempotency_key_is_stored_with_it_and_comes_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let spec = Digest::of(b"{\"module\":\"m\"}");
    store
        .put_job(&record("keyed"), Some(("retry-1", &spec)))
        .unwrap();
    store.put_job(&record("plain"), None).unwrap();
    store.refuse_jobs.store(true, Ordering::Relaxed);
    let other = Digest::of(b"other");
    store
        .put_job(&record("refused"), Some(("retry-2", &other)))
        .unwrap_err();
    store.refuse_jobs.store(false, Ordering::Relaxed);

    let store = reopen(store, &path);
    let Stored { jobs, keys } = store.load().unwrap();
    let mut ids: Vec<&str> = jobs.iter().map(|j| j.job.def.id.0.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["keyed", "plain"]);
    assert_eq!(
        keys,
        [StoredKey {
            key: "retry-1".into(),
            spec,
            job: JobId("keyed".into()),
        }],
        "the refused job's key is not stored either"
    );
}

#[test]
fn a_data_dir_written_before_the_key_table_opens_with_no_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    // The tables as the Flint before idempotency keys wrote them, with one job.
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let bytes = postcard::to_stdvec(&record("old")).unwrap();
        txn.open_table(JOBS)
            .unwrap()
            .insert("old", bytes.as_slice())
            .unwrap();
        txn.open_table(JOB_ENDS).unwrap();
        txn.open_table(TASK_END_BATCHES).unwrap();
        txn.commit().unwrap();
    }
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let Stored { jobs, keys } = store.load().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].job.def.id, JobId("old".into()));
    assert!(keys.is_empty());

    // The table is there now: keys go in, and one naming no stored job is not loaded.
    let spec = Digest::of(b"spec");
    store.put_job(&record("new"), Some(("k", &spec))).unwrap();
    let txn = store.db.begin_write().unwrap();
    txn.open_table(IDEMPOTENCY_KEYS)
        .unwrap()
        .insert("stale", (&spec.0, "gone"))
        .unwrap();
    txn.commit().unwrap();
    let keys = reopen(store, &path).load().unwrap().keys;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!((keys[0].key.as_str(), &keys[0].job.0[..]), ("k", "new"));
}

#[test]
fn ends_within_the_commit_interval_share_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = JobStore::open(&dir.path().join("jobs.redb"), Duration::from_secs(3)).unwrap();
    let new = crate::scheduler::tests::job("j", 20, 1);
    store
        .put_job(&crate::store::durable::job_record(&new), None)
        .unwrap();
    let job = JobId("j".into());
    // 20 ends over about 100 ms, far less than the interval: the first is committed
    // at once, the other 19 wait for the interval to pass and go in one commit.
    for index in 0..20 {
        store.task_ended(job.clone(), index, end(1, 1));
        std::thread::sleep(Duration::from_millis(5));
    }
    let stored = load_until(&store, |s| s[0].tasks.len() == 20);
    assert_eq!(stored[0].tasks.len(), 20);
    assert_eq!(
        store.commits(),
        2,
        "one commit for the first end, one for the rest"
    );
}

#[test]
fn a_flush_commits_at_once_whatever_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let store = JobStore::open(&dir.path().join("jobs.redb"), Duration::from_secs(3600)).unwrap();
    let new = crate::scheduler::tests::job("j", 3, 1);
    store
        .put_job(&crate::store::durable::job_record(&new), None)
        .unwrap();
    let job = JobId("j".into());
    store.task_ended(job.clone(), 0, end(1, 1));
    // The first end is committed at once; the next two would wait an hour.
    load_until(&store, |s| s[0].tasks.len() == 1);
    store.task_ended(job.clone(), 1, end(1, 1));
    store.task_ended(job.clone(), 2, end(1, 1));
    let started = Instant::now();
    store.flush();
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(store.load().unwrap().jobs[0].tasks.len(), 3, "flushed");
}

#[test]
fn task_ends_come_back_after_a_reopen_latest_first_and_split_when_large() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let new = crate::scheduler::tests::job("j", 4, 1);
    store
        .put_job(&crate::store::durable::job_record(&new), None)
        .unwrap();
    let job = JobId("j".into());
    // 700 KiB results: two of them pass BATCH_VALUE_BYTES, so the commit splits.
    for index in 0..3 {
        store.task_ended(job.clone(), index, end(1, 700 << 10));
    }
    store.task_ended(job.clone(), 0, end(2, 3));
    store.job_ended(
        job.clone(),
        JobEndRecord {
            state: JobState::Succeeded,
            finished_at_ms: 5,
            error: None,
        },
    );
    load_until(&store, |s| s[0].end.is_some());
    let store = reopen(store, &path);
    let stored = store.load().unwrap().jobs;
    assert_eq!(stored.len(), 1);
    let indices: Vec<u32> = stored[0].tasks.iter().map(|(i, _)| *i).collect();
    assert_eq!(indices, [0, 1, 2], "by index, once each");
    assert_eq!(
        stored[0].tasks[0].1,
        end(2, 3),
        "the later end of task 0 wins"
    );
    assert_eq!(stored[0].tasks[2].1, end(1, 700 << 10));
    // New ends after a reopen go after the old ones, not over them.
    store.task_ended(job.clone(), 3, end(1, 1));
    let stored = load_until(&store, |s| s[0].tasks.len() == 4);
    assert_eq!(stored[0].tasks[1].1, end(1, 700 << 10));
}
