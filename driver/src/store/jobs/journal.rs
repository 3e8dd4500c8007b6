//! The journal of accepted jobs: what makes a job durable before the API answers 202,
//! at the cost of one small write and one sync. A job's record is appended here and
//! synced, then folded into the database by the writer thread's next group commit.
//! Committing it to the database directly cost a transaction over a dozen tables' pages
//! and their sync, 0.4 ms, which was most of a single-task job's round trip.
//!
//! Files `jobs.journal.<epoch>` beside the database, each preallocated (so a sync writes
//! the record's page, not the file's size too). Format 2 (magic `FLNTJRN2`):
//!
//! - a 32-byte header: the magic, the epoch (u64 LE), and the record this file voids
//!   (its file's epoch and its offset there, u64 LE each; zeros for none);
//! - records `[len u32][crc32 u32][payload]`, a zero length ending them; a payload
//!   starts with its version (2: see [`record`]), then the job's `JobRecord` (as
//!   `jobs.v3` stores it), the ends its tasks had at acceptance (memoized tasks), its
//!   options, its owner and its network: everything an accepted job is. A record of the
//!   Flint before ends at the owner (a job without network); the Flint before reads a
//!   record of this one up to the owner and ignores the rest.
//!
//! Format 1 (`FLNTJRN1`, the Flint before): a 16-byte header (magic, epoch) and records
//! whose payload is a postcard `JobRecord` alone. Such files are still folded at open,
//! their jobs as what those records held (the admin's, with default options); new
//! files are always format 2.
//!
//! Records reach the writer in the order they are appended (both under one lock), so
//! what the database holds is always a prefix of the journal: the commit that folds a
//! record stores its end (`journal_epoch`, `journal_end` in `meta`), and opening the
//! store folds whatever lies past that mark. A record cut short by a crash fails its
//! checksum and was never acknowledged. A file wholly before the mark is deleted; a file
//! not yet folded never is, even when the disk is too full to fold it at open (its jobs
//! are served from the journal meanwhile, see [`super::JobStore::load`]).
//!
//! An append whose write or sync fails was refused, but its bytes may still reach the
//! disk: the refusal is made durable before anything else is appended. Its frame is
//! zeroed and synced (a zero length ends the file's records); failing that, the file is
//! retired and the next one's header voids the record; failing that too, every later
//! append is refused, naming why, until such a file can be made.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::StoreError;
use super::faults::Faults;
use files::{HEADER, Segment, list, list_and, path};

mod files;
pub(super) mod record;

/// Bytes a journal file is preallocated to; a record larger than what is left starts a
/// file of its own size. About 600 single-task jobs.
const FILE_BYTES: u64 = 256 << 10;

/// Where a record ends: the database has folded the journal up to here. (As a void, in
/// a header: where the voided record starts.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Position {
    pub epoch: u64,
    pub end: u64,
}

/// A record read back at open: where it ends, the version of the file it is in, and
/// its payload.
pub(super) type ReadBack = (Position, u8, Vec<u8>);

pub(super) struct Journal {
    dir: PathBuf,
    current: Mutex<Current>,
    /// The next file, made ahead by the writer thread ([`Journal::prepare`]) so that
    /// the submission that fills a file does not wait for the next one's making.
    spare: Mutex<Option<Segment>>,
    /// The epoch the next file made gets: every file has its own, and a file taken
    /// into use always has a later one than the file before it.
    next_epoch: AtomicU64,
    /// The first epoch this journal made: every file before it was read at open.
    first_epoch: u64,
    /// Bytes used of the current file, read without its lock.
    used: AtomicU64,
    /// Held by an append's sync and by the writer's commits: a sync that shares the disk
    /// with a commit writing megabytes of task ends waits for all of it anyway, and
    /// slows the commit down besides.
    pub(super) syncs: Mutex<()>,
    faults: Arc<Faults>,
}

struct Current {
    /// The file appended to; none until one could be made (the disk was full at open,
    /// or a file was retired and its successor could not be made).
    segment: Option<Segment>,
    /// A refused record that may still reach the disk: until a new file's header voids
    /// it, nothing more is appended.
    void: Option<Position>,
}

