//! The job store: an embedded database (redb) in the driver's data dir holding every job
//! it accepted until the job is deleted: the job's record, the tasks that reached a final
//! state (with their inline results and logs), its end, a summary for listing it, and
//! the indexes that find it. A job is written, and its write committed, before the API
//! answers 202; task and job ends are group-committed by a writer thread ([`writer`]),
//! so a burst of short tasks costs one commit, not one per task. After a crash, a task
//! whose end was not yet committed simply runs again: results are kept at least once and
//! served exactly once. A job submitted with an idempotency key is stored with its key,
//! in one transaction.
//!
//! The driver holds only live jobs in memory; a finished one is read from here when
//! asked for ([`JobStore::job`]), so memory follows what runs, not what has run.
//!
//! Layout 5 (the `meta` table's `layout`). Every table's name carries its own version;
//! [`migrate`] brings a data dir of layout 4 (the release before) up to date.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::Ordering;
use std::time::Duration;

use flint_protocol::api::{JobState, TaskCounts, TaskState};
use flint_protocol::records::{
    AttemptRecord, JobDef, JobEndRecord, JobRecord, JobSummaryRecord, TaskEndRecord,
};
use flint_protocol::{Digest, JobId};
use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
    WriteTransaction,
};

mod handle;
mod index;
mod migrate;
mod writer;

pub use index::{JobFilter, JobPage};

/// The layout this driver writes, in the `meta` table under `layout`.
pub const LAYOUT: u64 = 5;
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The next task-end value's sequence number (they are keyed by job and sequence).
const NEXT_SEQUENCE: &str = "next_task_end_sequence";

// v2: task inputs may be fetched (url / result inputs) and results may be blocks.
// v3: a job's module may be a URL, its digest and size unknown.
const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs.v3");
/// Task ends by (job, sequence): the ends of one job in one group commit are one value,
/// a `Vec<(u32, TaskEndRecord)>`, so that a job's ends are one range to read or delete.
/// v5 (layout 5); v4 was keyed by sequence alone, many jobs per value.
const TASK_ENDS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("task_ends.v5");
const JOB_ENDS: TableDefinition<&str, &[u8]> = TableDefinition::new("job_ends.v3");
/// Job -> its attempts (`Vec<AttemptRecord>`), written once its last attempt has
/// ended: the timeline of a finished job. Added in layout 5 without a new layout: a
/// data dir without it has no timelines, and its jobs' timelines are rebuilt from
/// their task ends.
const JOB_ATTEMPTS: TableDefinition<&str, &[u8]> = TableDefinition::new("job_attempts.v1");
/// Idempotency keys: key -> (the SHA-256 of the canonical spec the key was given with,
/// the job it made). Written in the job's own transaction, so a job and its key are
/// stored together or not at all.
const IDEMPOTENCY_KEYS: TableDefinition<&str, (&[u8; 32], &str)> =
    TableDefinition::new("idempotency_keys.v1");
