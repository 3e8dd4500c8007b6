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
fn status_of(code: ErrorCode) -> StatusCode {
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

    /// The `.rs` files under `dir`, tests' files left out.
    fn sources(dir: &std::path::Path, into: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, into);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !path.to_string_lossy().ends_with("tests.rs")
            {
                into.push(path);
            }
        }
    }

    /// What the layers that answer requests may write of a status: the successes. An
    /// error's status is its code's, so a 4xx or 5xx, or a kind spelled as a string,
    /// anywhere else would be a second place deciding it.
    #[test]
    fn no_layer_writes_an_error_status_or_a_kind_outside_the_enum() {
        const SUCCESSES: [&str; 4] = ["OK", "CREATED", "ACCEPTED", "NO_CONTENT"];
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        for layer in ["http", "service", "admission", "store", "views"] {
            let path = src.join(layer);
            match path.is_dir() {
                true => sources(&path, &mut files),
                false => files.push(path.with_extension("rs")),
            }
        }
        let kinds: Vec<String> = ErrorCode::ALL.iter().map(|c| format!("\"{c}\"")).collect();
        let mut found = Vec::new();
        for path in files.iter().filter(|p| !p.ends_with("http/error.rs")) {
            let text = std::fs::read_to_string(path).unwrap();
            // A file's unit tests come last, and may check statuses.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (n, line) in code.lines().enumerate() {
                let statuses = line.split("StatusCode::").skip(1).map(|rest| {
                    let end = rest.find(|c: char| !(c.is_ascii_uppercase() || c == '_'));
                    &rest[..end.unwrap_or(rest.len())]
                });
                let bad_status = statuses.into_iter().any(|name| !SUCCESSES.contains(&name));
                let kind = kinds.iter().find(|k| line.contains(k.as_str()));
                if bad_status || kind.is_some() {
                    found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(found.is_empty(), "{}", found.join("\n"));
        assert!(files.len() > 30, "{} files", files.len());
    }
}