impl Journal {
    /// Opens the journal in `dir`, returning the records past `mark` (in order, with
    /// their positions and versions) for the caller to fold, and starting a fresh file
    /// (later, if the disk has no room for one now).
    pub(super) fn open(
        dir: &Path,
        mark: Position,
        faults: Arc<Faults>,
    ) -> Result<(Journal, Vec<ReadBack>), StoreError> {
        let mut epochs = list_and(dir, |partial| {
            let _ = std::fs::remove_file(partial);
        })?;
        epochs.sort_unstable();
        let mut read = Vec::new();
        for &epoch in epochs.iter().filter(|&&e| e >= mark.epoch) {
            read.extend(files::read(&path(dir, epoch), epoch)?);
        }
        // A later file's header may void a record of an earlier one.
        let voids: Vec<Position> = read.iter().filter_map(|f| f.void).collect();
        let mut unfolded = Vec::new();
        for file in read {
            for (position, bytes) in file.records {
                let void = voids
                    .iter()
                    .any(|v| v.epoch == position.epoch && position.end > v.end);
                let folded = position.epoch == mark.epoch && position.end <= mark.end;
                if !void && !folded {
                    unfolded.push((position, file.version, bytes));
                }
            }
        }
        let epoch = epochs.last().map_or(1, |e| e + 1).max(mark.epoch + 1);
        let segment = match Segment::create(dir, epoch, FILE_BYTES, None, &faults) {
            Ok(segment) => Some(segment),
            Err(e) => {
                tracing::warn!(error = %e, "job journal: no new file at start; the first job accepted makes one");
                None
            }
        };
        Ok((
            Journal {
                dir: dir.to_owned(),
                used: AtomicU64::new(segment.as_ref().map_or(0, |s| s.used)),
                current: Mutex::new(Current {
                    segment,
                    void: None,
                }),
                spare: Mutex::new(None),
                next_epoch: AtomicU64::new(epoch + 1),
                first_epoch: epoch,
                syncs: Mutex::new(()),
                faults,
            },
            unfolded,
        ))
    }

