//! Jobs: submit (admission is the service's), read, wait for, kill, and page through
//! jobs and their tasks, timelines and logs. Results are [`super::results`]'.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flint_protocol::api::{
    ErrorCode, ErrorResponse, JobSpec, JobState, JobView, List, TaskView, TimelineView,
};
use flint_protocol::{JobId, defaults};
use serde::Deserialize;
use utoipa::IntoParams;

use super::edge;
use super::error::{ApiError, ApiResult};
use crate::service::{Driver, IdempotencyKey, Submitted};
use crate::store::{JobFilter, OwnerFilter};
use crate::tenants::{ADMIN, Caller};
use crate::views::{TIMELINE_PAGE, task_views, timeline_view};

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
    /// Seconds to wait for the job (or graph) to end (at most 300) before answering.
    #[param(minimum = 0)]
    pub(super) wait: Option<f64>,
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
        (status = 429, description = "`quota_exceeded`: past one of the tenant's limits (`max_jobs`, `max_pending_tasks`, `max_storage_bytes`, `max_task_memory_mb`, `max_task_timeout_ms`, `max_priority`); the message names the limit, what the tenant holds and what the job would add. Nothing was stored", body = ErrorResponse),
        (status = 422, description = "an invalid spec: `invalid_spec`, `unknown_module`, `invalid_module_id`, `unknown_file`, `no_tasks`, `too_many_tasks`, `unschedulable`; for `result` and `results` inputs `unknown_result`, `result_not_ready`, `no_result`, `input_too_large`, `too_many_input_parts`; or `idempotency_conflict`: the `Idempotency-Key` belongs to a job submitted with another spec (the message names it)", body = ErrorResponse),
        (status = 507, description = "`storage_full`: the data dir holds its quota (`--data-dir-max-bytes`; the message names the limit and what the dir holds) or the driver's disk is full; the job is not accepted (a repeat under an `Idempotency-Key` is still answered)", body = ErrorResponse),
    ))]
pub(super) async fn submit_job(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
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
    let (status, id) = match driver.submit_spec(body, key, &caller).await? {
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
pub(super) fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<IdempotencyKey>> {
    let mut given = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = given.next() else {
        return Ok(None);
    };
    if given.next().is_some() {
        return Err(ApiError::new(
            ErrorCode::BadIdempotencyKey,
            "the Idempotency-Key header is given more than once; give it once",
        ));
    }
    Ok(Some(IdempotencyKey::parse(value.as_bytes())?))
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
    wait_until_ended(
        driver,
        wait,
        Duration::ZERO,
        || Ok(driver.existing_job_view(id)?),
        |view| view.state.is_final(),
    )
    .await
}

/// `view()` once `ended` says so or `wait` seconds (at most [`MAX_WAIT`]) have passed,
/// looked at again whenever a job ends (at most once per `every`: a view of many jobs
/// is not made again for each of a burst of ends); at once without `wait`.
pub(super) async fn wait_until_ended<V>(
    driver: &Driver,
    wait: Option<f64>,
    every: Duration,
    view: impl Fn() -> ApiResult<V>,
    ended: impl Fn(&V) -> bool,
) -> ApiResult<V> {
    let wait = wait
        .filter(|w| w.is_finite() && *w > 0.0)
        // Clamped before converting: `from_secs_f64` panics past `Duration::MAX`
        // (found by schemathesis with `?wait=1.8e19`).
        .map(|w| Duration::from_secs_f64(w.min(MAX_WAIT.as_secs_f64())));
    let deadline = wait.map(|w| Instant::now() + w);
    let mut endings = driver.job_endings();
    loop {
        let seen = view()?;
        let Some(deadline) = deadline else {
            return Ok(seen);
        };
        // The deadline is checked here too: while other jobs keep ending, `changed()`
        // is always ready and the timeout below never fires.
        if ended(&seen) || Instant::now() >= deadline {
            return Ok(seen);
        }
        let changed = tokio::time::timeout_at(deadline.into(), endings.changed()).await;
        if !matches!(changed, Ok(Ok(()))) {
            return view();
        }
        if !every.is_zero() {
            tokio::time::sleep_until(deadline.min(Instant::now() + every).into()).await;
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
    let live = driver.apply(|s| match s.kill_job(&id, SystemTime::now()) {
        Some(actions) => (true, actions),
        None => (false, Vec::new()),
    });
    if live {
        tracing::info!(job = %id, "job killed by request");
    }
    // A job already over (live or not) is left as it is.
    let view = driver.existing_job_view(&id)?;
    Ok((StatusCode::ACCEPTED, axum::Json(view)))
}

/// Deletes a finished job with everything it owns: its task records, results, logs and
/// blocks; its idempotency key is free again. A running job is refused: kill it first.
#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "the job's id")),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, description = "no such job (`job_not_found`), or already deleted", body = ErrorResponse),
        (status = 409, description = "the job has not ended (`job_running`; kill it first), or a job that has not ended reads its results (`job_in_use`)", body = ErrorResponse),
    ))]
pub(super) async fn delete_job(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    driver.delete_job(&JobId(id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct JobsQuery {
    /// Items per page, 1 to 10,000.
    #[param(minimum = 1, maximum = 10_000)]
    limit: Option<u64>,
    /// The `next` cursor of the previous page.
    after: Option<String>,
    /// Only jobs in this state.
    state: Option<JobState>,
    /// Only jobs of this name (exactly).
    name: Option<String>,
    /// Only jobs created at or after this time (RFC 3339, e.g. `2026-12-01T00:00:00Z`).
    #[param(format = DateTime)]
    created_after: Option<String>,
    /// Only jobs created before this time (RFC 3339).
    #[param(format = DateTime)]
    created_before: Option<String>,
    /// Only this tenant's jobs (`admin`: the admin's own); the admin's to ask, a tenant
    /// lists only its own whatever it gives.
    tenant: Option<String>,
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
            ErrorCode::BadQuery,
            format!("limit={n}: a page holds 1 to {MAX_PAGE} items"),
        )),
    }
}

/// Jobs, newest first, a page at a time, optionally filtered by state, name and
/// creation time; served from the job store's indexes.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(JobsQuery),
    responses(
        (status = 200, description = "a page of jobs", body = List<JobView>),
        (status = 400, description = "a bad query (`bad_query`): a limit out of range, a time that is not RFC 3339", body = ErrorResponse),
    ))]
