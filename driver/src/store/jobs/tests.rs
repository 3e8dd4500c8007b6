//! The job store on a real redb file: round trips, group commits, reopening.

use std::time::Instant;

use flint_protocol::TaskResult;
use flint_protocol::api::{JobState, TaskState};
use redb::TableDefinition;

use super::rows::queued_summary;
use super::schema::*;
use super::*;

pub(super) mod egress;

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

/// Waits for the writer thread's group commits to show `ready` of job `id`.
fn load_until(store: &JobStore, id: &str, ready: impl Fn(&StoredJob) -> bool) -> StoredJob {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stored = store.job(&JobId(id.into())).unwrap().expect("stored");
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
        .put_job(&record("keyed"), &[], Some(("retry-1", &spec)))
        .unwrap();
    store.put_job(&record("plain"), &[], None).unwrap();
    store.refuse_jobs.store(true, Ordering::Relaxed);
    let other = Digest::of(b"other");
    store
        .put_job(&record("refused"), &[], Some(("retry-2", &other)))
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
        txn.open_table(migrate::TASK_ENDS_V4).unwrap();
        txn.commit().unwrap();
    }
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let Stored { jobs, keys } = store.load().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].job.def.id, JobId("old".into()));
    assert!(keys.is_empty());

    // The table is there now: keys go in, and one naming no stored job is not loaded.
    let spec = Digest::of(b"spec");
    store
        .put_job(&record("new"), &[], Some(("k", &spec)))
        .unwrap();
    let db = store.db.get().unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(IDEMPOTENCY_KEYS)
        .unwrap()
        .insert("stale", (&spec.0, "gone"))
        .unwrap();
    txn.commit().unwrap();
    drop(db);
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
        .put_job(&crate::store::durable::job_record(&new), &[], None)
        .unwrap();
    let job = JobId("j".into());
    // 20 ends over about 100 ms, far less than the interval: the first is committed
    // at once, the other 19 wait for the interval to pass and go in one commit.
    for index in 0..20 {
        store.task_ended(job.clone(), index, end(1, 1));
        std::thread::sleep(Duration::from_millis(5));
    }
    let stored = load_until(&store, "j", |s| s.tasks.len() == 20);
    assert_eq!(stored.tasks.len(), 20);
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
        .put_job(&crate::store::durable::job_record(&new), &[], None)
        .unwrap();
    let job = JobId("j".into());
    store.task_ended(job.clone(), 0, end(1, 1));
    // The first end is committed at once; the next two would wait an hour.
    load_until(&store, "j", |s| s.tasks.len() == 1);
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
        .put_job(&crate::store::durable::job_record(&new), &[], None)
        .unwrap();
    let job = JobId("j".into());
    // 700 KiB results: two of them pass BATCH_VALUE_BYTES, so the commit splits.
    for index in 0..3 {
        store.task_ended(job.clone(), index, end(1, 700 << 10));
    }
    store.task_ended(job.clone(), 0, end(2, 3));
    store.flush();
    let store = reopen(store, &path);
    let stored = store.load().unwrap().jobs;
    assert_eq!(stored.len(), 1, "live, so loaded");
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
    let stored = load_until(&store, "j", |s| s.tasks.len() == 4);
    assert_eq!(stored.tasks[1].1, end(1, 700 << 10));
    assert_eq!(stored.tasks[0].1, end(2, 3));
}

fn job_end(state: JobState, finished_at_ms: u64) -> JobEndRecord {
    JobEndRecord {
        state,
        finished_at_ms,
        error: None,
    }
}

/// A summary as the service makes it at a job's end.
fn final_summary(record: &JobRecord, state: JobState, finished_at_ms: u64) -> JobSummaryRecord {
    let mut summary = queued_summary(record);
    summary.state = state;
    summary.finished_at_ms = Some(finished_at_ms);
    summary.counts.succeeded = summary.counts.pending;
    summary.counts.pending = 0;
    summary
}

/// A record of a job named `name`, created at `created`.
fn record_at(id: &str, name: &str, created: u64) -> JobRecord {
    let mut record = record(id);
    record.def.name = name.into();
    record.def.created_at_ms = created;
    record
}

