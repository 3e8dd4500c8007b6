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
    ErrorBody, ErrorResponse, ExecutorView, FileSpec, InputSpec, JobSpec, JobView, List,
    ResultInfo, TaskState, TaskView, Uploaded,
};
use flint_protocol::{
    Digest, FetchRef, FileRef, JobId, ModuleRef, Resources, TaskInput, TaskResult, defaults,
};
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
        // Executors' uploads of large results are streamed, never buffered: the size
        // limit is the job's own max_output_bytes, checked as the bytes arrive.
        .route(
            "/v1/blocks/{job}/{name}",
            put(put_block)
                .get(get_block)
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/ui", get(crate::ui::page))
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
            "block" => "block_not_found",
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
    let storage = |e: std::io::Error| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage", e.to_string())
    };
    // Streamed: a 256 MiB file costs the driver a buffer, not its size.
    let file = tokio::fs::File::open(store.path(&digest))
        .await
        .map_err(storage)?;
    let len = file.metadata().await.map_err(storage)?.len();
    Ok((
        [
            (header::CONTENT_TYPE, content_type.to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(tokio_util::io::ReaderStream::new(file)),
    )
        .into_response())
}

/// An executor's upload of a large result, streamed into the block store. Answers with
/// the size and digest the driver saw, for the executor to compare with its own.
async fn put_block(
    State(driver): State<Arc<Driver>>,
    Path((job, name)): Path<(String, String)>,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<ResultInfo>)> {
    let job_id = JobId(job.clone());
    let max = driver
        .read(|s| {
            s.jobs
                .get(&job_id)
                .map(|j| j.def.resources.max_output_bytes)
        })
        .ok_or_else(|| ApiError::not_found("job", format!("no job {job_id}")))?;
    let id = format!("{job}/{name}");
    let (size, digest) = driver
        .blocks
        .put_stream(&id, body.into_data_stream(), max)
        .await
        .map_err(block_error)?;
    Ok((
        StatusCode::CREATED,
        axum::Json(ResultInfo {
            size,
            sha256: digest.hex(),
        }),
    ))
}

async fn get_block(
    State(driver): State<Arc<Driver>>,
    Path((job, name)): Path<(String, String)>,
) -> ApiResult<Response> {
    stream_block(&driver, &format!("{job}/{name}")).await
}

async fn stream_block(driver: &Driver, id: &str) -> ApiResult<Response> {
    let got = driver.blocks.get(id).await.map_err(block_error)?;
    let len = got.meta.size;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(got.into_stream()),
    )
        .into_response())
}

fn block_error(e: crate::blocks::BlockError) -> ApiError {
    use crate::blocks::BlockError;
    match e {
        BlockError::BadId(_) => ApiError::invalid("invalid_block_id", e.to_string()),
        BlockError::TooLarge { .. } => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "output_limit", e.to_string())
        }
        BlockError::Upload { .. } => {
            ApiError::new(StatusCode::BAD_REQUEST, "bad_body", e.to_string())
        }
        BlockError::Store(object_store::Error::NotFound { .. }) => {
            ApiError::not_found("block", e.to_string())
        }
        BlockError::Store(_) | BlockError::Io(_) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage", e.to_string())
        }
    }
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
        .map(|(name, spec)| file_ref(driver, name, spec))
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
                    input: decode_input(driver, input, &format!("inputs[{i}]"))?,
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
                    Some(input) => decode_input(driver, input, &format!("tasks[{i}].input"))?,
                    None => TaskInput::Inline(Vec::new()),
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
                "resources.max_output_bytes may be at most {}",
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
    let max_result_bytes = spec
        .max_result_bytes
        .unwrap_or(defaults::JOB_MAX_RESULT_BYTES);
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
        max_result_bytes,
        created_at_ms: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    };
    Ok(NewJob { def, tasks })
}

