//! Outbound HTTP from a task: [`get`], [`post`], [`request`], and [`send`] for a request
//! whose response is taken later.
//!
//! Every request is judged by the executor, not by this crate: the operator's, the
//! tenant's and the job's allow-lists (`"network": {"allow": [...]}` in the job spec),
//! and the task's `resources.egress` limits. A refusal is an [`Error`] the task can
//! handle; it does not fail the task by itself.
//!
//! ```no_run
//! use flint_sdk::http;
//!
//! let response = http::get("https://api.example.com/v1/items/7")?;
//! if response.is_success() {
//!     println!("{}", response.text().unwrap_or("<binary>"));
//! }
//! let created = http::request(
//!     http::Request::post("https://api.example.com/v1/items", br#"{"name":"x"}"#.to_vec())
//!         .with_header("content-type", "application/json")
//!         .with_timeout(std::time::Duration::from_secs(5)),
//! )?;
//! assert_eq!(created.status, 201);
//! # Ok::<(), http::Error>(())
//! ```
//!
//! # Per target
//!
//! | target          | goes through                                       |
//! |-----------------|----------------------------------------------------|
//! | `wasm32-wasip1` | the executor's `flint` import module: `http_send`, `http_take`, `http_error` (`p1.rs`) |
//! | `wasm32-wasip2` | `wasi:http/outgoing-handler` (`p2.rs`): a component imports WASI only |
//! | anything else   | nothing: every call returns [`Error::Unsupported`] |
//!
//! The whole response is held in memory; the executor caps it with the task's
//! `max_bytes`, and a response past that is an [`Error::Limit`], never a cut body.
//!
//! # Invariants
//!
//! Only [`get`] follows redirects, each hop a new request the executor judges in full;
//! [`request`], [`post`] and [`send`] hand a 3xx back as it came. The URL, the
//! location resolution and the ABI's JSON are pure (`url.rs`, `wire.rs`) and tested on
//! the host.

mod url;
// Only a module speaks the `flint` ABI; the host's tests still cover its bytes.
#[cfg(any(
    test,
    all(target_arch = "wasm32", target_os = "wasi", target_env = "p1")
))]
mod wire;

#[cfg(all(target_arch = "wasm32", target_os = "wasi", target_env = "p1"))]
mod p1;
#[cfg(all(target_arch = "wasm32", target_os = "wasi", target_env = "p1"))]
use p1 as backend;

#[cfg(all(target_arch = "wasm32", target_os = "wasi", target_env = "p2"))]
mod p2;
#[cfg(all(target_arch = "wasm32", target_os = "wasi", target_env = "p2"))]
use p2 as backend;

#[cfg(not(all(
    target_arch = "wasm32",
    target_os = "wasi",
    any(target_env = "p1", target_env = "p2")
)))]
mod unsupported;
#[cfg(not(all(
    target_arch = "wasm32",
    target_os = "wasi",
    any(target_env = "p1", target_env = "p2")
)))]
use unsupported as backend;

use std::fmt;
use std::time::Duration;

/// How many redirects [`get`] follows before it gives up, as browsers and curl do.
pub const MAX_REDIRECTS: usize = 10;

/// An outgoing request. The builder methods take and return it by value:
/// `Request::get(url).with_header("accept", "text/plain")`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Any method; `GET`, `POST`, `PUT`, ... as written.
    pub method: String,
    /// An absolute `http://` or `https://` URL.
    pub url: String,
    /// Sent in order, names as given. A `Host` header must name the URL's authority
    /// (the executor refuses any other), and hop-by-hop headers are refused.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// How long the whole request may take, from sending to the last byte of the
    /// body ([`Error::Timeout`] after it). Without one, only the task's own deadline
    /// bounds it.
    pub timeout: Option<Duration>,
}

impl Request {
    pub fn new(method: impl Into<String>, url: impl Into<String>) -> Request {
        Request {
            method: method.into(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: None,
        }
    }

    pub fn get(url: impl Into<String>) -> Request {
        Request::new("GET", url)
    }

    pub fn post(url: impl Into<String>, body: impl Into<Vec<u8>>) -> Request {
        Request::new("POST", url).with_body(body)
    }

    /// Adds a header after the ones already there (a repeated name is sent twice).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Request {
        self.timeout = Some(timeout);
        self
    }
}

/// A response, whole: status, headers in the order the server sent them (names as the
/// executor's client gives them, lowercase over HTTP/1.1), and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The body as UTF-8 text (no charset is looked at).
    pub fn text(&self) -> Result<&str, std::str::Utf8Error> {
        std::str::from_utf8(&self.body)
    }

    /// The body decoded as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// The first value of the header `name`, compared without regard to case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// A 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// A status that [`get`] follows when a `Location` comes with it.
    pub fn is_redirect(&self) -> bool {
        matches!(self.status, 301 | 302 | 303 | 307 | 308)
    }
}