#[test]
fn a_finished_job_is_not_loaded_at_start_but_read_when_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let done = record_at("done", "a", 1);
    store.put_job(&done, &[], None).unwrap();
    store
        .put_job(&record_at("live", "a", 2), &[], None)
        .unwrap();
    let id = JobId("done".into());
    store.task_ended(id.clone(), 0, end(1, 1));
    store.task_ended(id.clone(), 1, end(1, 2));
    let write = store.job_ended(
        id.clone(),
        job_end(JobState::Succeeded, 10),
        final_summary(&done, JobState::Succeeded, 10),
    );
    store.flush();
    assert!(store.is_durable(write));
    let store = reopen(store, &path);
    let live: Vec<String> = store
        .load()
        .unwrap()
        .jobs
        .iter()
        .map(|j| j.job.def.id.0.clone())
        .collect();
    assert_eq!(live, ["live"]);
    let stored = store.job(&id).unwrap().unwrap();
    assert_eq!(stored.tasks.len(), 2);
    assert_eq!(stored.end.unwrap().state, JobState::Succeeded);
    let totals = store.totals().unwrap();
    assert_eq!(totals.jobs[state_code(JobState::Succeeded) as usize], 1);
    assert_eq!(totals.tasks.succeeded, 2);
    assert_eq!(
        store.finished_before(11, 10).unwrap(),
        std::slice::from_ref(&id)
    );
    assert!(
        store.finished_before(10, 10).unwrap().is_empty(),
        "ended at 10, not before"
    );
}

#[test]
fn deleting_a_job_leaves_nothing_of_it_in_any_table() {
    let dir = tempfile::tempdir().unwrap();
    let store = JobStore::open(&dir.path().join("jobs.redb"), Duration::ZERO).unwrap();
    let mut gone = record_at("gone", "n", 1);
    gone.def.options.exact_accounting = true;
    gone.def.owner = flint_protocol::records::Owner {
        tenant: Some("team".into()),
        priority: 3,
    };
    gone.def.network = Some(egress::grant());
    let spec = Digest::of(b"spec");
    store.put_job(&gone, &[], Some(("key-1", &spec))).unwrap();
    store
        .put_job(&record_at("kept", "n", 2), &[], None)
        .unwrap();
    let id = JobId("gone".into());
    for index in 0..2 {
        store.task_ended(id.clone(), index, end(1, 10));
    }
    store.job_ended(
        id.clone(),
        job_end(JobState::Succeeded, 5),
        final_summary(&gone, JobState::Succeeded, 5),
    );
    store.attempts_ended(id.clone(), vec![attempt(0, 1)]);
    store.memo_found(Digest::of(b"a task's key"), id.clone(), 1);
    store.flush();
    assert!(store.attempts(&id).unwrap().is_some());
    assert!(store.memo(&Digest::of(b"a task's key")).unwrap().is_some());
    {
        // Each side table had a row of it, or finding none after would prove nothing.
        let txn = store.db.get().unwrap().begin_read().unwrap();
        for side in [
            "job_options.v1",
            "job_owners.v1",
            "job_network.v1",
            "job_attempts.v3",
        ] {
            assert!(names_gone(&txn, side), "{side} had no row of the job");
        }
    }
    let deleted = store.delete_job(&id).unwrap().expect("it was there");
    assert_eq!(deleted.key.as_deref(), Some("key-1"));
    assert!(store.delete_job(&id).unwrap().is_none(), "once");
    assert!(store.job(&id).unwrap().is_none());
    // Every table, read whole: no key or value names the job.
    let db = store.db.get().unwrap();
    let txn = db.begin_read().unwrap();
    for table in txn.list_tables().unwrap() {
        let name = table.name().to_owned();
        assert!(
            !names_gone(&txn, &name),
            "{name} still names the deleted job"
        );
    }
    assert!(store.job(&JobId("kept".into())).unwrap().is_some());
}