/// Job -> its idempotency key, so that deleting a job frees its key.
const JOB_KEYS: TableDefinition<&str, &str> = TableDefinition::new("job_keys.v1");
/// Job -> [`JobSummaryRecord`].
const SUMMARIES: TableDefinition<&str, &[u8]> = TableDefinition::new("job_summaries.v1");
/// Indexes of every job: by creation time; by state (a live job is under `queued` until
/// it ends), then creation time; by name, then creation time; finished jobs by the time
/// they finished (what retention deletes first).
const BY_CREATED: TableDefinition<(u64, &str), ()> = TableDefinition::new("jobs_by_created.v1");
const BY_STATE: TableDefinition<(u8, u64, &str), ()> = TableDefinition::new("jobs_by_state.v1");
const BY_NAME: TableDefinition<(&str, u64, &str), ()> = TableDefinition::new("jobs_by_name.v1");
const BY_FINISHED: TableDefinition<(u64, &str), ()> = TableDefinition::new("jobs_by_finished.v1");
/// Uploaded modules (`m:<hex>`) and files (`f:<hex>`) -> how many stored jobs name
/// them; a blob no job names may be deleted once it is old enough.
const BLOB_REFS: TableDefinition<&str, u64> = TableDefinition::new("blob_refs.v1");
/// Tables of layouts before 4: a data dir holding them was written by a Flint too old
/// to migrate from.
const ANCIENT_TABLES: [&str; 3] = ["jobs.v1", "jobs.v2", "task_ends.v3"];

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
    /// (see [`migrate`]). Task and job ends are committed at most once per
    /// `commit_interval`; zero commits as soon as the previous commit is done.
    pub fn open(path: &Path, commit_interval: Duration) -> Result<Self, StoreError> {
        let db = Arc::new(create(path)?);
        let ancient: Vec<String> = {
            let txn = db.begin_read().map_err(db_error)?;
            txn.list_tables()
                .map_err(db_error)?
                .map(|t| t.name().to_owned())
                .filter(|name| ANCIENT_TABLES.contains(&name.as_str()))
                .collect()
        };
        if !ancient.is_empty() {
            // Refused rather than ignored: those jobs would silently disappear.
            return Err(StoreError::Db(format!(
                "{} holds jobs in a layout older than 4 ({}), which this Flint cannot \
                 migrate; finish them with the Flint that wrote them, or move the data dir away",
                path.display(),
                ancient.join(", ")
            )));
        }
        migrate::run(&db, &migrate::Hooks::from_env())?;
        let txn = db.begin_write().map_err(db_error)?;
        create_tables(&txn)?;
        let next_sequence = {
            let mut meta = txn.open_table(META).map_err(db_error)?;
            // A new data dir (an old one was migrated above, and says so).
            if meta.get("layout").map_err(db_error)?.is_none() {
                meta.insert("layout", LAYOUT).map_err(db_error)?;
            }
            let next = meta.get(NEXT_SEQUENCE).map_err(db_error)?;
            next.map_or(0, |v| v.value())
        };
        txn.commit().map_err(db_error)?;
        let db = Arc::new(handle::Handle::new(
            path.to_owned(),
            Arc::into_inner(db).expect("no other handle yet"),
        ));
        let writer = writer::Writer::start(db.clone(), next_sequence, commit_interval)?;
        Ok(JobStore {
            db,
            writer,
            #[cfg(test)]
            refuse_jobs: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            hold_jobs: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Stores an accepted job durably, with the idempotency key it was submitted under
    /// (if any) and its spec's digest, in one transaction. Blocks for the commit: call
    /// it off the runtime.
    pub fn put_job(&self, job: &JobRecord, key: Option<(&str, &Digest)>) -> Result<(), StoreError> {
        #[cfg(test)]
        if self.refuse_jobs.load(Ordering::Relaxed) {
            return Err(StoreError::Db("No space left on device (a test's)".into()));
        }
        #[cfg(test)]
        while self.hold_jobs.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let stored = (|| {
            let txn = self.db.get()?.begin_write().map_err(db_error)?;
            insert_job(&txn, job, key)?;
            txn.commit().map_err(db_error)
        })();
        if let Err(e) = &stored
            && handle::Handle::needs_reopen(e)
        {
            // For the next submission's sake: this one is refused either way.
            let _ = self.db.reopen();
        }
        stored
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

    /// A finished job's attempts, as [`Self::attempts_ended`] stored them; `None` for a
    /// job stored without them (still running, or finished before they were kept).
    pub fn attempts(&self, id: &JobId) -> Result<Option<Vec<AttemptRecord>>, StoreError> {
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        let table = match txn.open_table(JOB_ATTEMPTS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(db_error(e)),
        };
        let value = table.get(id.0.as_str()).map_err(db_error)?;
        Ok(value.map(|v| postcard::from_bytes(v.value())).transpose()?)
    }

    /// Whether the write numbered `write` (and every one before it) is committed.
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
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        let jobs = txn.open_table(JOBS).map_err(db_error)?;
        let mut keys = Vec::new();
        for entry in txn
            .open_table(IDEMPOTENCY_KEYS)
            .map_err(db_error)?
            .iter()
            .map_err(db_error)?
        {
            let (key, value) = entry.map_err(db_error)?;
            let (spec, job) = value.value();
            // Only a key whose job is stored: one left over would claim a job that is gone.
            if jobs.get(job).map_err(db_error)?.is_some() {
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
        Ok(Stored { jobs: stored, keys })
    }

    /// A stored job, live or finished, as it was last committed.
    pub fn job(&self, id: &JobId) -> Result<Option<StoredJob>, StoreError> {
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        read_job(&txn, &id.0)
    }

    /// A stored job's summary.
    pub fn summary(&self, id: &JobId) -> Result<Option<JobSummaryRecord>, StoreError> {
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(SUMMARIES).map_err(db_error)?;
        let value = table.get(id.0.as_str()).map_err(db_error)?;
        Ok(value.map(|v| postcard::from_bytes(v.value())).transpose()?)
    }

    /// Deletes a job and everything the store holds of it (record, task ends, end,
    /// summary, index entries, idempotency key), in one transaction. `None` when there
    /// is no such job.
    pub fn delete_job(&self, id: &JobId) -> Result<Option<Deleted>, StoreError> {
        let txn = self.db.get()?.begin_write().map_err(db_error)?;
        let deleted = delete_job(&txn, &id.0)?;
        txn.commit().map_err(db_error)?;
        Ok(deleted)
    }

    /// [`Self::delete_job`] for several jobs in one transaction (retention's: one commit,
    /// one sync, for a page of jobs). The deleted ones, with their ids.
    pub fn delete_jobs(&self, ids: &[JobId]) -> Result<Vec<(JobId, Deleted)>, StoreError> {
        let txn = self.db.get()?.begin_write().map_err(db_error)?;
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
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
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
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(BLOB_REFS).map_err(db_error)?;
        let refs = table
            .get(blob_key(digest, files).as_str())
            .map_err(db_error)?;
        Ok(refs.map_or(0, |v| v.value()))
    }

    /// The finished jobs' totals, read once at start (one pass over the summaries).
    pub fn totals(&self) -> Result<Totals, StoreError> {
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
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
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        txn.open_table(JOBS)
            .map_err(db_error)?
            .len()
            .map_err(db_error)
    }
}

/// Bytes of pages redb keeps in memory. Its default (a GiB) is a cache that grows with
/// the file until it reaches it, which is the driver's memory growing with every job it
/// ever ran; the pages a running job touches (its record, its latest task ends, the
/// index tails) fit in a few MiB.
const PAGE_CACHE_BYTES: usize = 32 << 20;

/// Opens the database at `path`, with the driver's page cache.
fn create(path: &Path) -> Result<Database, StoreError> {
    Database::builder()
        .set_cache_size(PAGE_CACHE_BYTES)
        .create(path)
        .map_err(db_error)
}

/// The state's number in the indexes: its place in [`JobState::ALL`].
pub(crate) fn state_code(state: JobState) -> u8 {
    JobState::ALL
        .iter()
        .position(|s| *s == state)
        .expect("every state is in ALL") as u8
}

fn blob_key(digest: &Digest, files: bool) -> String {
    format!("{}:{}", if files { 'f' } else { 'm' }, digest.hex())
}

/// The uploads a job names (those the driver stores and serves), as [`BLOB_REFS`] keys.
fn blob_keys(def: &JobDef) -> Vec<String> {
    let module = def
        .module
        .digest
        .filter(|_| def.module.served_by_driver())
        .map(|d| blob_key(&d, false));
    let files = def
        .files
        .iter()
        .filter(|f| f.served_by_driver())
        .filter_map(|f| f.digest.map(|d| blob_key(&d, true)));
    module.into_iter().chain(files).collect()
}

pub(super) fn create_tables(txn: &WriteTransaction) -> Result<(), StoreError> {
    for table in [JOBS, JOB_ENDS, SUMMARIES] {
        txn.open_table(table).map_err(db_error)?;
    }
    for table in [BY_CREATED, BY_FINISHED] {
        txn.open_table(table).map_err(db_error)?;
    }
    txn.open_table(TASK_ENDS).map_err(db_error)?;
    txn.open_table(JOB_ATTEMPTS).map_err(db_error)?;
    txn.open_table(IDEMPOTENCY_KEYS).map_err(db_error)?;
    txn.open_table(JOB_KEYS).map_err(db_error)?;
    txn.open_table(BY_STATE).map_err(db_error)?;
    txn.open_table(BY_NAME).map_err(db_error)?;
    txn.open_table(BLOB_REFS).map_err(db_error)?;
    txn.open_table(META).map_err(db_error)?;
    Ok(())
}

/// A new job's summary: queued, every task pending.
fn queued_summary(job: &JobRecord) -> JobSummaryRecord {
    JobSummaryRecord {
        name: job.def.name.clone(),
        state: JobState::Queued,
        created_at_ms: job.def.created_at_ms,
        finished_at_ms: None,
        tasks: job.tasks.len() as u32,
        counts: TaskCounts {
            pending: job.tasks.len() as u32,
            ..TaskCounts::default()
        },
        error: None,
    }
}

fn insert_job(
    txn: &WriteTransaction,
    job: &JobRecord,
    key: Option<(&str, &Digest)>,
) -> Result<(), StoreError> {
    let bytes = postcard::to_stdvec(job)?;
    let id = job.def.id.0.as_str();
    txn.open_table(JOBS)
        .map_err(db_error)?
        .insert(id, bytes.as_slice())
        .map_err(db_error)?;
    if let Some((key, spec)) = key {
        txn.open_table(IDEMPOTENCY_KEYS)
            .map_err(db_error)?
            .insert(key, (&spec.0, id))
            .map_err(db_error)?;
        txn.open_table(JOB_KEYS)
            .map_err(db_error)?
            .insert(id, key)
            .map_err(db_error)?;
    }
    index_job(txn, &job.def, &queued_summary(job))
}

/// Writes a job's summary and its index entries (all but `BY_FINISHED` for a live
/// job), and counts the uploads it names.
fn index_job(
    txn: &WriteTransaction,
    def: &JobDef,
    summary: &JobSummaryRecord,
) -> Result<(), StoreError> {
    let id = def.id.0.as_str();
    let created = summary.created_at_ms;
    txn.open_table(SUMMARIES)
        .map_err(db_error)?
        .insert(id, postcard::to_stdvec(summary)?.as_slice())
        .map_err(db_error)?;
    txn.open_table(BY_CREATED)
        .map_err(db_error)?
        .insert((created, id), ())
        .map_err(db_error)?;
    txn.open_table(BY_STATE)
        .map_err(db_error)?
        .insert((state_code(summary.state), created, id), ())
        .map_err(db_error)?;
    txn.open_table(BY_NAME)
        .map_err(db_error)?
        .insert((summary.name.as_str(), created, id), ())
        .map_err(db_error)?;
    if let Some(finished) = summary.finished_at_ms {
        txn.open_table(BY_FINISHED)
            .map_err(db_error)?
            .insert((finished, id), ())
            .map_err(db_error)?;
    }
    let mut refs = txn.open_table(BLOB_REFS).map_err(db_error)?;
    for key in blob_keys(def) {
        let n = refs
            .get(key.as_str())
            .map_err(db_error)?
            .map_or(0, |v| v.value());
        refs.insert(key.as_str(), n + 1).map_err(db_error)?;
    }
    Ok(())
}

/// Stores a job's end and moves it in the indexes from live to its final state. A job
/// that was never stored (its record's commit failed) is skipped.
fn end_job(
    txn: &WriteTransaction,
    id: &str,
    end: &JobEndRecord,
    summary: &JobSummaryRecord,
) -> Result<(), StoreError> {
    let mut summaries = txn.open_table(SUMMARIES).map_err(db_error)?;
    let Some(old) = summaries
        .get(id)
        .map_err(db_error)?
        .map(|v| v.value().to_vec())
    else {
        return Ok(());
    };
    let old: JobSummaryRecord = postcard::from_bytes(&old)?;
    summaries
        .insert(id, postcard::to_stdvec(summary)?.as_slice())
        .map_err(db_error)?;
    let mut by_state = txn.open_table(BY_STATE).map_err(db_error)?;
    by_state
        .remove((state_code(old.state), old.created_at_ms, id))
        .map_err(db_error)?;
    by_state
        .insert((state_code(summary.state), old.created_at_ms, id), ())
        .map_err(db_error)?;
    if let Some(finished) = old.finished_at_ms {
        txn.open_table(BY_FINISHED)
            .map_err(db_error)?
            .remove((finished, id))
            .map_err(db_error)?;
    }
    if let Some(finished) = summary.finished_at_ms {
        txn.open_table(BY_FINISHED)
            .map_err(db_error)?
            .insert((finished, id), ())
            .map_err(db_error)?;
    }
    txn.open_table(JOB_ENDS)
        .map_err(db_error)?
        .insert(id, postcard::to_stdvec(end)?.as_slice())
        .map_err(db_error)?;
    Ok(())
}

fn delete_job(txn: &WriteTransaction, id: &str) -> Result<Option<Deleted>, StoreError> {
    let Some(summary) = txn
        .open_table(SUMMARIES)
        .map_err(db_error)?
        .remove(id)
        .map_err(db_error)?
        .map(|v| postcard::from_bytes::<JobSummaryRecord>(v.value()))
        .transpose()?
    else {
        return Ok(None);
    };
    let created = summary.created_at_ms;
    let record = txn
        .open_table(JOBS)
        .map_err(db_error)?
        .remove(id)
        .map_err(db_error)?
        .map(|v| postcard::from_bytes::<JobRecord>(v.value()))
        .transpose()?;
    {
        let mut ends = txn.open_table(TASK_ENDS).map_err(db_error)?;
        let sequences: Vec<u64> = ends
            .range((id, 0)..=(id, u64::MAX))
            .map_err(db_error)?
            .map(|e| e.map(|(k, _)| k.value().1))
            .collect::<Result<_, _>>()
            .map_err(db_error)?;
        for sequence in sequences {
            ends.remove((id, sequence)).map_err(db_error)?;
        }
    }
    txn.open_table(JOB_ENDS)
        .map_err(db_error)?
        .remove(id)
        .map_err(db_error)?;
    txn.open_table(JOB_ATTEMPTS)
        .map_err(db_error)?
        .remove(id)
        .map_err(db_error)?;
    txn.open_table(BY_CREATED)
        .map_err(db_error)?
        .remove((created, id))
        .map_err(db_error)?;
    txn.open_table(BY_STATE)
        .map_err(db_error)?
        .remove((state_code(summary.state), created, id))
        .map_err(db_error)?;
    txn.open_table(BY_NAME)
        .map_err(db_error)?
        .remove((summary.name.as_str(), created, id))
        .map_err(db_error)?;
    if let Some(finished) = summary.finished_at_ms {
        txn.open_table(BY_FINISHED)
            .map_err(db_error)?
            .remove((finished, id))
            .map_err(db_error)?;
    }
    let key = txn
        .open_table(JOB_KEYS)
        .map_err(db_error)?
        .remove(id)
        .map_err(db_error)?
        .map(|v| v.value().to_owned());
    if let Some(key) = &key {
        txn.open_table(IDEMPOTENCY_KEYS)
            .map_err(db_error)?
            .remove(key.as_str())
            .map_err(db_error)?;
    }
    if let Some(record) = &record {
        let mut refs = txn.open_table(BLOB_REFS).map_err(db_error)?;
        for blob in blob_keys(&record.def) {
            let n = refs
                .get(blob.as_str())
                .map_err(db_error)?
                .map_or(0, |v| v.value());
            if n <= 1 {
                refs.remove(blob.as_str()).map_err(db_error)?;
            } else {
                refs.insert(blob.as_str(), n - 1).map_err(db_error)?;
            }
        }
    }
    Ok(Some(Deleted { summary, key }))
}

/// A job's record, task ends (the latest end of each task) and end, as committed.
fn read_job(txn: &redb::ReadTransaction, id: &str) -> Result<Option<StoredJob>, StoreError> {
    read_job_from(
        &txn.open_table(JOBS).map_err(db_error)?,
        &txn.open_table(TASK_ENDS).map_err(db_error)?,
        &txn.open_table(JOB_ENDS).map_err(db_error)?,
        id,
    )
}

/// [`read_job`] within a write transaction (the migration's).
fn read_job_in(txn: &WriteTransaction, id: &str) -> Result<Option<StoredJob>, StoreError> {
    read_job_from(
        &txn.open_table(JOBS).map_err(db_error)?,
        &txn.open_table(TASK_ENDS).map_err(db_error)?,
        &txn.open_table(JOB_ENDS).map_err(db_error)?,
        id,
    )
}

fn read_job_from(
    jobs: &impl ReadableTable<&'static str, &'static [u8]>,
    ends: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
    job_ends: &impl ReadableTable<&'static str, &'static [u8]>,
    id: &str,
) -> Result<Option<StoredJob>, StoreError> {
    let Some(job) = jobs
        .get(id)
        .map_err(db_error)?
        .map(|v| postcard::from_bytes::<JobRecord>(v.value()))
        .transpose()?
    else {
        return Ok(None);
    };
    let mut tasks: BTreeMap<u32, TaskEndRecord> = BTreeMap::new();
    // In sequence order, so a later end of a task replaces an earlier one.
    for entry in ends.range((id, 0)..=(id, u64::MAX)).map_err(db_error)? {
        let (_, bytes) = entry.map_err(db_error)?;
        let value: Vec<(u32, TaskEndRecord)> = postcard::from_bytes(bytes.value())?;
        tasks.extend(value);
    }
    let end = job_ends
        .get(id)
        .map_err(db_error)?
        .map(|b| postcard::from_bytes(b.value()))
        .transpose()?;
    Ok(Some(StoredJob {
        job,
        tasks: tasks.into_iter().collect(),
        end,
    }))
}

/// A stored job's summary as its pieces say (for migrating a data dir whose layout had
/// none).
fn summary_of(stored: &StoredJob) -> JobSummaryRecord {
    let mut summary = queued_summary(&stored.job);
    for (index, end) in &stored.tasks {
        if (*index as usize) < stored.job.tasks.len() {
            summary.counts.pending -= 1;
            *summary.counts.of_mut(end.state) += 1;
        }
    }
    if let Some(end) = &stored.end {
        summary.state = end.state;
        summary.finished_at_ms = Some(end.finished_at_ms);
        summary.error = end.error.clone();
        summary.counts.killed += summary.counts.pending + summary.counts.running;
        summary.counts.pending = 0;
        summary.counts.running = 0;
    }
    summary
}

#[cfg(test)]
mod tests;
