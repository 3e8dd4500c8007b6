//! The journal on real files beside a real redb store: crashes at each point, torn
//! records, files made ahead, concurrent submitters, and reads before any commit.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use flint_protocol::JobId;
use flint_protocol::records::JobRecord;

use super::super::JobStore;
use super::super::faults::Faults;
use super::record::Journaled;
use super::*;

fn record(id: &str, tasks: usize) -> JobRecord {
    crate::store::durable::job_record(&crate::scheduler::tests::job(id, tasks, 1))
}

fn open(path: &Path) -> JobStore {
    // The writer thread of a store just dropped lets go of the file once its queue
    // closes.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match JobStore::open(path, Duration::ZERO) {
            Ok(store) => return store,
            Err(e) => assert!(Instant::now() < deadline, "open: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Appends as `accept_job` does but sends nothing to the writer: the moment after
/// the sync and before any group commit, where a crash leaves a job only here.
fn journal_only(store: &JobStore, job: &JobRecord) {
    let record = Journaled::encode(job.clone(), &[]).unwrap();
    store.journal.append(record, |_, _| ()).unwrap();
}

/// The current file's epoch and the bytes used of it.
fn current(store: &JobStore) -> (u64, u64) {
    let current = store.journal.current();
    let segment = current.segment.as_ref().expect("a current file");
    (segment.epoch, segment.used)
}

/// The bytes a record of `job` takes in the journal (its payload).
fn payload_len(job: &JobRecord) -> u64 {
    Journaled::encode(job.clone(), &[]).unwrap().as_ref().len() as u64
}

fn stored_ids(store: &JobStore) -> Vec<String> {
    let mut ids: Vec<String> = store
        .load()
        .unwrap()
        .jobs
        .into_iter()
        .map(|j| j.job.def.id.0)
        .collect();
    ids.sort();
    ids
}

fn journal_files(dir: &Path) -> Vec<u64> {
    let mut epochs = list(dir).unwrap();
    epochs.sort();
    epochs
}

#[test]
fn jobs_only_in_the_journal_at_a_crash_are_in_the_store_after_it_across_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    store.accept_job(record("folded", 1), &[]).unwrap();
    store.flush();
    // Enough records to fill the first file and start others: 30,000 tasks each.
    let big: Vec<JobRecord> = (0..6)
        .map(|i| record(&format!("big-{i}"), 30_000))
        .collect();
    assert!(payload_len(&big[0]) > FILE_BYTES / 6);
    for job in &big {
        journal_only(&store, job);
    }
    assert!(
        journal_files(dir.path()).len() >= 2,
        "the records span files"
    );
    drop(store);

    let store = open(&path);
    let mut expected: Vec<String> = (0..6).map(|i| format!("big-{i}")).collect();
    expected.push("folded".into());
    expected.sort();
    assert_eq!(stored_ids(&store), expected);
    let big_0 = store.job(&JobId("big-0".into())).unwrap().unwrap();
    assert_eq!(big_0.job.tasks.len(), 30_000, "the whole record");
    // Folded, so the files that held them are gone but the fresh one.
    assert_eq!(journal_files(dir.path()).len(), 1);
    drop(store);
    // And folded once: a second reopen finds the same jobs, none twice.
    let store = open(&path);
    assert_eq!(stored_ids(&store), expected);
}

#[test]
fn a_folded_job_deleted_later_does_not_come_back_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    store.accept_job(record("a", 1), &[]).unwrap();
    store.accept_job(record("b", 1), &[]).unwrap();
    store.flush();
    assert!(store.delete_job(&JobId("a".into())).unwrap().is_some());
    // Its record is still in the journal's current file, before the mark.
    assert_eq!(journal_files(dir.path()).len(), 1);
    drop(store);
    let store = open(&path);
    assert_eq!(stored_ids(&store), ["b"]);
}

