//! Executors' own logs (their stderr), for the executors `flint dev` started: it tells
//! the driver where each one's stderr file is, and `GET /v1/executors/{id}/log` serves
//! its tail. Executors started any other way log wherever their operator sends stderr;
//! the driver never sees those files.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use flint_protocol::ExecutorId;
use flint_protocol::api::ErrorResponse;

use crate::api::ApiError;
use crate::service::Driver;

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
pub fn log_url(driver: &Driver, id: &ExecutorId) -> Option<String> {
    driver
        .executor_logs
        .get(id)
        .map(|_| format!("/v1/executors/{id}/log"))
}

/// An executor's stderr (the last 1 MiB), for executors `flint dev` started.
#[utoipa::path(get, path = "/v1/executors/{id}/log", tag = "executors",
    params(("id" = String, Path, description = "the executor's id")),
    responses(
        (status = 200, description = "the log's last 1 MiB; when cut, it starts with a line saying so", body = String, content_type = "text/plain"),
        (status = 404, description = "no such executor (`executor_not_found`), or the driver has no log of it (`no_log`): only executors `flint dev` started have one here", body = ErrorResponse),
    ))]
pub async fn get_executor_log(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_path", e.body_text()))?;
    let id = ExecutorId(id);
    let Some(path) = driver.executor_logs.get(&id) else {
        let known = driver.read(|s| s.executors.contains_key(&id));
        return Err(match known {
            true => ApiError::new(
                StatusCode::NOT_FOUND,
                "no_log",
                format!(
                    "executor {id} was not started by this driver's `flint dev`: its log is \
                     wherever its own stderr goes"
                ),
            ),
            false => ApiError::new(
                StatusCode::NOT_FOUND,
                "executor_not_found",
                format!("no executor {id}"),
            ),
        });
    };
    let tail = tokio::task::spawn_blocking(move || read_tail(&path, EXECUTOR_LOG_TAIL_BYTES))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage", e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], tail).into_response())
}

/// The last `max` bytes of a file, after a line saying how much was left out.
fn read_tail(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
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
