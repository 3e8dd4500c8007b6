//! wasm32-wasip2: `wasi:http/outgoing-handler` through the `wasip2` crate. A component
//! imports WASI only (componentizing a module knows nothing of a `flint` import module),
//! and the executor judges and counts these requests in its wasi-http hooks.
//!
//! wasi-http reports errors as an `error-code` without the executor's message, so a
//! message here names the method, URL and code (`HttpRequestDenied`), not the rule.

use std::time::Duration;

use wasip2::clocks::monotonic_clock;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, HeaderError, IncomingBody, IncomingResponse, Method,
    OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::error::Error as IoError;
use wasip2::io::poll::{self, Pollable};
use wasip2::io::streams::StreamError;

use super::url;
use super::{Error, Request, Response};

/// How much one read of a response body asks for.
const READ_CHUNK: u64 = 64 * 1024;

pub(crate) struct Sent {
    response: FutureIncomingResponse,
    deadline: Option<Deadline>,
    what: String,
}

/// The request's own timeout, as an instant of the monotonic clock.
#[derive(Clone, Copy)]
struct Deadline {
    at: monotonic_clock::Instant,
    timeout: Duration,
}

pub(crate) fn send(request: &Request) -> Result<Sent, Error> {
    let what = format!("{} {}", request.method, request.url);
    let deadline = request.timeout.map(|timeout| Deadline {
        at: monotonic_clock::now().saturating_add(nanos(timeout)),
        timeout,
    });
    let parts = url::split(&request.url).map_err(|e| Error::Invalid(format!("{what}: {e}")))?;
    let outgoing = OutgoingRequest::new(fields(&what, request)?);
    let invalid = |part: &str| Error::Invalid(format!("{what}: the {part} is not valid"));
    outgoing
        .set_method(&method(&request.method))
        .map_err(|()| invalid("method"))?;
    outgoing
        .set_scheme(Some(&scheme(parts.scheme)))
        .map_err(|()| invalid("scheme"))?;
    outgoing
        .set_authority(Some(parts.authority))
        .map_err(|()| invalid("authority"))?;
    outgoing
        .set_path_with_query(Some(parts.path_and_query))
        .map_err(|()| invalid("path or query"))?;
    // A request whose body is never taken goes out with an empty one of known length;
    // a taken body is a stream, which the host may send chunked, even for a GET.
    let body = (!request.body.is_empty())
        .then(|| outgoing.body().expect("a new request's body is taken once"));
    let options = request.timeout.map(options);
    let response =
        outgoing_handler::handle(outgoing, options).map_err(|code| from_code(&what, code))?;
    if let Some(body) = body {
        // Written after `handle`: the host reads the body while sending, so one larger
        // than the host's buffer would never drain if written before.
        write_body(body, &request.body, deadline);
    }
    Ok(Sent {
        response,
        deadline,
        what,
    })
}

impl Sent {
    pub(crate) fn take(self) -> Result<Response, Error> {
        let what = &self.what;
        wait(&self.response.subscribe(), self.deadline, what)?;
        let response = match self.response.get() {
            Some(Ok(Ok(response))) => response,
            Some(Ok(Err(code))) => return Err(from_code(what, code)),
            Some(Err(())) | None => {
                return Err(Error::Invalid(format!(
                    "{what}: the host's response future was ready but held nothing"
                )));
            }
        };
        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
            .collect();
        let body = read_body(what, &response, self.deadline)?;
        Ok(Response {
            status,
            headers,
            body,
        })
    }
}

/// The request's headers, plus a `content-length` for a body, or for a method that has
/// one even when it is empty, so that the server sees a length rather than a chunked
/// body, as for a module's requests.
fn fields(what: &str, request: &Request) -> Result<Fields, Error> {
    let mut entries: Vec<(String, Vec<u8>)> = request
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), value.clone().into_bytes()))
        .collect();
    let carries_body = !request.body.is_empty()
        || ["POST", "PUT", "PATCH"]
            .iter()
            .any(|m| m.eq_ignore_ascii_case(&request.method));
    let has_length = entries
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-length"));
    if carries_body && !has_length {
        entries.push((
            "content-length".into(),
            request.body.len().to_string().into_bytes(),
        ));
    }
    Fields::from_list(&entries).map_err(|e| match e {
        HeaderError::Forbidden => Error::Denied(format!(
            "{what}: the host forbids one of the headers {:?}",
            header_names(request)
        )),
        HeaderError::InvalidSyntax | HeaderError::Immutable => Error::Invalid(format!(
            "{what}: a header name or value is not valid: {:?}",
            header_names(request)
        )),
    })
}

fn header_names(request: &Request) -> Vec<&str> {
    request.headers.iter().map(|(n, _)| n.as_str()).collect()
}

fn method(method: &str) -> Method {
    match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "CONNECT" => Method::Connect,
        "OPTIONS" => Method::Options,
        "TRACE" => Method::Trace,
        "PATCH" => Method::Patch,
        // Methods are case-sensitive (RFC 9110): `get` is some other method.
        other => Method::Other(other.to_owned()),
    }
}