#[test]
fn a_record_cut_short_by_a_crash_is_ignored_and_the_ones_before_it_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    // Closes the store and writes `bytes` at `offset` from the end of what its
    // journal holds.
    let damage = |store: JobStore, offset: i64, bytes: &[u8]| {
        let (epoch, end) = current(&store);
        drop(store);
        let file = OpenOptions::new()
            .write(true)
            .open(path_of(dir.path(), epoch))
            .unwrap();
        file.write_all_at(bytes, end.checked_add_signed(offset).unwrap())
            .unwrap();
    };
    journal_only(&store, &record("whole", 1));
    journal_only(&store, &record("torn", 1));
    // The last record's final byte never reached the disk.
    damage(store, -1, &[0xff]);
    let store = open(&path);
    assert_eq!(stored_ids(&store), ["whole"]);
    // A length running past the file's end is the end too.
    journal_only(&store, &record("next", 1));
    damage(store, 0, &u32::MAX.to_le_bytes());
    let store = open(&path);
    assert_eq!(stored_ids(&store), ["next", "whole"]);
}

#[test]
fn a_file_that_is_not_this_epochs_journal_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    journal_only(&store, &record("kept", 1));
    drop(store);
    // Another file under a journal's name (a copy from elsewhere, a later epoch's
    // header), and a file whose header was never finished.
    std::fs::write(dir.path().join("jobs.journal.99"), b"not a journal").unwrap();
    std::fs::write(dir.path().join("jobs.journal.100.new"), b"").unwrap();
    let store = open(&path);
    assert_eq!(stored_ids(&store), ["kept"]);
    assert!(!dir.path().join("jobs.journal.100.new").exists());
    assert!(current(&store).0 > 99, "a fresh epoch after every file");
}

/// Four submitters at once across several new files while the writer folds and
/// deletes behind them (a new file being made is not an unfinished one to remove).
#[test]
fn concurrent_submissions_across_new_files_while_folding_all_land_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let store = &store;
            scope.spawn(move || {
                for i in 0..80 {
                    store
                        .accept_job(record(&format!("j-{t}-{i:02}"), 2000), &[])
                        .unwrap();
                }
            });
        }
    });
    assert!(current(&store).0 > 3, "several files were made");
    store.flush();
    assert_eq!(stored_ids(&store).len(), 320);
    let mut kept = vec![current(&store).0];
    kept.extend(
        store
            .journal
            .spare
            .lock()
            .unwrap()
            .as_ref()
            .map(|s| s.epoch),
    );
    assert_eq!(
        journal_files(dir.path()),
        kept,
        "the folded files are gone: the current one and the one made ahead are left"
    );
    drop(store);
    let store = open(&path);
    assert_eq!(stored_ids(&store).len(), 320);
}

#[test]
fn the_next_file_is_made_ahead_and_taken_when_the_current_one_fills() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    let first = current(&store).0;
    let mut n = 0;
    while store.journal.used.load(Ordering::Relaxed) < FILE_BYTES / 2 {
        store
            .accept_job(record(&format!("a-{n}"), 200), &[])
            .unwrap();
        n += 1;
    }
    // The commit that folds them makes the next file.
    store.flush();
    let spare = store
        .journal
        .spare
        .lock()
        .unwrap()
        .as_ref()
        .map(|s| s.epoch);
    let spare = spare.expect("made ahead");
    assert!(spare > first);
    assert!(journal_files(dir.path()).contains(&spare));
    while current(&store).0 == first {
        store
            .accept_job(record(&format!("a-{n}"), 200), &[])
            .unwrap();
        n += 1;
    }
    assert_eq!(current(&store).0, spare, "the file made ahead was taken");
    store.flush();
    drop(store);
    let store = open(&path);
    assert_eq!(stored_ids(&store).len(), n);
}

