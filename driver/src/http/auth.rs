//! Who may talk to the driver: a bearer token for the HTTP API and a cluster secret for
//! executors (their hello, and their module and file downloads).
//!
//! Both are optional here; the binary refuses to listen beyond loopback without them
//! unless told `--insecure`. Secrets are compared in constant time. The web UI's page is
//! open (it holds no cluster data; it asks the user for the token and sends it on every
//! request it makes), so a browser can reach it on a secured driver.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use subtle::ConstantTimeEq;

use flint_protocol::api::ErrorCode;

use super::error::ApiError;
use crate::tenants::{Caller, Registry};

/// The secrets a driver checks; `None` leaves that door open.
#[derive(Clone, Default)]
pub struct Credentials {
    /// Bearer token for every API route but the open ones: the admin's.
    pub api_token: Option<String>,
    /// Executors' secret: in their hello, and as a bearer token on module and file
    /// downloads.
    pub cluster_secret: Option<String>,
    /// Tenants' tokens (`--tenants`), when the driver has them.
    pub tenants: Option<std::sync::Arc<Registry>>,
}

/// Routes anyone may call: liveness, the API's own description, the web UI's static
/// page and `/`, which only redirects to it. Matched exactly: `/ui/...` or `/healthz/x`
/// still need the token.
pub(crate) const OPEN_PATHS: &[&str] = &["/healthz", "/v1/openapi.json", "/ui", "/"];

fn is_open(path: &str) -> bool {
    OPEN_PATHS.contains(&path)
}

/// Routes executors call with the cluster secret: downloads of what jobs use, and of the
/// earlier results tasks read as input.
pub(crate) fn executors_read(method: &Method, path: &str) -> bool {
    let download = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
    };
    // Blocks are `<job>/<name>`: executors upload large results and read earlier ones.
    let block = path
        .strip_prefix("/v1/blocks/")
        .is_some_and(|id| id.split('/').count() == 2 && id.split('/').all(|p| !p.is_empty()));
    // Earlier results that `results` inputs name: `/v1/jobs/<job>/tasks/<n>/result`.
    let result = path
        .strip_prefix("/v1/jobs/")
        .and_then(|rest| rest.strip_suffix("/result"))
        .and_then(|rest| rest.split_once("/tasks/"))
        .is_some_and(|(job, task)| {
            !job.is_empty() && !job.contains('/') && task.parse::<u32>().is_ok()
        });
    (*method == Method::GET
        && (download("/v1/modules/") || download("/v1/files/") || block || result))
        || (*method == Method::PUT && block)
}

impl Credentials {
    /// Who is calling, if a request to `path` with these headers may go on at all.
    pub fn check(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<Caller, ApiError> {
        if self.api_token.is_none() && self.tenants.is_none() {
            return Ok(Caller::Admin);
        }
        // `/` only redirects a browser's GET to the UI; anything else there is asked
        // for the token like the rest of the API.
        if is_open(path) && (path != "/" || *method == Method::GET) {
            return Ok(Caller::Admin);
        }
        let Some(given) = bearer(headers) else {
            return Err(ApiError::new(
                ErrorCode::Unauthorized,
                "this driver needs a bearer token: send `Authorization: Bearer <token>` (the CLI reads --token or FLINT_TOKEN)",
            ));
        };
        if let Some(token) = &self.api_token
            && same_secret(token, given)
        {
            return Ok(Caller::Admin);
        }
        if let Some(tenant) = self.tenants.as_ref().and_then(|t| t.get().identify(given)) {
            return Ok(Caller::Tenant(tenant));
        }
        if let Some(secret) = &self.cluster_secret
            && executors_read(method, path)
            && same_secret(secret, given)
        {
            return Ok(Caller::Executor);
        }
        Err(ApiError::new(ErrorCode::Unauthorized, "wrong bearer token"))
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// What the middleware in front of every route holds.
#[derive(Clone)]
pub struct Guard {
    pub credentials: std::sync::Arc<Credentials>,
    pub driver: std::sync::Arc<crate::service::Driver>,
}

/// The middleware in front of every route: who is calling (put in the request for the
/// handlers), and whether that caller may reach what the path names at all.
pub async fn require(State(guard): State<Guard>, mut request: Request, next: Next) -> Response {
    let caller =
        match guard
            .credentials
            .check(request.method(), request.uri().path(), request.headers())
        {
            Ok(caller) => caller,
            Err(e) => return e.into_response(),
        };
    if let Err(e) =
        super::access::gate(&guard.driver, &caller, request.method(), request.uri()).await
    {
        return e.into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Compares two secrets in time that depends only on their lengths (`subtle`), so a
/// caller cannot learn a secret byte by byte from how long refusals take.
fn same_secret(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        headers
    }

    #[test]
    fn token_guards_the_api_and_the_secret_only_downloads() {
        let credentials = Credentials {
            api_token: Some("tok".into()),
            cluster_secret: Some("sec".into()),
            tenants: None,
        };
        let get = Method::GET;
        let none = HeaderMap::new();
        assert!(credentials.check(&get, "/healthz", &none).is_ok());
        assert!(credentials.check(&get, "/v1/openapi.json", &none).is_ok());
        assert!(credentials.check(&get, "/ui", &none).is_ok());
        assert!(credentials.check(&get, "/ui/", &none).is_err());
        // `/` is open only to the browser's GET that it redirects.
        assert!(credentials.check(&get, "/", &none).is_ok());
        assert!(credentials.check(&Method::POST, "/", &none).is_err());
        assert!(credentials.check(&get, "/ui/x", &none).is_err());
        assert!(credentials.check(&get, "/v1/jobs", &none).is_err());
        assert!(
            credentials
                .check(&get, "/v1/jobs", &with_bearer("tok"))
                .is_ok()
        );
        assert!(
            credentials
                .check(&get, "/v1/jobs", &with_bearer("tok2"))
                .is_err()
        );
        assert!(
            credentials
                .check(&get, "/v1/jobs", &with_bearer("sec"))
                .is_err()
        );
        let module = "/v1/modules/sha256:00";
        assert!(credentials.check(&get, module, &with_bearer("sec")).is_ok());
        assert!(credentials.check(&get, module, &with_bearer("tok")).is_ok());
        assert!(credentials.check(&get, module, &none).is_err());
        assert!(
            credentials
                .check(&get, "/v1/files/x", &with_bearer("sec"))
                .is_ok()
        );
        assert!(
            credentials
                .check(&Method::PUT, "/v1/modules", &with_bearer("sec"))
                .is_err()
        );
        // Executors read earlier results (for `results` inputs), but nothing else of a job.
        let result = "/v1/jobs/job-1/tasks/3/result";
        assert!(credentials.check(&get, result, &with_bearer("sec")).is_ok());
        assert!(credentials.check(&get, result, &none).is_err());
        for other in [
            "/v1/jobs/job-1/tasks/3/log",
            "/v1/jobs/job-1/tasks",
            "/v1/jobs/job-1/tasks/x/result",
            "/v1/jobs/a/b/tasks/3/result",
        ] {
            assert!(
                credentials.check(&get, other, &with_bearer("sec")).is_err(),
                "{other}"
            );
        }
        assert!(
            credentials
                .check(&Method::POST, "/v1/jobs/job-1/kill", &with_bearer("sec"))
                .is_err()
        );
        let open = Credentials::default();
        assert!(open.check(&get, "/v1/jobs", &none).is_ok());
    }

    #[test]
    fn same_secret_is_equality() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert!(same_secret("", ""));
    }
}
