//! The job store: an embedded database (redb) in the driver's data dir holding accepted
//! jobs, the tasks that reached a final state (with their inline results), and jobs that
//! ended. A job is written, and its write committed, before the API answers 202; task
//! and job ends are group-committed by a writer thread, so a burst of short tasks costs
//! one commit, not one per task. After a crash, a task whose end was not yet committed
//! simply runs again: results are kept at least once and served exactly once.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;

use flint_protocol::JobId;
use flint_protocol::records::{JobEndRecord, JobRecord, TaskEndRecord};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

// v2: task inputs may be fetched (url / result inputs) and results may be blocks.
// v3: a job's module may be a URL, its digest and size unknown.
const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs.v3");
const TASK_ENDS: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("task_ends.v3");
const JOB_ENDS: TableDefinition<&str, &[u8]> = TableDefinition::new("job_ends.v3");
/// Tables of earlier layouts: a data dir holding them was written by an older Flint.
const OLD_TABLES: [&str; 2] = ["jobs.v1", "jobs.v2"];

/// Ends written per commit at most; a bound on how long one commit holds the writer.
const GROUP_COMMIT: usize = 4096;

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

/// One stored job with what is known of its end.
pub struct StoredJob {
    pub job: JobRecord,
    pub tasks: Vec<(u32, TaskEndRecord)>,
    pub end: Option<JobEndRecord>,
}

enum Write {
    TaskEnd(JobId, u32, TaskEndRecord),
    JobEnd(JobId, JobEndRecord),
}

pub struct JobStore {
    db: Arc<Database>,
    writes: mpsc::Sender<Write>,
}

impl JobStore {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
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
        txn.open_table(TASK_ENDS).map_err(db_error)?;
        txn.commit().map_err(db_error)?;
        let (writes, queue) = mpsc::channel();
        let writer_db = db.clone();
        std::thread::Builder::new()
            .name("flint-job-store".into())
            .spawn(move || write_loop(&writer_db, &queue))
            .map_err(db_error)?;
        Ok(JobStore { db, writes })
    }

    /// Stores an accepted job durably. Blocks for the commit: call it off the runtime.
    pub fn put_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        let bytes = postcard::to_stdvec(job)?;
        let txn = self.db.begin_write().map_err(db_error)?;
        txn.open_table(JOBS)
            .map_err(db_error)?
            .insert(job.def.id.0.as_str(), bytes.as_slice())
            .map_err(db_error)?;
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

    /// Everything stored, for rebuilding the scheduler's state at start.
    pub fn load(&self) -> Result<Vec<StoredJob>, StoreError> {
        let txn = self.db.begin_read().map_err(db_error)?;
        let jobs = txn.open_table(JOBS).map_err(db_error)?;
        let task_ends = txn.open_table(TASK_ENDS).map_err(db_error)?;
        let job_ends = txn.open_table(JOB_ENDS).map_err(db_error)?;
        let mut stored = Vec::new();
        for entry in jobs.iter().map_err(db_error)? {
            let (id, bytes) = entry.map_err(db_error)?;
            let job: JobRecord = postcard::from_bytes(bytes.value())?;
            let mut tasks = Vec::new();
            for entry in task_ends
                .range((id.value(), 0)..=(id.value(), u32::MAX))
                .map_err(db_error)?
            {
                let (key, bytes) = entry.map_err(db_error)?;
                tasks.push((key.value().1, postcard::from_bytes(bytes.value())?));
            }
            let end = job_ends
                .get(id.value())
                .map_err(db_error)?
                .map(|b| postcard::from_bytes(b.value()))
                .transpose()?;
            stored.push(StoredJob { job, tasks, end });
        }
        Ok(stored)
    }
}

fn write_loop(db: &Database, queue: &mpsc::Receiver<Write>) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < GROUP_COMMIT {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        if let Err(e) = commit(db, &batch) {
            // The ends stay in memory and are served; after a restart their tasks run
            // again. Nothing else to do but say so.
            tracing::error!(error = %e, ends = batch.len(), "job store commit failed");
        }
    }
}

fn commit(db: &Database, batch: &[Write]) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(db_error)?;
    {
        let mut task_ends = txn.open_table(TASK_ENDS).map_err(db_error)?;
        let mut job_ends = txn.open_table(JOB_ENDS).map_err(db_error)?;
        for write in batch {
            match write {
                Write::TaskEnd(job, index, end) => {
                    let bytes = postcard::to_stdvec(end)?;
                    task_ends
                        .insert((job.0.as_str(), *index), bytes.as_slice())
                        .map_err(db_error)?;
                }
                Write::JobEnd(job, end) => {
                    let bytes = postcard::to_stdvec(end)?;
                    job_ends
                        .insert(job.0.as_str(), bytes.as_slice())
                        .map_err(db_error)?;
                }
            }
        }
    }
    txn.commit().map_err(db_error)
}
