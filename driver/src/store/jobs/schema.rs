//! The job store's layout: every table with its version, the layout number the `meta`
//! table records, and how index and reference keys are encoded. Apart from the
//! [`JobStore`](super::JobStore)'s methods so that the layout reads in one place: a
//! table's version changes here, and the store, its writer and the migration all name
//! their tables from here.

use flint_protocol::Digest;
use flint_protocol::api::JobState;
use std::collections::HashSet;

use redb::{
    Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle, WriteTransaction,
};

use super::faults::Faults;
use super::{StoreError, db_error};

/// The layout this driver writes, in the `meta` table under `layout`.
pub const LAYOUT: u64 = 5;
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The next task-end value's sequence number (they are keyed by job and sequence).
pub(super) const NEXT_SEQUENCE: &str = "next_task_end_sequence";
/// The sequence of a job's task-end value written with its record: the ends its tasks
/// had when it was accepted (memoized tasks). The writer numbers its values from 1, so
/// this one comes first in the job's range and is never overwritten.
pub(super) const ACCEPTED_SEQUENCE: u64 = 0;

// v2: task inputs may be fetched (url / result inputs) and results may be blocks.
// v3: a job's module may be a URL, its digest and size unknown.
pub(super) const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs.v3");
/// Task ends by (job, sequence): the ends of one job in one group commit are one value,
/// a `Vec<(u32, TaskEndRecord)>`, so that a job's ends are one range to read or delete.
/// v5 (layout 5); v4 was keyed by sequence alone, many jobs per value.
pub(super) const TASK_ENDS: TableDefinition<(&str, u64), &[u8]> =
    TableDefinition::new("task_ends.v5");
pub(super) const JOB_ENDS: TableDefinition<&str, &[u8]> = TableDefinition::new("job_ends.v3");
/// Job -> its attempts (`Vec<AttemptRecord>`), written once its last attempt has
/// ended: the timeline of a finished job. Added in layout 5 without a new layout: a
/// data dir without it has no timelines, and its jobs' timelines are rebuilt from
/// their task ends.
/// v2 keeps each attempt's budget and usage; a job stored with only a v1 value is read
/// from it, with neither. v3: usage counts outbound HTTP and pins list the responses
/// recorded; a job stored with only a v2 value is read from it (`AttemptRecordV2`), its
/// egress counts zero and its pins without responses, which is what it had.
pub(super) const JOB_ATTEMPTS: TableDefinition<&str, &[u8]> =
    TableDefinition::new("job_attempts.v3");
pub(super) const JOB_ATTEMPTS_V2: TableDefinition<&str, &[u8]> =
    TableDefinition::new("job_attempts.v2");
pub(super) const JOB_ATTEMPTS_V1: TableDefinition<&str, &[u8]> =
    TableDefinition::new("job_attempts.v1");
/// Job -> its [`JobOptions`](flint_protocol::records::JobOptions), for a job that asked
/// for any (exact accounting, escalated retries): written with the job, read whenever it
/// is, deleted with it. Added in layout 5 without a new layout: a job without a value
/// here has the defaults.
pub(super) const JOB_OPTIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("job_options.v1");
/// Job -> its [`Owner`](flint_protocol::records::Owner) (tenant and priority), for a
/// job a tenant submitted or that has a priority: written with the job, read whenever it
/// is, deleted with it. Added in layout 5 without a new layout: a job without a value
/// here is the admin's, at priority 0.
pub(super) const JOB_OWNERS: TableDefinition<&str, &[u8]> = TableDefinition::new("job_owners.v1");
/// Job -> its [`NetworkGrant`](flint_protocol::NetworkGrant) (the outbound HTTP its
/// tasks may make), for a job that has one: written with the job, read whenever it is,
/// deleted with it. Added in layout 5 without a new layout: a job without a row has no
/// network, as no job had before.
pub(super) const JOB_NETWORK: TableDefinition<&str, &[u8]> = TableDefinition::new("job_network.v1");
/// (`m:<hex>` or `f:<hex>`, tenant) -> (): the tenants that uploaded a module or file
/// (`*` for one the admin shared with every tenant). A tenant sees the uploads it has a
/// row for and the shared ones; the admin sees all.
pub(super) const UPLOAD_OWNERS: TableDefinition<(&str, &str), ()> =
    TableDefinition::new("upload_owners.v1");