#[test]
fn a_record_larger_than_a_file_gets_a_file_of_its_own_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    let big = record("big", 100_000);
    let bytes = payload_len(&big);
    assert!(bytes > FILE_BYTES);
    journal_only(&store, &big);
    let epoch = current(&store).0;
    let size = std::fs::metadata(path_of(dir.path(), epoch)).unwrap().len();
    assert_eq!(
        size,
        HEADER + 8 + bytes,
        "not zeroed first, then written again"
    );
    journal_only(&store, &record("after", 1));
    assert!(current(&store).0 > epoch, "the next record starts another");
    drop(store);
    let store = open(&path);
    assert_eq!(stored_ids(&store), ["after", "big"]);
}

/// A job in the journal only is still what every read of the store sees: the
/// listing, the job as submitted, its owner.
#[test]
fn a_job_just_accepted_is_read_and_listed_before_any_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    // A commit interval no test outlasts: only a read's own fold can commit.
    let store = JobStore::open(&dir.path().join("jobs.redb"), Duration::from_secs(3600)).unwrap();
    // The writer's first commit comes at once; after it, the interval holds.
    store.accept_job(record("first", 1), &[]).unwrap();
    store.flush();
    let commits = store.commits();
    store.accept_job(record("second", 1), &[]).unwrap();
    assert!(!store.is_durable(store.last_job.load(Ordering::Acquire)));
    let page = store
        .list(&super::super::JobFilter::default(), None, 10)
        .unwrap();
    let listed: Vec<&str> = page.items.iter().map(|(id, _)| id.0.as_str()).collect();
    assert_eq!(listed, ["second", "first"]);
    assert!(
        store.commits() > commits,
        "the listing folded the journal first"
    );
    store.accept_job(record("third", 1), &[]).unwrap();
    let third = store.job(&JobId("third".into())).unwrap().expect("read");
    assert_eq!(third.job.def.id.0, "third");
}

fn path_of(dir: &Path, epoch: u64) -> PathBuf {
    path(dir, epoch)
}

fn owned_record(id: &str, tenant: &str) -> JobRecord {
    let mut job = record(id, 2);
    job.def.owner = flint_protocol::records::Owner {
        tenant: Some(tenant.into()),
        priority: 3,
    };
    job.def.options = flint_protocol::records::JobOptions {
        exact_accounting: true,
        escalate: Some(flint_protocol::records::Escalation {
            memory: 2.0,
            timeout: 1.5,
            max_memory_mb: 512,
            max_timeout_ms: 60_000,
        }),
        determinism: Some(flint_protocol::Determinism { seed: 42 }),
        memoize: true,
        memoized: Vec::new(),
    };
    job.def.network = Some(super::super::tests::egress::grant());
    job
}

/// A job folded at open after a crash is the job that was accepted: its tenant, every
/// option and its network, not the admin's job with the defaults and no network.
#[test]
fn a_job_folded_from_the_journal_keeps_its_tenant_its_options_and_its_network() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    let accepted = owned_record("owned", "acme");
    journal_only(&store, &accepted);
    drop(store);
    let store = open(&path);
    let folded = store.job(&JobId("owned".into())).unwrap().expect("folded");
    assert_eq!(folded.job.def.owner, accepted.def.owner);
    assert_eq!(folded.job.def.options, accepted.def.options);
    assert!(folded.job.def.network.is_some());
    assert_eq!(folded.job.def.network, accepted.def.network);
    assert_eq!(folded.job, accepted);
    let loaded = store.load().unwrap().jobs;
    assert_eq!(loaded[0].job, accepted, "restored as accepted at start");
    assert_eq!(
        store.owner(&JobId("owned".into())).unwrap(),
        Some(accepted.def.owner)
    );
}

/// What the Flint before wrote, byte for byte: `FLNTJRN1`, the epoch, then records
/// `[len][crc32][postcard JobRecord]` up to a zero length, in a preallocated file.
fn write_v1_journal(dir: &Path, epoch: u64, jobs: &[JobRecord]) {
    let mut file = Vec::new();
    file.extend_from_slice(b"FLNTJRN1");
    file.extend_from_slice(&epoch.to_le_bytes());
    for job in jobs {
        let record = postcard::to_stdvec(job).unwrap();
        file.extend_from_slice(&(record.len() as u32).to_le_bytes());
        file.extend_from_slice(&crc32fast::hash(&record).to_le_bytes());
        file.extend_from_slice(&record);
    }
    file.resize(file.len().max(256 << 10), 0);
    std::fs::write(dir.join(format!("jobs.journal.{epoch}")), file).unwrap();
}