/// Whether table `name` holds a key or value naming the job `gone`.
fn names_gone(txn: &redb::ReadTransaction, name: &str) -> bool {
    match name {
        "jobs.v3" | "job_ends.v3" | "job_summaries.v1" | "job_attempts.v1" | "job_attempts.v2"
        | "job_attempts.v3" | "job_options.v1" | "job_owners.v1" | "job_network.v1" => txn
            .open_table(TableDefinition::<&str, &[u8]>::new(name))
            .unwrap()
            .get("gone")
            .unwrap()
            .is_some(),
        "job_keys.v1" => txn
            .open_table(JOB_KEYS)
            .unwrap()
            .get("gone")
            .unwrap()
            .is_some(),
        "task_ends.v5" => txn
            .open_table(TASK_ENDS)
            .unwrap()
            .range(("gone", 0)..=("gone", u64::MAX))
            .unwrap()
            .next()
            .is_some(),
        "jobs_by_created.v1" | "jobs_by_finished.v1" => {
            let t = txn
                .open_table(TableDefinition::<(u64, &str), ()>::new(name))
                .unwrap();
            t.iter().unwrap().any(|e| e.unwrap().0.value().1 == "gone")
        }
        "jobs_by_state.v1" => txn
            .open_table(BY_STATE)
            .unwrap()
            .iter()
            .unwrap()
            .any(|e| e.unwrap().0.value().2 == "gone"),
        "jobs_by_name.v1" => txn
            .open_table(BY_NAME)
            .unwrap()
            .iter()
            .unwrap()
            .any(|e| e.unwrap().0.value().2 == "gone"),
        "idempotency_keys.v1" => txn
            .open_table(IDEMPOTENCY_KEYS)
            .unwrap()
            .iter()
            .unwrap()
            .any(|e| e.unwrap().1.value().1 == "gone"),
        "memo.v1" => txn
            .open_table(MEMO)
            .unwrap()
            .iter()
            .unwrap()
            .any(|e| e.unwrap().1.value().0 == "gone"),
        "memo_by_job.v1" => txn
            .open_table(MEMO_BY_JOB)
            .unwrap()
            .range(("gone", 0)..=("gone", u32::MAX))
            .unwrap()
            .next()
            .is_some(),
        // A graph's record names its jobs by id (a job deleted alone shows as deleted
        // in its graph); this job is in none.
        "graphs.v1" => txn.open_table(GRAPHS).unwrap().iter().unwrap().any(|e| {
            let record: flint_protocol::records::GraphRecord =
                postcard::from_bytes(e.unwrap().1.value()).unwrap();
            record.jobs.iter().any(|(_, job)| job.0 == "gone")
        }),
        // Executors are not a job's: nothing of a job is kept there.
        "blob_refs.v1" | "upload_owners.v1" | "meta" | "executors.v1" => false,
        other => panic!("a table this test does not know: {other}; teach it to look there"),
    }
}

#[test]
fn listing_uses_the_indexes_newest_first_with_filters_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let store = JobStore::open(&dir.path().join("jobs.redb"), Duration::ZERO).unwrap();
    // Ten jobs, created at 10, 20, ... 100; names alternate; the odd ones failed.
    for i in 1..=10u64 {
        let name = if i % 2 == 0 { "even" } else { "odd" };
        let id = format!("j{i:02}");
        let record = record_at(&id, name, i * 10);
        store.put_job(&record, &[], None).unwrap();
        let state = if i % 2 == 0 {
            JobState::Succeeded
        } else {
            JobState::Failed
        };
        if i != 10 {
            store.job_ended(
                JobId(id.clone()),
                job_end(state, i * 10 + 1),
                final_summary(&record, state, i * 10 + 1),
            );
        }
    }
    store.flush();
    let ids = |page: &JobPage| {
        page.items
            .iter()
            .map(|(id, _)| id.0.clone())
            .collect::<Vec<_>>()
    };
    let all = store.list(&JobFilter::default(), None, 100).unwrap();
    assert_eq!(
        ids(&all),
        [
            "j10", "j09", "j08", "j07", "j06", "j05", "j04", "j03", "j02", "j01"
        ]
    );
    assert!(!all.more);
    let failed = JobFilter {
        state: Some(JobState::Failed),
        ..JobFilter::default()
    };
    assert_eq!(
        ids(&store.list(&failed, None, 100).unwrap()),
        ["j09", "j07", "j05", "j03", "j01"]
    );
    let even = JobFilter {
        name: Some("even".into()),
        ..JobFilter::default()
    };
    assert_eq!(
        ids(&store.list(&even, None, 100).unwrap()),
        ["j10", "j08", "j06", "j04", "j02"]
    );
    let window = JobFilter {
        created_after: Some(30),
        created_before: Some(70),
        ..JobFilter::default()
    };
    assert_eq!(
        ids(&store.list(&window, None, 100).unwrap()),
        ["j06", "j05", "j04", "j03"]
    );
    let even_in_window = JobFilter {
        name: Some("even".into()),
        ..window.clone()
    };
    assert_eq!(
        ids(&store.list(&even_in_window, None, 100).unwrap()),
        ["j06", "j04"]
    );
    // The live job is under `queued` until it ends.
    let queued = JobFilter {
        state: Some(JobState::Queued),
        ..JobFilter::default()
    };
    assert_eq!(ids(&store.list(&queued, None, 100).unwrap()), ["j10"]);
    // Pages of 3, each after the last of the one before.
    let mut seen = Vec::new();
    let mut before: Option<(u64, String)> = None;
    loop {
        let page = store
            .list(
                &JobFilter::default(),
                before.as_ref().map(|(t, id)| (*t, id.as_str())),
                3,
            )
            .unwrap();
        seen.extend(ids(&page));
        let Some((id, summary)) = page.items.last() else {
            break;
        };
        if !page.more {
            break;
        }
        before = Some((summary.created_at_ms, id.0.clone()));
    }
    assert_eq!(seen, ids(&all));
    // A cursor past `created_before` changes nothing; one before it bounds the page.
    let page = store.list(&window, Some((50, "j05")), 100).unwrap();
    assert_eq!(ids(&page), ["j04", "j03"]);
}

