//! The HTTP API (API.md): routes, request -> state change, and one error type whose
//! mapping to statuses lives in one place.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use base64::Engine as _;
use flint_protocol::api::{
    ErrorBody, ErrorResponse, ExecutorView, InputSpec, JobSpec, JobView, List, ResultInfo,
    TaskState, TaskView, Uploaded,
};
use flint_protocol::{Digest, FileRef, JobId, ModuleRef, Resources, defaults};
use serde::Deserialize;

use crate::modules::{ModuleError, ModuleStore};
use crate::service::Driver;
use crate::state::{ClusterState, Job, JobDef, NewJob, NewTask};

/// Longest `?wait=` honoured, so a client cannot pin a connection forever.
const MAX_WAIT: Duration = Duration::from_secs(300);
/// Default and largest page of a list.
const PAGE: usize = 100;
const MAX_PAGE: usize = 10_000;

pub fn router(driver: Arc<Driver>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/v1/modules",
            put(put_module).layer(DefaultBodyLimit::max(defaults::MAX_MODULE_BYTES)),
        )
        .route("/v1/modules/{id}", get(get_module))
        .route(
            "/v1/files",
            put(put_file).layer(DefaultBodyLimit::max(defaults::MAX_FILE_BYTES)),
        )
        .route("/v1/files/{id}", get(get_file))
        .route(
            "/v1/jobs",
            get(list_jobs)
                .post(submit_job)
                .layer(DefaultBodyLimit::max(defaults::MAX_JOB_SPEC_BYTES)),
        )
        .route("/v1/jobs/{id}", get(get_job))
        .route("/v1/jobs/{id}/kill", post(kill_job))
        .route("/v1/jobs/{id}/tasks", get(list_tasks))
        .route("/v1/jobs/{id}/tasks/{index}/result", get(get_result))
        .route("/v1/jobs/{id}/tasks/{index}/log", get(get_log))
        .route("/v1/executors", get(list_executors))
        .fallback(|| async { ApiError::not_found("route", "no such route; see API.md") })
        .with_state(driver)
}

/// Every error the API returns: a status, a kind callers can branch on, and a message
/// that says what was wrong.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }

    fn invalid(kind: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, kind, message)
    }

    fn not_found(what: &'static str, message: impl Into<String>) -> Self {
        let kind = match what {
            "job" => "job_not_found",
            "task" => "task_not_found",
            "module" => "module_not_found",
            "file" => "file_not_found",
            _ => "not_found",
        };
        Self::new(StatusCode::NOT_FOUND, kind, message)
    }

    fn body(rejection: BytesRejection) -> Self {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return Self::new(status, "body_too_large", rejection.body_text());
        }
        Self::new(StatusCode::BAD_REQUEST, "bad_body", rejection.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(kind = self.kind, message = %self.message, "request failed");
        }
        let body = ErrorResponse {
            error: ErrorBody {
                kind: self.kind.to_owned(),
                message: self.message,
            },
        };
        (self.status, axum::Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

async fn healthz() -> &'static str {
    "ok\n"
}

async fn put_module(
    State(driver): State<Arc<Driver>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, axum::Json<Uploaded>)> {
    put_blob(driver, body, |d| &d.modules).await
}

async fn put_file(
    State(driver): State<Arc<Driver>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, axum::Json<Uploaded>)> {
    put_blob(driver, body, |d| &d.files).await
}

async fn put_blob(
    driver: Arc<Driver>,
    body: Result<Bytes, BytesRejection>,
    store: fn(&Driver) -> &ModuleStore,
) -> ApiResult<(StatusCode, axum::Json<Uploaded>)> {
    let body = body.map_err(ApiError::body)?;
    let stored = tokio::task::spawn_blocking(move || store(&driver).put(&body))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    match stored {
        Ok((id, info)) => Ok((
            StatusCode::CREATED,
            axum::Json(Uploaded {
                id,
                size: info.size,
            }),
        )),
        Err(ModuleError::Invalid(why)) => Err(ApiError::invalid("invalid_module", why)),
        Err(e @ ModuleError::Io { .. }) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "storage",
            e.to_string(),
        )),
    }
}

async fn get_module(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    get_blob(&driver.modules, "module", &id, "application/wasm").await
}

async fn get_file(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    get_blob(&driver.files, "file", &id, "application/octet-stream").await
}

async fn get_blob(
    store: &ModuleStore,
    what: &'static str,
    id: &str,
    content_type: &'static str,
) -> ApiResult<Response> {
    let digest = parse_module_id(id)?;
    if store.get(&digest).is_none() {
        return Err(ApiError::not_found(what, format!("no {what} {digest}")));
    }
    let bytes = tokio::fs::read(store.path(&digest))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage", e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, content_type)], bytes).into_response())
}