pub(super) async fn list_jobs(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<JobsQuery>, QueryRejection>,
) -> ApiResult<axum::Json<List<JobView>>> {
    let Query(query) = query.map_err(ApiError::query)?;
    let limit = page_limit(query.limit, PAGE)?;
    let filter = JobFilter {
        state: query.state,
        name: query.name,
        created_after: query
            .created_after
            .as_deref()
            .map(|t| unix_ms("created_after", t))
            .transpose()?,
        created_before: query
            .created_before
            .as_deref()
            .map(|t| unix_ms("created_before", t))
            .transpose()?,
        // A tenant lists its own jobs only; the admin anyone's, or one tenant's.
        owner: match (caller.tenant(), query.tenant) {
            (Some(t), _) => Some(OwnerFilter(Some(t.name.to_string()))),
            (None, Some(name)) if name == ADMIN => Some(OwnerFilter(None)),
            (None, Some(name)) => Some(OwnerFilter(Some(name))),
            (None, None) => None,
        },
    };
    let (items, next) = driver.jobs_page(filter, query.after, limit).await?;
    Ok(axum::Json(List { items, next }))
}

/// An RFC 3339 time as Unix milliseconds.
fn unix_ms(name: &str, text: &str) -> ApiResult<u64> {
    // Times before 1970 are before every job.
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis().max(0) as u64)
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::BadQuery,
                format!("{name}={text:?}: not an RFC 3339 time (e.g. 2026-12-01T00:00:00Z)"),
            )
        })
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
    let page = driver.existing_job(&JobId(id), |job| {
        let end = job.tasks.len().min(first.saturating_add(limit));
        let items: Vec<TaskView> = task_views(job, first.min(end)..end);
        let next = (end < job.tasks.len()).then(|| (end - 1).to_string());
        List { items, next }
    })?;
    Ok(axum::Json(page))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct TimelineQuery {
    /// Attempts per page, 1 to 100,000 (the default).
    #[param(minimum = 1, maximum = 100_000)]
    limit: Option<u64>,
    /// The `next` cursor of the previous page.
    after: Option<u64>,
}

/// Every attempt of the job's tasks (launch, executor, start and end, outcome, whether
/// a speculative copy), in launch order, a page at a time: what the web UI draws its
/// timeline, throughput and duration charts from.
#[utoipa::path(get, path = "/v1/jobs/{id}/timeline", tag = "jobs",
    params(("id" = String, Path, description = "the job's id"), TimelineQuery),
    responses(
        (status = 200, description = "a page of the job's attempts", body = TimelineView),
        (status = 400, description = "a bad query", body = ErrorResponse),
        (status = 404, description = "no such job", body = ErrorResponse),
    ))]
pub(super) async fn get_timeline(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
    query: Result<Query<TimelineQuery>, QueryRejection>,
) -> ApiResult<axum::Json<TimelineView>> {
    let Query(query) = query.map_err(ApiError::query)?;
    let limit = match query.limit {
        None => TIMELINE_PAGE,
        Some(n @ 1..=100_000) => n as usize,
        Some(n) => {
            return Err(ApiError::new(
                ErrorCode::BadQuery,
                format!("limit={n}: a timeline page holds 1 to {TIMELINE_PAGE} attempts"),
            ));
        }
    };
    let first = query
        .after
        .map_or(0, |a| usize::try_from(a).unwrap_or(usize::MAX));
    let timeline = driver.existing_job(&JobId(id), |job| {
        timeline_view(job, SystemTime::now(), first, limit)
    })?;
    Ok(axum::Json(timeline))
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
    let log = driver.existing_task(&JobId(id), index, |t| t.log.clone())?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], log).into_response())
}
