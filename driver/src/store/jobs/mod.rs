//! The job store: an embedded database (redb) in the driver's data dir holding every job
//! it accepted until the job is deleted: the job's record, the tasks that reached a final
//! state (with their inline results and logs), its end, a summary for listing it, and
//! the indexes that find it. A job is durable before the API answers 202: synced to the
//! [`journal`], folded in by the next group commit of the writer thread ([`writer`]),
//! which also commits task and job ends, a burst of them in one commit (a job with an
//! idempotency key is committed directly with its key, for a repeat to find). After a
//! crash, a task whose end was not yet committed runs again: results are kept at least
//! once and served exactly once. A memoized task's end is stored with its job's record
//! (it never runs), and nothing of a job whose record was refused is stored.
//!
//! The driver holds only live jobs in memory; a finished one is read from here when
//! asked for ([`JobStore::job`]), so memory follows what runs, not what has run.
//!
//! Layout 5 (the `meta` table's `layout`). Every table's name carries its own version;
//! [`migrate`] brings a data dir of layout 4 (the release before) up to date.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flint_protocol::api::{CodedError, ErrorCode, JobState, TaskCounts, TaskState};
use flint_protocol::records::{
    AttemptRecord, JobEndRecord, JobRecord, JobSummaryRecord, TaskEndRecord,
};
use flint_protocol::{Digest, JobId};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableHandle};

mod accept;
mod faults;
mod fold;
mod graphs;
mod handle;
mod index;
mod journal;
mod migrate;
mod owners;
mod read;
mod rows;
mod schema;
mod writer;

pub use index::{JobFilter, JobPage, OwnerFilter};
pub use owners::SHARED;
use read::read_job;
use rows::delete_job;
pub use schema::blob_key;
use schema::{
    ANCIENT_TABLES, BLOB_REFS, BY_FINISHED, BY_STATE, GRAPHS, IDEMPOTENCY_KEYS, JOBS, MEMO,
    SUMMARIES, state_code,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("job store: {0}")]
    Db(String),
    /// The disk (or a disk quota of the OS) is full.
    #[error("job store: the disk is full: {0}")]
    Full(String),
    #[error("job store record: {0}")]
    Record(#[from] postcard::Error),
}

impl StoreError {
    /// Whether the disk (or the file system's quota) is full.
    pub fn is_storage_full(&self) -> bool {
        matches!(self, StoreError::Full(_))
    }
}

/// A full disk refuses new work (507); a store that fails otherwise is the driver's
/// fault (500).
impl CodedError for StoreError {
    fn code(&self) -> ErrorCode {
        match self.is_storage_full() {
            true => ErrorCode::StorageFull,
            false => ErrorCode::Storage,
        }
    }
}

fn db_error<E: Into<redb::Error>>(e: E) -> StoreError {
    match e.into() {
        redb::Error::Io(e) if crate::store::usage::is_disk_full(&e) => {
            StoreError::Full(e.to_string())
        }
        e => StoreError::Db(e.to_string()),
    }
}

/// What the scheduler must rebuild at start: the live jobs and every idempotency key.
pub struct Stored {
    pub jobs: Vec<StoredJob>,
    /// The idempotency keys of the stored jobs (live or finished).
    pub keys: Vec<StoredKey>,
}

/// An idempotency key, the digest of the spec it was given with, and the job it made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    pub key: String,
    pub spec: Digest,
    pub job: JobId,
}

/// One stored job with what is known of its end.
pub struct StoredJob {
    pub job: JobRecord,
    pub tasks: Vec<(u32, TaskEndRecord)>,
    pub end: Option<JobEndRecord>,
}

/// What a deleted job owned outside the store, for the caller to delete too.
#[derive(Debug)]
pub struct Deleted {
    pub summary: JobSummaryRecord,
    /// Its idempotency key, now free.
    pub key: Option<String>,
}

/// Jobs, and tasks by state, of the finished jobs stored: what `/metrics` adds to the
/// live jobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub jobs: [u64; 5],
    pub tasks: TaskCounts,
}

impl Totals {
    pub fn add(&mut self, summary: &JobSummaryRecord, sign: i64) {
        let at = state_code(summary.state) as usize;
        self.jobs[at] = self.jobs[at].saturating_add_signed(sign);
        for state in TaskState::ALL {
            let n = self.tasks.of_mut(state);
            let by = summary.counts.of(state) as i64 * sign;
            *n = (*n as i64 + by).max(0) as u32;
        }
    }
}

