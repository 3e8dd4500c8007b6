//! Which digest each (URL, timestamp) resolved to, kept on disk so it survives a restart.
//!
//! One small file per key under `<dir>/keys/`, named by the SHA-256 of the key (never by
//! anything from the URL itself) and holding the digest's hex; written to a temp file and
//! renamed, so a reader sees the old record or the new one, never half of one.

use std::io::Write;
use std::path::{Path, PathBuf};

use flint_protocol::Digest;
use sha2::{Digest as _, Sha256};

use crate::{CacheKey, FetchError, Trust, index};

pub(crate) struct KeyRecords {
    dir: PathBuf,
    tmp_dir: PathBuf,
}

impl KeyRecords {
    pub(crate) fn new(dir: &Path, tmp_dir: &Path) -> KeyRecords {
        KeyRecords {
            dir: dir.to_owned(),
            tmp_dir: tmp_dir.to_owned(),
        }
    }

    fn path(&self, key: &CacheKey, trust: Trust) -> PathBuf {
        let mut hasher = Sha256::new();
        hasher.update(key.url.as_bytes());
        // The timestamp and the trust are a fixed width at the end, so no two keys hash
        // the same bytes. The trust is part of the key because a driver fetch may carry
        // the bearer token and reach origins a job may not: its bytes are not a job's to
        // have just by naming the same URL and timestamp.
        hasher.update(key.timestamp_ms.to_le_bytes());
        hasher.update(match trust {
            Trust::Driver => b"D",
            Trust::Job => b"J",
        });
        self.dir.join(hex::encode(hasher.finalize()))
    }

    /// The digest `key` resolved to before under `trust`, if it is recorded and readable.
    pub(crate) fn get(&self, key: &CacheKey, trust: Trust) -> Result<Option<Digest>, FetchError> {
        let path = self.path(key, trust);
        match std::fs::read_to_string(&path) {
            // A garbled record is only a lost hint: the fetch rewrites it.
            Ok(text) => Ok(index::parse_hex_digest(text.trim())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(FetchError::io(&path, e)),
        }
    }

    pub(crate) fn put(
        &self,
        key: &CacheKey,
        trust: Trust,
        digest: Digest,
    ) -> Result<(), FetchError> {
        let tmp_dir = &self.tmp_dir;
        let mut tmp =
            tempfile::NamedTempFile::new_in(tmp_dir).map_err(|e| FetchError::io(tmp_dir, e))?;
        tmp.write_all(digest.hex().as_bytes())
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|e| FetchError::io(tmp.path(), e))?;
        let path = self.path(key, trust);
        tmp.persist(&path)
            .map_err(|e| FetchError::io(&path, e.error))?;
        Ok(())
    }
}
