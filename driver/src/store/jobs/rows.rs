//! A job's rows written, ended and removed within a write transaction: its record, its
//! summary and index entries, its idempotency key, the reference counts of the uploads
//! it names. Kept together because these writes must stay symmetric (what inserting a
//! job adds, deleting it removes), and apart from the store's handle and its readers.

use flint_protocol::Digest;
use flint_protocol::api::JobState;
use flint_protocol::records::{
    JobDef, JobEndRecord, JobRecord, JobSummaryRecord, StoredCounts, TaskEndRecord,
};
use redb::{ReadableTable, WriteTransaction};

use super::schema::{
    ACCEPTED_SEQUENCE, BLOB_REFS, BY_CREATED, BY_FINISHED, BY_NAME, BY_STATE, IDEMPOTENCY_KEYS,
    JOB_ATTEMPTS, JOB_ATTEMPTS_V1, JOB_ATTEMPTS_V2, JOB_ENDS, JOB_KEYS, JOB_NETWORK, JOB_OPTIONS,
    JOB_OWNERS, JOBS, MEMO, MEMO_BY_JOB, SUMMARIES, TASK_ENDS, blob_key, state_code,
};
use super::{Deleted, StoreError, db_error};

/// The uploads a job names (those the driver stores and serves), as [`BLOB_REFS`] keys.
pub(super) fn blob_keys(def: &JobDef) -> Vec<String> {
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

/// A new job's summary: queued, every task pending.
pub(super) fn queued_summary(job: &JobRecord) -> JobSummaryRecord {
    JobSummaryRecord {
        name: job.def.name.clone(),
        state: JobState::Queued,
        created_at_ms: job.def.created_at_ms,
        finished_at_ms: None,
        tasks: job.tasks.len() as u32,
        counts: StoredCounts {
            pending: job.tasks.len() as u32,
            ..StoredCounts::default()
        },
        error: None,
    }
}

/// Stores an accepted job: its record, the ends its tasks had at acceptance (memoized
/// tasks), its options, owner, network and idempotency key, its summary and index
/// entries.
pub(super) fn insert_job(
    txn: &WriteTransaction,
    job: &JobRecord,
    ends: &[(u32, TaskEndRecord)],
    key: Option<(&str, &Digest)>,
) -> Result<(), StoreError> {
    let ends = match ends.is_empty() {
        true => None,
        false => Some(postcard::to_stdvec(ends)?),
    };
    insert_encoded(txn, job, &postcard::to_stdvec(job)?, ends.as_deref(), key)
}

/// [`insert_job`] with the record and the ends already encoded (`bytes` and `ends`, as
/// the journal holds them).
pub(super) fn insert_encoded(
    txn: &WriteTransaction,
    job: &JobRecord,
    bytes: &[u8],
    ends: Option<&[u8]>,
    key: Option<(&str, &Digest)>,
) -> Result<(), StoreError> {
    let id = job.def.id.0.as_str();
    txn.open_table(JOBS)
        .map_err(db_error)?
        .insert(id, bytes)
        .map_err(db_error)?;
    if let Some(ends) = ends {
        // Stored with the record, so that a memoized task is never pending after a
        // restart, whatever else was committed.
        txn.open_table(TASK_ENDS)
            .map_err(db_error)?
            .insert((id, ACCEPTED_SEQUENCE), ends)
            .map_err(db_error)?;
    }
    if !job.def.options.is_default() {
        let options = postcard::to_stdvec(&job.def.options)?;
        txn.open_table(JOB_OPTIONS)
            .map_err(db_error)?
            .insert(id, options.as_slice())
            .map_err(db_error)?;
    }
    if !job.def.owner.is_default() {
        let owner = postcard::to_stdvec(&job.def.owner)?;
        txn.open_table(JOB_OWNERS)
            .map_err(db_error)?
            .insert(id, owner.as_slice())
            .map_err(db_error)?;
    }
    if let Some(network) = &job.def.network {
        let network = postcard::to_stdvec(network)?;
        txn.open_table(JOB_NETWORK)
            .map_err(db_error)?
            .insert(id, network.as_slice())
            .map_err(db_error)?;
    }
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
pub(super) fn index_job(
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
pub(super) fn end_job(
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

pub(super) fn delete_job(txn: &WriteTransaction, id: &str) -> Result<Option<Deleted>, StoreError> {
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
    let record = txn
        .open_table(JOBS)
        .map_err(db_error)?
        .remove(id)
        .map_err(db_error)?
        .map(|v| postcard::from_bytes::<JobRecord>(v.value()))
        .transpose()?;
    delete_task_ends(txn, id)?;
    delete_memo(txn, id)?;
    txn.open_table(JOB_ENDS)
        .map_err(db_error)?
        .remove(id)
        .map_err(db_error)?;
    for table in [
        JOB_ATTEMPTS,
        JOB_ATTEMPTS_V2,
        JOB_ATTEMPTS_V1,
        JOB_OPTIONS,
        JOB_OWNERS,
        JOB_NETWORK,
    ] {
        txn.open_table(table)
            .map_err(db_error)?
            .remove(id)
            .map_err(db_error)?;
    }
    unindex(txn, id, &summary)?;
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
        release_blobs(txn, record)?;
    }
    Ok(Some(Deleted { summary, key }))
}

fn delete_task_ends(txn: &WriteTransaction, id: &str) -> Result<(), StoreError> {
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
    Ok(())
}

/// A deleted job's memo entries: later jobs find nothing of it (those that took a result
/// from it keep their own copy).
fn delete_memo(txn: &WriteTransaction, id: &str) -> Result<(), StoreError> {
    let mut by_job = txn.open_table(MEMO_BY_JOB).map_err(db_error)?;
    let mut memo = txn.open_table(MEMO).map_err(db_error)?;
    let entries: Vec<(u32, Vec<u8>)> = by_job
        .range((id, 0)..=(id, u32::MAX))
        .map_err(db_error)?
        .map(|e| e.map(|(k, v)| (k.value().1, v.value().to_vec())))
        .collect::<Result<_, _>>()
        .map_err(db_error)?;
    for (index, key) in entries {
        by_job.remove((id, index)).map_err(db_error)?;
        let ours = memo
            .get(key.as_slice())
            .map_err(db_error)?
            .map(|v| v.value() == (id, index));
        if ours == Some(true) {
            memo.remove(key.as_slice()).map_err(db_error)?;
        }
    }
    Ok(())
}

/// Takes a deleted job out of the listing indexes.
fn unindex(txn: &WriteTransaction, id: &str, summary: &JobSummaryRecord) -> Result<(), StoreError> {
    let created = summary.created_at_ms;
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
    Ok(())
}

/// One reference fewer to each blob a deleted job's record names.
fn release_blobs(txn: &WriteTransaction, record: &JobRecord) -> Result<(), StoreError> {
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
    Ok(())
}
