//! An accepted job's way in: committed directly with its idempotency key, or synced to
//! the journal for the next group commit to fold; and the jobs a journal held at open
//! that a full disk kept the database from taking, served from memory until folded.

use std::sync::atomic::Ordering;

use super::journal::Position;
use super::journal::record::Journaled;
use super::rows::insert_job;
use super::writer::{Write, Writer};
use super::{JobStore, StoreError, StoredJob, db_error, handle};
use flint_protocol::records::{JobRecord, TaskEndRecord};
use flint_protocol::{Digest, JobId};

/// Jobs the journal held at open that are not in the database yet, with the ends their
/// tasks had at acceptance.
#[derive(Default)]
pub(super) struct Unfolded {
    /// The writer's number of the last of them: once committed, the database has all.
    write: u64,
    jobs: Vec<(JobRecord, Vec<(u32, TaskEndRecord)>)>,
}

impl Unfolded {
    /// Sends `records` to the writer, in order, keeping a copy to serve meanwhile.
    pub(super) fn hand_over(
        writer: &Writer,
        records: Vec<(Position, Journaled)>,
    ) -> Result<Self, StoreError> {
        let mut unfolded = Unfolded::default();
        for (position, journaled) in records {
            unfolded
                .jobs
                .push((journaled.job.clone(), journaled.ends()?));
            unfolded.write = writer.send(Write::Job(Box::new(journaled), position));
        }
        Ok(unfolded)
    }

    pub(super) fn write(&self) -> u64 {
        self.write
    }
}

impl JobStore {
    /// Tests refuse a job's record as a full disk would, or hold it as a slow one.
    #[cfg(test)]
    pub(super) fn test_disk(&self) -> Result<(), StoreError> {
        while self.hold_jobs.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if self.refuse_jobs.load(Ordering::Relaxed) {
            return Err(StoreError::Db("No space left on device (a test's)".into()));
        }
        Ok(())
    }

    /// Stores an accepted job durably with the ends its tasks have as it is accepted
    /// (memoized tasks), its idempotency key (if any) and its spec's digest, in one
    /// transaction. Blocks for the commit: call it off the runtime.
    pub fn put_job(
        &self,
        job: &JobRecord,
        ends: &[(u32, TaskEndRecord)],
        key: Option<(&str, &Digest)>,
    ) -> Result<(), StoreError> {
        #[cfg(test)]
        self.test_disk()?;
        let stored = self.faults.commit().and_then(|()| {
            let txn = self.db.get()?.begin_write().map_err(db_error)?;
            insert_job(&txn, job, ends, key)?;
            txn.commit().map_err(db_error)
        });
        if let Err(e) = &stored
            && handle::Handle::needs_reopen(e)
        {
            // For the next submission's sake: this one is refused either way.
            let _ = self.db.reopen();
        }
        stored
    }

    /// Stores an accepted job without an idempotency key (and the ends its tasks have
    /// as it is accepted) durably: synced to the journal, folded in by the next group
    /// commit. Blocks for the sync: call it off the runtime. An error means the job is
    /// not stored, now or after a crash.
    pub fn accept_job(
        &self,
        job: JobRecord,
        ends: &[(u32, TaskEndRecord)],
    ) -> Result<(), StoreError> {
        #[cfg(test)]
        self.test_disk()?;
        let record = Journaled::encode(job, ends)?;
        let write = self.journal.append(record, |position, record| {
            self.writer.send(Write::Job(Box::new(record), position))
        })?;
        self.last_job.fetch_max(write, Ordering::AcqRel);
        Ok(())
    }

    /// The jobs held at open that may not be in the database yet: none once the writer
    /// has folded them all. Taken before a read transaction begins, so that a job folded
    /// in between is in the database then.
    pub(super) fn unfolded_jobs(&self) -> Vec<StoredJob> {
        let mut unfolded = self.unfolded.lock().expect("no panic while holding it");
        if self.is_durable(unfolded.write) {
            unfolded.jobs = Vec::new();
        }
        (unfolded.jobs.iter())
            .map(|(job, ends)| StoredJob {
                job: job.clone(),
                tasks: ends.clone(),
                end: None,
            })
            .collect()
    }

    /// A job held at open and not folded yet, as accepted.
    pub(super) fn unfolded_job(&self, id: &JobId) -> Option<StoredJob> {
        let unfolded = self.unfolded.lock().expect("no panic while holding it");
        let (job, ends) = unfolded.jobs.iter().find(|(job, _)| job.def.id == *id)?;
        Some(StoredJob {
            job: job.clone(),
            tasks: ends.clone(),
            end: None,
        })
    }
}
