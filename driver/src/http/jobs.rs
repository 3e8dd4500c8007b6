//! Jobs: submit (admission is the service's), read, wait for, kill, and page through
//! jobs and their tasks' results and logs.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flint_protocol::api::{ErrorResponse, JobSpec, JobView, List, TaskState, TaskView};
use flint_protocol::{JobId, TaskResult, defaults};
use serde::Deserialize;
use utoipa::IntoParams;

use super::blobs::stream_block;
use super::edge;
use super::error::{ApiError, ApiResult};
use crate::scheduler::{ClusterState, Task};
use crate::service::{Driver, IdempotencyKey, Submitted};
use crate::views::{job_view, task_view};

/// The header that makes a submission safe to retry.
const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Longest `?wait=` honoured, so a client cannot pin a connection forever.
const MAX_WAIT: Duration = Duration::from_secs(300);
/// Default and largest page of a list.
pub(super) const PAGE: usize = 100;
pub(super) const MAX_PAGE: usize = 10_000;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct WaitQuery {
    /// Seconds to wait for the job to end (at most 300) before answering.
    #[param(minimum = 0)]
    wait: Option<f64>,
}

/// Submits a job. It is stored before the answer, so an accepted job survives a driver
/// restart. With `?wait=S` the answer comes when the job ends or S seconds pass. With an
/// `Idempotency-Key`, a repeat of the same spec gets the job the first made (200), not
/// a second one, for as long as the job exists.
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs",
    params(
        WaitQuery,
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255, pattern = "^[!-~]+$",
            description = "Makes the submission safe to retry: the first submission with a key creates \
                the job (202); a repeat with the same key and the same spec (the same JSON once \
                object keys are sorted and whitespace dropped) answers 200 with that job, even one \
                arriving while the first is still being stored; with another spec, 422 \
                `idempotency_conflict`. A key lives as long as its job. 1 to 255 bytes of visible \
                ASCII (0x21-0x7e), else 400 `bad_idempotency_key`."),
    ),
    request_body = JobSpec,
    responses(
        (status = 200, description = "a repeat of an earlier submission with the same `Idempotency-Key` and spec: that job (with `wait`, maybe ended)", body = JobView),
        (status = 202, description = "accepted (and, with `wait`, maybe ended)", body = JobView),
        (status = 400, description = "not JSON (`invalid_json`), a bad query, or a bad `Idempotency-Key` (`bad_idempotency_key`: empty, over 255 bytes, a byte outside 0x21-0x7e, or given twice)", body = ErrorResponse),
        (status = 413, description = "larger than the job spec limit", body = ErrorResponse),
        (status = 422, description = "an invalid spec: `invalid_spec`, `unknown_module`, `invalid_module_id`, `unknown_file`, `no_tasks`, `too_many_tasks`, `unschedulable`; for `result` and `results` inputs `unknown_result`, `result_not_ready`, `no_result`, `input_too_large`, `too_many_input_parts`; or `idempotency_conflict`: the `Idempotency-Key` belongs to a job submitted with another spec (the message names it)", body = ErrorResponse),
    ))]
pub(super) async fn submit_job(
    State(driver): State<Arc<Driver>>,
    query: Result<Query<WaitQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<JobView>)> {
    let Query(query) = query.map_err(ApiError::query)?;
    let key = idempotency_key(&headers)?;
    let limit = defaults::MAX_JOB_SPEC_BYTES;
    let body = edge::read_body(
        &headers,
        body,
        limit,
        driver.config.edge.body_idle_timeout,
        "job spec",
    )
    .await?;
    let (status, id) = match driver.submit_spec(body, key).await? {
        Submitted::Accepted(id) => {
            tracing::info!(job = %id, "job accepted");
            (StatusCode::ACCEPTED, id)
        }
        Submitted::Repeated(id) => {
            tracing::info!(job = %id, "repeated submission answered with its job");
            (StatusCode::OK, id)
        }
    };
    let view = wait_for_job(&driver, &id, query.wait).await?;
    Ok((status, axum::Json(view)))
}

/// The request's `Idempotency-Key`, if it has one (and only one) that follows the rule.
fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<IdempotencyKey>> {
    let bad =
        |message: String| ApiError::new(StatusCode::BAD_REQUEST, "bad_idempotency_key", message);
    let mut given = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = given.next() else {
        return Ok(None);
    };
    if given.next().is_some() {
        return Err(bad(
            "the Idempotency-Key header is given more than once; give it once".into(),
        ));
    }
    IdempotencyKey::parse(value.as_bytes())
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

/// A job's state, counts per task state, timings and error; with `?wait=S`, once it
/// has ended or S seconds have passed.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "the job's id"), WaitQuery),
    responses(
        (status = 200, description = "the job", body = JobView),
        (status = 400, description = "a bad query", body = ErrorResponse),
        (status = 404, description = "no such job", body = ErrorResponse),
    ))]
