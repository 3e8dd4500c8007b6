//! Uploaded modules and files: stored once per SHA-256 (modules under
//! `<data-dir>/modules/`, validated as wasm first; files under `<data-dir>/files/`, any
//! bytes), served to executors by digest.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use flint_protocol::Digest;

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
    #[error("storing module at {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub struct ModuleStore {
    dir: PathBuf,
    index: Mutex<HashMap<Digest, ModuleInfo>>,
    /// Modules must be valid wasm; files may be anything.
    wasm_only: bool,
}

impl ModuleStore {
    /// Opens a store of wasm modules, indexing what a previous run left.
    pub fn open(dir: PathBuf) -> Result<Self, ModuleError> {
        Self::open_with(dir, true)
    }

    /// Opens a store of files (any bytes).
    pub fn open_files(dir: PathBuf) -> Result<Self, ModuleError> {
        Self::open_with(dir, false)
    }

    fn open_with(dir: PathBuf, wasm_only: bool) -> Result<Self, ModuleError> {
        let io = |source| ModuleError::Io {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let mut index = HashMap::new();
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let Some(digest) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".wasm"))
                .and_then(|hex| hex.parse::<Digest>().ok())
            else {
                continue;
            };
            let meta = entry.metadata().map_err(io)?;
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
            wasm_only,
        })
    }

    /// Validates and stores `wasm`; storing the same bytes again changes nothing.
    pub fn put(&self, wasm: &[u8]) -> Result<(Digest, ModuleInfo), ModuleError> {
        if self.wasm_only {
            validate(wasm)?;
        }
        let digest = Digest::of(wasm);
        if let Some(info) = self.get(&digest) {
            return Ok((digest, info));
        }
        let path = self.path(&digest);
        let io = |source| ModuleError::Io {
            path: path.clone(),
            source,
        };
        // Write-then-rename: a crash mid-write never leaves a partial module under its
        // digest's name.
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(io)?;
        std::io::Write::write_all(&mut tmp, wasm).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(&path).map_err(|e| io(e.error))?;
        let info = ModuleInfo {
            size: wasm.len() as u64,
            timestamp_ms: now_ms(),
        };
        let mut index = self.index.lock().expect("module index lock poisoned");
        Ok((digest, *index.entry(digest).or_insert(info)))
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

    #[test]
    fn stores_once_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let store = ModuleStore::open(dir.path().into()).unwrap();
        let (digest, info) = store.put(EMPTY_MODULE).unwrap();
        assert_eq!(store.put(EMPTY_MODULE).unwrap(), (digest, info));
        assert_eq!(std::fs::read(store.path(&digest)).unwrap(), EMPTY_MODULE);
        let reopened = ModuleStore::open(dir.path().into()).unwrap();
        assert_eq!(
            reopened.get(&digest).map(|i| i.size),
            Some(EMPTY_MODULE.len() as u64)
        );
    }

    #[test]
    fn rejects_what_is_not_wasm() {
        let dir = tempfile::tempdir().unwrap();
        let store = ModuleStore::open(dir.path().into()).unwrap();
        let err = store.put(b"#!/bin/sh\necho hi").unwrap_err();
        assert!(err.to_string().contains("magic"), "{err}");
        let err = store.put(b"\0asm\x01\0\0\0\x01\x05garbage").unwrap_err();
        assert!(matches!(err, ModuleError::Invalid(_)), "{err}");
        let err = store.put(b"\0asm\x01\0\0\0").unwrap_err();
        assert!(err.to_string().contains("_start"), "{err}");
    }
}
