//! Outbound HTTP for components: `wasi:http/outgoing-handler`, whose one sender is
//! [`EgressHooks`] (wasmtime-wasi-http is built without `default-send-request`, so no
//! code in the executor connects for a guest on its own). A request takes the path a
//! core module's takes, `prepare`, `Call::run`, `settle` on the attempt's
//! [`EgressCtx`], so it is judged, limited, counted, recorded and replayed the same way;
//! what differs is how it is read and how its end is told.
//!
//! - **What is judged** is the URI wasi-http assembled from the guest's scheme,
//!   `:authority` and path. `Host` is one of wasi-http's forbidden headers and these
//!   hooks add none (`set_host_header`), so the authority is the one place a host comes
//!   from: a guest cannot have one host judged and another reached.
//! - **The body** is read whole before the request is judged: a tape pins a request by
//!   its body, and the client sends it whole. It is read up to what is left of
//!   `max_bytes` after the head, and one byte more, which tells that it is past them;
//!   such a request fails on `max_bytes` as a module's would, and is never handed to
//!   the client (what was read of its body is what its pin hashes).
//! - **Concurrency**: a request is in flight from when its body starts being read until
//!   `settle` or until the guest drops its future; `max_concurrent` counts those (a
//!   request past it is refused before its body is read), and those in flight at once
//!   take their bytes from one budget (`ByteBudget`), so that together they stay within
//!   `max_bytes`.
//! - **Waiting**: wasi-http spawns the hooks' future on the task thread's runtime and the
//!   store's table owns its handle. A guest waiting on the response's pollable is inside
//!   `stop::bounded`, so a kill or the deadline drops the store, which aborts the future,
//!   whose `EgressClient::send_within` aborts the exchange and closes its connection;
//!   the attempt lets the runtime run the aborts before its thread goes idle
//!   (`attempt::run_component`).
//! - **Errors** are wasi-http's `error-code`, as the SDK reads them (`wasm-sdk`'s
//!   `http/p2.rs`): a refusal by the policy or for want of a grant is
//!   `HTTP-request-denied`, an address refused at connect `destination-IP-prohibited`
//!   (both `Denied`); `max_requests` and `max_concurrent` are `connection-limit-reached`,
//!   `max_bytes` `HTTP-request-body-size` (the request's side: the room its body had)
//!   or `HTTP-response-body-size` (the response's), all `Limit`; the request's own
//!   timeout is `connection-read-timeout` (`connection-timeout` when only a connect
//!   timeout was given), `Timeout`; anything else is `internal-error` with the
//!   executor's message. A refusal is in the attempt's denials with the message a
//!   module's gets.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use flint_fetch_cache::egress::EgressResponse;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::head::Head;
use super::request::{Failure, Prepared};
use super::{Access, EgressCtx, EgressSpent, Errno, Limit};
use crate::sandbox::ComponentCtx;

/// What wasi-http awaits for a response: it and the future of the connection behind it.
type Sending = Box<dyn Future<Output = Result<(Response<WasiBody>, Io), HttpError>> + Send>;
type Io = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

/// Links `wasi:http/types` and `wasi:http/outgoing-handler` (and nothing of WASI that
/// the component linker has already).
pub(in crate::sandbox) fn add_to_linker(
    linker: &mut wasmtime::component::Linker<ComponentCtx>,
) -> wasmtime::Result<()> {
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)
}

/// A component's store holds these; each request's future holds the context too, to
/// settle the request when it ends, without the store.
pub struct EgressHooks {
    egress: Arc<Mutex<EgressCtx>>,
}

impl EgressHooks {
    pub(in crate::sandbox) fn new(egress: EgressCtx) -> Self {
        EgressHooks {
            egress: Arc::new(Mutex::new(egress)),
        }
    }

    pub(in crate::sandbox) fn spent(&self) -> EgressSpent {
        lock(&self.egress).spent()
    }
}

impl WasiHttpHooks for EgressHooks {
    fn set_host_header(&mut self) -> bool {
        false
    }

    fn send_request(
        &mut self,
        request: Request<WasiBody>,
        options: Option<RequestOptions>,
        _io: Io,
    ) -> Sending {
        Box::new(send(self.egress.clone(), request, options))
    }
}

