//! The HTTP API (API.md): routes, request -> state change, and one error type whose
//! mapping to statuses lives in one place.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use base64::Engine as _;
use flint_protocol::api::{
    ErrorBody, ErrorResponse, ExecutorView, FileSpec, InputSpec, JobSpec, JobView, List,
    ResultInfo, TaskState, TaskView, Uploaded,
};
use flint_protocol::{
    Digest, FetchRef, FileRef, JobId, ModuleRef, Resources, TaskInput, TaskResult, defaults,
};
use serde::Deserialize;
use utoipa::{IntoParams, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{self, Credentials};
use crate::edge::{self, RequestLimit};
use crate::guest_env::{self, GuestStringError};
use crate::inputs::{InputBudget, block_fetch, ready_result, results_input};
use crate::modules::{ModuleError, ModuleStore};
use crate::service::Driver;
use crate::state::{ClusterState, Job, JobDef, NewJob, NewTask};

/// Longest `?wait=` honoured, so a client cannot pin a connection forever.
const MAX_WAIT: Duration = Duration::from_secs(300);
/// Default and largest page of a list.
const PAGE: usize = 100;
const MAX_PAGE: usize = 10_000;

/// The routes, their OpenAPI document (built from the handlers' annotations, served at
/// `/v1/openapi.json`), and the edge in front of them: concurrency limit, then auth.
pub fn router(driver: Arc<Driver>) -> Router {
    let (routes, openapi) = OpenApiRouter::with_openapi(crate::openapi::ApiDoc::openapi())
        .routes(routes!(healthz))
        .routes(routes!(crate::metrics::get_metrics))
        .routes(routes!(put_module))
        .routes(routes!(get_module))
        .routes(routes!(put_file))
        .routes(routes!(get_file))
        .routes(routes!(list_jobs, submit_job))
        .routes(routes!(get_job))
        .routes(routes!(kill_job))
        .routes(routes!(crate::events::job_events))
        .routes(routes!(list_tasks))
        .routes(routes!(get_result))
        .routes(routes!(get_log))
        .routes(routes!(list_executors))
        .routes(routes!(crate::executor_logs::get_executor_log))
        .split_for_parts();
    let openapi = crate::openapi::finish(openapi);
    let credentials = Arc::new(Credentials {
        api_token: driver.config.api_token.clone(),
        cluster_secret: driver.config.cluster_secret.clone(),
    });
    let limit = RequestLimit::new(driver.config.edge.max_concurrent_requests);
    routes
        .route(
            "/v1/openapi.json",
            get(move || {
                let openapi = openapi.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], openapi) }
            }),
        )
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
        .layer(from_fn_with_state(credentials, auth::require))
        .layer(from_fn_with_state(limit, edge::limit_concurrency))
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
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(kind: &'static str, message: impl Into<String>) -> Self {
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

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    fn query(rejection: QueryRejection) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_query", rejection.body_text())
    }

    fn path(rejection: PathRejection) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_path", rejection.body_text())
    }
}

impl From<GuestStringError> for ApiError {
    fn from(e: GuestStringError) -> Self {
        ApiError::invalid("invalid_spec", e.to_string())
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
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                "Bearer".parse().expect("a valid header"),
            );
        }
        response
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Liveness: answers while the driver serves requests. Needs no token.
#[utoipa::path(get, path = "/healthz", tag = "driver", security(()),
    responses((status = 200, description = "the driver is up", body = String, content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok\n"
}

/// Uploads a wasm module: validated, stored by SHA-256; uploading it again is a no-op.
#[utoipa::path(put, path = "/v1/modules", tag = "modules",
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the module's bytes (a wasm module or component)"),
    responses(
        (status = 201, description = "stored", body = Uploaded),
        (status = 413, description = "larger than the module limit", body = ErrorResponse),
        (status = 422, description = "not a valid wasm module (`invalid_module`)", body = ErrorResponse),
    ))]
async fn put_module(
    State(driver): State<Arc<Driver>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<Uploaded>)> {
    let upload = Upload {
        what: "module",
        limit: defaults::MAX_MODULE_BYTES,
        store: |d| &d.modules,
    };
    put_blob(driver, &headers, body, upload).await
}

