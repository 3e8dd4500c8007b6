//! Uploads and downloads of what jobs use: modules and files (content-addressed, on
//! the driver's disk), and the blocks executors put large results in.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flint_protocol::api::{ErrorCode, ErrorResponse, ResultInfo, Uploaded};
use flint_protocol::{JobId, defaults};

use super::edge;
use super::error::{ApiError, ApiResult};
use crate::service::Driver;
use crate::store::blocks::TAPE_SUFFIX;
use crate::tenants::Caller;

/// Uploads a wasm module: validated, stored by SHA-256; uploading it again is a no-op.
#[utoipa::path(put, path = "/v1/modules", tag = "modules", params(ShareQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the module's bytes (a wasm module or component)"),
    responses(
        (status = 201, description = "stored", body = Uploaded),
        (status = 400, description = "a bad query", body = ErrorResponse),
        (status = 403, description = "`admin_only`: a tenant asked for `?shared=true`", body = ErrorResponse),
        (status = 429, description = "`quota_exceeded`: it would take the tenant past its `max_storage_bytes`", body = ErrorResponse),
        (status = 413, description = "larger than the module limit", body = ErrorResponse),
        (status = 422, description = "not a valid wasm module (`invalid_module`)", body = ErrorResponse),
        (status = 507, description = "`storage_full`: storing it would pass the data dir's quota (`--data-dir-max-bytes`; the message names the limit and what the dir holds), or the driver's disk is full", body = ErrorResponse),
    ))]
pub(super) async fn put_module(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
    share: Result<Query<ShareQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<Uploaded>)> {
    let Query(share) = share.map_err(ApiError::query)?;
    let upload = Upload {
        what: "module",
        limit: defaults::MAX_MODULE_BYTES,
        files: false,
    };
    put_blob(driver, &headers, body, upload, (caller, share.shared)).await
}

/// Who else may use an upload.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ShareQuery {
    /// Every tenant may name it in its jobs and read it (the admin's to give; a
    /// tenant's upload is its own).
    #[serde(default)]
    shared: bool,
}

/// Uploads a file jobs can name in `files`; stored by SHA-256, idempotent.
#[utoipa::path(put, path = "/v1/files", tag = "files", params(ShareQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the file's bytes"),
    responses(
        (status = 201, description = "stored", body = Uploaded),
        (status = 400, description = "a bad query", body = ErrorResponse),
        (status = 403, description = "`admin_only`: a tenant asked for `?shared=true`", body = ErrorResponse),
        (status = 429, description = "`quota_exceeded`: it would take the tenant past its `max_storage_bytes`", body = ErrorResponse),
        (status = 413, description = "larger than the file limit", body = ErrorResponse),
        (status = 507, description = "`storage_full`: storing it would pass the data dir's quota (`--data-dir-max-bytes`; the message names the limit and what the dir holds), or the driver's disk is full", body = ErrorResponse),
    ))]
pub(super) async fn put_file(
    State(driver): State<Arc<Driver>>,
    Extension(caller): Extension<Caller>,
    share: Result<Query<ShareQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<Uploaded>)> {
    let Query(share) = share.map_err(ApiError::query)?;
    let upload = Upload {
        what: "file",
        limit: defaults::MAX_FILE_BYTES,
        files: true,
    };
    put_blob(driver, &headers, body, upload, (caller, share.shared)).await
}

/// What an upload route stores, and its size limit.
pub(super) struct Upload {
    what: &'static str,
    limit: usize,
    files: bool,
}