/// Memoized results: a task's memo key (SHA-256, see `scheduler::memo`) -> the first job
/// and task that succeeded with it and kept its result inline. Added in layout 5 without
/// a new layout; deleted with that job (through `MEMO_BY_JOB`).
pub(super) const MEMO: TableDefinition<&[u8], (&str, u32)> = TableDefinition::new("memo.v1");
/// (job, task) -> the memo key it is the entry of, so that deleting a job drops its
/// entries.
pub(super) const MEMO_BY_JOB: TableDefinition<(&str, u32), &[u8]> =
    TableDefinition::new("memo_by_job.v1");
/// Idempotency keys: key -> (the SHA-256 of the canonical spec the key was given with,
/// the job it made). Written in the job's own transaction, so a job and its key are
/// stored together or not at all.
pub(super) const IDEMPOTENCY_KEYS: TableDefinition<&str, (&[u8; 32], &str)> =
    TableDefinition::new("idempotency_keys.v1");
/// Job -> its idempotency key, so that deleting a job frees its key.
pub(super) const JOB_KEYS: TableDefinition<&str, &str> = TableDefinition::new("job_keys.v1");
/// Graph id -> its [`GraphRecord`](flint_protocol::records::GraphRecord): the local
/// names of its jobs and the edges between them, written in the transaction that stores
/// its jobs. Added in layout 5 without a new layout: a data dir without it has no graphs.
pub(super) const GRAPHS: TableDefinition<&str, &[u8]> = TableDefinition::new("graphs.v1");
/// Executor id -> nothing: the executors registered and not since seen leave, so that
/// a restarted driver knows whom to wait for before it launches again what they may
/// still run (`--adopt-wait-ms`). Added in layout 5 without a new layout: a data dir
/// without it knew no executors.
pub(super) const EXECUTORS: TableDefinition<&str, ()> = TableDefinition::new("executors.v1");
/// Job -> [`JobSummaryRecord`].
pub(super) const SUMMARIES: TableDefinition<&str, &[u8]> = TableDefinition::new("job_summaries.v1");
/// Indexes of every job: by creation time; by state (a live job is under `queued` until
/// it ends), then creation time; by name, then creation time; finished jobs by the time
/// they finished (what retention deletes first).
pub(super) const BY_CREATED: TableDefinition<(u64, &str), ()> =
    TableDefinition::new("jobs_by_created.v1");
pub(super) const BY_STATE: TableDefinition<(u8, u64, &str), ()> =
    TableDefinition::new("jobs_by_state.v1");
pub(super) const BY_NAME: TableDefinition<(&str, u64, &str), ()> =
    TableDefinition::new("jobs_by_name.v1");
pub(super) const BY_FINISHED: TableDefinition<(u64, &str), ()> =
    TableDefinition::new("jobs_by_finished.v1");
/// Uploaded modules (`m:<hex>`) and files (`f:<hex>`) -> how many stored jobs name
/// them; a blob no job names may be deleted once it is old enough.
pub(super) const BLOB_REFS: TableDefinition<&str, u64> = TableDefinition::new("blob_refs.v1");
/// Tables of layouts before 4: a data dir holding them was written by a Flint too old
/// to migrate from.
pub(super) const ANCIENT_TABLES: [&str; 3] = ["jobs.v1", "jobs.v2", "task_ends.v3"];

/// The state's number in the indexes: its place in [`JobState::ALL`].
pub(super) fn state_code(state: JobState) -> u8 {
    JobState::ALL
        .iter()
        .position(|s| *s == state)
        .expect("every state is in ALL") as u8
}

