//! The job store: an embedded database (redb) in the driver's data dir holding accepted
//! jobs, the tasks that reached a final state (with their inline results), and jobs that
//! ended. A job is written, and its write committed, before the API answers 202; task
//! and job ends are group-committed by a writer thread, so a burst of short tasks costs
//! one commit, not one per task, and the task ends of a commit are stored together as a
//! few values, not one B-tree insert each. Commits are at least a commit interval apart
//! (5 ms by default): each costs a sync of the file and a few page writes whatever it
//! holds, and at 100,000 task ends a second committing as fast as the disk allows spent
//! more CPU than the tasks. After a crash, a task whose end was not yet committed simply
//! runs again: results are kept at least once and served exactly once. A job submitted
//! with an idempotency key is stored with its key, in one transaction.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use flint_protocol::records::{JobEndRecord, JobRecord, TaskEndRecord};
use flint_protocol::{Digest, JobId};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

// v2: task inputs may be fetched (url / result inputs) and results may be blocks.
// v3: a job's module may be a URL, its digest and size unknown.
const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs.v3");
// v4: task ends in batches, keyed by a sequence number in commit order.
const TASK_END_BATCHES: TableDefinition<u64, &[u8]> = TableDefinition::new("task_ends.v4");
const JOB_ENDS: TableDefinition<&str, &[u8]> = TableDefinition::new("job_ends.v3");
/// Idempotency keys: key -> (the SHA-256 of the canonical spec the key was given with,
/// the job it made). Written in the job's own transaction, so a job and its key are
/// stored together or not at all. Added after the tables above: a data dir without it
/// opens with it empty. Deleting a job (issue 15's retention) must delete its key here,
/// in the same transaction; the table is keyed by key, so the job's key will have to
/// come from the driver's key map or a job -> key table beside this one.
const IDEMPOTENCY_KEYS: TableDefinition<&str, (&[u8; 32], &str)> =
    TableDefinition::new("idempotency_keys.v1");
/// Tables of earlier layouts: a data dir holding them was written by an older Flint.
const OLD_TABLES: [&str; 3] = ["jobs.v1", "jobs.v2", "task_ends.v3"];

/// Ends written per commit at most; a bound on how long one commit holds the writer.
const GROUP_COMMIT: usize = 4096;
/// About this many bytes of task ends (inline results and logs, mostly) per stored
/// value: a commit of 4,096 ends with 1 MiB inline results each is split, not one
/// 4 GiB value.
const BATCH_VALUE_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("job store: {0}")]
    Db(String),
    #[error("job store record: {0}")]
    Record(#[from] postcard::Error),
}

fn db_error<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Db(e.to_string())
}