#[test]
fn a_journal_of_the_previous_format_is_folded_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    // A crash of the Flint before left two files of records no commit had folded.
    let owned = owned_record("v1-owned", "acme");
    write_v1_journal(dir.path(), 1, &[record("v1-a", 3), owned.clone()]);
    write_v1_journal(dir.path(), 2, &[record("v1-b", 1)]);
    let store = open(&path);
    assert_eq!(stored_ids(&store), ["v1-a", "v1-b", "v1-owned"]);
    let a = store.job(&JobId("v1-a".into())).unwrap().unwrap();
    assert_eq!(a.job, record("v1-a", 3), "the whole record");
    // A version-1 record never held an owner or options: the job is as that Flint
    // made it after a crash, the admin's with the defaults.
    let folded = store.job(&JobId("v1-owned".into())).unwrap().unwrap();
    assert!(folded.job.def.owner.is_default());
    assert!(folded.job.def.options.is_default());
    assert_eq!(folded.job.def.network, None);
    assert_eq!(folded.job.tasks, owned.tasks);
    // Folded, and the files with them; the fresh one is of the new format.
    let files = journal_files(dir.path());
    assert_eq!(files, [3]);
    let fresh = std::fs::read(path_of(dir.path(), 3)).unwrap();
    assert_eq!(&fresh[..8], b"FLNTJRN2");
    drop(store);
    let store = open(&path);
    assert_eq!(stored_ids(&store).len(), 3, "folded once");
}

/// A version-2 record as the Flint before wrote it, byte for byte: the version, the
/// `JobRecord`'s length and bytes, the ends, the options and the owner, and nothing
/// after.
fn record_of_the_release_before(job: &JobRecord) -> Vec<u8> {
    let record = postcard::to_stdvec(job).unwrap();
    let mut payload = vec![2];
    payload.extend_from_slice(&(record.len() as u32).to_le_bytes());
    payload.extend_from_slice(&record);
    let no_ends: Vec<(u32, flint_protocol::records::TaskEndRecord)> = Vec::new();
    payload.extend_from_slice(&postcard::to_stdvec(&no_ends).unwrap());
    payload.extend_from_slice(&postcard::to_stdvec(&job.def.options).unwrap());
    payload.extend_from_slice(&postcard::to_stdvec(&job.def.owner).unwrap());
    payload
}

#[test]
fn a_record_of_the_release_before_ends_at_its_owner_and_is_a_job_without_network() {
    let mut before = owned_record("before", "acme");
    before.def.network = None;
    let payload = record_of_the_release_before(&before);
    let decoded = Journaled::decode(2, payload.clone()).unwrap();
    assert_eq!(decoded.job, before);
    // And folded at open after a crash of that Flint.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    store.journal.append(payload, |_, _| ()).unwrap();
    drop(store);
    let store = open(&path);
    let folded = store.job(&JobId("before".into())).unwrap().expect("folded");
    assert_eq!(folded.job, before);
}