#[test]
fn blob_refs_count_the_stored_jobs_that_name_an_upload() {
    let dir = tempfile::tempdir().unwrap();
    let store = JobStore::open(&dir.path().join("jobs.redb"), Duration::ZERO).unwrap();
    let mut a = record_at("a", "n", 1);
    let digest = Digest::of(b"module");
    a.def.module = flint_protocol::ModuleRef {
        digest: Some(digest),
        url: "http://driver/v1/modules/x".into(),
        timestamp_ms: 1,
        size: Some(6),
    };
    let mut b = a.clone();
    b.def.id = JobId("b".into());
    store.put_job(&a, &[], None).unwrap();
    store.put_job(&b, &[], None).unwrap();
    assert_eq!(store.blob_refs(&digest, false).unwrap(), 2);
    assert_eq!(
        store.blob_refs(&digest, true).unwrap(),
        0,
        "a module, not a file"
    );
    store.delete_job(&a.def.id).unwrap();
    assert_eq!(store.blob_refs(&digest, false).unwrap(), 1);
    store.delete_job(&b.def.id).unwrap();
    assert_eq!(store.blob_refs(&digest, false).unwrap(), 0);
}

/// The data dir the release before this one wrote (`scripts/make-store-fixture`).
fn layout4_fixture() -> (tempfile::TempDir, std::path::PathBuf, Vec<(String, String)>) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data-dir-layout4");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    std::fs::copy(fixture.join("jobs.redb"), &path).unwrap();
    let jobs = std::fs::read_to_string(fixture.join("JOBS"))
        .unwrap()
        .lines()
        .map(|l| {
            let (what, id) = l.split_once('=').unwrap();
            (what.to_owned(), id.to_owned())
        })
        .collect();
    (dir, path, jobs)
}

#[test]
fn a_layout_4_data_dir_migrates_in_chunks_and_serves_every_job() {
    let (_dir, path, jobs) = layout4_fixture();
    {
        let db = Database::create(&path).unwrap();
        // One value or job per transaction: every step runs more than once.
        migrate::run(&db, &migrate::Hooks::chunks_of(1)).unwrap();
    }
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let id = |what: &str| JobId(jobs.iter().find(|(w, _)| w == what).unwrap().1.clone());
    let live: Vec<JobId> = store
        .load()
        .unwrap()
        .jobs
        .iter()
        .map(|j| j.job.def.id.clone())
        .collect();
    assert_eq!(live, [id("queued")]);
    let keys = store.load().unwrap().keys;
    assert_eq!(keys.len(), 1);
    assert_eq!(
        (keys[0].key.as_str(), &keys[0].job),
        ("fixture-a", &id("idempotent"))
    );
    let a = store.job(&id("idempotent")).unwrap().unwrap();
    assert_eq!(a.tasks.len(), 3);
    assert!(a.tasks.iter().all(|(_, t)| t.state == TaskState::Succeeded));
    assert_eq!(a.end.unwrap().state, JobState::Succeeded);
    let summary = store.summary(&id("failed")).unwrap().unwrap();
    assert_eq!(
        (summary.state, summary.counts.failed),
        (JobState::Failed, 1)
    );
    let summary = store.summary(&id("killed")).unwrap().unwrap();
    assert_eq!(
        (summary.state, summary.counts.killed),
        (JobState::Killed, 1)
    );
    let block = store.job(&id("block")).unwrap().unwrap();
    assert!(matches!(
        block.tasks[0].1.result,
        Some(TaskResult::Block(_))
    ));
    let listed = store.list(&JobFilter::default(), None, 100).unwrap();
    assert_eq!(listed.items.len(), 6);
    // Deleting a migrated job frees its key: the job -> key table was filled.
    assert_eq!(
        store
            .delete_job(&id("idempotent"))
            .unwrap()
            .unwrap()
            .key
            .as_deref(),
        Some("fixture-a")
    );
    // New ends after the migration do not land on migrated sequence numbers.
    store.task_ended(id("queued"), 0, end(1, 1));
    store.flush();
    assert_eq!(store.job(&id("queued")).unwrap().unwrap().tasks.len(), 1);
    assert_eq!(store.job(&id("block")).unwrap().unwrap().tasks.len(), 1);
}

