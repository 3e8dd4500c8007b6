//! What outbound HTTP added to the store: a job's network grant in its side table, and
//! attempts whose usage and pins grew (`job_attempts.v3`); and the data dirs of the
//! Flint before, which had neither, read as they were.

use flint_protocol::records::{AttemptOutcome, AttemptRecord, AttemptRecordV2, PinsV1, UsageV1};
use flint_protocol::{ExecutorId, FailureKind, NetworkGrant, Pins, Usage};

use super::*;

pub(in crate::store::jobs) fn grant() -> NetworkGrant {
    NetworkGrant {
        allow: vec![
            "https://api.example.com".into(),
            "https://*.example.org:8443".into(),
        ],
        tenant_allow: Some(vec!["https://*.example.com".into()]),
        max_requests: 7,
        max_bytes: 1 << 20,
        max_concurrent: 2,
    }
}

fn network_row(store: &JobStore, id: &str) -> Option<Vec<u8>> {
    let txn = store.db.get().unwrap().begin_read().unwrap();
    let table = txn.open_table(JOB_NETWORK).unwrap();
    table.get(id).unwrap().map(|v| v.value().to_vec())
}

#[test]
fn a_jobs_network_grant_is_stored_beside_it_and_comes_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let mut put = record_at("put", "a", 1);
    put.def.network = Some(grant());
    store.put_job(&put, &[], None).unwrap();
    // Accepted through the journal and folded by a group commit, as the API does.
    let mut accepted = record_at("accepted", "a", 2);
    accepted.def.network = Some(NetworkGrant {
        tenant_allow: None,
        ..grant()
    });
    store.accept_job(accepted.clone(), &[]).unwrap();
    store
        .put_job(&record_at("plain", "a", 3), &[], None)
        .unwrap();
    store.flush();
    let store = reopen(store, &path);
    let job = |id: &str| store.job(&JobId(id.into())).unwrap().unwrap().job;
    assert_eq!(job("put"), put);
    assert_eq!(job("accepted"), accepted);
    assert_eq!(job("plain").def.network, None);
    // A live job comes back with it at start too: its tasks are launched with it.
    let loaded = store.load().unwrap().jobs;
    let put_loaded = loaded.iter().find(|j| j.job.def.id.0 == "put").unwrap();
    assert_eq!(put_loaded.job.def.network, Some(grant()));
    assert!(network_row(&store, "put").is_some());
    assert!(
        network_row(&store, "plain").is_none(),
        "no row for a job without network"
    );
}

#[test]
fn deleting_a_job_deletes_its_network_grant() {
    let dir = tempfile::tempdir().unwrap();
    let store = JobStore::open(&dir.path().join("jobs.redb"), Duration::ZERO).unwrap();
    let mut job = record_at("gone", "n", 1);
    job.def.network = Some(grant());
    store.put_job(&job, &[], None).unwrap();
    assert!(network_row(&store, "gone").is_some());
    store.delete_job(&JobId("gone".into())).unwrap().unwrap();
    assert!(network_row(&store, "gone").is_none());
    // A job of that id submitted again has no network unless it asks for it.
    store
        .put_job(&record_at("gone", "n", 2), &[], None)
        .unwrap();
    let again = store.job(&JobId("gone".into())).unwrap().unwrap();
    assert_eq!(again.job.def.network, None);
}

/// A finished job's attempts as the Flint before wrote them to `job_attempts.v2`, byte
/// for byte (its `postcard::to_stdvec(&Vec<AttemptRecord>)` of [`attempts_v2`], printed
/// by that release's code): the test of the frozen layouts, which nothing else checks.
const ATTEMPTS_V2: &str = "02010206657865632d310a0114010102018002e807010105ac02900380800403\
    07090162c66a7a5dd70c3146618063c344e531e6d4b59e379808443ce962b3abd63c5a01252f10c83610ebc\
    a1a059c0bae8255eba2f95be4d1d7bcfa89d7248a82d9f111de7d1b721a1e0632b7cf04edf5032c8ecffa9f\
    9a08492152b926f1a5a7e765d7000106657865632d320b0000008001d00f0000";

/// What [`ATTEMPTS_V2`] holds.
fn attempts_v2() -> Vec<AttemptRecordV2> {
    vec![
        AttemptRecordV2 {
            task: 1,
            attempt: 2,
            executor: ExecutorId("exec-1".into()),
            start_us: 10,
            end_us: Some(20),
            outcome: Some(AttemptOutcome::Failed(FailureKind::Timeout)),
            speculative: true,
            memory_mb: 256,
            timeout_ms: 1_000,
            usage: Some(UsageV1 {
                fuel: Some(5),
                cpu_us: 300,
                wall_us: 400,
                peak_memory_bytes: 65_536,
                input_bytes: 3,
                output_bytes: 7,
                fetched_bytes: 9,
            }),
            pins: Some(PinsV1 {
                module: Digest::of(b"m"),
                files: vec![Digest::of(b"f")],
                input: Digest::of(b"i"),
            }),
        },
        AttemptRecordV2 {
            task: 0,
            attempt: 1,
            executor: ExecutorId("exec-2".into()),
            start_us: 11,
            end_us: None,
            outcome: None,
            speculative: false,
            memory_mb: 128,
            timeout_ms: 2_000,
            usage: None,
            pins: None,
        },
    ]
}

