//! Uploaded modules and files: stored once per SHA-256 (modules under
//! `<data-dir>/modules/`, validated as wasm first; files under `<data-dir>/files/`, any
//! bytes), served to executors by digest. What they hold counts towards the data dir's
//! quota ([`usage`](super::usage)); a write is written to a temp file and renamed, so a
//! failed one (a full disk) leaves nothing behind.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use flint_protocol::Digest;
use flint_protocol::api::{CodedError, ErrorCode};

use super::usage::{DataDirUsage, OverQuota, is_disk_full};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    pub size: u64,
    /// When the driver was first given these bytes: with the URL, the executors' cache key.
    pub timestamp_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// Refused by the module rules the executors' engine is built from; the message
    /// names the rule.
    #[error("{0}")]
    Invalid(String),
    /// Storing it would pass `--data-dir-max-bytes`.
    #[error("the {what} is not stored: {quota}")]
    OverQuota {
        what: &'static str,
        #[source]
        quota: OverQuota,
    },
    #[error("storing {what} at {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ModuleError {
    /// The disk (or a disk quota of the OS) is full: nothing was stored.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, ModuleError::Io { source, .. } if is_disk_full(source))
    }
}

/// The module's fault (422), the quota or a full disk (507), the driver's disk
/// otherwise (500).
impl CodedError for ModuleError {
    fn code(&self) -> ErrorCode {
        match self {
            ModuleError::Invalid(_) => ErrorCode::InvalidModule,
            ModuleError::OverQuota { .. } => ErrorCode::StorageFull,
            e if e.is_disk_full() => ErrorCode::StorageFull,
            ModuleError::Io { .. } => ErrorCode::Storage,
        }
    }

    fn message(&self) -> String {
        match self.is_disk_full() {
            true => format!("the disk is full: {self}"),
            false => self.to_string(),
        }
    }
}

pub struct ModuleStore {
    dir: PathBuf,
    index: Mutex<HashMap<Digest, ModuleInfo>>,
    /// When each blob was last uploaded again or named by an admitted job (Unix ms),
    /// for retention; taken after `index` whenever both are.
    last_used: Mutex<HashMap<Digest, u64>>,
    /// Modules must be valid wasm; files may be anything.
    wasm_only: bool,
    usage: Arc<DataDirUsage>,
}

impl ModuleStore {
    /// Opens a store of wasm modules, indexing what a previous run left and counting it
    /// in `usage`.
    pub fn open(dir: PathBuf, usage: Arc<DataDirUsage>) -> Result<Self, ModuleError> {
        Self::open_with(dir, true, usage)
    }

    /// Opens a store of files (any bytes).
    pub fn open_files(dir: PathBuf, usage: Arc<DataDirUsage>) -> Result<Self, ModuleError> {
        Self::open_with(dir, false, usage)
    }

    fn what(&self) -> &'static str {
        what(self.wasm_only)
    }

    fn open_with(
        dir: PathBuf,
        wasm_only: bool,
        usage: Arc<DataDirUsage>,
    ) -> Result<Self, ModuleError> {
        let io = |source| ModuleError::Io {
            what: what(wasm_only),
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let mut index = HashMap::new();
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            // Everything here counts, a temp file a crash left too: it takes the space.
            let meta = entry.metadata().map_err(io)?;
            if meta.is_file() {
                usage.stored(meta.len());
            }
            let name = entry.file_name();
            let Some(digest) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".wasm"))
                .and_then(|hex| hex.parse::<Digest>().ok())
            else {
                continue;
            };
            let timestamp_ms = meta.modified().map(unix_ms).unwrap_or_else(|_| now_ms());
            index.insert(
                digest,
                ModuleInfo {
                    size: meta.len(),
                    timestamp_ms,
                },
            );
        }
        Ok(ModuleStore {
            dir,
            index: Mutex::new(index),
            last_used: Mutex::new(HashMap::new()),
            wasm_only,
            usage,
        })
    }

    /// Validates and stores `wasm`; storing the same bytes again changes nothing (and is
    /// not refused by the quota). Refused when the bytes would pass the data dir's
    /// quota; a write that fails (a full disk) leaves nothing behind.
    pub fn put(&self, wasm: &[u8]) -> Result<(Digest, ModuleInfo), ModuleError> {
        if self.wasm_only {
            validate(wasm)?;
        }
        let digest = Digest::of(wasm);
        if let Some(info) = self.touch(&digest) {
            return Ok((digest, info));
        }
        let reservation =
            self.usage
                .reserve(wasm.len() as u64)
                .map_err(|quota| ModuleError::OverQuota {
                    what: self.what(),
                    quota,
                })?;
        let path = self.path(&digest);
        let io = |source| ModuleError::Io {
            what: self.what(),
            path: path.clone(),
            source,
        };
        // Write-then-rename: a crash mid-write never leaves a partial module under its
        // digest's name, and a failed write is removed with its temp file.
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(io)?;
        std::io::Write::write_all(&mut tmp, wasm).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(&path).map_err(|e| io(e.error))?;
        let info = ModuleInfo {
            size: wasm.len() as u64,
            timestamp_ms: now_ms(),
        };
        let mut index = self.index.lock().expect("module index lock poisoned");
        match index.entry(digest) {
            // Stored meanwhile by another upload of the same bytes: one file, counted once.
            Entry::Occupied(stored) => Ok((digest, *stored.get())),
            Entry::Vacant(entry) => {
                reservation.keep();
                Ok((digest, *entry.insert(info)))
            }
        }
    }

    pub fn get(&self, digest: &Digest) -> Option<ModuleInfo> {
        self.index
            .lock()
            .expect("module index lock poisoned")
            .get(digest)
            .copied()
    }

    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.wasm", digest.hex()))
    }

    /// Every stored blob, with when it was stored.
    pub fn list(&self) -> Vec<(Digest, ModuleInfo)> {
        let index = self.index.lock().expect("module index lock poisoned");
        index.iter().map(|(d, info)| (*d, *info)).collect()
    }

    /// A stored blob's info, marking it used now (an admitted job names it), so that
    /// retention keeps it; `None` when it is not stored (or was just deleted).
    pub fn touch(&self, digest: &Digest) -> Option<ModuleInfo> {
        let index = self.index.lock().expect("module index lock poisoned");
        let info = index.get(digest).copied()?;
        self.last_used
            .lock()
            .expect("module index lock poisoned")
            .insert(*digest, now_ms());
        Some(info)
    }

    /// Deletes a blob last stored or used before `cutoff_ms` (retention's, once no stored
    /// job names it), atomically with [`Self::touch`]: a job admitted meanwhile either
    /// keeps it or is refused as naming no upload. Storing the same bytes later simply
    /// stores them again. Whether it was deleted.
    pub fn delete_unused(&self, digest: &Digest, cutoff_ms: u64) -> Result<bool, ModuleError> {
        let path = self.path(digest);
        let removed = {
            let mut index = self.index.lock().expect("module index lock poisoned");
            let mut used = self.last_used.lock().expect("module index lock poisoned");
            let Some(info) = index.get(digest).copied() else {
                return Ok(false);
            };
            if used.get(digest).copied().unwrap_or(info.timestamp_ms) >= cutoff_ms {
                return Ok(false);
            }
            used.remove(digest);
            index.remove(digest);
            info
        };
        match std::fs::remove_file(&path) {
            Ok(()) => {
                self.usage.released(removed.size);
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
            Err(source) => Err(ModuleError::Io {
                what: self.what(),
                path,
                source,
            }),
        }
    }
}

