//! The journal of accepted jobs: what makes a job durable before the API answers 202,
//! at the cost of one small write and one sync. A job's record is appended here and
//! synced, then folded into the database by the writer thread's next group commit.
//! Committing it to the database directly cost a transaction over a dozen tables' pages
//! and their sync, 0.4 ms, which was most of a single-task job's round trip.
//!
//! Files `jobs.journal.<epoch>` beside the database, each preallocated (so a sync writes
//! the record's page, not the file's size too), starting with a header of magic and
//! epoch, then records of `[len u32][crc32 u32][postcard JobRecord]`; a zero length ends
//! them. Records reach the writer in the order they are appended (both under one lock),
//! so what the database holds is always a prefix of the journal: the commit that folds a
//! record stores its end (`journal_epoch`, `journal_end` in `meta`), and opening the
//! store folds whatever lies past that mark. A record cut short by a crash fails its
//! checksum and was never acknowledged. A file wholly before the mark is deleted.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use flint_protocol::records::JobRecord;

use super::StoreError;

const MAGIC: &[u8; 8] = b"FLNTJRN1";
const HEADER: u64 = 16;
/// Bytes a journal file is preallocated to; a record larger than what is left starts a
/// file of its own size. About 600 single-task jobs.
const FILE_BYTES: u64 = 256 << 10;

/// Where a record ends: the database has folded the journal up to here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Position {
    pub epoch: u64,
    pub end: u64,
}

pub(super) struct Journal {
    dir: PathBuf,
    current: Mutex<Segment>,
    /// The next file, made ahead by the writer thread ([`Journal::prepare`]) so that
    /// the submission that fills a file does not wait for the next one's making.
    spare: Mutex<Option<Segment>>,
    /// The epoch the next file made gets: every file has its own, and a file taken
    /// into use always has a later one than the file before it.
    next_epoch: AtomicU64,
    /// Bytes used of the current file, read without its lock.
    used: AtomicU64,
    /// Held by an append's sync and by the writer's commits: a sync that shares the disk
    /// with a commit writing megabytes of task ends waits for all of it anyway, and
    /// slows the commit down besides.
    pub(super) syncs: Mutex<()>,
}

struct Segment {
    epoch: u64,
    file: File,
    used: u64,
    size: u64,
}

impl Journal {
    /// Opens the journal in `dir`, returning the records past `mark` for the caller to
    /// fold (in order, with their positions), and starting a fresh file for what comes.
    pub(super) fn open(
        dir: &Path,
        mark: Position,
    ) -> Result<(Journal, Vec<(Position, JobRecord)>), StoreError> {
        let mut epochs = list_and(dir, |partial| {
            let _ = std::fs::remove_file(partial);
        })?;
        epochs.sort_unstable();
        let mut unfolded = Vec::new();
        for &epoch in &epochs {
            if epoch < mark.epoch {
                continue;
            }
            let from = if epoch == mark.epoch { mark.end } else { 0 };
            for (position, bytes) in read(&path(dir, epoch), epoch)? {
                if position.end > from {
                    unfolded.push((position, postcard::from_bytes(&bytes)?));
                }
            }
        }
        let epoch = epochs.last().map_or(1, |e| e + 1).max(mark.epoch + 1);
        let current = Segment::create(dir, epoch, FILE_BYTES)?;
        Ok((
            Journal {
                dir: dir.to_owned(),
                used: AtomicU64::new(current.used),
                current: Mutex::new(current),
                spare: Mutex::new(None),
                next_epoch: AtomicU64::new(epoch + 1),
                syncs: Mutex::new(()),
            },
            unfolded,
        ))
    }

