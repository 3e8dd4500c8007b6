//! `GET /v1/jobs/{id}/tasks/{index}/replay`: what one attempt of a task ran with (module,
//! files and input by digest and where to get them, args, env, seed, budget) and what it
//! did, for `flint replay` to run again in the same sandbox on a laptop.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use base64::Engine as _;
use flint_protocol::api::{
    ErrorBody, ErrorResponse, ReplayBundle, ReplayInputPart, ReplaySource, TaskState,
};
use flint_protocol::records::JobRecord;
use flint_protocol::{Digest, FetchRef, InputPart, JobId, Pins, TaskInput};
use serde::Deserialize;
use utoipa::IntoParams;

use super::error::{ApiError, ApiResult};
use crate::service::Driver;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ReplayQuery {
    /// The attempt to replay (1 is the first); the task's latest when left out.
    #[param(minimum = 1)]
    attempt: Option<u32>,
}

/// What the driver saw of the attempt: from the job's attempts and its task.
struct Seen {
    attempt: u32,
    task_count: u32,
    memory_mb: u32,
    timeout_ms: u64,
    outcome: Option<String>,
    pins: Option<Pins>,
    /// The task's failure, log and result, when this attempt is its last and it ended.
    error: Option<ErrorBody>,
    log: Option<Digest>,
    result: Option<Digest>,
}

/// What one attempt of a task ran with and how it ended: `flint replay` runs it again
/// locally. 410 `replay_unavailable` when something it ran was deleted since (an
/// uploaded module or file removed by retention or `DELETE`).
#[utoipa::path(get, path = "/v1/jobs/{id}/tasks/{index}/replay", tag = "jobs",
    params(("id" = String, Path, description = "the job's id"),
           ("index" = u32, Path, description = "the task's index"), ReplayQuery),
    responses(
        (status = 200, description = "the attempt's bundle", body = ReplayBundle),
        (status = 400, description = "a bad task index or attempt", body = ErrorResponse),
        (status = 404, description = "no such job, task or attempt", body = ErrorResponse),
        (status = 409, description = "the task has not run yet", body = ErrorResponse),
        (status = 410, description = "what it ran was deleted", body = ErrorResponse),
    ))]
pub(super) async fn get_replay(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<(String, u32)>, PathRejection>,
    query: Result<Query<ReplayQuery>, QueryRejection>,
) -> ApiResult<axum::Json<ReplayBundle>> {
    let Path((id, index)) = path.map_err(ApiError::path)?;
    let Query(query) = query.map_err(ApiError::query)?;
    let id = JobId(id);
    let seen = seen(&driver, &id, index, query.attempt)?;
    // The job as submitted (its tasks' inputs, args and env), as the store keeps it for
    // as long as the job exists.
    let record = {
        let (driver, job) = (driver.clone(), id.clone());
        tokio::task::spawn_blocking(move || driver.job_record(&job))
            .await
            .map_err(|e| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
            })?
            .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "storage", e.to_string()))?
            .ok_or_else(|| ApiError::not_found("job", format!("no job {id}")))?
    };
    bundle(&driver, record, index, seen).map(axum::Json)
}

fn seen(driver: &Driver, id: &JobId, index: u32, asked: Option<u32>) -> ApiResult<Seen> {
    driver
        .job(id, |job| {
            let task = job.tasks.get(index as usize).ok_or_else(|| {
                ApiError::not_found("task", format!("job {id} has no task {index}"))
            })?;
            let mut spans = job.attempts.iter().enumerate().rev();
            let span = match asked {
                Some(n) => {
                    let found = spans.find(|(_, s)| s.task == index && s.attempt == n);
                    Some(found.ok_or_else(|| {
                        ApiError::not_found(
                            "attempt",
                            format!("task {index} of job {id} has no attempt {n}"),
                        )
                    })?)
                }
                None => spans.find(|(_, s)| s.task == index),
            };
            // A task that ended before a driver restart while its job ran on has no
            // span: its one known attempt is its last, with the job's budget.
            let attempt = span.map_or(task.attempts, |(_, s)| s.attempt);
            if attempt == 0 {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "not_run",
                    format!("task {index} of job {id} has not run yet: nothing to replay"),
                ));
            }
            let last = attempt == task.attempts && task.state.is_final();
            let budget = job.def.resources;
            Ok(Seen {
                attempt,
                task_count: job.tasks.len() as u32,
                memory_mb: span.map_or(budget.memory_mb, |(_, s)| s.memory_mb).max(1),
                timeout_ms: span.map_or(budget.timeout_ms, |(_, s)| s.timeout_ms).max(1),
                outcome: match span {
                    Some((_, s)) => s.outcome.map(|o| o.as_str().to_owned()),
                    None => Some(task.state.as_str().to_owned()),
                },
                pins: span.and_then(|(at, _)| job.pins.get(&(at as u32)).cloned()),
                error: last.then(|| task.error_body()).flatten(),
                log: last.then(|| Digest::of(&task.log)),
                result: (last && task.state == TaskState::Succeeded)
                    .then_some(task.result_digest)
                    .flatten(),
            })
        })?
        .ok_or_else(|| ApiError::not_found("job", format!("no job {id}")))?
}