pub fn blob_key(digest: &Digest, files: bool) -> String {
    format!("{}:{}", if files { 'f' } else { 'm' }, digest.hex())
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
    txn.open_table(JOB_OPTIONS).map_err(db_error)?;
    txn.open_table(JOB_OWNERS).map_err(db_error)?;
    txn.open_table(JOB_NETWORK).map_err(db_error)?;
    txn.open_table(UPLOAD_OWNERS).map_err(db_error)?;
    txn.open_table(MEMO).map_err(db_error)?;
    txn.open_table(MEMO_BY_JOB).map_err(db_error)?;
    txn.open_table(IDEMPOTENCY_KEYS).map_err(db_error)?;
    txn.open_table(JOB_KEYS).map_err(db_error)?;
    txn.open_table(BY_STATE).map_err(db_error)?;
    txn.open_table(BY_NAME).map_err(db_error)?;
    txn.open_table(BLOB_REFS).map_err(db_error)?;
    txn.open_table(META).map_err(db_error)?;
    txn.open_table(GRAPHS).map_err(db_error)?;
    txn.open_table(EXECUTORS).map_err(db_error)?;
    Ok(())
}

/// Whether `tables` (the names a data dir holds) has every table [`create_tables`] makes.
fn has_every_table(tables: &HashSet<String>) -> bool {
    let has = |name: &str| tables.contains(name);
    has(JOBS.name())
        && has(JOB_ENDS.name())
        && has(SUMMARIES.name())
        && has(BY_CREATED.name())
        && has(BY_FINISHED.name())
        && has(TASK_ENDS.name())
        && has(JOB_ATTEMPTS.name())
        && has(JOB_OPTIONS.name())
        && has(JOB_OWNERS.name())
        && has(JOB_NETWORK.name())
        && has(UPLOAD_OWNERS.name())
        && has(MEMO.name())
        && has(MEMO_BY_JOB.name())
        && has(IDEMPOTENCY_KEYS.name())
        && has(JOB_KEYS.name())
        && has(BY_STATE.name())
        && has(BY_NAME.name())
        && has(BLOB_REFS.name())
        && has(META.name())
        && has(GRAPHS.name())
        && has(EXECUTORS.name())
}

/// Makes the tables and the layout a data dir lacks (a new one, or one from before a
/// table was added), and returns the writer's next task-end sequence (never
/// [`ACCEPTED_SEQUENCE`]). A data dir with all of them is not written to: a driver
/// whose disk is full still starts.
pub(super) fn prepare(db: &Database, faults: &Faults) -> Result<u64, StoreError> {
    let txn = db.begin_read().map_err(db_error)?;
    let tables: HashSet<String> = txn
        .list_tables()
        .map_err(db_error)?
        .map(|t| t.name().to_owned())
        .collect();
    if has_every_table(&tables) {
        let meta = txn.open_table(META).map_err(db_error)?;
        if meta.get("layout").map_err(db_error)?.is_some() {
            let next = meta.get(NEXT_SEQUENCE).map_err(db_error)?;
            return Ok(next.map_or(0, |v| v.value()).max(ACCEPTED_SEQUENCE + 1));
        }
    }
    drop(txn);
    faults.commit()?;
    let txn = db.begin_write().map_err(db_error)?;
    create_tables(&txn)?;
    let next = {
        let mut meta = txn.open_table(META).map_err(db_error)?;
        // A new data dir (an old one was migrated before this, and says so).
        if meta.get("layout").map_err(db_error)?.is_none() {
            meta.insert("layout", LAYOUT).map_err(db_error)?;
        }
        let next = meta.get(NEXT_SEQUENCE).map_err(db_error)?;
        next.map_or(0, |v| v.value())
    };
    txn.commit().map_err(db_error)?;
    Ok(next.max(ACCEPTED_SEQUENCE + 1))
}