/// Why a request got no response. The message names the method and URL; for a refusal
/// it also names the rule and what would allow it (`network.allow`, `--egress-allow`,
/// the tenant's `egress_allow`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Refused by policy: the URL's scheme, host or port, a header, or the address the
    /// name resolved to. Also every request of a job without `network`.
    Denied(String),
    /// A limit of the task's `resources.egress` (`max_requests`, `max_bytes`,
    /// `max_concurrent`, named in the message), or [`MAX_REDIRECTS`] for [`get`].
    Limit(String),
    /// The request's own [`Request::timeout`] passed.
    Timeout(String),
    /// The connection failed, was reset, or the response was malformed.
    Io(String),
    /// The request could not be made as given (a method, URL or header that does not
    /// parse), or the runtime broke the ABI's promises.
    Invalid(String),
    /// Not running as a wasm32-wasip1 or wasm32-wasip2 guest (on the host, in unit
    /// tests): there is no executor to send through.
    Unsupported,
}

impl Error {
    /// The variant's name, as tests and logs print it: `Denied`, `Limit`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Denied(_) => "Denied",
            Error::Limit(_) => "Limit",
            Error::Timeout(_) => "Timeout",
            Error::Io(_) => "Io",
            Error::Invalid(_) => "Invalid",
            Error::Unsupported => "Unsupported",
        }
    }

    /// What went wrong, without the kind.
    pub fn message(&self) -> &str {
        match self {
            Error::Denied(m)
            | Error::Limit(m)
            | Error::Timeout(m)
            | Error::Io(m)
            | Error::Invalid(m) => m,
            Error::Unsupported => {
                "outbound HTTP needs a wasm32-wasip1 or wasm32-wasip2 task run by Flint"
            }
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            Error::Denied(_) => "request denied",
            Error::Limit(_) => "egress limit reached",
            Error::Timeout(_) => "request timed out",
            Error::Io(_) => "request failed",
            Error::Invalid(_) => "invalid request",
            Error::Unsupported => return f.write_str(self.message()),
        };
        write!(f, "{what}: {}", self.message())
    }
}

impl std::error::Error for Error {}

/// A request under way whose response has not been taken.
///
/// On wasm32-wasip1 [`send`] returns once the whole response is held by the executor
/// (calls are sequential there), and the response counts against `max_concurrent`
/// until taken. On wasm32-wasip2 it returns once the request and its body are sent,
/// and [`Pending::take`] waits for the response. Dropping it discards the response
/// (on wasip1 by taking and freeing it, on wasip2 by aborting the request).
pub struct Pending(backend::Sent);

impl Pending {
    /// Waits for the response (wasip2) and returns it whole.
    pub fn take(self) -> Result<Response, Error> {
        self.0.take()
    }
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

/// Sends `request` without taking its response: several can be under way at once,
/// up to the task's `max_concurrent` (an [`Error::Limit`] past it). Never follows a
/// redirect.
pub fn send(request: Request) -> Result<Pending, Error> {
    backend::send(&request).map(Pending)
}

/// Sends `request` and returns its response. A 3xx comes back as it is: redirects are
/// not followed (a `POST` must not turn into a `GET` behind its caller's back).
pub fn request(request: Request) -> Result<Response, Error> {
    send(request)?.take()
}

/// `GET url`, following up to [`MAX_REDIRECTS`] redirects (a `Location` relative to
/// the URL that answered is resolved against it). Each hop is a new request, judged
/// and counted by the executor like the first.
pub fn get(url: &str) -> Result<Response, Error> {
    follow_redirects(url, request)
}

/// `POST url` with `body`. Not followed if redirected.
pub fn post(url: &str, body: impl Into<Vec<u8>>) -> Result<Response, Error> {
    request(Request::post(url, body))
}

/// [`get`]'s loop, over any way of sending, so the host's tests can play the server.
fn follow_redirects(
    url: &str,
    mut fetch: impl FnMut(Request) -> Result<Response, Error>,
) -> Result<Response, Error> {
    let mut url = url.to_owned();
    for _ in 0..=MAX_REDIRECTS {
        let response = fetch(Request::get(url.as_str()))?;
        let location = match response.header("location") {
            Some(location) if response.is_redirect() => location,
            _ => return Ok(response),
        };
        url = url::resolve(&url, location).map_err(|e| {
            Error::Invalid(format!(
                "GET {url}: {} redirects to {location:?}: {e}",
                response.status
            ))
        })?;
    }
    Err(Error::Limit(format!(
        "GET {url}: still redirected after {MAX_REDIRECTS} redirects (flint_sdk::http::get follows \
         no more; http::request hands each 3xx back)"
    )))
}

#[cfg(test)]
mod tests;
