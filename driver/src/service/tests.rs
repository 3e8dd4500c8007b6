//! The service's own behaviour: answering a submit once stored, the advertised URL.

use std::sync::atomic::Ordering;

use flint_protocol::JobId;
use flint_protocol::api::{JobState, TaskState};

use super::*;
use crate::tenants::Caller;

/// A driver on a fresh data dir, listening nowhere.
pub(crate) fn driver() -> (tempfile::TempDir, Arc<Driver>) {
    let dir = tempfile::tempdir().unwrap();
    let driver = Driver::new(
        DriverConfig::new(dir.path().to_owned()),
        "127.0.0.1:7070".parse().unwrap(),
    )
    .unwrap();
    (dir, driver)
}

#[tokio::test]
async fn a_job_is_answered_once_stored_and_one_that_cannot_be_is_killed() {
    let (_dir, driver) = driver();
    driver
        .submit(crate::scheduler::tests::job("kept", 3, 1))
        .await
        .unwrap();
    // Synced to the journal before submit returned (see store::jobs::journal's tests
    // for a crash right then), and in the database from the next group commit.
    driver.jobs.store.flush();
    let stored = driver.jobs.store.load().unwrap().jobs;
    assert_eq!(stored.len(), 1, "stored once submit returned");
    assert_eq!(stored[0].job.def.id, JobId("kept".into()));

    driver.jobs.store.refuse_jobs.store(true, Ordering::Relaxed);
    let err = driver
        .submit(crate::scheduler::tests::job("lost", 3, 1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("No space left"), "{err}");
    // Over, so out of the live jobs; still shown until its end is settled and the
    // cache forgets it (it was never stored).
    assert!(driver.read(|s| !s.jobs.contains_key(&JobId("lost".into()))));
    let (state, error, pending) = driver
        .job(&JobId("lost".into()), |job| {
            (job.state, job.error.clone(), job.counts().pending)
        })
        .unwrap()
        .expect("held in memory");
    assert_eq!(state, JobState::Killed, "never accepted, so stopped");
    let (kind, message) = error.unwrap();
    assert_eq!(kind, "killed");
    assert!(
        message.contains("not accepted: the job store could not record it"),
        "{message}"
    );
    assert_eq!(pending, 0, "nothing of it left to run");
    driver.jobs.store.flush();
    assert_eq!(
        driver.jobs.store.load().unwrap().jobs.len(),
        1,
        "only the first is stored"
    );
}

/// A job can end before its record is committed (a slow disk, a job killed at once):
/// its end waits for the record, and so must its attempts, which the writer would
/// otherwise find no job for and drop, leaving the stored timeline without them.
#[tokio::test]
async fn a_job_that_ends_before_its_record_is_committed_keeps_its_attempts() {
    let (_dir, driver) = driver();
    let id = JobId("early".into());
    driver.jobs.store.hold_jobs.store(true, Ordering::Relaxed);
    let submit = tokio::spawn({
        let driver = driver.clone();
        async move {
            driver
                .submit(crate::scheduler::tests::job("early", 2, 1))
                .await
        }
    });
    while !driver.read(|s| s.jobs.contains_key(&id)) {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    driver.apply(|s| {
        let job = s.jobs.get_mut(&id).unwrap();
        let executor = flint_protocol::ExecutorId("exec-1".into());
        job.open_span(0, &executor, false, std::time::SystemTime::now());
        job.open_span(1, &executor, false, std::time::SystemTime::now());
        let stop = s.stop_job(&id, "killed by a test".into(), std::time::SystemTime::now());
        ((), stop.unwrap_or_default())
    });
    // Whatever was sent so far is committed before the record is: the race as it goes.
    driver.flush_store();
    assert_eq!(
        driver.jobs.store.attempts(&id).unwrap(),
        None,
        "not yet stored"
    );
    driver.jobs.store.hold_jobs.store(false, Ordering::Relaxed);
    submit.await.unwrap().unwrap();
    driver.flush_store();
    let stored = driver.jobs.store.job(&id).unwrap().expect("stored");
    assert!(stored.end.is_some(), "its end stored too");
    let attempts = driver
        .jobs
        .store
        .attempts(&id)
        .unwrap()
        .expect("the attempts stored");
    assert_eq!(
        attempts.iter().map(|a| a.task).collect::<Vec<_>>(),
        [0, 1],
        "both attempts, in launch order"
    );
}

#[test]
fn executors_get_the_advertised_url_or_a_reachable_host() {
    let any = "0.0.0.0:7070".parse().unwrap();
    let local = "127.0.0.1:7070".parse().unwrap();
    let name = || Some("driver-7".to_owned());
    assert_eq!(
        advertised_base(Some("https://flint.example:443/"), any, name),
        "https://flint.example:443"
    );
    assert_eq!(advertised_base(None, any, name), "http://driver-7:7070");
    assert_eq!(
        advertised_base(None, "[::]:9".parse().unwrap(), name),
        "http://driver-7:9"
    );
    assert_eq!(advertised_base(None, local, name), "http://127.0.0.1:7070");
    assert_eq!(advertised_base(None, any, || None), "http://0.0.0.0:7070");
}

/// The smallest WASI command: a type, a function and its `_start` export.
pub(crate) const EMPTY_MODULE: &[u8] = b"\0asm\x01\0\0\0\x01\x04\x01\x60\0\0\x03\x02\x01\0\
    \x07\x0a\x01\x06_start\0\0\x0a\x04\x01\x02\0\x0b";

fn keyed(key: &str) -> Option<IdempotencyKey> {
    Some(key.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_key_makes_one_job_however_many_submit_it_at_once() {
    let (_dir, driver) = driver();
    let (module, _) = driver.uploads.modules.put(EMPTY_MODULE).unwrap();
    let spec = bytes::Bytes::from(format!(
        r#"{{"module": "{module}", "inputs": [{{"text": "a"}}]}}"#
    ));
    let submissions: Vec<_> = (0..20)
        .map(|_| {
            let (driver, spec) = (driver.clone(), spec.clone());
            tokio::spawn(async move { driver.submit_spec(spec, keyed("k"), &Caller::Admin).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for submission in submissions {
        outcomes.push(submission.await.unwrap().unwrap());
    }
    let accepted: Vec<&JobId> = outcomes
        .iter()
        .filter_map(|o| match o {
            Submitted::Accepted(id) => Some(id),
            Submitted::Repeated(_) => None,
        })
        .collect();
    assert_eq!(accepted.len(), 1, "{outcomes:?}");
    let id = accepted[0].clone();
    assert!(outcomes.contains(&Submitted::Repeated(id.clone())));
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Submitted::Accepted(j) | Submitted::Repeated(j) if *j == id))
    );
    assert_eq!(driver.read(|s| s.jobs.len()), 1);
    let stored = driver.jobs.store.load().unwrap();
    assert_eq!(stored.jobs.len(), 1);
    assert_eq!(stored.keys.len(), 1);
    assert_eq!(
        (stored.keys[0].key.as_str(), &stored.keys[0].job),
        ("k", &id)
    );

    let other = bytes::Bytes::from(format!(
        r#"{{"module": "{module}", "inputs": [{{"text": "b"}}]}}"#
    ));
    match driver.submit_spec(other, keyed("k"), &Caller::Admin).await {
        Err(SubmitError::Conflict { key, job }) => assert_eq!((key.as_str(), job), ("k", id)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_key_whose_job_was_refused_or_not_stored_stays_free() {
    let (_dir, driver) = driver();
    let (module, _) = driver.uploads.modules.put(EMPTY_MODULE).unwrap();
    let spec = bytes::Bytes::from(format!(
        r#"{{"module": "{module}", "inputs": [{{"text": "a"}}]}}"#
    ));

    // Refused by admission: the key is free, and forgotten.
    let unknown = bytes::Bytes::from_static(br#"{"module": "sha256:0000000000000000000000000000000000000000000000000000000000000000", "inputs": [{"text": "a"}]}"#);
    let refused = driver
        .submit_spec(unknown, keyed("k"), &Caller::Admin)
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, SubmitError::Rejected(r) if r.code.as_str() == "unknown_module"),
        "{refused:?}"
    );
    let not_json = driver
        .submit_spec(bytes::Bytes::from_static(b"{"), keyed("k"), &Caller::Admin)
        .await;
    assert!(matches!(not_json, Err(SubmitError::Rejected(r)) if r.code.as_str() == "invalid_json"));

    // Not stored: the job is killed where it stands, and the key is free again.
    driver.jobs.store.refuse_jobs.store(true, Ordering::Relaxed);
    let lost = driver
        .submit_spec(spec.clone(), keyed("k"), &Caller::Admin)
        .await
        .unwrap_err();
    assert!(matches!(lost, SubmitError::Storage(_)), "{lost:?}");
    driver
        .jobs
        .store
        .refuse_jobs
        .store(false, Ordering::Relaxed);
    assert_eq!(
        driver.jobs.idempotency.in_use(),
        0,
        "unclaimed keys are forgotten"
    );

    let Submitted::Accepted(id) = driver
        .submit_spec(spec.clone(), keyed("k"), &Caller::Admin)
        .await
        .unwrap()
    else {
        panic!("the retry makes the job");
    };
    assert_eq!(
        driver
            .submit_spec(spec, keyed("k"), &Caller::Admin)
            .await
            .unwrap(),
        Submitted::Repeated(id)
    );
    assert_eq!(driver.jobs.idempotency.in_use(), 1);
    assert_eq!(
        driver.read(|s| s.jobs.len()),
        1,
        "the stored one; the killed one has ended"
    );
    assert_eq!(driver.jobs.store.load().unwrap().jobs.len(), 1);
}

/// A memoize job whose task 0 succeeds while its record is held (a slow disk), whose
/// record is then refused or stored; the rows of it the store holds right before the
/// record's verdict (with the job's task-0 state then), and once the submission is over.
async fn end_a_task_while_storing(
    driver: &Arc<Driver>,
    refuse: bool,
) -> (TaskState, Vec<&'static str>, Vec<&'static str>) {
    let executor = flint_protocol::ExecutorId("exec-1".into());
    let generation = driver.apply(|s| {
        s.register_executor(executor.clone(), "h".into(), 2, 1, false, Vec::new())
            .unwrap()
    });
    let mut job = crate::scheduler::tests::job("j", 2, 1);
    job.def.options.memoize = true;
    job.def.options.determinism = Some(flint_protocol::Determinism { seed: 1 });
    let id = job.def.id.clone();
    driver.jobs.store.hold_jobs.store(true, Ordering::Relaxed);
    let submit = tokio::spawn({
        let driver = driver.clone();
        async move { driver.submit(job).await }
    });
    let launched = |s: &crate::scheduler::ClusterState| {
        (s.jobs.get(&id)).is_some_and(|j| j.tasks.iter().all(|t| t.attempts > 0))
    };
    while !driver.read(launched) {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let attempt = driver.read(|s| s.jobs[&id].tasks[0].attempts);
    driver.apply(|s| {
        let mut status = crate::scheduler::tests::status("j", 0, attempt, Ok(()));
        status.generation = generation;
        let now = std::time::SystemTime::now();
        ((), s.status_update(&executor, generation, status, now))
    });
    let state = driver.read(|s| s.jobs[&id].tasks[0].state);
    driver.flush_store();
    let before = driver.jobs.store.rows_of(&id);
    driver
        .jobs
        .store
        .refuse_jobs
        .store(refuse, Ordering::Relaxed);
    driver.jobs.store.hold_jobs.store(false, Ordering::Relaxed);
    assert_eq!(submit.await.unwrap().is_err(), refuse);
    driver.flush_store();
    (state, before, driver.jobs.store.rows_of(&id))
}

/// A job whose record the store refuses was never accepted: a task of it that ended
/// while the record was being stored, and the memo entry it made, must not be stored
/// either (nor the tasks it killed), now or after a restart.
#[tokio::test]
async fn a_refused_jobs_task_ends_and_memo_entries_are_never_stored() {
    let (dir, driver) = driver();
    let (state, before, after) = end_a_task_while_storing(&driver, true).await;
    assert_eq!(state, TaskState::Succeeded);
    assert!(before.is_empty(), "held with the record: {before:?}");
    assert!(after.is_empty(), "{after:?}");
    drop(driver);
    let store = loop {
        match crate::store::JobStore::open(&dir.path().join("jobs.redb"), Default::default()) {
            Ok(store) => break store,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    };
    let id = JobId("j".into());
    assert!(store.job(&id).unwrap().is_none());
    assert!(store.rows_of(&id).is_empty());
}

/// The same task end, of a job whose record is then stored: sent on after the record
/// (the store keeps no end of a job it does not hold), not lost.
#[tokio::test]
async fn a_task_that_ends_while_its_record_is_stored_is_stored_after_it() {
    let (_dir, driver) = driver();
    let (_, before, after) = end_a_task_while_storing(&driver, false).await;
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(after, ["task_ends", "memo_by_job", "memo"]);
}