#[test]
fn a_migration_stopped_midway_is_finished_by_the_next_open() {
    let (_dir, path, jobs) = layout4_fixture();
    {
        let db = Database::create(&path).unwrap();
        let values = || {
            let txn = db.begin_read().unwrap();
            txn.open_table(migrate::TASK_ENDS_V4)
                .unwrap()
                .len()
                .unwrap()
        };
        let before = values();
        assert!(
            before >= 2,
            "the fixture has several task-end values ({before})"
        );
        // Step 1 for one value only, as if the process had died after that commit.
        migrate::move_some(&db, 1).unwrap();
        assert_eq!(values(), before - 1);
    }
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    assert_eq!(
        store
            .list(&JobFilter::default(), None, 100)
            .unwrap()
            .items
            .len(),
        jobs.len()
    );
    let db = store.db.get().unwrap();
    let txn = db.begin_read().unwrap();
    let tables: Vec<String> = txn
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_owned())
        .collect();
    assert!(!tables.contains(&"task_ends.v4".to_owned()), "{tables:?}");
    let ends: usize = jobs
        .iter()
        .map(|(_, id)| store.job(&JobId(id.clone())).unwrap().unwrap().tasks.len())
        .sum();
    // 3 echo tasks, the failed one, the block and the reduce; the killed task and the
    // queued ones never ended.
    assert_eq!(ends, 3 + 1 + 1 + 1, "every task end of the fixture, once");
}

#[test]
fn after_a_failed_write_the_store_reopens_its_file_and_takes_writes_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = JobStore::open(&dir.path().join("jobs.redb"), Duration::ZERO).unwrap();
    store.put_job(&record("before"), &[], None).unwrap();
    let old = Arc::as_ptr(&store.db.get().unwrap());
    store.db.reopen().unwrap();
    assert_ne!(Arc::as_ptr(&store.db.get().unwrap()), old, "a new handle");
    // Writes and reads go on, by callers and the writer thread alike.
    store.put_job(&record("after"), &[], None).unwrap();
    store.task_ended(JobId("after".into()), 0, end(1, 1));
    store.flush();
    assert_eq!(
        store
            .job(&JobId("after".into()))
            .unwrap()
            .unwrap()
            .tasks
            .len(),
        1
    );
    assert!(store.job(&JobId("before".into())).unwrap().is_some());
    assert!(handle::Handle::needs_reopen(&StoreError::Db(
        "Previous I/O error occurred. Please close and re-open the database.".into()
    )));
    assert!(handle::Handle::needs_reopen(&StoreError::Full(
        "No space left on device".into()
    )));
}

fn attempt(task: u32, attempt: u32) -> AttemptRecord {
    AttemptRecord {
        task,
        attempt,
        executor: flint_protocol::ExecutorId("exec-1".into()),
        start_us: 10,
        end_us: Some(20),
        outcome: Some(flint_protocol::records::AttemptOutcome::Succeeded),
        speculative: attempt > 1,
        memory_mb: 128 * attempt,
        timeout_ms: 1_000,
        usage: Some(flint_protocol::Usage {
            cpu_us: u64::from(task),
            fuel: (attempt > 1).then_some(5),
            ..Default::default()
        }),
        pins: (task == 1).then(|| flint_protocol::Pins {
            module: Digest::of(b"m"),
            files: vec![Digest::of(b"f")],
            input: Digest::of(b"i"),
            egress: Vec::new(),
            egress_tape: None,
        }),
    }
}

