//! Executors' own logs (their stderr), for the executors `flint dev` started: it tells
//! the driver where each one's stderr file is, and `GET /v1/executors/{id}/log` serves
//! its tail ([`read_tail`]). Executors started any other way log wherever their operator sends stderr;
//! the driver never sees those files.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Mutex;

use flint_protocol::ExecutorId;

/// The most of an executor's log served: its end, where the news is.
pub const EXECUTOR_LOG_TAIL_BYTES: u64 = 1024 * 1024;

/// Where each executor's stderr goes, for those whose launcher said.
#[derive(Default)]
pub struct ExecutorLogs {
    paths: Mutex<HashMap<ExecutorId, PathBuf>>,
}

impl ExecutorLogs {
    pub fn set(&self, id: ExecutorId, stderr: PathBuf) {
        self.lock().insert(id, stderr);
    }

    pub fn get(&self, id: &ExecutorId) -> Option<PathBuf> {
        self.lock().get(id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ExecutorId, PathBuf>> {
        self.paths.lock().expect("executor logs lock poisoned")
    }
}

/// The path a client reads an executor's log at, when the driver has it.
pub fn log_url(logs: &ExecutorLogs, id: &ExecutorId) -> Option<String> {
    logs.get(id).map(|_| format!("/v1/executors/{id}/log"))
}

/// The last `max` bytes of a file, after a line saying how much was left out.
pub fn read_tail(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let mut out = Vec::new();
    if len > max {
        out.extend(format!("[flint: the last {max} of {len} bytes]\n").bytes());
        file.seek(SeekFrom::Start(len - max))?;
    }
    file.take(max).read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_log_is_cut_to_its_end_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stderr");
        std::fs::write(&path, b"0123456789").unwrap();
        assert_eq!(read_tail(&path, 10).unwrap(), b"0123456789");
        assert_eq!(
            read_tail(&path, 4).unwrap(),
            b"[flint: the last 4 of 10 bytes]\n6789"
        );
    }
}