#[derive(Deserialize)]
struct WaitQuery {
    /// Seconds to wait for the job to end.
    wait: Option<f64>,
}

async fn submit_job(
    State(driver): State<Arc<Driver>>,
    Query(query): Query<WaitQuery>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, axum::Json<JobView>)> {
    let body = body.map_err(ApiError::body)?;
    let spec: JobSpec = serde_json::from_slice(&body).map_err(|e| {
        let kind = if e.is_data() {
            "invalid_spec"
        } else {
            "invalid_json"
        };
        let status = if e.is_data() {
            StatusCode::UNPROCESSABLE_ENTITY
        } else {
            StatusCode::BAD_REQUEST
        };
        ApiError::new(status, kind, format!("job spec: {e}"))
    })?;
    let job = accept(&driver, spec)?;
    let id = job.def.id.clone();
    let (max_cores, any_fuel) =
        driver.read(|s| (s.max_executor_cores(), s.any_executor_meters_fuel()));
    if max_cores.is_some() && job.def.resources.fuel.is_some() && !any_fuel {
        return Err(ApiError::invalid(
            "unschedulable",
            "tasks have a fuel budget but no executor meters fuel (start executors with --fuel)",
        ));
    }
    if let Some(max) = max_cores
        && job.def.resources.cores > max
    {
        return Err(ApiError::invalid(
            "unschedulable",
            format!(
                "tasks need {} cores but the largest executor has {max}",
                job.def.resources.cores
            ),
        ));
    }
    driver.submit(job).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage",
            format!("job not accepted: {e}"),
        )
    })?;
    tracing::info!(job = %id, "job accepted");
    let view = wait_for_job(&driver, &id, query.wait).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(view)))
}

/// Checks a spec and turns it into a job the scheduler can run.
fn accept(driver: &Driver, spec: JobSpec) -> ApiResult<NewJob> {
    let digest = parse_module_id(&spec.module)?;
    let info = driver.modules.get(&digest).ok_or_else(|| {
        ApiError::invalid(
            "unknown_module",
            format!("no module {digest} has been uploaded; PUT it to /v1/modules first"),
        )
    })?;
    let files = spec
        .files
        .iter()
        .map(|(name, id)| file_ref(driver, name, id))
        .collect::<ApiResult<Vec<FileRef>>>()?;
    let tasks: Vec<NewTask> = match (spec.inputs, spec.tasks) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "invalid_spec",
                "give either `inputs` or `tasks`, not both",
            ));
        }
        (None, None) => Vec::new(),
        (Some(inputs), None) => inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                Ok(NewTask {
                    input: decode_input(input, &format!("inputs[{i}]"))?,
                    args: Vec::new(),
                    env: Vec::new(),
                })
            })
            .collect::<ApiResult<_>>()?,
        (None, Some(tasks)) => tasks
            .into_iter()
            .enumerate()
            .map(|(i, task)| {
                let input = match task.input {
                    Some(input) => decode_input(input, &format!("tasks[{i}].input"))?,
                    None => Vec::new(),
                };
                Ok(NewTask {
                    input,
                    args: task.args,
                    env: task.env.into_iter().collect(),
                })
            })
            .collect::<ApiResult<_>>()?,
    };
    if tasks.is_empty() {
        return Err(ApiError::invalid(
            "no_tasks",
            "a job needs at least one task: give a non-empty `inputs` or `tasks`",
        ));
    }
    if tasks.len() > defaults::MAX_TASKS_PER_JOB {
        return Err(ApiError::invalid(
            "too_many_tasks",
            format!(
                "{} tasks; a job may have at most {}",
                tasks.len(),
                defaults::MAX_TASKS_PER_JOB
            ),
        ));
    }
    let d = Resources::default();
    let r = spec.resources;
    let resources = Resources {
        cores: r.cores.unwrap_or(d.cores),
        memory_mb: r.memory_mb.unwrap_or(d.memory_mb),
        timeout_ms: r.timeout_ms.unwrap_or(d.timeout_ms),
        max_output_bytes: r.max_output_bytes.unwrap_or(d.max_output_bytes),
        fuel: r.fuel,
    };
    if resources.fuel == Some(0) {
        return Err(ApiError::invalid(
            "invalid_spec",
            "resources.fuel must be at least 1 (leave it out for no budget)",
        ));
    }
    for (name, value) in [
        ("cores", u64::from(resources.cores)),
        ("memory_mb", u64::from(resources.memory_mb)),
        ("timeout_ms", resources.timeout_ms),
    ] {
        if value == 0 {
            return Err(ApiError::invalid(
                "invalid_spec",
                format!("resources.{name} must be at least 1"),
            ));
        }
    }
    if resources.max_output_bytes > defaults::TASK_MAX_OUTPUT_BYTES {
        return Err(ApiError::invalid(
            "invalid_spec",
            format!(
                "resources.max_output_bytes may be at most {} (results travel inline)",
                defaults::TASK_MAX_OUTPUT_BYTES
            ),
        ));
    }
    let max_failures = spec.max_failures.unwrap_or(defaults::MAX_FAILURES);
    if max_failures == 0 {
        return Err(ApiError::invalid(
            "invalid_spec",
            "max_failures must be at least 1",
        ));
    }
    let name = spec.name.unwrap_or_else(|| "job".into());
    let def = JobDef {
        id: JobId(format!("job-{}", uuid::Uuid::now_v7().simple())),
        name,
        module: ModuleRef {
            digest,
            url: format!("{}/v1/modules/{digest}", driver.http_base),
            timestamp_ms: info.timestamp_ms,
            size: info.size,
        },
        files,
        args: spec.args,
        env: spec.env.into_iter().collect(),
        resources,
        max_failures,
        created_at_ms: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    };
    Ok(NewJob { def, tasks })
}