#[test]
fn a_finished_jobs_attempts_come_back_after_a_reopen_and_none_for_a_job_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    store
        .put_job(&record_at("done", "a", 1), &[], None)
        .unwrap();
    let id = JobId("done".into());
    assert_eq!(store.attempts(&id).unwrap(), None, "none before its end");
    let attempts = vec![attempt(0, 1), attempt(1, 1), attempt(1, 2)];
    store.attempts_ended(id.clone(), attempts.clone());
    // A job deleted (or never stored) before the write is committed gets no timeline:
    // nothing would ever delete it.
    let never = JobId("never-stored".into());
    let write = store.attempts_ended(never.clone(), vec![attempt(0, 1)]);
    store.flush();
    assert!(store.is_durable(write));
    let store = reopen(store, &path);
    assert_eq!(store.attempts(&id).unwrap(), Some(attempts));
    assert_eq!(store.attempts(&never).unwrap(), None);
}

#[test]
fn a_jobs_options_are_stored_beside_it_and_a_job_without_any_has_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let mut asked = record_at("asked", "a", 1);
    asked.def.options = flint_protocol::records::JobOptions {
        exact_accounting: true,
        escalate: Some(flint_protocol::records::Escalation {
            memory: 2.0,
            timeout: 1.0,
            max_memory_mb: 1024,
            max_timeout_ms: 60_000,
        }),
        determinism: Some(flint_protocol::Determinism { seed: 7 }),
        memoize: true,
        memoized: vec![(1, JobId("earlier".into()), 3)],
    };
    store.put_job(&asked, &[], None).unwrap();
    store
        .put_job(&record_at("plain", "a", 2), &[], None)
        .unwrap();
    let store = reopen(store, &path);
    let job = |id: &str| store.job(&JobId(id.into())).unwrap().unwrap().job;
    assert_eq!(job("asked").def.options, asked.def.options);
    assert!(job("plain").def.options.is_default());
    // A live job comes back with them at start too (the scheduler escalates from them).
    let loaded = store.load().unwrap().jobs;
    let asked_loaded = loaded.iter().find(|j| j.job.def.id.0 == "asked").unwrap();
    assert_eq!(asked_loaded.job.def.options, asked.def.options);
    let txn = store.db.get().unwrap().begin_read().unwrap();
    let options = txn.open_table(JOB_OPTIONS).unwrap();
    assert!(
        options.get("plain").unwrap().is_none(),
        "no row for the defaults"
    );
}

#[test]
fn attempts_stored_before_usage_was_kept_are_read_from_the_old_table_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    store.put_job(&record_at("old", "a", 1), &[], None).unwrap();
    let old = vec![flint_protocol::records::AttemptRecordV1 {
        task: 0,
        attempt: 1,
        executor: flint_protocol::ExecutorId("exec-1".into()),
        start_us: 10,
        end_us: Some(20),
        outcome: Some(flint_protocol::records::AttemptOutcome::Succeeded),
        speculative: false,
    }];
    {
        let db = store.db.get().unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(JOB_ATTEMPTS_V1)
            .unwrap()
            .insert("old", postcard::to_stdvec(&old).unwrap().as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let read = store.attempts(&JobId("old".into())).unwrap().unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!((read[0].task, read[0].end_us), (0, Some(20)));
    assert_eq!((read[0].memory_mb, read[0].usage), (0, None));
    // Deleting the job takes the old row too.
    store.delete_job(&JobId("old".into())).unwrap().unwrap();
    assert_eq!(store.attempts(&JobId("old".into())).unwrap(), None);
}

#[test]
fn a_memo_entry_is_the_first_stored_computation_and_goes_with_its_job() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    store
        .put_job(&record_at("first", "a", 1), &[], None)
        .unwrap();
    store
        .put_job(&record_at("second", "a", 2), &[], None)
        .unwrap();
    let (key, other) = (Digest::of(b"key"), Digest::of(b"other"));
    store.memo_found(key, JobId("first".into()), 0);
    store.memo_found(key, JobId("second".into()), 4);
    store.memo_found(other, JobId("second".into()), 5);
    store.flush();
    let store = reopen(store, &path);
    assert_eq!(
        store.memo(&key).unwrap(),
        Some((JobId("first".into()), 0)),
        "the first keeps it"
    );
    assert_eq!(store.memo(&Digest::of(b"unknown")).unwrap(), None);
    // Deleting the holder frees its keys for the next computation, and nothing else.
    store.delete_job(&JobId("first".into())).unwrap().unwrap();
    assert_eq!(store.memo(&key).unwrap(), None);
    assert_eq!(
        store.memo(&other).unwrap(),
        Some((JobId("second".into()), 5))
    );
    store.memo_found(key, JobId("second".into()), 4);
    store.flush();
    assert_eq!(store.memo(&key).unwrap(), Some((JobId("second".into()), 4)));
    // An entry whose job was never stored (or is gone) gives way.
    let orphan = Digest::of(b"orphan");
    store.memo_found(orphan, JobId("never-stored".into()), 0);
    store.flush();
    store.memo_found(orphan, JobId("second".into()), 6);
    store.flush();
    assert_eq!(
        store.memo(&orphan).unwrap(),
        Some((JobId("second".into()), 6))
    );
    store.delete_job(&JobId("second".into())).unwrap().unwrap();
    assert_eq!(store.memo(&orphan).unwrap(), None);
}