pub struct JobStore {
    db: Arc<handle::Handle>,
    writer: writer::Writer,
    journal: Arc<journal::Journal>,
    /// The writer's number for the latest job accepted through the journal.
    last_job: AtomicU64,
    /// Jobs the journal held at open that the database could not take then (a full
    /// disk), served from here until the writer folds them.
    unfolded: std::sync::Mutex<accept::Unfolded>,
    /// Where tests make the disk fail (nothing, outside tests).
    faults: Arc<faults::Faults>,
    /// Tests set it to make `put_job` fail as a full or broken disk would.
    #[cfg(test)]
    pub(crate) refuse_jobs: std::sync::atomic::AtomicBool,
    /// Tests set it to keep `put_job` from committing, as a slow disk would, until
    /// they clear it.
    #[cfg(test)]
    pub(crate) hold_jobs: std::sync::atomic::AtomicBool,
}

impl JobStore {
    /// Opens (or creates) the store at `path`, migrating a data dir of the layout before
    /// (see [`migrate`]) and folding the journal. Task and job ends are committed at most
    /// once per `commit_interval`; zero commits as soon as the previous commit is done.
    pub fn open(path: &Path, commit_interval: Duration) -> Result<Self, StoreError> {
        Self::open_with(path, commit_interval, Arc::default())
    }