#[test]
fn attempts_stored_before_egress_was_counted_are_read_from_the_v2_table_with_none() {
    let bytes = hex::decode(ATTEMPTS_V2).unwrap();
    assert_eq!(
        postcard::from_bytes::<Vec<AttemptRecordV2>>(&bytes).unwrap(),
        attempts_v2(),
        "the frozen layouts are the layouts of then"
    );
    assert!(
        postcard::from_bytes::<Vec<AttemptRecord>>(&bytes).is_err(),
        "the current layout cannot read them: the table name had to change"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    store.put_job(&record_at("old", "a", 1), &[], None).unwrap();
    {
        let db = store.db.get().unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(JOB_ATTEMPTS_V2)
            .unwrap()
            .insert("old", bytes.as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let store = reopen(store, &path);
    let read = store.attempts(&JobId("old".into())).unwrap().unwrap();
    let first = &read[0];
    assert_eq!((first.task, first.attempt, first.memory_mb), (1, 2, 256));
    assert_eq!(
        first.usage,
        Some(Usage {
            fuel: Some(5),
            cpu_us: 300,
            wall_us: 400,
            peak_memory_bytes: 65_536,
            input_bytes: 3,
            output_bytes: 7,
            fetched_bytes: 9,
            egress_requests: 0,
            egress_bytes_sent: 0,
            egress_bytes_received: 0,
        })
    );
    assert_eq!(
        first.pins,
        Some(Pins {
            module: Digest::of(b"m"),
            files: vec![Digest::of(b"f")],
            input: Digest::of(b"i"),
            egress: Vec::new(),
            egress_tape: None,
        })
    );
    assert_eq!(
        (read[1].usage, &read[1].pins, read[1].end_us),
        (None, &None, None)
    );
    assert_eq!(read.len(), 2);
    // Deleting the job takes the old row too.
    store.delete_job(&JobId("old".into())).unwrap().unwrap();
    assert_eq!(store.attempts(&JobId("old".into())).unwrap(), None);
    let txn = store.db.get().unwrap().begin_read().unwrap();
    let v2 = txn.open_table(JOB_ATTEMPTS_V2).unwrap();
    assert!(v2.get("old").unwrap().is_none());
}

/// Attempts stored now, with egress counted and responses pinned, come back whole.
#[test]
fn an_attempts_egress_usage_and_pins_come_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    store.put_job(&record_at("new", "a", 1), &[], None).unwrap();
    let mut called = attempt(1, 1);
    let usage = called.usage.as_mut().unwrap();
    (usage.egress_requests, usage.egress_bytes_sent) = (3, 120);
    usage.egress_bytes_received = 4_000;
    let pins = called.pins.as_mut().unwrap();
    pins.egress = vec![flint_protocol::EgressPin {
        method: "POST".into(),
        url: "https://api.example.com/v1".into(),
        request_sha256: Digest::of(b"q"),
        status: 200,
        response: Digest::of(b"r"),
        offset: 0,
        len: 4_000,
    }];
    pins.egress_tape = Some(flint_protocol::BlockRef {
        id: "new/1-1-0.tape".into(),
        size: 4_000,
        digest: Digest::of(b"tape"),
    });
    let attempts = vec![attempt(0, 1), called];
    store.attempts_ended(JobId("new".into()), attempts.clone());
    store.flush();
    let store = reopen(store, &path);
    assert_eq!(
        store.attempts(&JobId("new".into())).unwrap(),
        Some(attempts)
    );
}

/// A data dir as the Flint before left it: every table of then, none of the two added
/// since. It opens (the two are made) and its jobs read as they were.
#[test]
fn a_data_dir_of_the_release_before_opens_with_jobs_without_network() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = JobStore::open(&path, Duration::ZERO).unwrap();
    let mut owned = record_at("owned", "a", 1);
    owned.def.owner.tenant = Some("acme".into());
    store.put_job(&owned, &[], None).unwrap();
    {
        let db = store.db.get().unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(JOB_ATTEMPTS_V2)
            .unwrap()
            .insert("owned", hex::decode(ATTEMPTS_V2).unwrap().as_slice())
            .unwrap();
        assert!(txn.delete_table(JOB_NETWORK).unwrap());
        assert!(txn.delete_table(JOB_ATTEMPTS).unwrap());
        txn.commit().unwrap();
    }
    let store = reopen(store, &path);
    let job = store.job(&JobId("owned".into())).unwrap().unwrap().job;
    assert_eq!(job, owned);
    assert_eq!(job.def.network, None);
    let attempts = store.attempts(&JobId("owned".into())).unwrap().unwrap();
    assert_eq!(attempts.len(), 2);
    let txn = store.db.get().unwrap().begin_read().unwrap();
    let tables: Vec<String> = (txn.list_tables().unwrap())
        .map(|t| t.name().to_owned())
        .collect();
    for added in ["job_network.v1", "job_attempts.v3"] {
        assert!(tables.iter().any(|t| t == added), "{added} made at open");
    }
}
