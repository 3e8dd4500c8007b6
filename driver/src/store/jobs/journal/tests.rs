//! The journal on real files beside a real redb store: crashes at each point, torn
//! records, files made ahead, concurrent submitters, and reads before any commit.

use std::time::{Duration, Instant};

use flint_protocol::JobId;
use flint_protocol::records::JobRecord;

use super::super::JobStore;
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
    let bytes = postcard::to_stdvec(job).unwrap();
    store.journal.append(bytes, |_, _| ()).unwrap();
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
    store.accept_job(record("folded", 1)).unwrap();
    store.flush();
    // Enough records to fill the first file and start others: 30,000 tasks each.
    let big: Vec<JobRecord> = (0..6)
        .map(|i| record(&format!("big-{i}"), 30_000))
        .collect();
    assert!(postcard::to_stdvec(&big[0]).unwrap().len() as u64 > FILE_BYTES / 6);
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
    store.accept_job(record("a", 1)).unwrap();
    store.accept_job(record("b", 1)).unwrap();
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
        let epoch = store.journal.start().epoch;
        let end = store.journal.current.lock().unwrap().used;
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
    assert!(
        store.journal.start().epoch > 99,
        "a fresh epoch after every file"
    );
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
                        .accept_job(record(&format!("j-{t}-{i:02}"), 2000))
                        .unwrap();
                }
            });
        }
    });
    assert!(store.journal.start().epoch > 3, "several files were made");
    store.flush();
    assert_eq!(stored_ids(&store).len(), 320);
    let mut kept = vec![store.journal.start().epoch];
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
    let first = store.journal.start().epoch;
    let mut n = 0;
    while store.journal.used.load(Ordering::Relaxed) < FILE_BYTES / 2 {
        store.accept_job(record(&format!("a-{n}"), 200)).unwrap();
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
    while store.journal.start().epoch == first {
        store.accept_job(record(&format!("a-{n}"), 200)).unwrap();
        n += 1;
    }
    assert_eq!(
        store.journal.start().epoch,
        spare,
        "the file made ahead was taken"
    );
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
    let bytes = postcard::to_stdvec(&big).unwrap().len() as u64;
    assert!(bytes > FILE_BYTES);
    journal_only(&store, &big);
    let epoch = store.journal.start().epoch;
    let size = std::fs::metadata(path_of(dir.path(), epoch)).unwrap().len();
    assert_eq!(
        size,
        HEADER + 8 + bytes,
        "not zeroed first, then written again"
    );
    journal_only(&store, &record("after", 1));
    assert!(
        store.journal.start().epoch > epoch,
        "the next record starts another"
    );
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
    store.accept_job(record("first", 1)).unwrap();
    store.flush();
    let commits = store.commits();
    store.accept_job(record("second", 1)).unwrap();
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
    store.accept_job(record("third", 1)).unwrap();
    let third = store.job(&JobId("third".into())).unwrap().expect("read");
    assert_eq!(third.job.def.id.0, "third");
}

fn path_of(dir: &Path, epoch: u64) -> PathBuf {
    path(dir, epoch)
}