#[test]
fn a_jobs_owner_comes_back_with_it_and_listings_by_owner_see_only_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let owned = |id: &str, created: u64, tenant: Option<&str>| {
        let mut r = record_at(id, "n", created);
        r.def.owner = flint_protocol::records::Owner {
            tenant: tenant.map(str::to_owned),
            priority: 0,
        };
        r
    };
    store
        .put_job(&owned("a1", 1, Some("a")), &[], None)
        .unwrap();
    store
        .put_job(&owned("b1", 2, Some("b")), &[], None)
        .unwrap();
    store.put_job(&owned("admin1", 3, None), &[], None).unwrap();
    store
        .put_job(&owned("a2", 4, Some("a")), &[], None)
        .unwrap();
    let store = reopen(store, &path);
    let a1 = store.job(&JobId("a1".into())).unwrap().unwrap();
    assert_eq!(a1.job.def.owner.tenant.as_deref(), Some("a"));
    let ids =
        |page: &JobPage| -> Vec<String> { page.items.iter().map(|(id, _)| id.0.clone()).collect() };
    let list = |owner: Option<OwnerFilter>| {
        let filter = JobFilter {
            owner,
            ..JobFilter::default()
        };
        ids(&store.list(&filter, None, 100).unwrap())
    };
    assert_eq!(list(Some(OwnerFilter(Some("a".into())))), ["a2", "a1"]);
    assert_eq!(list(Some(OwnerFilter(Some("b".into())))), ["b1"]);
    assert_eq!(list(Some(OwnerFilter(None))), ["admin1"]);
    assert_eq!(
        list(Some(OwnerFilter(Some("c".into())))),
        Vec::<String>::new()
    );
    assert_eq!(list(None).len(), 4);
    // A page of one tenant's jobs says whether there is more of that tenant's only.
    let filter = JobFilter {
        owner: Some(OwnerFilter(Some("b".into()))),
        ..JobFilter::default()
    };
    assert!(!store.list(&filter, None, 1).unwrap().more);
}

#[test]
fn upload_owners_are_kept_across_a_reopen_and_forgotten_with_the_blob() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let m = Digest::of(b"module");
    store.add_upload_owner(&m, false, "a").unwrap();
    store.add_upload_owner(&m, false, "b").unwrap();
    store.add_upload_owner(&m, true, SHARED).unwrap();
    let store = reopen(store, &path);
    let mut rows = store.upload_owners().unwrap();
    rows.sort();
    let key = |files| blob_key(&m, files);
    assert_eq!(
        rows,
        [
            (key(true), SHARED.to_owned()),
            (key(false), "a".to_owned()),
            (key(false), "b".to_owned()),
        ]
    );
    store.remove_upload_owners(&m, false).unwrap();
    assert_eq!(
        store.upload_owners().unwrap(),
        [(key(true), SHARED.to_owned())]
    );
}