/// Everything the store holds, as `load` reads it at start.
pub struct Stored {
    pub jobs: Vec<StoredJob>,
    /// The idempotency keys of those jobs.
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

enum Write {
    TaskEnd(JobId, u32, TaskEndRecord),
    JobEnd(JobId, JobEndRecord),
    /// Commit what came before now, then answer.
    Flush(mpsc::SyncSender<()>),
}

pub struct JobStore {
    db: Arc<Database>,
    writes: mpsc::Sender<Write>,
    writer: Arc<WriterState>,
    /// The writer thread, woken early by a flush.
    writer_thread: std::thread::Thread,
    /// Tests set it to make `put_job` fail as a full or broken disk would.
    #[cfg(test)]
    pub(crate) refuse_jobs: std::sync::atomic::AtomicBool,
}

/// What the writer thread shares with the store's callers.
#[derive(Default)]
struct WriterState {
    /// Group commits of task and job ends so far.
    commits: AtomicU64,
    /// A flush is waiting: stop waiting out the commit interval.
    flush: AtomicBool,
}

impl JobStore {
    /// Opens (or creates) the store at `path`. Task and job ends are committed at most
    /// once per `commit_interval`; zero commits as soon as the previous commit is done.
    pub fn open(path: &Path, commit_interval: Duration) -> Result<Self, StoreError> {
        let db = Arc::new(Database::create(path).map_err(db_error)?);
        let txn = db.begin_write().map_err(db_error)?;
        let old: Vec<String> = txn
            .list_tables()
            .map_err(db_error)?
            .map(|t| t.name().to_owned())
            .filter(|name| OLD_TABLES.contains(&name.as_str()))
            .collect();
        if !old.is_empty() {
            // Refused rather than ignored: those jobs would silently disappear.
            return Err(StoreError::Db(format!(
                "{} holds jobs in an older layout ({}); finish them with the Flint that \
                 wrote them, or move the data dir away",
                path.display(),
                old.join(", ")
            )));
        }
        for table in [JOBS, JOB_ENDS] {
            txn.open_table(table).map_err(db_error)?;
        }
        txn.open_table(IDEMPOTENCY_KEYS).map_err(db_error)?;
        let next_batch = txn
            .open_table(TASK_END_BATCHES)
            .map_err(db_error)?
            .last()
            .map_err(db_error)?
            .map_or(0, |(key, _)| key.value() + 1);
        txn.commit().map_err(db_error)?;
        let (writes, queue) = mpsc::channel();
        let writer_db = db.clone();
        let writer = Arc::new(WriterState::default());
        let state = writer.clone();
        let thread = std::thread::Builder::new()
            .name("flint-job-store".into())
            .spawn(move || write_loop(&writer_db, &queue, next_batch, commit_interval, &state))
            .map_err(db_error)?;
        Ok(JobStore {
            db,
            writes,
            writer,
            writer_thread: thread.thread().clone(),
            #[cfg(test)]
            refuse_jobs: std::sync::atomic::AtomicBool::new(false),
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
        let bytes = postcard::to_stdvec(job)?;
        let id = job.def.id.0.as_str();
        let txn = self.db.begin_write().map_err(db_error)?;
        txn.open_table(JOBS)
            .map_err(db_error)?
            .insert(id, bytes.as_slice())
            .map_err(db_error)?;
        if let Some((key, spec)) = key {
            txn.open_table(IDEMPOTENCY_KEYS)
                .map_err(db_error)?
                .insert(key, (&spec.0, id))
                .map_err(db_error)?;
        }
        txn.commit().map_err(db_error)
    }

    /// Queues a task's end for the next group commit.
    pub fn task_ended(&self, job: JobId, index: u32, end: TaskEndRecord) {
        // The writer thread lives as long as the store; a send can fail only while the
        // process is going down, when the end is re-run after restart anyway.
        let _ = self.writes.send(Write::TaskEnd(job, index, end));
    }

    pub fn job_ended(&self, job: JobId, end: JobEndRecord) {
        let _ = self.writes.send(Write::JobEnd(job, end));
    }

    /// Commits every end queued so far, without waiting for the commit interval, and
    /// returns once that is done (or the writer is gone): a driver stopping cleanly
    /// keeps every task end, where a crash may lose the last interval's.
    pub fn flush(&self) {
        let (done, wait) = mpsc::sync_channel(1);
        if self.writes.send(Write::Flush(done)).is_ok() {
            self.writer.flush.store(true, Ordering::Release);
            self.writer_thread.unpark();
            let _ = wait.recv();
        }
    }

    /// Group commits of task and job ends since the store was opened.
    pub fn commits(&self) -> u64 {
        self.writer.commits.load(Ordering::Relaxed)
    }

    /// Everything stored, for rebuilding the scheduler's state at start: the jobs, and
    /// the idempotency keys of those jobs.
    pub fn load(&self) -> Result<Stored, StoreError> {
        let txn = self.db.begin_read().map_err(db_error)?;
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
        let batches = txn.open_table(TASK_END_BATCHES).map_err(db_error)?;
        let job_ends = txn.open_table(JOB_ENDS).map_err(db_error)?;
        // Every task end, by job and index; in commit order, so a later end of a task
        // replaces an earlier one as an insert under its key would.
        let mut ends: HashMap<String, BTreeMap<u32, TaskEndRecord>> = HashMap::new();
        for entry in batches.iter().map_err(db_error)? {
            let (_, bytes) = entry.map_err(db_error)?;
            let batch: Vec<(JobId, u32, TaskEndRecord)> = postcard::from_bytes(bytes.value())?;
            for (job, index, end) in batch {
                ends.entry(job.0).or_default().insert(index, end);
            }
        }
        let mut stored = Vec::new();
        for entry in jobs.iter().map_err(db_error)? {
            let (id, bytes) = entry.map_err(db_error)?;
            let job: JobRecord = postcard::from_bytes(bytes.value())?;
            let tasks = ends
                .remove(id.value())
                .map(|t| t.into_iter().collect())
                .unwrap_or_default();
            let end = job_ends
                .get(id.value())
                .map_err(db_error)?
                .map(|b| postcard::from_bytes(b.value()))
                .transpose()?;
            stored.push(StoredJob { job, tasks, end });
        }
        Ok(Stored { jobs: stored, keys })
    }
}

fn write_loop(
    db: &Database,
    queue: &mpsc::Receiver<Write>,
    mut next_batch: u64,
    commit_interval: Duration,
    state: &WriterState,
) {
    let mut last_commit: Option<Instant> = None;
    while let Ok(first) = queue.recv() {
        // Ends arriving within the interval join this commit. A backlog (the last
        // commit was full) is written without waiting, and a flush stops the wait.
        // Parked, not blocked in `recv`: a task end sent meanwhile wakes nobody.
        if let Some(last) = last_commit {
            let deadline = last + commit_interval;
            loop {
                let now = Instant::now();
                if now >= deadline
                    || matches!(first, Write::Flush(_))
                    || state.flush.load(Ordering::Acquire)
                {
                    break;
                }
                std::thread::park_timeout(deadline - now);
            }
        }
        state.flush.store(false, Ordering::Release);
        let mut batch = vec![first];
        while batch.len() < GROUP_COMMIT {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        last_commit = (batch.len() < GROUP_COMMIT).then(Instant::now);
        let committed = commit(db, &batch, &mut next_batch);
        state.commits.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = committed {
            // The ends stay in memory and are served; after a restart their tasks run
            // again. Nothing else to do but say so.
            tracing::error!(error = %e, ends = batch.len(), "job store commit failed");
        }
        for write in &batch {
            if let Write::Flush(done) = write {
                let _ = done.try_send(());
            }
        }
    }
}

fn commit(db: &Database, batch: &[Write], next_batch: &mut u64) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(db_error)?;
    let mut sequence = *next_batch;
    {
        let mut batches = txn.open_table(TASK_END_BATCHES).map_err(db_error)?;
        let mut job_ends = txn.open_table(JOB_ENDS).map_err(db_error)?;
        let mut value: Vec<(&JobId, u32, &TaskEndRecord)> = Vec::new();
        let mut value_bytes = 0;
        let mut flush = |value: &mut Vec<_>, value_bytes: &mut usize| {
            if value.is_empty() {
                return Ok::<_, StoreError>(());
            }
            let bytes = postcard::to_stdvec(&*value)?;
            batches
                .insert(sequence, bytes.as_slice())
                .map_err(db_error)?;
            sequence += 1;
            value.clear();
            *value_bytes = 0;
            Ok(())
        };
        for write in batch {
            match write {
                Write::TaskEnd(job, index, end) => {
                    value.push((job, *index, end));
                    value_bytes +=
                        64 + end.log.len() + end.result.as_ref().map_or(0, |r| r.len() as usize);
                    if value_bytes >= BATCH_VALUE_BYTES {
                        flush(&mut value, &mut value_bytes)?;
                    }
                }
                Write::JobEnd(job, end) => {
                    let bytes = postcard::to_stdvec(end)?;
                    job_ends
                        .insert(job.0.as_str(), bytes.as_slice())
                        .map_err(db_error)?;
                }
                Write::Flush(_) => {}
            }
        }
        flush(&mut value, &mut value_bytes)?;
    }
    txn.commit().map_err(db_error)?;
    *next_batch = sequence;
    Ok(())
}

#[cfg(test)]
mod tests;