pub(super) async fn get_job(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
    query: Result<Query<WaitQuery>, QueryRejection>,
) -> ApiResult<axum::Json<JobView>> {
    let Query(query) = query.map_err(ApiError::query)?;
    Ok(axum::Json(
        wait_for_job(&driver, &JobId(id), query.wait).await?,
    ))
}

/// The job's view once it has ended or `wait` seconds have passed, whichever is first.
async fn wait_for_job(driver: &Driver, id: &JobId, wait: Option<f64>) -> ApiResult<JobView> {
    let wait = wait
        .filter(|w| w.is_finite() && *w > 0.0)
        // Clamped before converting: `from_secs_f64` panics past `Duration::MAX`
        // (found by schemathesis with `?wait=1.8e19`).
        .map(|w| Duration::from_secs_f64(w.min(MAX_WAIT.as_secs_f64())));
    let deadline = wait.map(|w| Instant::now() + w);
    let mut endings = driver.job_endings();
    loop {
        let view = driver
            .read(|s| s.jobs.get(id).map(job_view))
            .ok_or_else(|| ApiError::not_found("job", format!("no job {id}")))?;
        let Some(deadline) = deadline else {
            return Ok(view);
        };
        if view.state.is_final() {
            return Ok(view);
        }
        let changed = tokio::time::timeout_at(deadline.into(), endings.changed()).await;
        if !matches!(changed, Ok(Ok(()))) {
            return driver
                .read(|s| s.jobs.get(id).map(job_view))
                .ok_or_else(|| ApiError::not_found("job", format!("no job {id}")));
        }
    }
}

/// Kills a job: pending tasks never start, running ones stop at the executor's next
/// epoch tick. A job already over is left as it is.
#[utoipa::path(post, path = "/v1/jobs/{id}/kill", tag = "jobs",
    params(("id" = String, Path, description = "the job's id")),
    responses(
        (status = 202, description = "killed (or already over)", body = JobView),
        (status = 404, description = "no such job", body = ErrorResponse),
    ))]
pub(super) async fn kill_job(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, axum::Json<JobView>)> {
    let id = JobId(id);
    let found = driver.apply(|s| match s.kill_job(&id, SystemTime::now()) {
        Some(actions) => (true, actions),
        None => (false, Vec::new()),
    });
    if !found {
        return Err(ApiError::not_found("job", format!("no job {id}")));
    }
    tracing::info!(job = %id, "job killed by request");
    let view = driver
        .read(|s| s.jobs.get(&id).map(job_view))
        .ok_or_else(|| ApiError::not_found("job", format!("no job {id}")))?;
    Ok((StatusCode::ACCEPTED, axum::Json(view)))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct PageQuery {
    /// Items per page, 1 to 10,000.
    #[param(minimum = 1, maximum = 10_000)]
    limit: Option<u64>,
    /// The `next` cursor of the previous page.
    after: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct TaskPageQuery {
    /// Items per page, 1 to 10,000.
    #[param(minimum = 1, maximum = 10_000)]
    limit: Option<u64>,
    /// The `next` cursor of the previous page: the last task index it held.
    after: Option<u32>,
}

fn page_limit(limit: Option<u64>, default: usize) -> ApiResult<usize> {
    match limit {
        None => Ok(default),
        Some(n @ 1..=10_000) => Ok(n as usize),
        Some(n) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_query",
            format!("limit={n}: a page holds 1 to {MAX_PAGE} items"),
        )),
    }
}

/// Jobs, newest first, a page at a time.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(PageQuery),
    responses(
        (status = 200, description = "a page of jobs", body = List<JobView>),
        (status = 400, description = "a bad query", body = ErrorResponse),
    ))]
