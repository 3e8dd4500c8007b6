//! Folding the journal at open: every record past the database's mark (jobs accepted
//! before a crash or stop that no group commit folded) goes into the database in one
//! commit, or, when the disk is still too full for it, to the writer thread, which
//! folds them once it can (the files keep them meanwhile).

use std::sync::Arc;

use redb::Database;

use super::faults::Faults;
use super::journal::record::Journaled;
use super::journal::{Journal, Position};
use super::rows::insert_encoded;
use super::schema::META;
use super::{StoreError, db_error};

const JOURNAL_EPOCH: &str = "journal_epoch";
const JOURNAL_END: &str = "journal_end";

/// Stores in `txn` how far the journal is folded.
pub(super) fn set_mark(txn: &redb::WriteTransaction, mark: Position) -> Result<(), StoreError> {
    let mut meta = txn.open_table(META).map_err(db_error)?;
    meta.insert(JOURNAL_EPOCH, mark.epoch).map_err(db_error)?;
    meta.insert(JOURNAL_END, mark.end).map_err(db_error)?;
    Ok(())
}

/// How far the database has folded the journal.
fn mark(db: &Database) -> Result<Position, StoreError> {
    use redb::ReadableDatabase;
    let txn = db.begin_read().map_err(db_error)?;
    let meta = txn.open_table(META).map_err(db_error)?;
    let get = |key| {
        meta.get(key)
            .map_err(db_error)
            .map(|v| v.map_or(0, |v| v.value()))
    };
    Ok(Position {
        epoch: get(JOURNAL_EPOCH)?,
        end: get(JOURNAL_END)?,
    })
}

/// Opens the journal beside the database at `path` and folds into the database every
/// record past its mark (jobs accepted before a crash or stop that no group commit
/// folded), then deletes the files that held them. When that commit fails (a disk
/// still full), the files stay and the records are returned, in order, for the writer
/// to fold once it can; a record this Flint cannot read fails the open (it is an
/// accepted job).
pub(super) fn fold_journal(
    db: &Database,
    path: &std::path::Path,
    faults: Arc<Faults>,
) -> Result<(Journal, Vec<(Position, Journaled)>), StoreError> {
    let mark = mark(db)?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    let (journal, records) = Journal::open(dir, mark, faults.clone())?;
    let mut unfolded = Vec::with_capacity(records.len());
    for (position, version, payload) in records {
        unfolded.push((position, Journaled::decode(version, payload)?));
    }
    let Some((last, _)) = unfolded.last() else {
        journal.folded_at_open();
        return Ok((journal, unfolded));
    };
    let folded = faults.commit().and_then(|()| {
        let txn = db.begin_write().map_err(db_error)?;
        for (_, job) in &unfolded {
            insert_encoded(&txn, &job.job, job.record_bytes(), job.ends_bytes(), None)?;
        }
        set_mark(&txn, *last)?;
        txn.commit().map_err(db_error)
    });
    match folded {
        Ok(()) => {
            tracing::info!(
                jobs = unfolded.len(),
                "job journal: folded the jobs accepted since the last commit"
            );
            journal.folded_at_open();
            Ok((journal, Vec::new()))
        }
        Err(e) => {
            tracing::error!(
                error = %e, jobs = unfolded.len(),
                "job journal: folding the jobs accepted since the last commit failed; they \
                 are served from the journal, which keeps them, and folded once the \
                 database takes a commit"
            );
            journal.folded(mark);
            Ok((journal, unfolded))
        }
    }
}