    fn current(&self) -> MutexGuard<'_, Current> {
        self.current
            .lock()
            .expect("no panic under the journal lock")
    }

    /// Appends `record` and syncs it, then hands it to `then` with its position, still
    /// under the journal's lock (so that records are sent on in the order written).
    pub(super) fn append<R: AsRef<[u8]>, T>(
        &self,
        record: R,
        then: impl FnOnce(Position, R) -> T,
    ) -> Result<T, StoreError> {
        let bytes = record.as_ref();
        let len = u32::try_from(bytes.len())
            .map_err(|_| StoreError::Db("a job record over 4 GiB".into()))?;
        let mut framed = Vec::with_capacity(bytes.len() + 8);
        framed.extend_from_slice(&len.to_le_bytes());
        framed.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
        framed.extend_from_slice(bytes);
        let mut current = self.current();
        // Room for the record and the zero length after it.
        let needed = framed.len() as u64 + 4;
        let fits = (current.segment.as_ref()).is_some_and(|s| s.used + needed <= s.size);
        if current.void.is_some() || !fits {
            self.next_file(&mut current, needed)?;
        }
        let segment = current.segment.as_mut().expect("a file was made above");
        let written = {
            let _alone = self.syncs.lock().expect("no panic under the sync lock");
            (self.faults.write_at(&segment.file, &framed, segment.used))
                .and_then(|()| self.faults.sync(&segment.file))
        };
        if let Err(e) = written {
            self.void(&mut current, framed.len());
            return Err(io_error(e));
        }
        segment.used += framed.len() as u64;
        self.used.store(segment.used, Ordering::Relaxed);
        let position = Position {
            epoch: segment.epoch,
            end: segment.used,
        };
        Ok(then(position, record))
    }

    /// Takes the next file into use: the one made ahead if it fits, else a new one
    /// (whose header voids the refused record, if one is waiting for that).
    fn next_file(&self, current: &mut Current, needed: u64) -> Result<(), StoreError> {
        let mut spare = self.spare.lock().expect("no panic under the journal lock");
        let after = current.segment.as_ref().map_or(0, |s| s.epoch);
        let next = match spare.take() {
            Some(next)
                if current.void.is_none()
                    && next.epoch > after
                    && next.used + needed <= next.size =>
            {
                next
            }
            other => {
                if let Some(unfit) = other {
                    let _ = std::fs::remove_file(path(&self.dir, unfit.epoch));
                }
                let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
                let size = FILE_BYTES.max(HEADER + needed);
                Segment::create(&self.dir, epoch, size, current.void, &self.faults)
                    .map_err(|e| refusing(current.void, e))?
            }
        };
        if let Some(void) = current.void.take() {
            tracing::warn!(
                epoch = void.epoch,
                offset = void.end,
                file = next.epoch,
                "job journal: the refused record is void"
            );
        }
        self.used.store(next.used, Ordering::Relaxed);
        current.segment = Some(next);
        Ok(())
    }

    /// Makes the refusal of the record of `len` bytes just written at the current
    /// file's end durable: its frame zeroed and synced, or else the file retired and
    /// the next one's header voiding it.
    fn void(&self, current: &mut Current, len: usize) {
        let segment = current.segment.as_ref().expect("the file just written");
        let at = Position {
            epoch: segment.epoch,
            end: segment.used,
        };
        let zeroed = {
            let _alone = self.syncs.lock().expect("no panic under the sync lock");
            (self.faults.write_at(&segment.file, &vec![0; len], at.end))
                .and_then(|()| self.faults.sync(&segment.file))
        };
        match zeroed {
            Ok(()) => {
                tracing::warn!(
                    epoch = at.epoch,
                    offset = at.end,
                    "job journal: a refused record was zeroed"
                );
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, epoch = at.epoch, offset = at.end, "job journal: zeroing a refused record; retiring its file")
            }
        }
        current.segment = None;
        current.void = Some(at);
        if let Err(e) = self.next_file(current, 0) {
            tracing::error!(error = %e, "job journal: no job is accepted until a new file can be made");
        }
    }

    /// Makes the next file ahead once the current one is half full (called by the
    /// writer thread after a commit): making one is a write of its size and two syncs.
    pub(super) fn prepare(&self) {
        if self.used.load(Ordering::Relaxed) < FILE_BYTES / 2 {
            return;
        }
        let mut spare = self.spare.lock().expect("no panic under the journal lock");
        if spare.is_none() {
            let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
            match Segment::create(&self.dir, epoch, FILE_BYTES, None, &self.faults) {
                Ok(next) => *spare = Some(next),
                // The submission that needs it makes it, and gets the error if any.
                Err(e) => tracing::warn!(error = %e, "job journal: making the next file ahead"),
            }
        }
    }

    /// The database holds every record up to `mark`: files wholly before it go.
    pub(super) fn folded(&self, mark: Position) {
        let Ok(mut epochs) = list(&self.dir) else {
            return;
        };
        // Oldest first: a file whose header voids a record goes after the record's.
        epochs.sort_unstable();
        for epoch in epochs.into_iter().filter(|&e| e < mark.epoch) {
            let _ = std::fs::remove_file(path(&self.dir, epoch));
        }
    }

    /// Every record read at open is folded: the files that held them go.
    pub(super) fn folded_at_open(&self) {
        self.folded(Position {
            epoch: self.first_epoch,
            end: 0,
        });
    }
}

/// The error of an append refused because a refused record's void could not be made
/// durable (none waiting: `e` itself).
fn refusing(void: Option<Position>, e: StoreError) -> StoreError {
    let Some(void) = void else { return e };
    let why = |e: String| {
        format!(
            "a refused job's record (journal file {}, offset {}) may still reach the disk, \
             and no file to void it could be made ({e}); no job is accepted until one can",
            void.epoch, void.end
        )
    };
    match e {
        StoreError::Full(e) => StoreError::Full(why(e)),
        StoreError::Db(e) => StoreError::Db(why(e)),
        other => other,
    }
}

fn io_error(e: std::io::Error) -> StoreError {
    if crate::store::usage::is_disk_full(&e) {
        StoreError::Full(e.to_string())
    } else {
        StoreError::Db(format!("job journal: {e}"))
    }
}

#[cfg(test)]
mod tests;
