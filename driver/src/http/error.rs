//! The one error type of the HTTP API: a status, a kind callers can branch on, and a
//! message that says what was wrong, as `{"error": {"kind", "message"}}`. Every
//! mapping from a lower layer's error to a status is here.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use flint_protocol::api::{ErrorBody, ErrorResponse};

use crate::admission::{INVALID_JSON, Rejection, STORAGE};
use crate::service::tenancy::QUOTA_EXCEEDED;
use crate::service::{DeleteError, SubmitError};
use crate::store::StoreError;
use crate::store::blobs::ModuleError;
use crate::store::blocks::BlockError;

/// Every error the API returns: a status, a kind callers can branch on, and a message
/// that says what was wrong.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) kind: &'static str,
    pub(crate) message: String,
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

    pub(crate) fn not_found(what: &'static str, message: impl Into<String>) -> Self {
        let kind = match what {
            "job" => "job_not_found",
            "task" => "task_not_found",
            "module" => "module_not_found",
            "file" => "file_not_found",
            "block" => "block_not_found",
            "attempt" => "attempt_not_found",
            _ => "not_found",
        };
        Self::new(StatusCode::NOT_FOUND, kind, message)
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// 507: the data dir is at its quota or the disk is full; nothing was stored.
    pub(crate) fn storage_full(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INSUFFICIENT_STORAGE, "storage_full", message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub(crate) fn query(rejection: QueryRejection) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_query", rejection.body_text())
    }

    pub(crate) fn path(rejection: PathRejection) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_path", rejection.body_text())
    }
}

/// A spec admission refused: 400 when it is not JSON at all, 500 when the job store
/// could not be read, else 422.
impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        let status = match r.kind {
            INVALID_JSON => StatusCode::BAD_REQUEST,
            STORAGE => StatusCode::INTERNAL_SERVER_ERROR,
            QUOTA_EXCEEDED => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        ApiError::new(status, r.kind, r.message)
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

/// Upload errors: the module's fault (422), the quota or a full disk (507), or the
/// driver's disk otherwise (500).
impl From<ModuleError> for ApiError {
    fn from(e: ModuleError) -> Self {
        match e {
            ModuleError::Invalid(why) => ApiError::invalid("invalid_module", why),
            e @ ModuleError::OverQuota { .. } => ApiError::storage_full(e.to_string()),
            e if e.is_disk_full() => ApiError::storage_full(format!("the disk is full: {e}")),
            e @ ModuleError::Io { .. } => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage", e.to_string())
            }
        }
    }
}

/// Block store errors: a bad id or body (4xx), a missing block (404), a full disk
/// (507), the store otherwise (500).
impl From<BlockError> for ApiError {
    fn from(e: BlockError) -> Self {
        match e {
            e if e.is_disk_full() => ApiError::storage_full(e.to_string()),
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
}

/// A submission that made no job: refused by admission (400 or 422), by the quota or a
/// full disk (507), not stored otherwise (503), or its idempotency key taken by another
/// spec (422).
impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Rejected(rejection) => rejection.into(),
            e @ SubmitError::OverQuota(_) => ApiError::storage_full(e.to_string()),
            SubmitError::Storage(e @ StoreError::Full(_)) => {
                ApiError::storage_full(format!("job not accepted: {e}"))
            }
            SubmitError::Storage(e) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage",
                format!("job not accepted: {e}"),
            ),
            e @ SubmitError::Conflict { .. } => {
                ApiError::invalid("idempotency_conflict", e.to_string())
            }
        }
    }
}

/// A handler's result.
pub type ApiResult<T> = Result<T, ApiError>;

/// The job store failing a read or a delete: the disk (507 when it is full) or the
/// store itself (500).
impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let status = match e.is_storage_full() {
            true => StatusCode::INSUFFICIENT_STORAGE,
            false => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let kind = match e.is_storage_full() {
            true => "storage_full",
            false => "storage",
        };
        ApiError::new(status, kind, e.to_string())
    }
}

/// A deletion refused (404, 409) or failed (500, 507).
impl From<DeleteError> for ApiError {
    fn from(e: DeleteError) -> Self {
        match e {
            DeleteError::NotFound(_) => ApiError::not_found("job", e.to_string()),
            DeleteError::Running(_) => {
                ApiError::new(StatusCode::CONFLICT, "job_running", e.to_string())
            }
            DeleteError::InUse { .. } => {
                ApiError::new(StatusCode::CONFLICT, "job_in_use", e.to_string())
            }
            DeleteError::Store(e) => e.into(),
            e @ DeleteError::Blocks { .. } => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage", e.to_string())
            }
        }
    }
}