/// Uploads a file jobs can name in `files`; stored by SHA-256, idempotent.
#[utoipa::path(put, path = "/v1/files", tag = "files",
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the file's bytes"),
    responses(
        (status = 201, description = "stored", body = Uploaded),
        (status = 413, description = "larger than the file limit", body = ErrorResponse),
    ))]
async fn put_file(
    State(driver): State<Arc<Driver>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<Uploaded>)> {
    let upload = Upload {
        what: "file",
        limit: defaults::MAX_FILE_BYTES,
        store: |d| &d.files,
    };
    put_blob(driver, &headers, body, upload).await
}

/// What an upload route stores, and its size limit.
struct Upload {
    what: &'static str,
    limit: usize,
    store: fn(&Driver) -> &ModuleStore,
}

async fn put_blob(
    driver: Arc<Driver>,
    headers: &HeaderMap,
    body: Body,
    upload: Upload,
) -> ApiResult<(StatusCode, axum::Json<Uploaded>)> {
    let body = edge::read_body(
        headers,
        body,
        upload.limit,
        driver.config.edge.body_idle_timeout,
        upload.what,
    )
    .await?;
    let store = upload.store;
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

/// A module's bytes. Executors fetch here with the cluster secret as their bearer token.
#[utoipa::path(get, path = "/v1/modules/{id}", tag = "modules",
    params(("id" = String, Path, description = "the module's id, `sha256:<hex>`", pattern = "^sha256:[0-9a-f]{64}$")),
    responses(
        (status = 200, description = "the module", body = Vec<u8>, content_type = "application/wasm"),
        (status = 404, description = "no such module", body = ErrorResponse),
        (status = 422, description = "not a module id", body = ErrorResponse),
    ))]
async fn get_module(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    get_blob(&driver.modules, "module", &id, "application/wasm").await
}

/// A file's bytes. Executors fetch here with the cluster secret as their bearer token.
#[utoipa::path(get, path = "/v1/files/{id}", tag = "files",
    params(("id" = String, Path, description = "the file's id, `sha256:<hex>`", pattern = "^sha256:[0-9a-f]{64}$")),
    responses(
        (status = 200, description = "the file", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 404, description = "no such file", body = ErrorResponse),
        (status = 422, description = "not a file id", body = ErrorResponse),
    ))]
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
    let (len, stream) = driver.blocks.get_stream(id).await.map_err(block_error)?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(stream),
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

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct WaitQuery {
    /// Seconds to wait for the job to end (at most 300) before answering.
    #[param(minimum = 0)]
    wait: Option<f64>,
}

/// Submits a job. It is stored before the answer, so an accepted job survives a driver
/// restart. With `?wait=S` the answer comes when the job ends or S seconds pass.
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", params(WaitQuery),
    request_body = JobSpec,
    responses(
        (status = 202, description = "accepted (and, with `wait`, maybe ended)", body = JobView),
        (status = 400, description = "not JSON (`invalid_json`), or a bad query", body = ErrorResponse),
        (status = 413, description = "larger than the job spec limit", body = ErrorResponse),
        (status = 422, description = "an invalid spec: `invalid_spec`, `unknown_module`, `invalid_module_id`, `unknown_file`, `no_tasks`, `too_many_tasks`, `unschedulable`; for `result` and `results` inputs `unknown_result`, `result_not_ready`, `no_result`, `input_too_large`, `too_many_input_parts`", body = ErrorResponse),
    ))]
async fn submit_job(
    State(driver): State<Arc<Driver>>,
    query: Result<Query<WaitQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<JobView>)> {
    let Query(query) = query.map_err(ApiError::query)?;
    let limit = defaults::MAX_JOB_SPEC_BYTES;
    let body = edge::read_body(
        &headers,
        body,
        limit,
        driver.config.edge.body_idle_timeout,
        "job spec",
    )
    .await?;
    let spec = parse_job_spec(&body)?;
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

/// A job spec from its JSON. Straight into `JobSpec` first: a spec of a million inputs
/// parsed through a `serde_json::Value` cost a map allocation per input, most of the
/// time of accepting it. Only a document that fails is parsed again in two steps, so
/// that every JSON document that parses is judged as a spec (422), never as bad JSON:
/// parsing straight into `JobSpec` reports some shape errors (an input object with two
/// keys) as syntax errors.
fn parse_job_spec(body: &[u8]) -> ApiResult<JobSpec> {
    if let Ok(spec) = serde_json::from_slice::<JobSpec>(body) {
        return Ok(spec);
    }
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("job spec: {e}"),
        )
    })?;
    JobSpec::deserialize(value)
        .map_err(|e| ApiError::invalid("invalid_spec", format!("job spec: {e}")))
}