fn what(wasm_only: bool) -> &'static str {
    match wasm_only {
        true => "module",
        false => "file",
    }
}

/// The executors' own rules (features, memories, tables, table sizes, the `_start`
/// export), so that a module accepted here fails later only for its imports or its
/// behaviour, never because the engine cannot take it. The executors check again with
/// their own memory maximum, which is at most the default one checked here.
fn validate(wasm: &[u8]) -> Result<(), ModuleError> {
    flint_module_rules::check(wasm, &flint_module_rules::Limits::DEFAULT)
        .map(drop)
        .map_err(|rejection| ModuleError::Invalid(rejection.message))
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The smallest WASI command: a type, a function and its `_start` export.
    const EMPTY_MODULE: &[u8] = b"\0asm\x01\0\0\0\x01\x04\x01\x60\0\0\x03\x02\x01\0\x07\x0a\x01\x06_start\0\0\x0a\x04\x01\x02\0\x0b";

    fn usage(dir: &std::path::Path, limit: u64) -> Arc<DataDirUsage> {
        Arc::new(DataDirUsage::new(limit, dir.join("jobs.redb")))
    }

    #[test]
    fn stores_once_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let counted = usage(dir.path(), 0);
        let store = ModuleStore::open(dir.path().into(), counted.clone()).unwrap();
        let (digest, info) = store.put(EMPTY_MODULE).unwrap();
        assert_eq!(store.put(EMPTY_MODULE).unwrap(), (digest, info));
        assert_eq!(std::fs::read(store.path(&digest)).unwrap(), EMPTY_MODULE);
        assert_eq!(counted.used(), EMPTY_MODULE.len() as u64, "counted once");
        let recounted = usage(dir.path(), 0);
        let reopened = ModuleStore::open(dir.path().into(), recounted.clone()).unwrap();
        assert_eq!(
            reopened.get(&digest).map(|i| i.size),
            Some(EMPTY_MODULE.len() as u64)
        );
        assert_eq!(recounted.used(), EMPTY_MODULE.len() as u64, "found at open");
    }

    #[test]
    fn rejects_what_is_not_wasm() {
        let dir = tempfile::tempdir().unwrap();
        let store = ModuleStore::open(dir.path().into(), usage(dir.path(), 0)).unwrap();
        let err = store.put(b"#!/bin/sh\necho hi").unwrap_err();
        assert!(err.to_string().contains("magic"), "{err}");
        let err = store.put(b"\0asm\x01\0\0\0\x01\x05garbage").unwrap_err();
        assert!(matches!(err, ModuleError::Invalid(_)), "{err}");
        let err = store.put(b"\0asm\x01\0\0\0").unwrap_err();
        assert!(err.to_string().contains("_start"), "{err}");
    }

    #[test]
    fn a_file_past_the_quota_is_refused_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let counted = usage(dir.path(), 100);
        let files = dir.path().join("files");
        let store = ModuleStore::open_files(files.clone(), counted.clone()).unwrap();
        store.put(&[1; 60]).unwrap();
        let err = store.put(&[2; 41]).unwrap_err();
        assert!(
            matches!(&err, ModuleError::OverQuota { what: "file", quota } if quota.used == 60),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("the file is not stored: 41 more bytes"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_dir(&files).unwrap().count(),
            1,
            "no temp file left"
        );
        assert_eq!(counted.used(), 60);
        store.put(&[1; 60]).unwrap();
        store.put(&[3; 40]).unwrap();
        assert_eq!(counted.used(), 100);
    }

    #[test]
    fn a_full_disk_is_told_from_other_write_errors() {
        let full = ModuleError::Io {
            what: "module",
            path: "m".into(),
            source: std::io::Error::from_raw_os_error(28),
        };
        assert!(full.is_disk_full());
        let other = ModuleError::Io {
            what: "module",
            path: "m".into(),
            source: std::io::Error::from_raw_os_error(13),
        };
        assert!(!other.is_disk_full());
    }
}