    /// Appends `record` and syncs it, then calls `then` with its position, still under
    /// the journal's lock (so that records are sent on in the order they were written).
    pub(super) fn append<T>(
        &self,
        record: &[u8],
        then: impl FnOnce(Position) -> T,
    ) -> Result<T, StoreError> {
        let len = u32::try_from(record.len())
            .map_err(|_| StoreError::Db("a job record over 4 GiB".into()))?;
        let mut framed = Vec::with_capacity(record.len() + 8);
        framed.extend_from_slice(&len.to_le_bytes());
        framed.extend_from_slice(&crc32fast::hash(record).to_le_bytes());
        framed.extend_from_slice(record);
        let mut current = self
            .current
            .lock()
            .expect("no panic under the journal lock");
        // Room for the record and the zero length after it.
        let needed = framed.len() as u64 + 4;
        if current.used + needed > current.size {
            let mut spare = self.spare.lock().expect("no panic under the journal lock");
            *current = match spare.take() {
                Some(next) if next.epoch > current.epoch && next.used + needed <= next.size => next,
                other => {
                    if let Some(unfit) = other {
                        let _ = std::fs::remove_file(path(&self.dir, unfit.epoch));
                    }
                    let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
                    Segment::create(&self.dir, epoch, FILE_BYTES.max(HEADER + needed))?
                }
            };
        }
        let synced = {
            let _alone = self.syncs.lock().expect("no panic under the sync lock");
            current
                .file
                .write_all_at(&framed, current.used)
                .and_then(|()| current.file.sync_data())
        };
        synced.map_err(io_error)?;
        current.used += framed.len() as u64;
        self.used.store(current.used, Ordering::Relaxed);
        Ok(then(Position {
            epoch: current.epoch,
            end: current.used,
        }))
    }

    /// Where the current file's records start.
    pub(super) fn start(&self) -> Position {
        let current = self
            .current
            .lock()
            .expect("no panic under the journal lock");
        Position {
            epoch: current.epoch,
            end: HEADER,
        }
    }

    /// Makes the next file ahead once the current one is half full (called by the
    /// writer thread after a commit): making one is a write of its size and two syncs.
    pub(super) fn prepare(&self) {
        if self.used.load(Ordering::Relaxed) < FILE_BYTES / 2 {
            return;
        }
        let mut spare = self.spare.lock().expect("no panic under the journal lock");
        if spare.is_none() {
            let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
            match Segment::create(&self.dir, epoch, FILE_BYTES) {
                Ok(next) => *spare = Some(next),
                // The submission that needs it makes it, and gets the error if any.
                Err(e) => tracing::warn!(error = %e, "job journal: making the next file ahead"),
            }
        }
    }

    /// The database holds every record up to `mark`: files wholly before it go.
    pub(super) fn folded(&self, mark: Position) {
        let Ok(epochs) = list(&self.dir) else { return };
        for epoch in epochs.into_iter().filter(|&e| e < mark.epoch) {
            let _ = std::fs::remove_file(path(&self.dir, epoch));
        }
    }
}

impl Segment {
    /// A new file of `size` zeroed bytes with its header, synced with its directory
    /// entry: appends then overwrite allocated blocks and their syncs carry no metadata.
    /// A file for one record larger than [`FILE_BYTES`] is not zeroed first: its one
    /// append would write it all a second time.
    fn create(dir: &Path, epoch: u64, size: u64) -> Result<Segment, StoreError> {
        let target = path(dir, epoch);
        let partial = dir.join(format!("jobs.journal.{epoch}.new"));
        let made = (|| {
            let mut file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&partial)?;
            let mut header = [0u8; HEADER as usize];
            header[..8].copy_from_slice(MAGIC);
            header[8..].copy_from_slice(&epoch.to_le_bytes());
            file.write_all(&header)?;
            if size <= FILE_BYTES {
                let zeros = vec![0u8; 64 << 10];
                let mut left = size - HEADER;
                while left > 0 {
                    let n = left.min(zeros.len() as u64) as usize;
                    file.write_all(&zeros[..n])?;
                    left -= n as u64;
                }
            }
            file.sync_all()?;
            std::fs::rename(&partial, &target)?;
            File::open(dir).and_then(|d| d.sync_all())?;
            Ok(file)
        })();
        match made {
            Ok(file) => Ok(Segment {
                epoch,
                file,
                used: HEADER,
                size,
            }),
            Err(e) => {
                // A full disk, most likely: what was written of it is no use to anyone.
                let _ = std::fs::remove_file(&partial);
                Err(io_error(e))
            }
        }
    }
}