/// A job file: a safe name (it becomes a path under `/files`) and an uploaded file or a
/// URL.
fn file_ref(driver: &Driver, name: &str, spec: &FileSpec) -> ApiResult<FileRef> {
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
    let id = match spec {
        FileSpec::Id(id) => id,
        FileSpec::Url(u) => {
            let at = format!("files.{name}");
            check_url(&u.url, &at)?;
            return Ok(FileRef {
                name: name.to_owned(),
                digest: parse_sha256(u.sha256.as_deref(), &at)?,
                url: u.url.clone(),
                timestamp_ms: driver.url_timestamp(&u.url, u.timestamp_ms),
                size: None,
            });
        }
    };
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
        digest: Some(digest),
        url: format!("{}/v1/files/{digest}", driver.http_base),
        timestamp_ms: info.timestamp_ms,
        size: Some(info.size),
    })
}

/// Only the shape is checked here; whether executors may fetch it is their URL policy's
/// call, made where the fetch happens.
fn check_url(url: &str, at: &str) -> ApiResult<()> {
    match url::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https" | "s3" | "file") => Ok(()),
        Ok(u) => Err(ApiError::invalid(
            "invalid_spec",
            format!(
                "{at}: scheme `{}` is not fetchable (http, https, s3, file)",
                u.scheme()
            ),
        )),
        Err(e) => Err(ApiError::invalid(
            "invalid_spec",
            format!("{at}: `{url}` is not a URL: {e}"),
        )),
    }
}

fn parse_sha256(hex: Option<&str>, at: &str) -> ApiResult<Option<Digest>> {
    hex.map(|h| {
        let h = h.strip_prefix("sha256:").unwrap_or(h);
        format!("sha256:{h}")
            .parse::<Digest>()
            .map_err(|e| ApiError::invalid("invalid_spec", format!("{at}.sha256: {e}")))
    })
    .transpose()
}

fn decode_input(driver: &Driver, input: InputSpec, at: &str) -> ApiResult<TaskInput> {
    match input {
        InputSpec::Text(text) => Ok(TaskInput::Inline(text.into_bytes())),
        InputSpec::Base64(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map(TaskInput::Inline)
            .map_err(|e| ApiError::invalid("invalid_spec", format!("{at}: invalid base64: {e}"))),
        InputSpec::Url { url, sha256 } => {
            check_url(&url, at)?;
            Ok(TaskInput::Fetch(FetchRef {
                digest: parse_sha256(sha256.as_deref(), at)?,
                timestamp_ms: driver.url_timestamp(&url, None),
                url,
            }))
        }
        InputSpec::Result(r) => driver.read(|s| {
            let task = s
                .jobs
                .get(&r.job)
                .and_then(|j| j.tasks.get(r.task as usize))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "unknown_result",
                        format!("{at}: job {} has no task {}", r.job, r.task),
                    )
                })?;
            match (&task.result, task.state) {
                (Some(TaskResult::Inline(bytes)), TaskState::Succeeded) => {
                    Ok(TaskInput::Inline(bytes.clone()))
                }
                (Some(TaskResult::Block(block)), TaskState::Succeeded) => {
                    Ok(TaskInput::Fetch(FetchRef {
                        url: driver.blocks.fetch_url(&block.id),
                        // A block never changes under its id.
                        timestamp_ms: 0,
                        digest: Some(block.digest),
                    }))
                }
                (_, state) => Err(ApiError::invalid(
                    "result_not_ready",
                    format!(
                        "{at}: task {} of {} is {} and has no result yet; submit this job once it has succeeded",
                        r.task,
                        r.job,
                        state_name(state)
                    ),
                )),
            }
        }),
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
    let result = driver.read(|s| {
        let task = find_task(s, &id, index)?;
        match (&task.result, task.state) {
            (Some(result), TaskState::Succeeded) => Ok(result.clone()),
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
    match result {
        TaskResult::Inline(bytes) => Ok((
            [(header::CONTENT_TYPE, "application/octet-stream")],
            Body::from(bytes),
        )
            .into_response()),
        TaskResult::Block(block) => stream_block(&driver, &block.id).await,
    }
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
            .map(|(result, digest)| ResultInfo {
                size: result.len(),
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
