//! The journal of accepted jobs: what makes a job durable before the API answers 202,
//! at the cost of one small write and one sync. A job's record is appended here and
//! synced, then folded into the database by the writer thread's next group commit.
//! Committing it to the database directly cost a transaction over a dozen tables' pages
//! and their sync, 0.4 ms, which was most of a single-task job's round trip.
//!
//! Files `jobs.journal.<epoch>` beside the database, each preallocated (so a sync writes
//! the record's page, not the file's size too), starting with a header of magic and
//! epoch, then records of `[len u32][crc32 u32][postcard JobRecord]`; a zero length ends
//! them. Records reach the writer in the order they are appended (both under one lock),
//! so what the database holds is always a prefix of the journal: the commit that folds a
//! record stores its end (`journal_epoch`, `journal_end` in `meta`), and opening the
//! store folds whatever lies past that mark. A record cut short by a crash fails its
//! checksum and was never acknowledged. A file wholly before the mark is deleted.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::StoreError;

const MAGIC: &[u8; 8] = b"FLNTJRN1";
const HEADER: u64 = 16;
/// Bytes a journal file is preallocated to; a record larger than what is left starts a
/// file of its own size. About 600 single-task jobs.
const FILE_BYTES: u64 = 256 << 10;

/// Where a record ends: the database has folded the journal up to here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Position {
    pub epoch: u64,
    pub end: u64,
}

/// A record as the journal holds it (a postcard `JobRecord`), with where it ends.
pub(super) type Encoded = (Position, Vec<u8>);

pub(super) struct Journal {
    dir: PathBuf,
    current: Mutex<Segment>,
    /// The next file, made ahead by the writer thread ([`Journal::prepare`]) so that
    /// the submission that fills a file does not wait for the next one's making.
    spare: Mutex<Option<Segment>>,
    /// The epoch the next file made gets: every file has its own, and a file taken
    /// into use always has a later one than the file before it.
    next_epoch: AtomicU64,
    /// Bytes used of the current file, read without its lock.
    used: AtomicU64,
    /// Held by an append's sync and by the writer's commits: a sync that shares the disk
    /// with a commit writing megabytes of task ends waits for all of it anyway, and
    /// slows the commit down besides.
    pub(super) syncs: Mutex<()>,
}

struct Segment {
    epoch: u64,
    file: File,
    used: u64,
    size: u64,
}

impl Journal {
    /// Opens the journal in `dir`, returning the records past `mark` (encoded, in order,
    /// with their positions) for the caller to fold, and starting a fresh file.
    pub(super) fn open(dir: &Path, mark: Position) -> Result<(Journal, Vec<Encoded>), StoreError> {
        let mut epochs = list_and(dir, |partial| {
            let _ = std::fs::remove_file(partial);
        })?;
        epochs.sort_unstable();
        let mut unfolded = Vec::new();
        for &epoch in &epochs {
            if epoch < mark.epoch {
                continue;
            }
            let from = if epoch == mark.epoch { mark.end } else { 0 };
            for (position, bytes) in read(&path(dir, epoch), epoch)? {
                if position.end > from {
                    unfolded.push((position, bytes));
                }
            }
        }
        let epoch = epochs.last().map_or(1, |e| e + 1).max(mark.epoch + 1);
        let current = Segment::create(dir, epoch, FILE_BYTES)?;
        Ok((
            Journal {
                dir: dir.to_owned(),
                used: AtomicU64::new(current.used),
                current: Mutex::new(current),
                spare: Mutex::new(None),
                next_epoch: AtomicU64::new(epoch + 1),
                syncs: Mutex::new(()),
            },
            unfolded,
        ))
    }

    /// Appends `record` and syncs it, then hands it to `then` with its position, still
    /// under the journal's lock (so that records are sent on in the order written).
    pub(super) fn append<T>(
        &self,
        record: Vec<u8>,
        then: impl FnOnce(Position, Vec<u8>) -> T,
    ) -> Result<T, StoreError> {
        let len = u32::try_from(record.len())
            .map_err(|_| StoreError::Db("a job record over 4 GiB".into()))?;
        let mut framed = Vec::with_capacity(record.len() + 8);
        framed.extend_from_slice(&len.to_le_bytes());
        framed.extend_from_slice(&crc32fast::hash(&record).to_le_bytes());
        framed.extend_from_slice(&record);
        let mut current = self
            .current
            .lock()
            .expect("no panic under the journal lock");
        // Room for the record and the zero length after it.
        let needed = framed.len() as u64 + 4;
        if current.used + needed > current.size {
            let mut spare = self.spare.lock().expect("no panic under the journal lock");
            *current = match spare.take() {
                Some(next) if next.epoch > current.epoch && next.used + needed <= next.size => next,
                other => {
                    if let Some(unfit) = other {
                        let _ = std::fs::remove_file(path(&self.dir, unfit.epoch));
                    }
                    let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
                    Segment::create(&self.dir, epoch, FILE_BYTES.max(HEADER + needed))?
                }
            };
        }
        let synced = {
            let _alone = self.syncs.lock().expect("no panic under the sync lock");
            current
                .file
                .write_all_at(&framed, current.used)
                .and_then(|()| current.file.sync_data())
        };
        synced.map_err(io_error)?;
        current.used += framed.len() as u64;
        self.used.store(current.used, Ordering::Relaxed);
        let position = Position {
            epoch: current.epoch,
            end: current.used,
        };
        Ok(then(position, record))
    }