/// A panic while it was held (a bug) leaves counts that are still the best there are.
fn lock(egress: &Mutex<EgressCtx>) -> MutexGuard<'_, EgressCtx> {
    egress.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn send(
    egress: Arc<Mutex<EgressCtx>>,
    request: Request<WasiBody>,
    options: Option<RequestOptions>,
) -> Result<(Response<WasiBody>, Io), HttpError> {
    let (parts, body) = request.into_parts();
    let timeout = Timeout::of(options);
    let head = head(&parts, timeout.map(|t| t.ms))?;
    let room = {
        let mut ctx = lock(&egress);
        if !ctx.reserve() {
            // Refused now as it would be once its body was in, its policy first.
            return Err(match ctx.prepare_head(head, Vec::new()) {
                Err(errno) => ctx.refused(errno),
                Ok(_) => unreachable!("with no place free, `within_limits` refuses"),
            });
        }
        ctx.body_room(&head)
    };
    let reading = InFlight(Some(egress.clone()));
    let body = read_body(body, room).await?;
    let Prepared { what, call, .. } = {
        let mut ctx = lock(&egress);
        // `prepare` takes the place again, the lock held between.
        reading.release(&mut ctx);
        match ctx.prepare_head(head, body.bytes) {
            Ok(prepared) => prepared,
            Err(errno) => return Err(ctx.refused(errno)),
        }
    };
    let in_flight = InFlight(Some(egress.clone()));
    let exchanged = match body.past {
        false => call.run().await,
        true => call.refused(Failure {
            errno: Errno::Limit,
            message: format!(
                "{what}: max_bytes reached: the request's body is past the {room} bytes \
                 left for it"
            ),
            bytes_sent: 0,
            bytes_received: 0,
        }),
    };
    in_flight.ended();
    let answer = {
        let mut ctx = lock(&egress);
        match ctx.account(&what, exchanged) {
            Ok(answer) => answer,
            Err(errno) => return Err(ctx.failed(errno, body.past.then_some(room), timeout)),
        }
    };
    let io: Io = Box::new(std::future::ready(Ok(())));
    Ok((response(&what, answer)?, io))
}

/// The request as `prepare` takes it. Header values are sent as text: one that is not
/// is refused here, never altered.
fn head(parts: &http::request::Parts, timeout_ms: Option<u64>) -> Result<Head, HttpError> {
    let (method, url) = (parts.method.as_str().to_owned(), parts.uri.to_string());
    let mut headers = Vec::with_capacity(parts.headers.len());
    for (name, value) in &parts.headers {
        let Ok(value) = value.to_str() else {
            return Err(HttpError::InternalError(Some(format!(
                "{method} {url}: the value of header `{name}` is not text (visible ASCII)"
            ))));
        };
        headers.push((name.as_str().to_owned(), value.to_owned()));
    }
    Ok(Head {
        method,
        url,
        headers,
        timeout_ms,
    })
}

/// A request body as read: `past` when it went on beyond the room it had.
struct Body {
    bytes: Vec<u8>,
    past: bool,
}

/// Reads at most `room` bytes and one more. A body the guest gave up on (dropped
/// unfinished, or shorter or longer than its `content-length`) ends in wasi-http's error,
/// which the guest gets back; nothing was sent or counted.
async fn read_body(mut body: WasiBody, room: u64) -> Result<Body, HttpError> {
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            return Err(HttpError::InternalError(Some(
                "a request's trailers cannot be sent (the executor sends none)".into(),
            )));
        };
        let left = room.saturating_sub(bytes.len() as u64);
        if data.len() as u64 > left {
            // `left` is below a length in memory, so it fits a usize.
            bytes.extend_from_slice(&data[..left as usize + 1]);
            return Ok(Body { bytes, past: true });
        }
        bytes.extend_from_slice(&data);
    }
    Ok(Body { bytes, past: false })
}

fn response(what: &str, answer: EgressResponse) -> Result<Response<WasiBody>, HttpError> {
    let mut response = Response::builder().status(answer.status);
    for (name, value) in &answer.headers {
        response = response.header(name.as_str(), value.as_str());
    }
    let body = Full::new(Bytes::from(answer.body))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    response.body(body).map_err(|e| {
        let why = format!("{what}: the response does not convert to wasi-http's: {e}");
        HttpError::InternalError(Some(why))
    })
}

/// The request's own timeout from wasi-http's options. The client hands a response
/// over whole, so its first byte reaches the guest with its last: the exchange gets the
/// connect and first-byte timeouts together; between-bytes has nothing to time.
#[derive(Clone, Copy)]
struct Timeout {
    ms: u64,
    first_byte: bool,
}

impl Timeout {
    fn of(options: Option<RequestOptions>) -> Option<Timeout> {
        let options = options?;
        let (connect, first_byte) = (options.connect_timeout, options.first_byte_timeout);
        let total = connect.unwrap_or_default() + first_byte.unwrap_or_default();
        (connect.is_some() || first_byte.is_some()).then(|| Timeout {
            ms: u64::try_from(total.as_millis()).unwrap_or(u64::MAX),
            first_byte: first_byte.is_some(),
        })
    }