/// The Flint before reads a record made now as it read its own (the steps of its
/// `Journaled::decode`): the same job, without the network it cannot hold.
#[test]
fn a_record_made_now_is_read_by_the_release_before_up_to_its_owner() {
    let now = owned_record("now", "acme");
    let payload = Journaled::encode(now.clone(), &[])
        .unwrap()
        .as_ref()
        .to_vec();
    assert_eq!(payload[0], 2, "a version it reads");
    let len = u32::from_le_bytes(payload[1..5].try_into().unwrap()) as usize;
    let mut job: JobRecord = postcard::from_bytes(&payload[5..5 + len]).unwrap();
    let rest = &payload[5 + len..];
    let (_, rest) =
        postcard::take_from_bytes::<Vec<(u32, flint_protocol::records::TaskEndRecord)>>(rest)
            .unwrap();
    let (options, rest) =
        postcard::take_from_bytes::<flint_protocol::records::JobOptions>(rest).unwrap();
    let (owner, ignored) =
        postcard::take_from_bytes::<flint_protocol::records::Owner>(rest).unwrap();
    job.def.options = options;
    job.def.owner = owner;
    let mut expected = now.clone();
    expected.def.network = None;
    assert_eq!(job, expected);
    // What it ignores is the network, and only that.
    let network: Option<flint_protocol::NetworkGrant> = postcard::from_bytes(ignored).unwrap();
    assert_eq!(network, now.def.network);
}

#[test]
fn a_record_of_a_later_version_refuses_the_open_and_stays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    let mut later = Journaled::encode(record("later", 1), &[])
        .unwrap()
        .as_ref()
        .to_vec();
    later[0] = 9;
    store.journal.append(later, |_, _| ()).unwrap();
    let epoch = current(&store).0;
    drop(store);
    std::thread::sleep(Duration::from_millis(100));
    let err = loop {
        match JobStore::open(&path, Duration::ZERO) {
            Err(e) if e.to_string().contains("version") => break e,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
            Ok(_) => panic!("an accepted job this Flint cannot read was dropped"),
        }
    };
    assert!(err.to_string().contains("record of version 9"), "{err}");
    assert!(
        journal_files(dir.path()).contains(&epoch),
        "its file is kept"
    );
}

/// The records a journal file holds as a fold would read them, ignoring voids.
fn records_in(dir: &Path, epoch: u64) -> Vec<String> {
    let file = files::read(&path_of(dir, epoch), epoch).unwrap().unwrap();
    (file.records.into_iter())
        .map(|(_, bytes)| Journaled::decode(file.version, bytes).unwrap().job.def.id.0)
        .collect()
}

/// Puts `job`'s record at `at` in the file of `epoch`: the kernel writing a refused
/// record's page back after all (a failed sync promises nothing either way).
fn write_back(dir: &Path, epoch: u64, at: u64, job: &JobRecord) {
    let payload = Journaled::encode(job.clone(), &[]).unwrap();
    let payload = payload.as_ref();
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    frame.extend_from_slice(payload);
    let file = OpenOptions::new()
        .write(true)
        .open(path_of(dir, epoch))
        .unwrap();
    file.write_all_at(&frame, at).unwrap();
}

/// An append whose write or sync failed was refused: the job must not come back after
/// a crash, though its bytes may have reached the disk. Its frame is zeroed, and the
/// next append takes its place.
#[test]
fn a_refused_append_whose_write_or_sync_failed_is_not_folded_after_a_crash() {
    for fault in ["write", "sync"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.redb");
        let fail = |store: &JobStore| {
            let failing = match fault {
                "write" => &store.faults.journal_writes,
                _ => &store.faults.journal_syncs,
            };
            failing.store(1, Ordering::Relaxed);
            let err = store.accept_job(record("refused", 1), &[]).unwrap_err();
            assert!(err.to_string().contains("injected"), "{err}");
        };
        let store = open(&path);
        // In the journal only, as at a crash: nothing reaches the database.
        journal_only(&store, &record("before", 1));
        fail(&store);
        // A crash right after the refusal.
        drop(store);
        let store = open(&path);
        assert_eq!(stored_ids(&store), ["before"], "{fault}");
        // The same file goes on after a refusal.
        fail(&store);
        let epoch = current(&store).0;
        journal_only(&store, &record("after", 1));
        assert_eq!(current(&store).0, epoch);
        drop(store);
        let store = open(&path);
        assert_eq!(stored_ids(&store), ["after", "before"], "{fault}");
    }
}