fn bundle(driver: &Driver, record: JobRecord, index: u32, seen: Seen) -> ApiResult<ReplayBundle> {
    let JobRecord { def, mut tasks } = record;
    let task = tasks.swap_remove(index as usize);
    let gone = |what: String| {
        ApiError::new(
            StatusCode::GONE,
            "replay_unavailable",
            format!(
                "{what} was deleted since the attempt ran (retention or DELETE): it cannot be replayed"
            ),
        )
    };
    let pins = seen.pins.as_ref();
    let module = match (def.module.served_by_driver(), def.module.digest) {
        (true, Some(digest)) => {
            driver
                .modules
                .get(&digest)
                .ok_or_else(|| gone(format!("module {digest}")))?;
            ReplaySource {
                url: format!("/v1/modules/{digest}"),
                sha256: Some(digest.to_string()),
            }
        }
        _ => ReplaySource {
            url: def.module.url.clone(),
            sha256: pins
                .map(|p| p.module)
                .or(def.module.digest)
                .map(|d| d.to_string()),
        },
    };
    let mut files = BTreeMap::new();
    for (at, file) in def.files.iter().enumerate() {
        let pinned = pins.and_then(|p| p.files.get(at)).copied();
        let source = match (file.served_by_driver(), file.digest) {
            (true, Some(digest)) => {
                driver
                    .files
                    .get(&digest)
                    .ok_or_else(|| gone(format!("file {digest} ({})", file.name)))?;
                ReplaySource {
                    url: format!("/v1/files/{digest}"),
                    sha256: Some(digest.to_string()),
                }
            }
            _ => ReplaySource {
                url: file.url.clone(),
                sha256: pinned.or(file.digest).map(|d| d.to_string()),
            },
        };
        files.insert(file.name.clone(), source);
    }
    let base = driver.http_base.as_str();
    let fetch = |f: &FetchRef| ReplaySource {
        // What the driver serves is named by its path, so that a client reaching the
        // driver at another address than executors do still gets it.
        url: match (f.served_by_driver(), f.url.strip_prefix(base)) {
            (true, Some(path)) if path.starts_with('/') => path.to_owned(),
            _ => f.url.clone(),
        },
        sha256: f.digest.map(|d| d.to_string()),
    };
    let inline = |bytes: &[u8]| ReplayInputPart::Inline {
        base64: base64::engine::general_purpose::STANDARD.encode(bytes),
    };
    let input = match &task.input {
        TaskInput::Inline(bytes) => vec![inline(bytes)],
        TaskInput::Fetch(f) => vec![ReplayInputPart::Fetch(fetch(f))],
        TaskInput::Parts(parts) => parts
            .iter()
            .map(|p| match p {
                InputPart::Inline(bytes) => inline(bytes),
                InputPart::Fetch(f) => ReplayInputPart::Fetch(fetch(f)),
            })
            .collect(),
    };
    let env = (def.env.iter().chain(&task.env))
        .filter(|(k, _)| !k.starts_with("FLINT_"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(ReplayBundle {
        job: def.id,
        task: index,
        attempt: seen.attempt,
        task_count: seen.task_count,
        name: def.name,
        module,
        files,
        input,
        input_sha256: pins.map(|p| p.input.to_string()),
        args: def.args.into_iter().chain(task.args).collect(),
        env,
        deterministic: def.options.determinism.is_some(),
        seed: def.options.determinism.map(|d| d.seed),
        memory_mb: seen.memory_mb,
        timeout_ms: seen.timeout_ms,
        max_output_bytes: def.resources.max_output_bytes,
        fuel: def.resources.fuel,
        outcome: seen.outcome,
        error: seen.error,
        log_sha256: seen.log.map(|d| d.to_string()),
        result_sha256: seen.result.map(|d| d.to_string()),
    })
}
