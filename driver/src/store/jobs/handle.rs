//! The job store's database, opened again after a failed write. redb marks its file
//! failed on the first I/O error of a commit (a full disk, most often) and refuses every
//! transaction after it (`PreviousIo`) until the file is opened anew; without a reopen a
//! driver whose disk filled once could never store a job again, however much space was
//! freed.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redb::Database;

use super::StoreError;

/// How long a reopen waits for the transactions in flight to let go of the old handle.
const DRAIN: Duration = Duration::from_secs(10);

pub(super) struct Handle {
    path: PathBuf,
    /// `None` between a failed reopen and the next try.
    current: RwLock<Option<Arc<Database>>>,
}

impl Handle {
    pub(super) fn new(path: PathBuf, db: Database) -> Self {
        Handle {
            path,
            current: RwLock::new(Some(Arc::new(db))),
        }
    }

    /// The database to begin a transaction on.
    pub(super) fn get(&self) -> Result<Arc<Database>, StoreError> {
        if let Some(db) = self
            .current
            .read()
            .expect("no panic while holding it")
            .as_ref()
        {
            return Ok(db.clone());
        }
        // The last reopen failed: try again.
        self.reopen()?;
        self.get()
    }

    /// Whether `error` leaves the file needing a reopen (an I/O error of redb's own,
    /// which it remembers).
    pub(super) fn needs_reopen(error: &StoreError) -> bool {
        match error {
            StoreError::Full(_) => true,
            StoreError::Db(message) => {
                message.contains("Previous I/O error") || message.contains("I/O error")
            }
            StoreError::Record(_) => false,
        }
    }

    /// Opens the file again, once every transaction still holding the old handle ends
    /// (they are short: a commit, a read of one job or one page of a listing).
    pub(super) fn reopen(&self) -> Result<(), StoreError> {
        let mut current = self.current.write().expect("no panic while holding it");
        if let Some(mut old) = current.take() {
            let deadline = Instant::now() + DRAIN;
            // redb locks its file: the old handle must be gone before the new one opens.
            loop {
                match Arc::try_unwrap(old) {
                    Ok(db) => {
                        drop(db);
                        break;
                    }
                    Err(still_held) if Instant::now() < deadline => {
                        old = still_held;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(still_held) => {
                        *current = Some(still_held);
                        return Err(StoreError::Db(
                            "job store: a transaction held the database for 10 s; not reopened"
                                .into(),
                        ));
                    }
                }
            }
        }
        let db = super::create(&self.path)?;
        tracing::warn!(path = %self.path.display(), "job store reopened after a failed write");
        *current = Some(Arc::new(db));
        Ok(())
    }
}
