//! The HTTP edge: how connections are served and what bounds them, before any route
//! runs. Slow request heads are cut off by hyper's header read timeout (which needs a
//! timer: `axum::serve` sets none, so it is off there); slow bodies by an idle timeout
//! between body pieces; bodies are refused with 413 as soon as their declared or
//! received size passes the route's limit; requests beyond the concurrency limit get
//! 503 with `Retry-After` instead of a queue.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use flint_protocol::api::ErrorCode;

use super::error::ApiError;
use crate::config::EdgeLimits;

/// Serves `app` on `listener` until `stop` is cancelled; open connections then finish the
/// request they are on.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &EdgeLimits,
    stop: CancellationToken,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors and the like: keep serving the ones we have.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => return,
        };
        let _ = stream.set_nodelay(true);
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = result {
                // Header timeouts and clients that hang up land here; nothing to do.
                tracing::debug!(%peer, error = %e, "http connection ended");
            }
        });
    }
}

/// Refuses requests past the concurrency limit at once, rather than queueing them
/// behind a slow handler. The permit lives as long as the request is being handled.
/// Executors' module and file downloads are not counted: shedding them would fail the
/// tasks of jobs already accepted because clients are busy (found by the 503 test: a
/// job failed with `fetch_error: HTTP status 503`); their number is bounded by the
/// executors' task slots.
///
/// Not tower's `ConcurrencyLimitLayer` + `LoadShedLayer`: those shed every request
/// alike (no exemption for executors' reads) and answer with an error the app would
/// still have to turn into the 503 + `Retry-After` + JSON body clients rely on, so
/// they would add two layers and keep this function's work.
pub async fn limit_concurrency(
    State(limit): State<Arc<RequestLimit>>,
    request: Request,
    next: Next,
) -> Response {
    if crate::http::auth::executors_read(request.method(), request.uri().path()) {
        return next.run(request).await;
    }
    let Ok(_permit) = limit.permits.clone().try_acquire_owned() else {
        return ApiError::new(
            ErrorCode::Overloaded,
            format!(
                "the driver is serving its limit of {} requests at once; retry after {} s",
                limit.max,
                flint_protocol::defaults::RETRY_AFTER_SECS
            ),
        )
        .into_response();
    };
    next.run(request).await
}

/// Requests being served at once, and how many may be.
pub struct RequestLimit {
    permits: Arc<Semaphore>,
    max: usize,
}

impl RequestLimit {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(RequestLimit {
            permits: Arc::new(Semaphore::new(max)),
            max,
        })
    }
}

/// Reads a whole request body of at most `limit` bytes. A declared length over the
/// limit is refused before a byte is read; a body that grows past it is refused as soon
/// as it does, so no more than `limit` bytes are ever held. A pause of more than
/// `idle` between pieces fails the request with 408.
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    idle: Duration,
    what: &str,
) -> Result<Bytes, ApiError> {
    read_body_within(headers, body, limit, None, idle, what).await
}

/// The most an upload may add to the data dir (what is left of its quota), and the
/// refusal of an upload of that many bytes or more.
pub struct Room<'a> {
    pub bytes: u64,
    pub refusal: &'a (dyn Fn(u64) -> ApiError + Sync),
}

/// [`read_body`], refusing also a body that would not fit in `room`: before a byte is
/// read when its declared length passes it, else as soon as what arrived does.
pub async fn read_body_within(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    room: Option<Room<'_>>,
    idle: Duration,
    what: &str,
) -> Result<Bytes, ApiError> {
    let check_room = |len: u64| match &room {
        Some(room) if len > room.bytes => Err((room.refusal)(len)),
        _ => Ok(()),
    };
    let too_large = || {
        ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("{what} is larger than the limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    if let Some(len) = declared {
        check_room(len)?;
    }
    let mut stream = body.into_data_stream();
    let mut buffer = Vec::with_capacity(declared.map_or(0, |len| len as usize));
    loop {
        let piece = tokio::time::timeout(idle, stream.next())
            .await
            .map_err(|_| {
                ApiError::new(
                    ErrorCode::BodyTimeout,
                    format!(
                        "{what}: no data for {} ms (the body idle timeout)",
                        idle.as_millis()
                    ),
                )
            })?;
        match piece {
            None => return Ok(Bytes::from(buffer)),
            Some(Ok(bytes)) => {
                if buffer.len() + bytes.len() > limit {
                    return Err(too_large());
                }
                check_room((buffer.len() + bytes.len()) as u64)?;
                buffer.extend_from_slice(&bytes);
            }
            Some(Err(e)) => {
                return Err(ApiError::new(
                    ErrorCode::BadBody,
                    format!("{what}: reading the body: {e}"),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;
    use axum::http::HeaderValue;

    fn chunks(pieces: Vec<&'static [u8]>) -> Body {
        Body::from_stream(futures_util::stream::iter(
            pieces
                .into_iter()
                .map(|p| Ok::<_, std::io::Error>(Bytes::from_static(p))),
        ))
    }

    const IDLE: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn a_body_within_the_limit_is_read_whole() {
        let body = chunks(vec![b"abc", b"def"]);
        let read = read_body(&HeaderMap::new(), body, 6, IDLE, "spec").await;
        assert_eq!(read.unwrap(), Bytes::from_static(b"abcdef"));
    }

    #[tokio::test]
    async fn a_body_that_grows_past_the_limit_is_refused_without_length() {
        let body = chunks(vec![b"abc", b"def", b"g"]);
        let err = read_body(&HeaderMap::new(), body, 6, IDLE, "spec")
            .await
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn a_declared_length_past_the_limit_is_refused_before_reading() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("7"));
        let untouched = Body::from_stream(futures_util::stream::poll_fn(
            |_| -> std::task::Poll<Option<Result<Bytes, std::io::Error>>> {
                panic!("the body was read")
            },
        ));
        let err = read_body(&headers, untouched, 6, IDLE, "spec")
            .await
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn a_body_past_the_room_left_is_refused_before_or_while_reading() {
        let refusal =
            |n: u64| ApiError::new(ErrorCode::StorageFull, format!("{n} bytes do not fit"));
        let room = || {
            Some(Room {
                bytes: 5,
                refusal: &refusal,
            })
        };
        let body = chunks(vec![b"abc", b"de"]);
        let read = read_body_within(&HeaderMap::new(), body, 6, room(), IDLE, "module").await;
        assert_eq!(
            read.unwrap(),
            Bytes::from_static(b"abcde"),
            "exactly the room"
        );

        let body = chunks(vec![b"abc", b"def"]);
        let err = read_body_within(&HeaderMap::new(), body, 6, room(), IDLE, "module")
            .await
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(err.message, "6 bytes do not fit");

        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("6"));
        let untouched = Body::from_stream(futures_util::stream::poll_fn(
            |_| -> std::task::Poll<Option<Result<Bytes, std::io::Error>>> {
                panic!("the body was read")
            },
        ));
        let err = read_body_within(&headers, untouched, 6, room(), IDLE, "module")
            .await
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::INSUFFICIENT_STORAGE);
    }

    #[tokio::test]
    async fn a_stalled_body_times_out() {
        let stalled = Body::from_stream(
            futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"a"))])
                .chain(futures_util::stream::pending()),
        );
        let idle = Duration::from_millis(20);
        let err = read_body(&HeaderMap::new(), stalled, 6, idle, "spec")
            .await
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::REQUEST_TIMEOUT);
    }
}
