//! The journal's files: making one (header, preallocation, the rename that publishes
//! it), finding them, and reading one back (either version's header and its records).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::super::StoreError;
use super::super::faults::Faults;
use super::{FILE_BYTES, Position, io_error};

/// The magic of the files this Flint writes, and of those the Flint before wrote.
pub(super) const MAGIC: &[u8; 8] = b"FLNTJRN2";
const MAGIC_V1: &[u8; 8] = b"FLNTJRN1";
/// Header bytes: magic, epoch, and the record it voids (epoch and offset, zero if none).
pub(super) const HEADER: u64 = 32;
const HEADER_V1: u64 = 16;

pub(super) struct Segment {
    pub epoch: u64,
    pub file: File,
    pub used: u64,
    pub size: u64,
}

impl Segment {
    /// A new file of `size` zeroed bytes with its header (voiding `void`, if given),
    /// synced with its directory entry: appends then overwrite allocated blocks and
    /// their syncs carry no metadata. A file for one record larger than [`FILE_BYTES`]
    /// is not zeroed first: its one append would write it all a second time.
    pub fn create(
        dir: &Path,
        epoch: u64,
        size: u64,
        void: Option<Position>,
        faults: &Faults,
    ) -> Result<Segment, StoreError> {
        let target = path(dir, epoch);
        let partial = dir.join(format!("jobs.journal.{epoch}.new"));
        let made = (|| {
            faults.new_file()?;
            let mut file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&partial)?;
            let void = void.unwrap_or_default();
            let mut header = Vec::with_capacity(HEADER as usize);
            header.extend_from_slice(MAGIC);
            for n in [epoch, void.epoch, void.end] {
                header.extend_from_slice(&n.to_le_bytes());
            }
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

pub(super) fn path(dir: &Path, epoch: u64) -> PathBuf {
    dir.join(format!("jobs.journal.{epoch}"))
}

/// The epochs of the journal files in `dir`.
pub(super) fn list(dir: &Path) -> Result<Vec<u64>, StoreError> {
    list_and(dir, |_| {})
}

/// [`list`], calling `unfinished` with each `.new` file: one being made now, or (when
/// the journal opens) one a crash cut short, which holds nothing acknowledged.
pub(super) fn list_and(
    dir: &Path,
    mut unfinished: impl FnMut(&Path),
) -> Result<Vec<u64>, StoreError> {
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

/// One file as read back: its format's version, the record its header voids, and its
/// records (each with where it ends), up to its end or the first cut short or corrupt.
pub(super) struct FileRecords {
    pub version: u8,
    pub void: Option<Position>,
    pub records: Vec<(Position, Vec<u8>)>,
}

/// Reads the journal file of `epoch`; `None` for a file that is not one (another
/// epoch's header, or none).
pub(super) fn read(path: &Path, epoch: u64) -> Result<Option<FileRecords>, StoreError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io_error)?;
    let number = |at: usize| {
        bytes
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let (version, header) = match bytes.get(..8) {
        Some(m) if m == MAGIC => (2, HEADER),
        Some(m) if m == MAGIC_V1 => (1, HEADER_V1),
        _ => (0, 0),
    };
    if version == 0 || number(8) != Some(epoch) || (bytes.len() as u64) < header {
        tracing::warn!(file = %path.display(), "job journal: not a journal file of this epoch; ignored");
        return Ok(None);
    }
    let void = match (version, number(16), number(24)) {
        (2, Some(epoch), Some(end)) if epoch > 0 => Some(Position { epoch, end }),
        _ => None,
    };
    let mut records = Vec::new();
    let mut at = header as usize;
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
        let end = Position {
            epoch,
            end: at as u64,
        };
        records.push((end, record.to_vec()));
    }
    Ok(Some(FileRecords {
        version,
        void,
        records,
    }))
}
