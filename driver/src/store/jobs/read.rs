//! Reading a stored job back from its tables: its record, the latest end of each task,
//! its end, and a summary rebuilt from those (shared by the store's reads and the
//! migration's write transaction, hence generic over the table type); and a finished
//! job's attempts, from whichever table version holds them.

use std::collections::BTreeMap;

use flint_protocol::JobId;
use flint_protocol::records::{
    AttemptRecord, AttemptRecordV1, JobRecord, JobSummaryRecord, TaskEndRecord,
};
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

use super::rows::queued_summary;
use super::schema::{
    JOB_ATTEMPTS, JOB_ATTEMPTS_V1, JOB_ENDS, JOB_OPTIONS, JOB_OWNERS, JOBS, TASK_ENDS,
};
use super::{JobStore, StoreError, StoredJob, db_error};

/// A job's record, task ends (the latest end of each task) and end, as committed.
pub(super) fn read_job(
    txn: &redb::ReadTransaction,
    id: &str,
) -> Result<Option<StoredJob>, StoreError> {
    let Some(mut stored) = read_job_from(
        &txn.open_table(JOBS).map_err(db_error)?,
        &txn.open_table(TASK_ENDS).map_err(db_error)?,
        &txn.open_table(JOB_ENDS).map_err(db_error)?,
        id,
    )?
    else {
        return Ok(None);
    };
    // A data dir from before the table has no options for any job: the defaults.
    let options = match txn.open_table(JOB_OPTIONS) {
        Ok(table) => table.get(id).map_err(db_error)?.map(|v| v.value().to_vec()),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(db_error(e)),
    };
    if let Some(bytes) = options {
        stored.job.def.options = postcard::from_bytes(&bytes)?;
    }
    let owner = match txn.open_table(JOB_OWNERS) {
        Ok(table) => table.get(id).map_err(db_error)?.map(|v| v.value().to_vec()),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(db_error(e)),
    };
    if let Some(bytes) = owner {
        stored.job.def.owner = postcard::from_bytes(&bytes)?;
    }
    Ok(Some(stored))
}

/// [`read_job`] within a write transaction (the migration's).
pub(super) fn read_job_in(
    txn: &WriteTransaction,
    id: &str,
) -> Result<Option<StoredJob>, StoreError> {
    read_job_from(
        &txn.open_table(JOBS).map_err(db_error)?,
        &txn.open_table(TASK_ENDS).map_err(db_error)?,
        &txn.open_table(JOB_ENDS).map_err(db_error)?,
        id,
    )
}

pub(super) fn read_job_from(
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
pub(super) fn summary_of(stored: &StoredJob) -> JobSummaryRecord {
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

impl JobStore {
    /// A finished job's attempts, as [`Self::attempts_ended`] stored them; `None` for a
    /// job stored without them (still running, or finished before they were kept).
    pub fn attempts(&self, id: &JobId) -> Result<Option<Vec<AttemptRecord>>, StoreError> {
        // Written after the job's end, so never before the job is folded.
        let txn = self.db.get()?.begin_read().map_err(db_error)?;
        let value =
            |table: redb::TableDefinition<&str, &[u8]>| -> Result<Option<Vec<u8>>, StoreError> {
                match txn.open_table(table) {
                    Ok(table) => Ok(table
                        .get(id.0.as_str())
                        .map_err(db_error)?
                        .map(|v| v.value().to_vec())),
                    Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
                    Err(e) => Err(db_error(e)),
                }
            };
        if let Some(bytes) = value(JOB_ATTEMPTS)? {
            return Ok(Some(postcard::from_bytes(&bytes)?));
        }
        let Some(bytes) = value(JOB_ATTEMPTS_V1)? else {
            return Ok(None);
        };
        let old: Vec<AttemptRecordV1> = postcard::from_bytes(&bytes)?;
        Ok(Some(
            old.into_iter()
                .map(|a| AttemptRecord {
                    task: a.task,
                    attempt: a.attempt,
                    executor: a.executor,
                    start_us: a.start_us,
                    end_us: a.end_us,
                    outcome: a.outcome,
                    speculative: a.speculative,
                    // Not kept then.
                    memory_mb: 0,
                    timeout_ms: 0,
                    usage: None,
                    pins: None,
                })
                .collect(),
        ))
    }
}
