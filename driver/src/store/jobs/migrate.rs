//! Bringing a data dir of the layout before (4) up to this one (5), in place, at open.
//!
//! Layout 4 kept task ends in values keyed by a sequence number alone (many jobs per
//! value), and had no summaries, indexes, job -> key table, blob counts or `meta`. The
//! migration is a series of transactions, each complete in itself, so a crash anywhere
//! leaves a data dir the next start carries on from:
//!
//! 1. task-end values move from `task_ends.v4` to `task_ends.v5` a chunk at a time, each
//!    chunk inserted and removed in one transaction (what is left in v4 is what is left
//!    to do);
//! 2. every job without a summary gets one, with its index entries and blob counts, a
//!    chunk at a time (a job with a summary is done);
//! 3. one last transaction fills the job -> key table, drops `task_ends.v4` and writes
//!    `layout = 5`.
//!
//! A data dir is of layout 4 when it has `jobs.v3` and no `layout` in `meta`.

use std::collections::HashMap;

use flint_protocol::JobId;
use flint_protocol::records::TaskEndRecord;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use super::read::{read_job_in, summary_of};
use super::rows::index_job;
use super::schema::{
    IDEMPOTENCY_KEYS, JOB_KEYS, JOBS, LAYOUT, META, NEXT_SEQUENCE, SUMMARIES, TASK_ENDS,
    create_tables,
};
use super::{StoreError, db_error};

/// Layout 4's task ends: sequence -> `Vec<(JobId, u32, TaskEndRecord)>`.
pub(super) const TASK_ENDS_V4: TableDefinition<u64, &[u8]> = TableDefinition::new("task_ends.v4");

/// What tests use to stop a migration midway; from the environment, as the driver
/// runs as a process in those tests.
pub(super) struct Hooks {
    /// Values or jobs per transaction.
    chunk: usize,
    /// Abort the process after this many of the migration's commits.
    abort_after: Option<u64>,
}

impl Hooks {
    pub(super) fn from_env() -> Self {
        let number = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        Hooks {
            chunk: number("FLINT_TEST_MIGRATION_CHUNK").map_or(512, |n| n.max(1) as usize),
            abort_after: number("FLINT_TEST_MIGRATION_ABORT_AFTER"),
        }
    }

    #[cfg(test)]
    pub(super) fn chunks_of(chunk: usize) -> Self {
        Hooks {
            chunk,
            abort_after: None,
        }
    }
}

/// Counts the migration's commits, for [`Hooks::abort_after`].
struct Progress<'h> {
    hooks: &'h Hooks,
    commits: u64,
}

impl Progress<'_> {
    fn committed(&mut self) {
        self.commits += 1;
        if self.hooks.abort_after == Some(self.commits) {
            eprintln!(
                "flint: aborting after migration commit {} (FLINT_TEST_MIGRATION_ABORT_AFTER)",
                self.commits
            );
            std::process::abort();
        }
    }
}

/// The data dir's layout: `None` for a new one.
fn layout(db: &Database) -> Result<Option<u64>, StoreError> {
    let txn = db.begin_read().map_err(db_error)?;
    let tables: Vec<String> = txn
        .list_tables()
        .map_err(db_error)?
        .map(|t| t.name().to_owned())
        .collect();
    if tables.iter().any(|t| t == META.name()) {
        let meta = txn.open_table(META).map_err(db_error)?;
        if let Some(layout) = meta.get("layout").map_err(db_error)? {
            return Ok(Some(layout.value()));
        }
    }
    Ok(tables.iter().any(|t| t == JOBS.name()).then_some(4))
}

/// Migrates the data dir to [`LAYOUT`] if it is older; a newer one is refused.
pub(super) fn run(db: &Database, hooks: &Hooks) -> Result<(), StoreError> {
    match layout(db)? {
        None => return Ok(()),
        Some(LAYOUT) => return Ok(()),
        Some(4) => {}
        Some(other) => {
            return Err(StoreError::Db(format!(
                "the job store has layout {other}, newer than this Flint's ({LAYOUT}); run \
                 the Flint that wrote it"
            )));
        }
    }
    tracing::info!("migrating the job store from layout 4 to {LAYOUT}");
    let mut progress = Progress { hooks, commits: 0 };
    let moved = move_task_ends(db, hooks.chunk, &mut progress)?;
    let summarized = summarize_jobs(db, hooks.chunk, &mut progress)?;
    let txn = db.begin_write().map_err(db_error)?;
    create_tables(&txn)?;
    {
        let keys = txn.open_table(IDEMPOTENCY_KEYS).map_err(db_error)?;
        let mut job_keys = txn.open_table(JOB_KEYS).map_err(db_error)?;
        for entry in keys.iter().map_err(db_error)? {
            let (key, value) = entry.map_err(db_error)?;
            job_keys
                .insert(value.value().1, key.value())
                .map_err(db_error)?;
        }
    }
    txn.delete_table(TASK_ENDS_V4).map_err(db_error)?;
    txn.open_table(META)
        .map_err(db_error)?
        .insert("layout", LAYOUT)
        .map_err(db_error)?;
    txn.commit().map_err(db_error)?;
    progress.committed();
    tracing::info!(
        task_end_values = moved,
        jobs = summarized,
        "job store migrated to layout {LAYOUT}"
    );
    Ok(())
}