/// A job file: a safe name (it becomes a path under `/files`) and an uploaded file.
fn file_ref(driver: &Driver, name: &str, id: &str) -> ApiResult<FileRef> {
    let safe = !name.is_empty()
        && name.len() <= 128
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !safe {
        return Err(ApiError::invalid(
            "invalid_spec",
            format!(
                "files: `{name}` is not a file name: use 1-128 of A-Z a-z 0-9 . _ - (not `.` or `..`)"
            ),
        ));
    }
    let digest = id.parse::<Digest>().map_err(|_| {
        ApiError::invalid(
            "invalid_spec",
            format!("files.{name}: `{id}` is not a file id; upload the file with PUT /v1/files and use the `sha256:` id it returns"),
        )
    })?;
    let info = driver.files.get(&digest).ok_or_else(|| {
        ApiError::invalid(
            "unknown_file",
            format!("files.{name}: no file {digest} has been uploaded; PUT it to /v1/files first"),
        )
    })?;
    Ok(FileRef {
        name: name.to_owned(),
        digest,
        url: format!("{}/v1/files/{digest}", driver.http_base),
        timestamp_ms: info.timestamp_ms,
        size: info.size,
    })
}

fn decode_input(input: InputSpec, at: &str) -> ApiResult<Vec<u8>> {
    match input {
        InputSpec::Text(text) => Ok(text.into_bytes()),
        InputSpec::Base64(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| ApiError::invalid("invalid_spec", format!("{at}: invalid base64: {e}"))),
    }
}

fn parse_module_id(id: &str) -> ApiResult<Digest> {
    id.parse::<Digest>()
        .map_err(|e| ApiError::invalid("invalid_module_id", e.to_string()))
}

async fn get_job(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
    Query(query): Query<WaitQuery>,
) -> ApiResult<axum::Json<JobView>> {
    Ok(axum::Json(
        wait_for_job(&driver, &JobId(id), query.wait).await?,
    ))
}

/// The job's view once it has ended or `wait` seconds have passed, whichever is first.
async fn wait_for_job(driver: &Driver, id: &JobId, wait: Option<f64>) -> ApiResult<JobView> {
    let wait = wait
        .filter(|w| w.is_finite() && *w > 0.0)
        .map(|w| Duration::from_secs_f64(w).min(MAX_WAIT));
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

/// Kills a job: its pending tasks never start, its running ones are interrupted at the
/// executor's next epoch tick. Killing a job that is already over changes nothing.
async fn kill_job(
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

#[derive(Deserialize)]
struct PageQuery {
    limit: Option<usize>,
    after: Option<String>,
}

async fn list_jobs(
    State(driver): State<Arc<Driver>>,
    Query(page): Query<PageQuery>,
) -> axum::Json<List<JobView>> {
    let limit = page.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE);
    axum::Json(driver.read(|s| {
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
    }))
}

async fn list_tasks(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
    Query(page): Query<PageQuery>,
) -> ApiResult<axum::Json<List<TaskView>>> {
    let limit = page.limit.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
    let first = match page.after.as_deref() {
        Some(after) => {
            after.parse::<usize>().map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_query",
                    "`after` is a task index",
                )
            })? + 1
        }
        None => 0,
    };
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

