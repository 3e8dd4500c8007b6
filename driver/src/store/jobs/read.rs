//! Reading a stored job back from its tables: its record, the latest end of each task,
//! its end, and a summary rebuilt from those (shared by the store's reads and the
//! migration's write transaction, hence generic over the table type), with what the
//! side tables hold of it (options, owner, network); and a finished job's attempts,
//! from whichever table version holds them.

use std::collections::BTreeMap;

use flint_protocol::JobId;
use flint_protocol::records::{
    AttemptRecord, AttemptRecordV1, AttemptRecordV2, JobRecord, JobSummaryRecord, TaskEndRecord,
};
use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use super::rows::queued_summary;
use super::schema::{
    JOB_ATTEMPTS, JOB_ATTEMPTS_V1, JOB_ATTEMPTS_V2, JOB_ENDS, JOB_NETWORK, JOB_OPTIONS, JOB_OWNERS,
    JOBS, TASK_ENDS,
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
    if let Some(bytes) = side_value(txn, JOB_OPTIONS, id)? {
        stored.job.def.options = postcard::from_bytes(&bytes)?;
    }
    if let Some(bytes) = side_value(txn, JOB_OWNERS, id)? {
        stored.job.def.owner = postcard::from_bytes(&bytes)?;
    }
    if let Some(bytes) = side_value(txn, JOB_NETWORK, id)? {
        stored.job.def.network = Some(postcard::from_bytes(&bytes)?);
    }
    Ok(Some(stored))
}

/// Job `id`'s value in `table`; none when the data dir is from before the table (a job
/// without a value there has what every job had then).
fn side_value(
    txn: &redb::ReadTransaction,
    table: TableDefinition<&str, &[u8]>,
    id: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    match txn.open_table(table) {
        Ok(table) => Ok(table.get(id).map_err(db_error)?.map(|v| v.value().to_vec())),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(db_error(e)),
    }
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
        let id = id.0.as_str();
        if let Some(bytes) = side_value(&txn, JOB_ATTEMPTS, id)? {
            return Ok(Some(postcard::from_bytes(&bytes)?));
        }
        if let Some(bytes) = side_value(&txn, JOB_ATTEMPTS_V2, id)? {
            let old: Vec<AttemptRecordV2> = postcard::from_bytes(&bytes)?;
            return Ok(Some(old.into_iter().map(AttemptRecord::from).collect()));
        }
        let Some(bytes) = side_value(&txn, JOB_ATTEMPTS_V1, id)? else {
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