/// When even the zeroing's sync fails, the file is retired and the next one's header
/// voids the record: the fold skips it, even with its bytes whole on disk.
#[test]
fn a_refused_record_that_cannot_be_zeroed_is_voided_by_the_next_files_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    journal_only(&store, &record("before", 1));
    let (old, at) = current(&store);
    // The append's sync and the zeroing's.
    store.faults.journal_syncs.store(2, Ordering::Relaxed);
    store.accept_job(record("refused", 1), &[]).unwrap_err();
    assert!(current(&store).0 > old, "retired");
    journal_only(&store, &record("after", 1));
    drop(store);
    write_back(dir.path(), old, at, &record("refused", 1));
    assert_eq!(records_in(dir.path(), old), ["before", "refused"]);
    let store = open(&path);
    assert_eq!(stored_ids(&store), ["after", "before"]);
}

/// With no file to void it in (a full disk), nothing more is appended: a job accepted
/// after the refused one could be folded with it. Once a file can be made, appends go on.
#[test]
fn when_no_file_can_void_a_refused_record_appends_are_refused_until_one_can() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    let (old, at) = current(&store);
    store.faults.journal_syncs.store(2, Ordering::Relaxed);
    // The file the refusal retires to, and the one the next submission tries.
    store.faults.journal_files.store(2, Ordering::Relaxed);
    store.accept_job(record("refused", 1), &[]).unwrap_err();
    let err = store
        .accept_job(record("also-refused", 1), &[])
        .unwrap_err();
    assert!(err.is_storage_full(), "{err}");
    assert!(
        err.to_string().contains("no job is accepted until"),
        "{err}"
    );
    journal_only(&store, &record("after", 1));
    assert!(current(&store).0 > old);
    drop(store);
    write_back(dir.path(), old, at, &record("refused", 1));
    let store = open(&path);
    assert_eq!(stored_ids(&store), ["after"]);
}