async fn get_result(
    State(driver): State<Arc<Driver>>,
    Path((id, index)): Path<(String, u32)>,
) -> ApiResult<Response> {
    let id = JobId(id);
    let bytes = driver.read(|s| {
        let task = find_task(s, &id, index)?;
        match (&task.result, task.state) {
            (Some(bytes), TaskState::Succeeded) => Ok(bytes.clone()),
            (_, state) => Err(ApiError::new(
                StatusCode::CONFLICT,
                "no_result",
                format!(
                    "task {index} of {id} is {} and has no result",
                    state_name(state)
                ),
            )),
        }
    })?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from(bytes),
    )
        .into_response())
}

async fn get_log(
    State(driver): State<Arc<Driver>>,
    Path((id, index)): Path<(String, u32)>,
) -> ApiResult<Response> {
    let id = JobId(id);
    let log = driver.read(|s| find_task(s, &id, index).map(|t| t.log.clone()))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], log).into_response())
}

async fn list_executors(State(driver): State<Arc<Driver>>) -> axum::Json<List<ExecutorView>> {
    let now = Instant::now();
    axum::Json(driver.read(|s| {
        List {
            items: s
                .executors
                .iter()
                .map(|(id, e)| ExecutorView {
                    id: id.clone(),
                    host: e.host.clone(),
                    state: e.state,
                    cores: e.cores,
                    free_cores: e.free_cores,
                    running: e.running.len() as u32,
                    generation: e.generation,
                    last_heartbeat_ms: Some(
                        now.saturating_duration_since(e.last_heartbeat).as_millis() as u64,
                    ),
                    pid: e.pid,
                    exit_code: e.exit_code,
                    tasks_finished: e.tasks_finished,
                    meters_fuel: e.meters_fuel,
                    modules_compiled: e.reported.modules_compiled,
                    module_cache_hits: e.reported.module_cache_hits,
                    excluded_for_ms: e
                        .health
                        .excluded_until
                        .filter(|until| *until > now)
                        .map(|until| (until - now).as_millis() as u64),
                    recent_task_failures: e.health.recent_failures(&s.config.exclusion, now) as u32,
                })
                .collect(),
            next: None,
        }
    }))
}

fn find_task<'s>(s: &'s ClusterState, id: &JobId, index: u32) -> ApiResult<&'s crate::state::Task> {
    let job = s
        .jobs
        .get(id)
        .ok_or_else(|| ApiError::not_found("job", format!("no job {id}")))?;
    job.tasks
        .get(index as usize)
        .ok_or_else(|| ApiError::not_found("task", format!("job {id} has no task {index}")))
}

fn job_view(job: &Job) -> JobView {
    JobView {
        id: job.def.id.clone(),
        name: job.def.name.clone(),
        state: job.state,
        created_at: humantime::format_rfc3339_millis(
            SystemTime::UNIX_EPOCH + Duration::from_millis(job.def.created_at_ms),
        )
        .to_string(),
        finished_at: job
            .finished_at
            .map(|t| humantime::format_rfc3339_millis(t).to_string()),
        tasks: job.tasks.len() as u32,
        counts: job.counts(),
        error: job.error.as_ref().map(|(kind, message)| ErrorBody {
            kind: kind.clone(),
            message: message.clone(),
        }),
    }
}

fn task_view(job: &Job, index: usize) -> TaskView {
    let task = &job.tasks[index];
    let micros = |us: u64| {
        humantime::format_rfc3339_micros(SystemTime::UNIX_EPOCH + Duration::from_micros(us))
            .to_string()
    };
    TaskView {
        index: index as u32,
        state: task.state,
        attempts: task.attempts,
        executor: task.executor.clone(),
        exit_code: task.failure.as_ref().and_then(|f| f.exit_code),
        error: task
            .failure
            .as_ref()
            .filter(|_| task.state != TaskState::Succeeded)
            .map(|f| ErrorBody {
                kind: f.kind.as_str().to_owned(),
                message: f.message.clone(),
            }),
        result: task
            .result
            .as_ref()
            .zip(task.result_digest)
            .map(|(bytes, digest)| ResultInfo {
                size: bytes.len() as u64,
                sha256: digest.hex(),
            }),
        started_at: task.started_at_us.map(micros),
        finished_at: task.finished_at_us.map(micros),
    }
}

fn state_name(state: TaskState) -> &'static str {
    match state {
        TaskState::Pending => "pending",
        TaskState::Running => "running",
        TaskState::Succeeded => "succeeded",
        TaskState::Failed => "failed",
        TaskState::Killed => "killed",
    }
}