/// Checks a spec and turns it into a job the scheduler can run.
fn accept(driver: &Driver, spec: JobSpec) -> ApiResult<NewJob> {
    if let Some(name) = &spec.name {
        guest_env::check_name("name", name)?;
    }
    guest_env::check_args("args", &spec.args)?;
    guest_env::check_env("env", &spec.env)?;
    let module = module_ref(driver, &spec)?;
    let files = spec
        .files
        .iter()
        .map(|(name, spec)| file_ref(driver, name, spec))
        .collect::<ApiResult<Vec<FileRef>>>()?;
    let mut budget = InputBudget {
        parts_left: defaults::MAX_INPUT_PARTS_PER_JOB,
        inline_left: defaults::INLINE_INPUT_PART_BYTES,
    };
    let mut decode = |input, at: &str| decode_input(driver, input, at, &mut budget);
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
                    input: decode(input, &format!("inputs[{i}]"))?,
                    args: Vec::new(),
                    env: Vec::new(),
                })
            })
            .collect::<ApiResult<_>>()?,
        (None, Some(tasks)) => tasks
            .into_iter()
            .enumerate()
            .map(|(i, task)| {
                guest_env::check_args(format_args!("tasks[{i}].args"), &task.args)?;
                guest_env::check_env(format_args!("tasks[{i}].env"), &task.env)?;
                let input = match task.input {
                    Some(input) => decode(input, &format!("tasks[{i}].input"))?,
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
        module,
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

/// The job's module: an uploaded one by id, or a URL the executors fetch through their
/// fetch cache and URL policy (cached by (URL, timestamp) like files; its bytes are
/// checked as wasm where they are compiled, so a bad one fails its tasks as
/// `invalid_module`).
fn module_ref(driver: &Driver, spec: &JobSpec) -> ApiResult<ModuleRef> {
    let module = spec.module.as_str();
    if module.starts_with("sha256:") {
        if spec.module_sha256.is_some() || spec.module_timestamp_ms.is_some() {
            return Err(ApiError::invalid(
                "invalid_spec",
                "module_sha256 and module_timestamp_ms are for a module by URL; an uploaded module's id is already its digest",
            ));
        }
        let digest = parse_module_id(module)?;
        let info = driver.modules.get(&digest).ok_or_else(|| {
            ApiError::invalid(
                "unknown_module",
                format!("no module {digest} has been uploaded; PUT it to /v1/modules first"),
            )
        })?;
        return Ok(ModuleRef {
            digest: Some(digest),
            url: format!("{}/v1/modules/{digest}", driver.http_base),
            timestamp_ms: info.timestamp_ms,
            size: Some(info.size),
        });
    }
    if !["http://", "https://", "s3://", "file://"]
        .iter()
        .any(|scheme| module.starts_with(scheme))
    {
        return Err(ApiError::invalid(
            "invalid_module_id",
            format!(
                "module `{module}` is neither an uploaded module's id (`sha256:<hex>`) nor a URL (http://, https://, s3://, file://)"
            ),
        ));
    }
    check_url(module, "module")?;
    Ok(ModuleRef {
        digest: parse_sha256(spec.module_sha256.as_deref(), "module")?,
        url: module.to_owned(),
        timestamp_ms: driver.url_timestamp(module, spec.module_timestamp_ms),
        // Never a size, wherever the URL points (the driver's own routes included): a
        // size marks a module the driver serves, which executors fetch with the cluster
        // secret (`ModuleRef::served_by_driver`).
        size: None,
    })
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
                // Never a size: that marks the driver's own uploads
                // (`FileRef::served_by_driver`), whatever this URL points at.
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

fn decode_input(
    driver: &Driver,
    input: InputSpec,
    at: &str,
    budget: &mut InputBudget,
) -> ApiResult<TaskInput> {
    match input {
        InputSpec::Text(text) => Ok(TaskInput::Inline(text.into_bytes())),
        InputSpec::Base64(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map(TaskInput::Inline)
            .map_err(|e| ApiError::invalid("invalid_spec", format!("{at}: invalid base64: {e}"))),
        InputSpec::Url { url, sha256 } => {
            check_url(&url, at)?;
            Ok(TaskInput::Fetch(Box::new(FetchRef {
                digest: parse_sha256(sha256.as_deref(), at)?,
                timestamp_ms: driver.url_timestamp(&url, None),
                url,
            })))
        }
        InputSpec::Result(r) => driver.read(|s| {
            let job = s.jobs.get(&r.job).ok_or_else(|| {
                ApiError::invalid("unknown_result", format!("{at}: no job {}", r.job))
            })?;
            Ok(match ready_result(job, r.task, at)? {
                TaskResult::Inline(bytes) => TaskInput::Inline(bytes.clone()),
                TaskResult::Block(block) => TaskInput::Fetch(Box::new(block_fetch(driver, block))),
            })
        }),
        InputSpec::Results(r) => driver.read(|s| results_input(driver, s, &r, at, budget)),
    }
}

fn parse_module_id(id: &str) -> ApiResult<Digest> {
    id.parse::<Digest>()
        .map_err(|e| ApiError::invalid("invalid_module_id", e.to_string()))
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
async fn get_job(
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

/// Kills a job: its pending tasks never start, its running ones are interrupted at the
/// executor's next epoch tick. Killing a job that is already over changes nothing.
/// Kills a job: pending tasks never start, running ones stop at the executor's next
/// epoch tick. A job already over is left as it is.
#[utoipa::path(post, path = "/v1/jobs/{id}/kill", tag = "jobs",
    params(("id" = String, Path, description = "the job's id")),
    responses(
        (status = 202, description = "killed (or already over)", body = JobView),
        (status = 404, description = "no such job", body = ErrorResponse),
    ))]
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

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct PageQuery {
    /// Items per page, 1 to 10,000.
    #[param(minimum = 1, maximum = 10_000)]
    limit: Option<u64>,
    /// The `next` cursor of the previous page.
    after: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct TaskPageQuery {
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
async fn list_jobs(
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
async fn list_tasks(
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
async fn get_result(
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

/// A task's log (its stderr), capped at 1 MiB.
#[utoipa::path(get, path = "/v1/jobs/{id}/tasks/{index}/log", tag = "jobs",
    params(("id" = String, Path, description = "the job's id"), ("index" = u32, Path, description = "the task's index")),
    responses(
        (status = 200, description = "the log", body = String, content_type = "text/plain"),
        (status = 400, description = "a bad task index", body = ErrorResponse),
        (status = 404, description = "no such job or task", body = ErrorResponse),
    ))]
async fn get_log(
    State(driver): State<Arc<Driver>>,
    path: Result<Path<(String, u32)>, PathRejection>,
) -> ApiResult<Response> {
    let Path((id, index)) = path.map_err(ApiError::path)?;
    let id = JobId(id);
    let log = driver.read(|s| find_task(s, &id, index).map(|t| t.log.clone()))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], log).into_response())
}

/// The executors: cores, free cores, state, heartbeat age and their own figures.
#[utoipa::path(get, path = "/v1/executors", tag = "executors",
    responses((status = 200, description = "every executor", body = List<ExecutorView>)))]
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
                    compile_cache_hits: e.reported.compile_cache_hits,
                    fetch_hits: e.reported.fetch_hits,
                    fetch_misses: e.reported.fetch_misses,
                    excluded_for_ms: e
                        .health
                        .excluded_until
                        .filter(|until| *until > now)
                        .map(|until| (until - now).as_millis() as u64),
                    recent_task_failures: e.health.recent_failures(&s.config.exclusion, now) as u32,
                    log_url: crate::executor_logs::log_url(&driver, id),
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

pub(crate) fn job_view(job: &Job) -> JobView {
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
        error: task.error_body(),
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

pub(crate) fn job_state_name(state: flint_protocol::api::JobState) -> &'static str {
    use flint_protocol::api::JobState;
    match state {
        JobState::Queued => "queued",
        JobState::Running => "running",
        JobState::Succeeded => "succeeded",
        JobState::Failed => "failed",
        JobState::Killed => "killed",
    }
}

pub(crate) fn state_name(state: TaskState) -> &'static str {
    match state {
        TaskState::Pending => "pending",
        TaskState::Running => "running",
        TaskState::Succeeded => "succeeded",
        TaskState::Failed => "failed",
        TaskState::Killed => "killed",
    }
}

#[cfg(test)]
mod tests;