fn scheme(scheme: &str) -> Scheme {
    if scheme.eq_ignore_ascii_case("http") {
        Scheme::Http
    } else if scheme.eq_ignore_ascii_case("https") {
        Scheme::Https
    } else {
        Scheme::Other(scheme.to_owned())
    }
}

fn options(timeout: Duration) -> RequestOptions {
    let options = RequestOptions::new();
    let timeout = Some(nanos(timeout));
    // A host that supports none of them still stops at the guest's own deadline.
    let _ = options.set_connect_timeout(timeout);
    let _ = options.set_first_byte_timeout(timeout);
    let _ = options.set_between_bytes_timeout(timeout);
    options
}

/// Writes `bytes` and finishes the body. Nothing here fails on its own: a body the
/// host stops taking (it refused the request, the server answered early, the
/// connection broke) is left unfinished, so the host aborts the request if it has not
/// answered, and the response, taken next, says what happened (a passed deadline too).
/// The host may close the stream as soon as the response is in, so a closed stream
/// after the last byte still finishes the body.
fn write_body(body: OutgoingBody, bytes: &[u8], deadline: Option<Deadline>) {
    let written = {
        let stream = body.write().expect("a body's stream is taken once");
        let ready = stream.subscribe();
        let mut rest = bytes;
        while !rest.is_empty() && ready_by(&ready, deadline) {
            let Ok(room) = stream.check_write() else {
                break;
            };
            let n = usize::try_from(room).map_or(rest.len(), |room| room.min(rest.len()));
            let (now, later) = rest.split_at(n);
            if stream.write(now).is_err() {
                break;
            }
            rest = later;
        }
        if rest.is_empty() && stream.flush().is_ok() && ready_by(&ready, deadline) {
            let _ = stream.check_write();
        }
        // The pollable and the stream are children of the body: they go first.
        rest.is_empty()
    };
    if written {
        let _ = OutgoingBody::finish(body, None);
    }
}

fn read_body(
    what: &str,
    response: &IncomingResponse,
    deadline: Option<Deadline>,
) -> Result<Vec<u8>, Error> {
    let body = response
        .consume()
        .expect("a response's body is consumed once");
    let mut bytes = Vec::new();
    {
        let stream = body.stream().expect("a body's stream is taken once");
        let ready = stream.subscribe();
        loop {
            wait(&ready, deadline, what)?;
            match stream.read(READ_CHUNK) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => return Err(read_error(what, e)),
            }
        }
    }
    // Trailers are not part of a Response; dropping their future discards them.
    drop(IncomingBody::finish(body));
    Ok(bytes)
}

/// Blocks until `pollable` is ready, or fails when the request's deadline passes first.
fn wait(pollable: &Pollable, deadline: Option<Deadline>, what: &str) -> Result<(), Error> {
    if ready_by(pollable, deadline) {
        return Ok(());
    }
    let timeout = deadline.map_or(0, |deadline| deadline.timeout.as_millis());
    Err(Error::Timeout(format!(
        "{what}: no complete response within the request's timeout of {timeout} ms"
    )))
}

/// Blocks until `pollable` is ready (true) or the deadline passes (false).
fn ready_by(pollable: &Pollable, deadline: Option<Deadline>) -> bool {
    let Some(deadline) = deadline else {
        pollable.block();
        return true;
    };
    let timer = monotonic_clock::subscribe_instant(deadline.at);
    poll::poll(&[pollable, &timer]).contains(&0)
}

/// A failed read of the response body: wasi-http's code for it if the host gave one.
fn read_error(what: &str, e: IoError) -> Error {
    match wasip2::http::types::http_error_code(&e) {
        Some(code) => from_code(what, code),
        None => Error::Io(format!("{what}: {}", e.to_debug_string())),
    }
}

/// wasi-http's error codes in the SDK's kinds. The executor reports a refusal as
/// `HTTP-request-denied` (`destination-IP-prohibited` for an address refused at
/// connect), and a limit as a size or connection limit.
fn from_code(what: &str, code: ErrorCode) -> Error {
    let message = match &code {
        ErrorCode::InternalError(Some(message)) => format!("{what}: {message}"),
        other => {
            let code = format!("{other:?}");
            format!("{what}: {}", code.trim_start_matches("ErrorCode::"))
        }
    };
    match code {
        ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited => Error::Denied(message),
        ErrorCode::ConnectionLimitReached
        | ErrorCode::HttpRequestBodySize(_)
        | ErrorCode::HttpRequestHeaderSectionSize(_)
        | ErrorCode::HttpRequestHeaderSize(_)
        | ErrorCode::HttpResponseBodySize(_)
        | ErrorCode::HttpResponseHeaderSectionSize(_)
        | ErrorCode::HttpResponseHeaderSize(_) => Error::Limit(message),
        ErrorCode::DnsTimeout
        | ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout => Error::Timeout(message),
        ErrorCode::HttpRequestMethodInvalid
        | ErrorCode::HttpRequestUriInvalid
        | ErrorCode::HttpRequestUriTooLong => Error::Invalid(message),
        _ => Error::Io(message),
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