    fn code(self) -> HttpError {
        match self.first_byte {
            true => HttpError::ConnectionReadTimeout,
            false => HttpError::ConnectionTimeout,
        }
    }
}

/// A request between `prepare` and `settle`: if the guest drops its future (or the
/// store goes), it is in flight no more.
struct InFlight(Option<Arc<Mutex<EgressCtx>>>);

impl InFlight {
    /// The request ended; `account` takes it out of flight.
    fn ended(mut self) {
        self.0 = None;
    }

    /// Out of flight, by a caller that holds the context already.
    fn release(mut self, ctx: &mut EgressCtx) {
        if self.0.take().is_some() {
            ctx.abandoned();
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(egress) = self.0.take() {
            lock(&egress).abandoned();
        }
    }
}

impl EgressCtx {
    /// The bytes a request's body may have: what is left of `max_bytes` after its head
    /// (method, URL, headers, counted as the client counts them); none without a grant,
    /// whose request is refused before its body matters.
    fn body_room(&self, head: &Head) -> u64 {
        let Some(limits) = self.limits() else {
            return 0;
        };
        let used = self.bytes_sent.saturating_add(self.bytes_received);
        let mut left = limits.max_bytes.saturating_sub(used);
        if let Access::Live { .. } = self.access {
            // Less when requests in flight are taking from it.
            left = left.min(self.budget.left());
        }
        let url = url::Url::parse(&head.url).map_or(head.url.len(), |url| url.as_str().len());
        let headers: usize = (head.headers.iter())
            .map(|(name, value)| name.len() + value.len())
            .sum();
        left.saturating_sub((head.method.len() + url + headers) as u64)
    }

    /// The code for a request refused before it was sent.
    fn refused(&mut self, errno: Errno) -> HttpError {
        match errno {
            Errno::Denied => HttpError::HttpRequestDenied,
            Errno::Limit => match self.limit_reached.take() {
                Some(Limit::Requests | Limit::Concurrent) => HttpError::ConnectionLimitReached,
                Some(Limit::Bytes) => HttpError::HttpRequestBodySize(Some(0)),
                // The recording's cap, which is `max_bytes` and framing.
                None => HttpError::HttpResponseBodySize(None),
            },
            Errno::Timeout | Errno::Io | Errno::Invalid => self.internal(),
        }
    }

    /// The code for a request that was sent (or given to the client) and failed.
    /// `room`: the body had more than it (the request's side of `max_bytes`).
    fn failed(&mut self, errno: Errno, room: Option<u64>, timeout: Option<Timeout>) -> HttpError {
        match (errno, room, timeout) {
            // The policy judged the request before: the client refuses only an address,
            // at connect.
            (Errno::Denied, ..) => HttpError::DestinationIpProhibited,
            (Errno::Limit, Some(room), _) => HttpError::HttpRequestBodySize(Some(room)),
            (Errno::Limit, None, _) => HttpError::HttpResponseBodySize(None),
            (Errno::Timeout, _, Some(timeout)) => timeout.code(),
            _ => self.internal(),
        }
    }

    fn internal(&self) -> HttpError {
        HttpError::InternalError(Some(self.last_error().to_owned()))
    }

    /// Takes a place in flight for a request whose body is being read, if one is free: a
    /// body is held whole before the request is prepared, so bodies count against
    /// `max_concurrent` as requests do.
    fn reserve(&mut self) -> bool {
        let free = (self.limits()).is_some_and(|limits| self.busy() < limits.max_concurrent.into());
        if free {
            self.in_flight += 1;
        }
        free
    }

    /// A request whose guest stopped waiting for it before it ended.
    fn abandoned(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_timeout_is_the_connect_and_first_byte_timeouts_together() {
        let options = |connect, first_byte, between| RequestOptions {
            connect_timeout: connect,
            first_byte_timeout: first_byte,
            between_bytes_timeout: between,
        };
        let (s1, s2) = (Some(Duration::from_secs(1)), Some(Duration::from_secs(2)));
        assert!(Timeout::of(None).is_none());
        assert!(Timeout::of(Some(options(None, None, s1))).is_none());
        let both = Timeout::of(Some(options(s1, s2, s1))).unwrap();
        assert_eq!((both.ms, both.first_byte), (3000, true));
        assert!(matches!(both.code(), HttpError::ConnectionReadTimeout));
        let connect = Timeout::of(Some(options(s1, None, None))).unwrap();
        assert_eq!((connect.ms, connect.first_byte), (1000, false));
        assert!(matches!(connect.code(), HttpError::ConnectionTimeout));
    }
}