    /// [`Self::open`], with the disk failing where `faults` says (tests').
    pub(crate) fn open_with(
        path: &Path,
        commit_interval: Duration,
        faults: Arc<faults::Faults>,
    ) -> Result<Self, StoreError> {
        let db = Arc::new(create(path)?);
        refuse_ancient(&db, path)?;
        migrate::run(&db, &migrate::Hooks::from_env())?;
        let next_sequence = schema::prepare(&db, &faults)?;
        let (journal, unfolded) = fold::fold_journal(&db, path, faults.clone())?;
        let journal = Arc::new(journal);
        let db = Arc::new(handle::Handle::new(
            path.to_owned(),
            Arc::into_inner(db).expect("no other handle yet"),
        ));
        let writer = writer::Writer::start(
            db.clone(),
            journal.clone(),
            faults.clone(),
            next_sequence,
            commit_interval,
        )?;
        let unfolded = accept::Unfolded::hand_over(&writer, unfolded)?;
        Ok(JobStore {
            db,
            writer,
            journal,
            last_job: AtomicU64::new(unfolded.write()),
            unfolded: std::sync::Mutex::new(unfolded),
            faults,
            #[cfg(test)]
            refuse_jobs: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            hold_jobs: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The database with every answered job folded in (a commit first if one came since
    /// the last), so reads and deletions see them as when each was committed at once.
    fn folded_db(&self) -> Result<Arc<Database>, StoreError> {
        if !self.is_durable(self.last_job.load(Ordering::Acquire)) {
            self.writer.flush();
        }
        self.db.get()
    }

    /// Queues a task's end for the next group commit; returns the write's number.
    pub fn task_ended(&self, job: JobId, index: u32, end: TaskEndRecord) -> u64 {
        self.writer.send(writer::Write::TaskEnd(job, index, end))
    }

    /// Queues a job's end (and its final summary) for the next group commit. Returns the
    /// write's number: once [`Self::is_durable`] says so, the job can be read from here.
    pub fn job_ended(&self, job: JobId, end: JobEndRecord, summary: JobSummaryRecord) -> u64 {
        self.writer
            .send(writer::Write::JobEnd(job, end, Box::new(summary)))
    }

    /// Queues a finished job's attempts (its timeline) for the next group commit; returns
    /// the write's number.
    pub fn attempts_ended(&self, job: JobId, attempts: Vec<AttemptRecord>) -> u64 {
        self.writer.send(writer::Write::Attempts(job, attempts))
    }

    /// Queues a memoize job's successful task as the entry of its memo key (unless an
    /// earlier one is); returns the write's number.
    pub fn memo_found(&self, key: Digest, job: JobId, index: u32) -> u64 {
        self.writer.send(writer::Write::Memo(key, job, index))
    }

    /// The job and task whose result a memo key stands for, if any is stored.
    pub fn memo(&self, key: &Digest) -> Result<Option<(JobId, u32)>, StoreError> {
        let txn = self.folded_db()?.begin_read().map_err(db_error)?;
        let table = match txn.open_table(MEMO) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(db_error(e)),
        };
        let found = table.get(key.0.as_slice()).map_err(db_error)?;
        Ok(found.map(|v| {
            let (job, index) = v.value();
            (JobId(job.to_owned()), index)
        }))
    }

    /// Whether the write numbered `write` (and every one before it) is committed.
    /// An executor registered (`true`) or left for good (`false`); returns the write's
    /// number.
    pub fn executor_known(&self, id: &str, present: bool) -> u64 {
        self.writer
            .send(writer::Write::Executor(id.to_owned(), present))
    }

    /// The executors registered and not seen leave, as committed.
    pub fn known_executors(&self) -> Result<Vec<String>, StoreError> {
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(schema::EXECUTORS).map_err(db_error)?;
        let mut ids = Vec::new();
        for row in table.iter().map_err(db_error)? {
            let (id, _) = row.map_err(db_error)?;
            ids.push(id.value().to_owned());
        }
        Ok(ids)
    }

    /// The number of the latest write sent: once [`Self::is_durable`] says so of it,
    /// every end and job handed to the store before this call is committed.
    pub fn last_write(&self) -> u64 {
        self.writer.last_sent()
    }

    /// Changes to the number of the latest write committed, whenever a commit lands.
    pub fn durable(&self) -> tokio::sync::watch::Receiver<u64> {
        self.writer.durable()
    }

    pub fn is_durable(&self, write: u64) -> bool {
        self.writer.committed() >= write
    }

    /// Commits every end queued so far, without waiting for the commit interval, and
    /// returns once that was tried (or the writer is gone): a driver stopping cleanly
    /// keeps every task end, where a crash may lose the last interval's.
    pub fn flush(&self) {
        self.writer.flush();
    }

    /// Group commits of task and job ends since the store was opened.
    pub fn commits(&self) -> u64 {
        self.writer.commits()
    }

    /// The live jobs (accepted, not ended) with their task ends so far, and every
    /// idempotency key, for rebuilding the scheduler's state at start. Finished jobs
    /// stay on disk.
    pub fn load(&self) -> Result<Stored, StoreError> {
        let db = self.folded_db()?;
        let unfolded = self.unfolded_jobs();
        let txn = db.begin_read().map_err(db_error)?;
        let jobs = txn.open_table(JOBS).map_err(db_error)?;
        let graphs = txn.open_table(GRAPHS).map_err(db_error)?;
        let mut keys = Vec::new();
        for entry in txn
            .open_table(IDEMPOTENCY_KEYS)
            .map_err(db_error)?
            .iter()
            .map_err(db_error)?
        {
            let (key, value) = entry.map_err(db_error)?;
            let (spec, job) = value.value();
            // Only a key whose job (or graph) is stored: one left over would claim what is
            // gone.
            let stored = jobs.get(job).map_err(db_error)?.is_some()
                || graphs.get(job).map_err(db_error)?.is_some();
            if stored {
                keys.push(StoredKey {
                    key: key.value().to_owned(),
                    spec: Digest(*spec),
                    job: JobId(job.to_owned()),
                });
            }
        }
        let live = state_code(JobState::Queued);
        let mut stored = Vec::new();
        let by_state = txn.open_table(BY_STATE).map_err(db_error)?;
        for entry in by_state
            .range((live, 0, "")..(live + 1, 0, ""))
            .map_err(db_error)?
        {
            let (key, _) = entry.map_err(db_error)?;
            let (_, _, id) = key.value();
            if let Some(job) = read_job(&txn, id)? {
                stored.push(job);
            }
        }
        // Jobs a full disk kept from being folded at open (none otherwise).
        for job in unfolded {
            if jobs
                .get(job.job.def.id.0.as_str())
                .map_err(db_error)?
                .is_none()
            {
                stored.push(job);
            }
        }
        Ok(Stored { jobs: stored, keys })
    }

    /// A stored job, live or finished, as it was last committed (or journaled).
    pub fn job(&self, id: &JobId) -> Result<Option<StoredJob>, StoreError> {
        // Folding on a miss only: a finished job is never in the journal alone.
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        let found = match read_job(&txn, &id.0)? {
            None if !self.is_durable(self.last_job.load(Ordering::Acquire)) => {
                read_job(&self.folded_db()?.begin_read().map_err(db_error)?, &id.0)?
            }
            found => found,
        };
        // One a full disk kept from being folded at open is served as accepted.
        Ok(found.or_else(|| self.unfolded_job(id)))
    }

    /// A stored job's summary.
    pub fn summary(&self, id: &JobId) -> Result<Option<JobSummaryRecord>, StoreError> {
        let txn = self.folded_db()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(SUMMARIES).map_err(db_error)?;
        let value = table.get(id.0.as_str()).map_err(db_error)?;
        Ok(value.map(|v| postcard::from_bytes(v.value())).transpose()?)
    }

    /// Deletes a job and everything the store holds of it (record, task ends, end,
    /// summary, index entries, idempotency key), in one transaction. `None` when there
    /// is no such job.
    pub fn delete_job(&self, id: &JobId) -> Result<Option<Deleted>, StoreError> {
        let txn = self.folded_db()?.begin_write().map_err(db_error)?;
        let deleted = delete_job(&txn, &id.0)?;
        txn.commit().map_err(db_error)?;
        Ok(deleted)
    }

    /// [`Self::delete_job`] for several jobs in one transaction (retention's: one commit,
    /// one sync, for a page of jobs). The deleted ones, with their ids.
    pub fn delete_jobs(&self, ids: &[JobId]) -> Result<Vec<(JobId, Deleted)>, StoreError> {
        let txn = self.folded_db()?.begin_write().map_err(db_error)?;
        let mut deleted = Vec::new();
        for id in ids {
            if let Some(d) = delete_job(&txn, &id.0)? {
                deleted.push((id.clone(), d));
            }
        }
        txn.commit().map_err(db_error)?;
        Ok(deleted)
    }

    /// Finished jobs that ended before `cutoff_ms` (Unix ms), oldest first, at most
    /// `limit`: what retention deletes.
    pub fn finished_before(&self, cutoff_ms: u64, limit: usize) -> Result<Vec<JobId>, StoreError> {
        let txn = self.folded_db()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(BY_FINISHED).map_err(db_error)?;
        let mut ids = Vec::new();
        for entry in table.range((0, "")..(cutoff_ms, "")).map_err(db_error)? {
            if ids.len() >= limit {
                break;
            }
            let (key, _) = entry.map_err(db_error)?;
            ids.push(JobId(key.value().1.to_owned()));
        }
        Ok(ids)
    }

    /// How many stored jobs name the uploaded module (`files: false`) or file.
    pub fn blob_refs(&self, digest: &Digest, files: bool) -> Result<u64, StoreError> {
        let txn = self.folded_db()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(BLOB_REFS).map_err(db_error)?;
        let refs = table
            .get(blob_key(digest, files).as_str())
            .map_err(db_error)?;
        Ok(refs.map_or(0, |v| v.value()))
    }

    /// The finished jobs' totals, read once at start (one pass over the summaries).
    pub fn totals(&self) -> Result<Totals, StoreError> {
        let txn = self.folded_db()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(SUMMARIES).map_err(db_error)?;
        let mut totals = Totals::default();
        for entry in table.iter().map_err(db_error)? {
            let (_, bytes) = entry.map_err(db_error)?;
            let summary: JobSummaryRecord = postcard::from_bytes(bytes.value())?;
            if summary.state.is_final() {
                totals.add(&summary, 1);
            }
        }
        Ok(totals)
    }

    /// Stored jobs in the store's own file, for the store's size figures.
    pub fn job_count(&self) -> Result<u64, StoreError> {
        let txn = self.folded_db()?.begin_read().map_err(db_error)?;
        txn.open_table(JOBS)
            .map_err(db_error)?
            .len()
            .map_err(db_error)
    }
}

/// Bytes of pages redb keeps in memory. Its default (a GiB) is a cache that grows with
/// the file until it reaches it, which is the driver's memory growing with every job it
/// ever ran; the pages a running job touches (its record, its latest task ends, the
/// index tails) fit in a few MiB. It is kept small because nothing empties it at rest:
/// after a 200,000-task job it held most of its 32 MiB, a driver's whole idle budget,
/// where the kernel's page cache holds the same pages for the reads that miss.
const PAGE_CACHE_BYTES: usize = 4 << 20;

/// Refuses a data dir of a layout too old to migrate: its jobs would silently disappear.
fn refuse_ancient(db: &Database, path: &Path) -> Result<(), StoreError> {
    let txn = db.begin_read().map_err(db_error)?;
    let ancient: Vec<String> = txn
        .list_tables()
        .map_err(db_error)?
        .map(|t| t.name().to_owned())
        .filter(|name| ANCIENT_TABLES.contains(&name.as_str()))
        .collect();
    if ancient.is_empty() {
        return Ok(());
    }
    Err(StoreError::Db(format!(
        "{} holds jobs in a layout older than 4 ({}), which this Flint cannot migrate; \
         finish them with the Flint that wrote them, or move the data dir away",
        path.display(),
        ancient.join(", ")
    )))
}

/// Opens the database at `path`, with the driver's page cache.
fn create(path: &Path) -> Result<Database, StoreError> {
    Database::builder()
        .set_cache_size(PAGE_CACHE_BYTES)
        .create(path)
        .map_err(db_error)
}

#[cfg(test)]
mod tests;