fn path(dir: &Path, epoch: u64) -> PathBuf {
    dir.join(format!("jobs.journal.{epoch}"))
}

/// The epochs of the journal files in `dir`.
fn list(dir: &Path) -> Result<Vec<u64>, StoreError> {
    list_and(dir, |_| {})
}

/// [`list`], calling `unfinished` with each `.new` file: one being made now, or (when
/// the journal opens) one a crash cut short, which holds nothing acknowledged.
fn list_and(dir: &Path, mut unfinished: impl FnMut(&Path)) -> Result<Vec<u64>, StoreError> {
    let mut epochs = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error)? {
        let name = entry.map_err(io_error)?.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("jobs.journal.")) else {
            continue;
        };
        match rest.parse::<u64>() {
            Ok(epoch) => epochs.push(epoch),
            Err(_) if rest.ends_with(".new") => unfinished(&dir.join(&name)),
            Err(_) => {}
        }
    }
    Ok(epochs)
}

/// The records of one file, up to its end or the first that is cut short or corrupt.
fn read(path: &Path, epoch: u64) -> Result<Vec<(Position, Vec<u8>)>, StoreError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io_error)?;
    let mut records = Vec::new();
    if bytes.len() < HEADER as usize || &bytes[..8] != MAGIC || bytes[8..16] != epoch.to_le_bytes()
    {
        tracing::warn!(file = %path.display(), "job journal: not a journal file of this epoch; ignored");
        return Ok(records);
    }
    let mut at = HEADER as usize;
    while let Some(frame) = bytes.get(at..at + 8) {
        let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame[4..].try_into().expect("4 bytes"));
        let Some(record) = bytes.get(at + 8..at + 8 + len).filter(|_| len > 0) else {
            break;
        };
        if crc32fast::hash(record) != crc {
            tracing::warn!(file = %path.display(), offset = at, "job journal: a record cut short by a crash (never acknowledged); ignored");
            break;
        }
        at += 8 + len;
        records.push((
            Position {
                epoch,
                end: at as u64,
            },
            record.to_vec(),
        ));
    }
    Ok(records)
}

fn io_error(e: std::io::Error) -> StoreError {
    if crate::store::usage::is_disk_full(&e) {
        StoreError::Full(e.to_string())
    } else {
        StoreError::Db(format!("job journal: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use flint_protocol::JobId;

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
        store.journal.append(&bytes, |_| ()).unwrap();
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
        let store = JobStore::open(&dir.path().join("jobs.redb"), Duration::from_secs(3600))
            .unwrap();
        // The writer's first commit comes at once; after it, the interval holds.
        store.accept_job(record("first", 1)).unwrap();
        store.flush();
        let commits = store.commits();
        store.accept_job(record("second", 1)).unwrap();
        assert!(!store.is_durable(store.last_job.load(Ordering::Acquire)));
        let page = store.list(&super::super::JobFilter::default(), None, 10).unwrap();
        let listed: Vec<&str> = page.items.iter().map(|(id, _)| id.0.as_str()).collect();
        assert_eq!(listed, ["second", "first"]);
        assert!(store.commits() > commits, "the listing folded the journal first");
        store.accept_job(record("third", 1)).unwrap();
        let third = store.job(&JobId("third".into())).unwrap().expect("read");
        assert_eq!(third.job.def.id.0, "third");
    }

    fn path_of(dir: &Path, epoch: u64) -> PathBuf {
        path(dir, epoch)
    }
}