    /// Where the current file's records start.
    pub(super) fn start(&self) -> Position {
        let current = self
            .current
            .lock()
            .expect("no panic under the journal lock");
        Position {
            epoch: current.epoch,
            end: HEADER,
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
            match Segment::create(&self.dir, epoch, FILE_BYTES) {
                Ok(next) => *spare = Some(next),
                // The submission that needs it makes it, and gets the error if any.
                Err(e) => tracing::warn!(error = %e, "job journal: making the next file ahead"),
            }
        }
    }

    /// The database holds every record up to `mark`: files wholly before it go.
    pub(super) fn folded(&self, mark: Position) {
        let Ok(epochs) = list(&self.dir) else { return };
        for epoch in epochs.into_iter().filter(|&e| e < mark.epoch) {
            let _ = std::fs::remove_file(path(&self.dir, epoch));
        }
    }
}

impl Segment {
    /// A new file of `size` zeroed bytes with its header, synced with its directory
    /// entry: appends then overwrite allocated blocks and their syncs carry no metadata.
    /// A file for one record larger than [`FILE_BYTES`] is not zeroed first: its one
    /// append would write it all a second time.
    fn create(dir: &Path, epoch: u64, size: u64) -> Result<Segment, StoreError> {
        let target = path(dir, epoch);
        let partial = dir.join(format!("jobs.journal.{epoch}.new"));
        let made = (|| {
            let mut file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&partial)?;
            let mut header = [0u8; HEADER as usize];
            header[..8].copy_from_slice(MAGIC);
            header[8..].copy_from_slice(&epoch.to_le_bytes());
            file.write_all(&header)?;
            if size <= FILE_BYTES {
                let zeros = vec![0u8; 64 << 10];
                let mut left = size - HEADER;
                while left > 0 {
                    let n = left.min(zeros.len() as u64) as usize;
                    file.write_all(&zeros[..n])?;
                    left -= n as u64;
                }
            }
            file.sync_all()?;
            std::fs::rename(&partial, &target)?;
            File::open(dir).and_then(|d| d.sync_all())?;
            Ok(file)
        })();
        match made {
            Ok(file) => Ok(Segment {
                epoch,
                file,
                used: HEADER,
                size,
            }),
            Err(e) => {
                // A full disk, most likely: what was written of it is no use to anyone.
                let _ = std::fs::remove_file(&partial);
                Err(io_error(e))
            }
        }
    }
}

fn path(dir: &Path, epoch: u64) -> PathBuf {
    dir.join(format!("jobs.journal.{epoch}"))
}

/// The epochs of the journal files in `dir`.
fn list(dir: &Path) -> Result<Vec<u64>, StoreError> {
    list_and(dir, |_| {})
}

/// [`list`], calling `unfinished` with each `.new` file: one being made now, or (when
/// the journal opens) one a crash cut short, which holds nothing acknowledged.
fn list_and(dir: &Path, mut unfinished: impl FnMut(&Path)) -> Result<Vec<u64>, StoreError> {
    let mut epochs = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error)? {
        let name = entry.map_err(io_error)?.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("jobs.journal.")) else {
            continue;
        };
        match rest.parse::<u64>() {
            Ok(epoch) => epochs.push(epoch),
            Err(_) if rest.ends_with(".new") => unfinished(&dir.join(&name)),
            Err(_) => {}
        }
    }
    Ok(epochs)
}

/// The records of one file, up to its end or the first that is cut short or corrupt.
fn read(path: &Path, epoch: u64) -> Result<Vec<(Position, Vec<u8>)>, StoreError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io_error)?;
    let mut records = Vec::new();
    if bytes.len() < HEADER as usize || &bytes[..8] != MAGIC || bytes[8..16] != epoch.to_le_bytes()
    {
        tracing::warn!(file = %path.display(), "job journal: not a journal file of this epoch; ignored");
        return Ok(records);
    }
    let mut at = HEADER as usize;
    while let Some(frame) = bytes.get(at..at + 8) {
        let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame[4..].try_into().expect("4 bytes"));
        let Some(record) = bytes.get(at + 8..at + 8 + len).filter(|_| len > 0) else {
            break;
        };
        if crc32fast::hash(record) != crc {
            tracing::warn!(file = %path.display(), offset = at, "job journal: a record cut short by a crash (never acknowledged); ignored");
            break;
        }
        at += 8 + len;
        records.push((
            Position {
                epoch,
                end: at as u64,
            },
            record.to_vec(),
        ));
    }
    Ok(records)
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