/// Opens the store at `path` with the database's commits failing as on a full disk.
fn open_full(path: &Path) -> (JobStore, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    faults.disk_full.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match JobStore::open_with(path, Duration::ZERO, faults.clone()) {
            Ok(store) => return (store, faults),
            Err(e) => assert!(Instant::now() < deadline, "open: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A driver that crashed with jobs only in the journal starts on a disk still full:
/// the jobs are served from the journal (restored, read, kept across another crash)
/// and folded once the database takes a commit.
#[test]
fn a_full_disk_at_open_serves_the_unfolded_jobs_from_the_journal_until_it_has_room() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    store.accept_job(record("folded", 1), &[]).unwrap();
    store.flush();
    journal_only(&store, &owned_record("unfolded", "acme"));
    drop(store);

    let (store, _) = open_full(&path);
    let loaded = store.load().unwrap().jobs;
    let ids: Vec<&str> = loaded.iter().map(|j| j.job.def.id.0.as_str()).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    let unfolded = loaded
        .iter()
        .find(|j| j.job.def.id.0 == "unfolded")
        .unwrap();
    assert_eq!(unfolded.job, owned_record("unfolded", "acme"), "whole");
    let read = store
        .job(&JobId("unfolded".into()))
        .unwrap()
        .expect("served");
    assert_eq!(read.job.def.owner.tenant.as_deref(), Some("acme"));
    // Jobs are still accepted (the journal's file is preallocated).
    store.accept_job(record("accepted-full", 1), &[]).unwrap();
    drop(store);

    // Another crash on the still-full disk: nothing was deleted.
    let (store, faults) = open_full(&path);
    assert_eq!(stored_ids(&store), ["accepted-full", "folded", "unfolded"]);
    let files = journal_files(dir.path()).len();
    assert!(files >= 2, "the unfolded files are kept: {files}");
    // Room again: the writer's next try folds them, and their files go.
    faults.disk_full.store(false, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(30);
    while journal_files(dir.path()).len() > 2 {
        assert!(Instant::now() < deadline, "never folded");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(store);
    let store = open(&path);
    assert_eq!(stored_ids(&store), ["accepted-full", "folded", "unfolded"]);
    let folded = store.job(&JobId("unfolded".into())).unwrap().unwrap();
    assert_eq!(folded.job.def.owner.tenant.as_deref(), Some("acme"));
}

/// A memoize job whose task 1 was taken from an earlier job's at submission.
fn memoized_job(id: &str) -> crate::scheduler::NewJob {
    let mut job = crate::scheduler::tests::job(id, 3, 1);
    job.def.options.memoize = true;
    job.def.options.determinism = Some(flint_protocol::Determinism { seed: 9 });
    job.tasks[1].memoized = Some(flint_protocol::TaskResult::Inline(b"earlier".to_vec()));
    job.def.options.memoized.push((1, JobId("first".into()), 4));
    job
}

/// A memoized task's end is part of its job's record: after a crash that committed
/// nothing else of the job (in the journal only, or committed with its key), the task
/// is restored as the memoized copy, succeeded with no attempt, never pending.
#[test]
fn a_memoized_task_is_restored_as_the_memoized_copy_whatever_was_committed() {
    use crate::store::durable;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.redb");
    let store = open(&path);
    let journaled = memoized_job("journaled");
    let record = Journaled::encode(
        durable::job_record(&journaled),
        &durable::accepted_ends(&journaled),
    )
    .unwrap();
    store.journal.append(record, |_, _| ()).unwrap();
    let keyed = memoized_job("keyed");
    let spec = flint_protocol::Digest::of(b"spec");
    store
        .put_job(
            &durable::job_record(&keyed),
            &durable::accepted_ends(&keyed),
            Some(("k", &spec)),
        )
        .unwrap();
    drop(store);

    let store = open(&path);
    let mut state = crate::scheduler::ClusterState::new(
        0,
        crate::scheduler::SchedulingConfig::default(),
        Instant::now(),
        std::time::SystemTime::now(),
    );
    state.restore(store.load().unwrap().jobs, std::time::SystemTime::now());
    for id in ["journaled", "keyed"] {
        let job = &state.jobs[&JobId(id.into())];
        let task = &job.tasks[1];
        assert_eq!(
            task.state,
            flint_protocol::api::TaskState::Succeeded,
            "{id}"
        );
        assert_eq!(task.attempts, 0, "{id}: never run");
        assert_eq!(
            task.result,
            Some(flint_protocol::TaskResult::Inline(b"earlier".to_vec()))
        );
        assert_eq!(
            Vec::from(job.pending.clone()),
            [0, 2],
            "{id}: the others run"
        );
        let views = crate::views::task_views(job, 0..3);
        let from = views[1].memoized_from.as_ref().expect("still the copy");
        assert_eq!((from.job.0.as_str(), from.task), ("first", 4));
        assert!(views[0].memoized_from.is_none());
    }
}

/// A job stored by the Flint before, whose memoized task's end a crash lost (it was a
/// task end of its own then): that task runs again, so it is shown as what it is, not
/// as a copy.
#[test]
fn a_memoized_task_whose_end_was_lost_before_this_release_runs_and_is_no_copy() {
    let job = memoized_job("old");
    let stored = crate::store::StoredJob {
        job: crate::store::durable::job_record(&job),
        tasks: Vec::new(),
        end: None,
    };
    let mut state = crate::scheduler::ClusterState::new(
        0,
        crate::scheduler::SchedulingConfig::default(),
        Instant::now(),
        std::time::SystemTime::now(),
    );
    state.restore(vec![stored], std::time::SystemTime::now());
    let job = &state.jobs[&JobId("old".into())];
    assert_eq!(Vec::from(job.pending.clone()), [0, 1, 2]);
    assert!(job.def.options.memoized.is_empty());
    let views = crate::views::task_views(job, 0..3);
    assert!(views.iter().all(|v| v.memoized_from.is_none()));
}