async fn put_blob(
    driver: Arc<Driver>,
    headers: &HeaderMap,
    body: Body,
    upload: Upload,
    (caller, shared): (Caller, bool),
) -> ApiResult<(StatusCode, axum::Json<Uploaded>)> {
    // On the parsed query (`?shared=%74rue` is `true` too), before any byte is read.
    if shared && caller.tenant().is_some() {
        return Err(ApiError::new(
            ErrorCode::AdminOnly,
            "only the admin shares an upload with every tenant (?shared=true)",
        ));
    }
    // Stop reading an upload as soon as it cannot fit under the quota; the store checks
    // again when it writes, against uploads running beside this one.
    let usage = &driver.uploads.usage;
    let refusal = |adding: u64| {
        ApiError::new(
            ErrorCode::StorageFull,
            format!(
                "the {} is not stored: {}",
                upload.what,
                usage.over_quota(adding)
            ),
        )
    };
    let room = usage.room().map(|bytes| edge::Room {
        bytes,
        refusal: &refusal,
    });
    let body = edge::read_body_within(
        headers,
        body,
        upload.limit,
        room,
        driver.config.edge.body_idle_timeout,
        upload.what,
    )
    .await?;
    let (id, info) = driver.upload(caller, (upload.files, shared), body).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(Uploaded {
            id,
            size: info.size,
        }),
    ))
}

/// A module's bytes. Executors fetch here with the cluster secret as their bearer token.
#[utoipa::path(get, path = "/v1/modules/{id}", tag = "modules",
    params(("id" = String, Path, description = "the module's id, `sha256:<hex>`", pattern = "^sha256:[0-9a-f]{64}$")),
    responses(
        (status = 200, description = "the module", body = Vec<u8>, content_type = "application/wasm"),
        (status = 404, description = "no such module", body = ErrorResponse),
        (status = 422, description = "not a module id", body = ErrorResponse),
    ))]
pub(super) async fn get_module(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    get_blob(&driver, false, &id, "application/wasm").await
}

/// A file's bytes. Executors fetch here with the cluster secret as their bearer token.
#[utoipa::path(get, path = "/v1/files/{id}", tag = "files",
    params(("id" = String, Path, description = "the file's id, `sha256:<hex>`", pattern = "^sha256:[0-9a-f]{64}$")),
    responses(
        (status = 200, description = "the file", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 404, description = "no such file", body = ErrorResponse),
        (status = 422, description = "not a file id", body = ErrorResponse),
    ))]
pub(super) async fn get_file(
    State(driver): State<Arc<Driver>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    get_blob(&driver, true, &id, "application/octet-stream").await
}

async fn get_blob(
    driver: &Driver,
    files: bool,
    id: &str,
    content_type: &'static str,
) -> ApiResult<Response> {
    // Streamed: a 256 MiB file costs the driver a buffer, not its size.
    let (file, len) = driver.open_upload(files, id).await?;
    Ok((
        [
            (header::CONTENT_TYPE, content_type.to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(tokio_util::io::ReaderStream::new(file)),
    )
        .into_response())
}

/// An executor's upload of a large result, or of a deterministic attempt's tape of
/// recorded responses (`*.egress`, within the job's `--egress-record-max-bytes`),
/// streamed into the block store. Answers with the size and digest the driver saw, for
/// the executor to compare with its own.
pub(super) async fn put_block(
    State(driver): State<Arc<Driver>>,
    Path((job, name)): Path<(String, String)>,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<ResultInfo>)> {
    let job_id = JobId(job.clone());
    // A job that ended meanwhile still takes its attempts' uploads (they are deleted
    // with it); a deleted one does not.
    let max = driver.existing_job(&job_id, |j| j.def.resources.max_output_bytes)?;
    let id = format!("{job}/{name}");
    let blocks = &driver.uploads.blocks;
    let body = body.into_data_stream();
    let (size, digest) = match name.ends_with(TAPE_SUFFIX) {
        // A deterministic attempt's recorded responses: within the job's cap.
        true => {
            let cap = driver.config.egress_record_max_bytes;
            blocks.put_tape(&id, body, cap).await?
        }
        false => blocks.put_stream(&id, body, max).await?,
    };
    Ok((
        StatusCode::CREATED,
        axum::Json(ResultInfo {
            size,
            sha256: digest.hex(),
        }),
    ))
}

pub(super) async fn get_block(
    State(driver): State<Arc<Driver>>,
    Path((job, name)): Path<(String, String)>,
) -> ApiResult<Response> {
    stream_block(&driver, &format!("{job}/{name}")).await
}

pub(super) async fn stream_block(driver: &Driver, id: &str) -> ApiResult<Response> {
    let (len, stream) = driver.uploads.blocks.get_stream(id).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}