pub(super) async fn list_jobs(
    State(driver): State<Arc<Driver>>,
    page: Result<Query<PageQuery>, QueryRejection>,
) -> ApiResult<axum::Json<List<JobView>>> {
    let Query(page) = page.map_err(ApiError::query)?;
    let limit = page_limit(page.limit, PAGE)?;
    Ok(axum::Json(driver.read(|s| {
        let newest_first = s.job_order.iter().rev();
        let start: Vec<&JobId> = match &page.after {
            Some(after) => newest_first
                .skip_while(|id| id.0 != *after)
                .skip(1)
                .collect(),
            None => newest_first.collect(),
        };
        let items: Vec<JobView> = start
            .iter()
            .take(limit)
            .map(|id| job_view(&s.jobs[*id]))
            .collect();
        let next = (start.len() > limit)
            .then(|| items.last().map(|j| j.id.0.clone()))
            .flatten();
        List { items, next }
    })))
}

/// A job's tasks in index order, a page at a time (`after` is a task index).
#[utoipa::path(get, path = "/v1/jobs/{id}/tasks", tag = "jobs",
    params(("id" = String, Path, description = "the job's id"), TaskPageQuery),
    responses(
        (status = 200, description = "a page of tasks", body = List<TaskView>),
        (status = 400, description = "a bad query", body = ErrorResponse),
        (status = 404, description = "no such job", body = ErrorResponse),
    ))]
pub(super) async fn list_tasks(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
    page: Result<Query<TaskPageQuery>, QueryRejection>,
) -> ApiResult<axum::Json<List<TaskView>>> {
    let Query(page) = page.map_err(ApiError::query)?;
    let limit = page_limit(page.limit, MAX_PAGE)?;
    let first = page.after.map_or(0, |after| after as usize + 1);
    let id = JobId(id);
    driver.read(|s| {
        let job = s
            .jobs
            .get(&id)
            .ok_or_else(|| ApiError::not_found("job", format!("no job {id}")))?;
        let end = job.tasks.len().min(first.saturating_add(limit));
        let items: Vec<TaskView> = (first.min(end)..end).map(|i| task_view(job, i)).collect();
        let next = (end < job.tasks.len()).then(|| (end - 1).to_string());
        Ok(axum::Json(List { items, next }))
    })
}

/// A succeeded task's result bytes.
#[utoipa::path(get, path = "/v1/jobs/{id}/tasks/{index}/result", tag = "jobs",
    params(("id" = String, Path, description = "the job's id"), ("index" = u32, Path, description = "the task's index")),
    responses(
        (status = 200, description = "the result", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 400, description = "a bad task index", body = ErrorResponse),
        (status = 404, description = "no such job or task", body = ErrorResponse),
        (status = 409, description = "the task has no result (`no_result`)", body = ErrorResponse),
    ))]
pub(super) async fn get_result(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<(String, u32)>, PathRejection>,
) -> ApiResult<Response> {
    let Path((id, index)) = path.map_err(ApiError::path)?;
    let id = JobId(id);
    let result = driver.read(|s| {
        let task = find_task(s, &id, index)?;
        match (&task.result, task.state) {
            (Some(result), TaskState::Succeeded) => Ok(result.clone()),
            (_, state) => Err(ApiError::new(
                StatusCode::CONFLICT,
                "no_result",
                format!(
                    "task {index} of {id} is {} and has no result",
                    state.as_str()
                ),
            )),
        }
    })?;
    match result {
        TaskResult::Inline(bytes) => Ok((
            [(header::CONTENT_TYPE, "application/octet-stream")],
            Body::from(bytes),
        )
            .into_response()),
        TaskResult::Block(block) => stream_block(&driver, &block.id).await,
    }
}

/// A task's log (its stderr), capped at 1 MiB.
#[utoipa::path(get, path = "/v1/jobs/{id}/tasks/{index}/log", tag = "jobs",
    params(("id" = String, Path, description = "the job's id"), ("index" = u32, Path, description = "the task's index")),
    responses(
        (status = 200, description = "the log", body = String, content_type = "text/plain"),
        (status = 400, description = "a bad task index", body = ErrorResponse),
        (status = 404, description = "no such job or task", body = ErrorResponse),
    ))]
pub(super) async fn get_log(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<(String, u32)>, PathRejection>,
) -> ApiResult<Response> {
    let Path((id, index)) = path.map_err(ApiError::path)?;
    let id = JobId(id);
    let log = driver.read(|s| find_task(s, &id, index).map(|t| t.log.clone()))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], log).into_response())
}

fn find_task<'s>(s: &'s ClusterState, id: &JobId, index: u32) -> ApiResult<&'s Task> {
    let job = s
        .jobs
        .get(id)
        .ok_or_else(|| ApiError::not_found("job", format!("no job {id}")))?;
    job.tasks
        .get(index as usize)
        .ok_or_else(|| ApiError::not_found("task", format!("job {id} has no task {index}")))
}
