//! The one error type of the HTTP API: an [`ErrorCode`] and a message that says what
//! was wrong, answered as `{"error": {"kind", "message"}}` with the code's status. The
//! status is the code's alone ([`ErrorCode::http_status`]); a lower layer's error
//! becomes an `ApiError` through its [`CodedError`] impl, beside the error itself.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use flint_protocol::api::{CodedError, ErrorCode, ErrorResponse};

/// Every error the API returns: a code callers can branch on, and a message that says
/// what was wrong.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
}

/// A handler's result.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }

    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The kind on the wire.
    pub fn kind(&self) -> &'static str {
        self.code.as_str()
    }

    pub fn status(&self) -> StatusCode {
        status_of(self.code)
    }

    pub(crate) fn query(rejection: QueryRejection) -> Self {
        Self::new(ErrorCode::BadQuery, rejection.body_text())
    }

    pub(crate) fn path(rejection: PathRejection) -> Self {
        Self::new(ErrorCode::BadPath, rejection.body_text())
    }
}

/// The status every answer of `code` gets.
pub fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.http_status()).expect("an ErrorCode's status is a valid status")
}

impl<E: CodedError> From<E> for ApiError {
    fn from(e: E) -> Self {
        ApiError::new(e.code(), e.message())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(kind = self.kind(), message = %self.message, "request failed");
        }
        let code = self.code;
        let body = ErrorResponse::new(code, self.message);
        let mut response = (status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        match code {
            ErrorCode::Unauthorized => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    "Bearer".parse().expect("a valid header"),
                );
            }
            ErrorCode::Overloaded => {
                headers.insert(
                    header::RETRY_AFTER,
                    flint_protocol::defaults::RETRY_AFTER_SECS.into(),
                );
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_answers_its_status_and_kind_with_its_headers() {
        for &code in ErrorCode::ALL {
            let response = ApiError::new(code, "why").into_response();
            assert_eq!(response.status().as_u16(), code.http_status(), "{code}");
            assert_eq!(
                response.headers().contains_key(header::RETRY_AFTER),
                code == ErrorCode::Overloaded,
                "{code}"
            );
            assert_eq!(
                response.headers().contains_key(header::WWW_AUTHENTICATE),
                code == ErrorCode::Unauthorized,
                "{code}"
            );
        }
    }
}
