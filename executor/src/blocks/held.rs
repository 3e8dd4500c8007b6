//! Result blocks kept on this executor's disk while the driver, their store, is away.
//!
//! An upload to the driver writes each chunk to a spool file as it goes (a [`Spool`]):
//! when the driver goes away mid-upload (or was away from the start), the bytes it did
//! not get are still here, the rest of the result goes to the spool too, and the block
//! is kept under its id with the size and SHA-256 the driver would have computed. Its
//! task's end waits in the end buffer until [`super::BlockClient::upload_held`] got the
//! block to the driver. The spool is dropped once the driver answered: writing it costs
//! a page-cache write per result byte, no hashing (the digest is taken only for a block
//! that is kept).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::Mutex;

use flint_protocol::Digest;
use sha2::{Digest as _, Sha256};

/// The held blocks, under `<work_dir>/blocks-held/`, by id.
pub(crate) struct HeldBlocks {
    dir: PathBuf,
    blocks: Mutex<HashMap<String, HeldBlock>>,
}

#[derive(Clone)]
pub(crate) struct HeldBlock {
    pub(crate) path: PathBuf,
    pub(crate) size: u64,
    pub(crate) digest: Digest,
}

/// One upload's copy on disk, written as its chunks are taken.
pub(crate) struct Spool {
    /// `None` once kept (renamed to the block's own file).
    path: Option<PathBuf>,
    /// `None` once a write failed: the upload goes on, but the block cannot be kept.
    file: Option<std::fs::File>,
    pub(crate) size: u64,
}

impl Spool {
    pub(crate) fn write(&mut self, chunk: &[u8]) {
        let Some(file) = &mut self.file else { return };
        match file.write_all(chunk) {
            Ok(()) => self.size += chunk.len() as u64,
            Err(e) => {
                tracing::warn!(error = %e, "cannot spool a result block; it cannot be kept if the driver goes away");
                self.file = None;
            }
        }
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl HeldBlocks {
    /// The held blocks' directory, emptied: an earlier process's blocks were never
    /// reported by this executor.
    pub(crate) fn clear(dir: PathBuf) -> io::Result<HeldBlocks> {
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::create_dir_all(&dir)?;
        Ok(HeldBlocks {
            dir,
            blocks: Mutex::default(),
        })
    }

    /// Block ids hold `/`: their files are named by the id's hex.
    fn path(&self, id: &str, suffix: &str) -> PathBuf {
        self.dir.join(format!("{}{suffix}", hex::encode(id)))
    }

    /// A spool for the upload of `id`; `None` (the upload runs without one) when the
    /// file cannot be made.
    pub(crate) fn spool(&self, id: &str) -> Option<Spool> {
        let path = self.path(id, ".part");
        match std::fs::File::create(&path) {
            Ok(file) => Some(Spool {
                path: Some(path),
                file: Some(file),
                size: 0,
            }),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot create a result spool");
                None
            }
        }
    }

    /// Keeps a finished spool as block `id`: its size and digest, which the driver would
    /// have computed from the same bytes. Blocking (it reads the block to hash it).
    pub(crate) fn keep(&self, id: &str, spool: &mut Spool) -> io::Result<(u64, Digest)> {
        // Not synced: a held block outlives a driver, not this process.
        let file = spool
            .file
            .take()
            .ok_or_else(|| io::Error::other("the spool is incomplete"))?;
        drop(file);
        let path = self.path(id, "");
        let spooled = spool
            .path
            .take()
            .expect("a spool with its file has its path");
        if let Err(e) = std::fs::rename(&spooled, &path) {
            let _ = std::fs::remove_file(&spooled);
            return Err(e);
        }
        let digest = hash(&path)?;
        let block = HeldBlock {
            path,
            size: spool.size,
            digest,
        };
        self.lock().insert(id.to_owned(), block);
        Ok((spool.size, digest))
    }

    pub(crate) fn get(&self, id: &str) -> Option<HeldBlock> {
        self.lock().get(id).cloned()
    }

    pub(crate) fn size(&self, id: &str) -> Option<u64> {
        self.lock().get(id).map(|block| block.size)
    }

    /// The driver has block `id`, or will never take it: deletes it.
    pub(crate) fn release(&self, id: &str) {
        if let Some(block) = self.lock().remove(id) {
            let _ = std::fs::remove_file(block.path);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HeldBlock>> {
        self.blocks.lock().expect("held blocks lock poisoned")
    }
}

fn hash(path: &std::path::Path) -> io::Result<Digest> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(Digest(hasher.finalize().into()));
        }
        hasher.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_spool_is_a_block_with_the_digest_of_its_bytes_and_an_abandoned_one_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let held = HeldBlocks::clear(dir.path().join("held")).unwrap();
        let mut spool = held.spool("job/0-1-1").unwrap();
        spool.write(b"hello ");
        spool.write(b"world");
        let (size, digest) = held.keep("job/0-1-1", &mut spool).unwrap();
        drop(spool);
        assert_eq!((size, digest), (11, Digest::of(b"hello world")));
        let block = held.get("job/0-1-1").unwrap();
        assert_eq!(std::fs::read(&block.path).unwrap(), b"hello world");
        assert_eq!(held.size("job/0-1-1"), Some(11));

        let abandoned = held.spool("job/1-1-1").unwrap();
        drop(abandoned);
        held.release("job/0-1-1");
        assert_eq!(held.size("job/0-1-1"), None);
        let left = std::fs::read_dir(dir.path().join("held")).unwrap().count();
        assert_eq!(left, 0, "nothing left on disk");
    }
}