/// Step 1: every layout-4 value split by job into layout-5 values under the same
/// sequence number (one job appears once per v4 value), so the order of a task's ends
/// is kept.
fn move_task_ends(db: &Database, chunk: usize, progress: &mut Progress) -> Result<u64, StoreError> {
    let mut moved = 0;
    loop {
        let n = move_chunk(db, chunk, progress)?;
        moved += n;
        if n < chunk as u64 {
            return Ok(moved);
        }
    }
}

/// Moves up to `chunk` values in one transaction; how many it moved.
fn move_chunk(db: &Database, chunk: usize, progress: &mut Progress) -> Result<u64, StoreError> {
    let txn = db.begin_write().map_err(db_error)?;
    let moved = {
        let mut old = txn.open_table(TASK_ENDS_V4).map_err(db_error)?;
        let mut new = txn.open_table(TASK_ENDS).map_err(db_error)?;
        let mut meta = txn.open_table(META).map_err(db_error)?;
        let mut taken = Vec::new();
        for entry in old.iter().map_err(db_error)?.take(chunk) {
            let (sequence, bytes) = entry.map_err(db_error)?;
            let batch: Vec<(JobId, u32, TaskEndRecord)> = postcard::from_bytes(bytes.value())?;
            taken.push((sequence.value(), batch));
        }
        let mut next = meta
            .get(NEXT_SEQUENCE)
            .map_err(db_error)?
            .map_or(0, |v| v.value());
        for (sequence, batch) in &taken {
            let mut by_job: Vec<(&JobId, Vec<(u32, &TaskEndRecord)>)> = Vec::new();
            let mut at: HashMap<&JobId, usize> = HashMap::new();
            for (job, index, end) in batch {
                let i = *at.entry(job).or_insert_with(|| {
                    by_job.push((job, Vec::new()));
                    by_job.len() - 1
                });
                by_job[i].1.push((*index, end));
            }
            for (job, value) in by_job {
                let bytes = postcard::to_stdvec(&value)?;
                new.insert((job.0.as_str(), *sequence), bytes.as_slice())
                    .map_err(db_error)?;
            }
            old.remove(*sequence).map_err(db_error)?;
            next = next.max(sequence + 1);
        }
        meta.insert(NEXT_SEQUENCE, next).map_err(db_error)?;
        taken.len() as u64
    };
    txn.commit().map_err(db_error)?;
    progress.committed();
    Ok(moved)
}

/// One transaction of step 1, moving at most `chunk` values: a migration that stops
/// there, for tests.
#[cfg(test)]
pub(super) fn move_some(db: &Database, chunk: usize) -> Result<(), StoreError> {
    let hooks = Hooks::chunks_of(chunk);
    let mut progress = Progress {
        hooks: &hooks,
        commits: 0,
    };
    move_chunk(db, chunk, &mut progress).map(|_| ())
}

/// Step 2: a summary, index entries and blob counts for every job without a summary.
fn summarize_jobs(db: &Database, chunk: usize, progress: &mut Progress) -> Result<u64, StoreError> {
    let mut summarized = 0;
    let mut after = String::new();
    loop {
        let txn = db.begin_write().map_err(db_error)?;
        create_tables(&txn)?;
        let (jobs, last) = {
            let records = txn.open_table(JOBS).map_err(db_error)?;
            let summaries = txn.open_table(SUMMARIES).map_err(db_error)?;
            let mut todo = Vec::new();
            let mut last = None;
            let range = records
                .range::<&str>((
                    std::ops::Bound::Excluded(after.as_str()),
                    std::ops::Bound::Unbounded,
                ))
                .map_err(db_error)?;
            for entry in range {
                let (id, _) = entry.map_err(db_error)?;
                let id = id.value().to_owned();
                last = Some(id.clone());
                if summaries.get(id.as_str()).map_err(db_error)?.is_none() {
                    todo.push(id);
                    if todo.len() >= chunk {
                        break;
                    }
                }
            }
            (todo, last)
        };
        for id in &jobs {
            if let Some(stored) = read_job_in(&txn, id)? {
                index_job(&txn, &stored.job.def, &summary_of(&stored))?;
            }
        }
        txn.commit().map_err(db_error)?;
        progress.committed();
        summarized += jobs.len() as u64;
        match last {
            Some(last) if jobs.len() >= chunk => after = last,
            _ => return Ok(summarized),
        }
    }
}
