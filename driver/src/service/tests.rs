//! The service's own behaviour: answering a submit once stored, the advertised URL.

use std::sync::atomic::Ordering;

use flint_protocol::JobId;
use flint_protocol::api::JobState;

use super::*;

#[tokio::test]
async fn a_job_is_answered_once_stored_and_one_that_cannot_be_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let driver = Driver::new(
        DriverConfig::new(dir.path().to_owned()),
        "127.0.0.1:7070".parse().unwrap(),
    )
    .unwrap();
    driver
        .submit(crate::scheduler::tests::job("kept", 3, 1))
        .await
        .unwrap();
    let stored = driver.store.load().unwrap();
    assert_eq!(stored.len(), 1, "committed before submit returned");
    assert_eq!(stored[0].job.def.id, JobId("kept".into()));

    driver.store.refuse_jobs.store(true, Ordering::Relaxed);
    let err = driver
        .submit(crate::scheduler::tests::job("lost", 3, 1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("No space left"), "{err}");
    let (state, error, pending) = driver.read(|s| {
        let job = &s.jobs[&JobId("lost".into())];
        (job.state, job.error.clone(), job.counts().pending)
    });
    assert_eq!(state, JobState::Killed, "never accepted, so stopped");
    let (kind, message) = error.unwrap();
    assert_eq!(kind, "killed");
    assert!(
        message.contains("not accepted: the job store could not record it"),
        "{message}"
    );
    assert_eq!(pending, 0, "nothing of it left to run");
    assert_eq!(
        driver.store.load().unwrap().len(),
        1,
        "only the first is stored"
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