impl JobStore {
    /// The tables that hold a row of `job` (its task ends, memo entries, timeline),
    /// committed so far: for tests that a job never stored left nothing behind.
    pub(crate) fn rows_of(&self, job: &JobId) -> Vec<&'static str> {
        let txn = self.db.get().unwrap().begin_read().unwrap();
        let id = job.0.as_str();
        let mut rows = Vec::new();
        let ends = txn.open_table(TASK_ENDS).unwrap();
        if ends
            .range((id, 0)..=(id, u64::MAX))
            .unwrap()
            .next()
            .is_some()
        {
            rows.push("task_ends");
        }
        let by_job = txn.open_table(MEMO_BY_JOB).unwrap();
        if by_job
            .range((id, 0)..=(id, u32::MAX))
            .unwrap()
            .next()
            .is_some()
        {
            rows.push("memo_by_job");
        }
        let memo = txn.open_table(MEMO).unwrap();
        if memo.iter().unwrap().any(|e| e.unwrap().1.value().0 == id) {
            rows.push("memo");
        }
        if txn
            .open_table(JOB_ATTEMPTS)
            .unwrap()
            .get(id)
            .unwrap()
            .is_some()
        {
            rows.push("job_attempts");
        }
        rows
    }
}

/// Task ends, memo entries and timelines of a job the database does not hold (never
/// stored, or deleted meanwhile) would outlive it: nothing would ever delete them.
#[test]
fn ends_memo_entries_and_timelines_of_a_job_never_stored_are_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    store.put_job(&record("stored"), &[], None).unwrap();
    for id in ["stored", "never-stored"] {
        let job = JobId(id.into());
        store.task_ended(job.clone(), 0, end(1, 1));
        store.memo_found(Digest::of(id.as_bytes()), job.clone(), 0);
        store.attempts_ended(job, vec![attempt(0, 1)]);
    }
    store.flush();
    let store = reopen(store, &path);
    assert_eq!(
        store.rows_of(&JobId("stored".into())),
        ["task_ends", "memo_by_job", "memo", "job_attempts"]
    );
    assert!(store.rows_of(&JobId("never-stored".into())).is_empty());
}

#[test]
fn a_graph_is_stored_with_its_jobs_and_key_or_not_at_all_and_its_key_leaves_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let graph = |id: &str, jobs: &[&str]| flint_protocol::records::GraphRecord {
        id: id.into(),
        created_at_ms: 1,
        tenant: None,
        jobs: jobs
            .iter()
            .map(|j| (j.to_string(), JobId(j.to_string())))
            .collect(),
        edges: vec![(0, 1)],
        recovered_from: None,
    };
    let spec = Digest::of(b"graph spec");
    // A disk that refuses: neither the graph, nor any of its jobs, nor its key.
    store.refuse_jobs.store(true, Ordering::Relaxed);
    let refused = [(record("r1"), vec![]), (record("r2"), vec![])];
    store
        .put_graph(
            &graph("graph-r", &["r1", "r2"]),
            &refused,
            Some(("k-r", &spec)),
        )
        .unwrap_err();
    store.refuse_jobs.store(false, Ordering::Relaxed);
    let jobs = [(record("a"), vec![]), (record("b"), vec![])];
    store
        .put_graph(&graph("graph-1", &["a", "b"]), &jobs, Some(("k-1", &spec)))
        .unwrap();

    let store = reopen(store, &path);
    let Stored { jobs, keys } = store.load().unwrap();
    let mut ids: Vec<&str> = jobs.iter().map(|j| j.job.def.id.0.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["a", "b"]);
    assert!(store.graph("graph-r").unwrap().is_none());
    assert_eq!(
        store.graph("graph-1").unwrap(),
        Some(graph("graph-1", &["a", "b"]))
    );
    assert_eq!(
        keys,
        [StoredKey {
            key: "k-1".into(),
            spec,
            job: JobId("graph-1".into()),
        }]
    );
    assert_eq!(
        store.delete_graph("graph-1").unwrap().as_deref(),
        Some("k-1")
    );
    assert!(store.graph("graph-1").unwrap().is_none());
    assert!(store.load().unwrap().keys.is_empty(), "the key is free");
}

#[test]
fn the_executors_known_are_what_registered_and_did_not_leave_and_outlive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let mut durable = store.durable();
    store.executor_known("exec-1", true);
    store.executor_known("exec-2", true);
    store.executor_known("exec-3", true);
    let last = store.executor_known("exec-2", false);
    assert_eq!(store.last_write(), last);
    // The watch says when the commit that holds them has landed.
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(10), durable.wait_for(|at| *at >= last))
                .await
                .expect("the commit lands")
                .unwrap();
        });
    assert!(store.is_durable(last));
    assert_eq!(store.known_executors().unwrap(), ["exec-1", "exec-3"]);
    let store = reopen(store, &path);
    assert_eq!(store.known_executors().unwrap(), ["exec-1", "exec-3"]);
}
