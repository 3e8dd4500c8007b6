//! The in-memory index of `<dir>/blobs`: sizes, recency, pins, and the byte budget.
//!
//! A blob whose pin is held by a caller is never evicted, so a path handed out stays
//! valid for as long as the caller holds the [`Fetched`](crate::Fetched) that names it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use flint_protocol::Digest;
use lru::LruCache;

/// Held while a caller uses a blob's path; eviction skips blobs with a live pin.
#[derive(Clone, Debug)]
pub(crate) struct Pin {
    _held: Arc<()>,
}

struct Blob {
    size: u64,
    /// False for blobs found on disk at open until their bytes are hashed once.
    verified: bool,
    /// The file's modification time when its bytes were verified: a blob written to
    /// since (same size or not) is hashed again before it is served.
    modified: Option<SystemTime>,
    pin: Arc<()>,
}

impl Blob {
    fn pinned(&self) -> bool {
        // Pins are only cloned under the index lock, so a count read here can only be
        // too high (a pin dropped concurrently), which merely delays an eviction.
        Arc::strong_count(&self.pin) > 1
    }
}

/// What the index knows about a digest, for the caller to act on outside the lock.
pub(crate) enum Lookup {
    Absent,
    /// Present with this size; `verified` says whether its bytes were hashed since open,
    /// and `modified` is the file's modification time then.
    Present {
        size: u64,
        verified: bool,
        modified: Option<SystemTime>,
    },
}

pub(crate) struct Index {
    blobs_dir: PathBuf,
    lru: LruCache<Digest, Blob>,
    total_bytes: u64,
    budget_bytes: u64,
}

impl Index {
    /// An index of the blobs already on disk, oldest first, all unverified: hashing every
    /// blob here would make opening a large cache slow.
    pub(crate) fn load(blobs_dir: &Path, budget_bytes: u64) -> std::io::Result<Index> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(blobs_dir)? {
            let entry = entry?;
            let Some(digest) = entry.file_name().to_str().and_then(parse_hex_digest) else {
                continue;
            };
            let meta = entry.metadata()?;
            if meta.is_file() {
                found.push((meta.modified()?, digest, meta.len()));
            }
        }
        found.sort_by_key(|(modified, ..)| *modified);
        let mut index = Index {
            blobs_dir: blobs_dir.to_owned(),
            lru: LruCache::unbounded(),
            total_bytes: 0,
            budget_bytes,
        };
        for (_, digest, size) in found {
            index.total_bytes += size;
            index.lru.put(
                digest,
                Blob {
                    size,
                    verified: false,
                    modified: None,
                    pin: Arc::default(),
                },
            );
        }
        index.evict()?;
        Ok(index)
    }

    pub(crate) fn path(&self, digest: &Digest) -> PathBuf {
        self.blobs_dir.join(digest.hex())
    }

    /// Marks `digest` most recently used and says what is known about it.
    pub(crate) fn lookup(&mut self, digest: &Digest) -> Lookup {
        match self.lru.get(digest) {
            None => Lookup::Absent,
            Some(blob) => Lookup::Present {
                size: blob.size,
                verified: blob.verified,
                modified: blob.modified,
            },
        }
    }

    /// Pins a blob whose bytes were just checked to be `size` bytes hashing to `digest`
    /// (its file last modified at `modified`), or returns `None` if it left the index
    /// meanwhile.
    pub(crate) fn pin_verified(
        &mut self,
        digest: &Digest,
        size: u64,
        modified: Option<SystemTime>,
    ) -> Option<Pin> {
        let blob = self.lru.get_mut(digest)?;
        self.total_bytes = self.total_bytes - blob.size + size;
        blob.size = size;
        blob.verified = true;
        blob.modified = modified;
        Some(Pin {
            _held: blob.pin.clone(),
        })
    }

    /// Forgets a blob whose bytes turned out wrong and deletes its file.
    pub(crate) fn remove_corrupt(&mut self, digest: &Digest) -> std::io::Result<()> {
        if let Some(blob) = self.lru.pop(digest) {
            self.total_bytes -= blob.size;
        }
        remove_if_present(&self.path(digest))
    }

    /// Puts a verified blob into place with `install` (a rename of its temp file), pins
    /// it, then evicts until under budget. Installing under the index lock means an
    /// eviction of an older copy of the same digest cannot delete the new file.
    pub(crate) fn insert(
        &mut self,
        digest: Digest,
        size: u64,
        install: impl FnOnce(&Path) -> std::io::Result<()>,
    ) -> std::io::Result<Pin> {
        let path = self.path(&digest);
        install(&path)?;
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        let pin = match self.lru.get_mut(&digest) {
            Some(blob) => {
                self.total_bytes = self.total_bytes - blob.size + size;
                blob.size = size;
                blob.verified = true;
                blob.modified = modified;
                Pin {
                    _held: blob.pin.clone(),
                }
            }
            None => {
                let pin = Arc::new(());
                self.total_bytes += size;
                self.lru.put(
                    digest,
                    Blob {
                        size,
                        verified: true,
                        modified,
                        pin: pin.clone(),
                    },
                );
                Pin { _held: pin }
            }
        };
        self.evict()?;
        Ok(pin)
    }

    /// Deletes least recently used unpinned blobs until the total fits the budget or
    /// only pinned blobs remain.
    fn evict(&mut self) -> std::io::Result<()> {
        while self.total_bytes > self.budget_bytes {
            let Some(victim) = self
                .lru
                .iter()
                .rev()
                .find(|(_, blob)| !blob.pinned())
                .map(|(digest, _)| *digest)
            else {
                return Ok(());
            };
            if let Some(blob) = self.lru.pop(&victim) {
                self.total_bytes -= blob.size;
            }
            remove_if_present(&self.path(&victim))?;
            tracing::debug!(digest = %victim, "evicted");
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, digest: &Digest) -> bool {
        self.lru.contains(digest)
    }

    #[cfg(test)]
    pub(crate) fn total_bytes(&self) -> u64 {
        self.total_bytes
    }
}

fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

pub(crate) fn parse_hex_digest(name: &str) -> Option<Digest> {
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(name, &mut bytes).ok()?;
    // Upper-case hex decodes too, but only the lower-case name is ever looked up.
    (hex::encode(bytes) == name).then_some(Digest(bytes))
}
