//! One request and its response: what a request is checked for before it leaves (it
//! parses, the policy admits it, it fits the byte budget), and how the response is read
//! against what is left of that budget.
//!
//! Bytes are counted so: sent = method + URL + header names and
//! values + body; received = header names and values + body. Framing (the status line,
//! separators, chunk sizes) is not counted: it is the same for every guest and none of
//! theirs to choose.

use std::sync::Arc;

use reqwest::header::{CONTENT_LENGTH, HeaderMap, HeaderName, HeaderValue};
use url::Url;

use super::budget::ByteBudget;
use super::policy::{EgressPolicy, EgressRefusal, RequestLine};
use super::resolver::ForbiddenAnswer;

/// What a guest asked for, unchecked: [`super::EgressClient::send`] parses and judges it.
#[derive(Clone, Debug)]
pub struct EgressRequest {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// bytes_sent = method + URL + header names and values + body; bytes_received = header names
/// and values + body. A header value that is not UTF-8 is given lossily, counted as it came.
#[derive(Clone, Debug)]
pub struct EgressResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

/// Why a request failed; every message names the method and URL.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// Refused by the policy, or by the resolver at connect.
    #[error("{0}")]
    Denied(EgressRefusal),
    /// The byte budget: the message names `max_bytes` and its value.
    #[error("{0}")]
    Limit(String, WireBytes),
    /// Connecting, sending or reading failed (refused, reset, a malformed response).
    #[error("{0}")]
    Io(String, WireBytes),
    /// A method, URL or header that does not parse.
    #[error("{0}")]
    Invalid(String),
}

/// What a request that failed had exchanged by then: counted like an answered one's,
/// since the bytes crossed the wire all the same (a guest whose requests fail after
/// sending their bodies is not sending for free).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireBytes {
    pub sent: u64,
    pub received: u64,
}

impl EgressError {
    /// The bytes of a failed request that left the host: none for a refused or invalid
    /// request, or one that never connected; the whole request once it may have gone.
    pub fn bytes_sent(&self) -> u64 {
        self.spent().sent
    }

    /// The bytes of its response read before it failed (headers and body).
    pub fn bytes_received(&self) -> u64 {
        self.spent().received
    }

    fn spent(&self) -> WireBytes {
        match self {
            EgressError::Limit(_, spent) | EgressError::Io(_, spent) => *spent,
            EgressError::Denied(_) | EgressError::Invalid(_) => WireBytes::default(),
        }
    }

    fn having_spent(self, spent: WireBytes) -> EgressError {
        match self {
            EgressError::Limit(message, _) => EgressError::Limit(message, spent),
            EgressError::Io(message, _) => EgressError::Io(message, spent),
            other => other,
        }
    }
}

impl From<EgressRefusal> for EgressError {
    fn from(refusal: EgressRefusal) -> Self {
        EgressError::Denied(refusal)
    }
}

/// A request that passed every check, in reqwest's types, ready to be sent.
pub(crate) struct Prepared {
    line: RequestLine,
    method: reqwest::Method,
    url: Url,
    headers: HeaderMap,
    body: Vec<u8>,
    bytes_sent: u64,
    /// What was left of the budget when the request was prepared, for the messages.
    max_bytes: u64,
    budget: Arc<ByteBudget>,
}

/// Parses and judges `request`, and takes its bytes from the budget; nothing refused
/// here is ever sent.
pub(crate) fn prepare(
    policy: &EgressPolicy,
    request: EgressRequest,
    budget: Arc<ByteBudget>,
) -> Result<Prepared, EgressError> {
    let line = RequestLine {
        method: request.method.clone(),
        url: request.url.clone(),
    };
    let url = Url::parse(&request.url)
        .map_err(|e| EgressError::Invalid(format!("{line}: the URL does not parse: {e}")))?;
    let line = RequestLine {
        method: request.method,
        url: url.as_str().to_owned(),
    };
    let method = reqwest::Method::from_bytes(line.method.as_bytes())
        .map_err(|_| EgressError::Invalid(format!("{line}: `{}` is not a method", line.method)))?;
    policy.judge(&line.method, &url, &request.headers)?;
    let headers = header_map(&line, &request.headers, request.body.len())?;
    let bytes_sent = (line.method.len() + line.url.len() + request.body.len()) as u64
        + request
            .headers
            .iter()
            .map(|(name, value)| (name.len() + value.len()) as u64)
            .sum::<u64>();
    let max_bytes = budget.left();
    if budget.take(bytes_sent).is_err() {
        return Err(EgressError::Limit(
            format!(
                "{line}: max_bytes {max_bytes} reached: the request alone is {bytes_sent} bytes"
            ),
            WireBytes::default(),
        ));
    }
    Ok(Prepared {
        line,
        method,
        url,
        headers,
        body: request.body,
        bytes_sent,
        max_bytes,
        budget,
    })
}

/// The guest's headers as hyper will write them. A value with CR, LF or NUL would split
/// the header block (a second request smuggled into a shared connection): invalid. So is
/// a `Content-Length` that is not the body's, which hyper would obey over the body.
fn header_map(
    line: &RequestLine,
    headers: &[(String, String)],
    body_len: usize,
) -> Result<HeaderMap, EgressError> {
    let invalid = |what: String| EgressError::Invalid(format!("{line}: {what}"));
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid(format!("`{name}` is not a header name")))?;
        let parsed = HeaderValue::from_bytes(value.as_bytes()).map_err(|_| {
            invalid(format!(
                "the value of header `{name}` holds a control character (CR, LF, NUL ...)"
            ))
        })?;
        if header == CONTENT_LENGTH && value.trim().parse::<usize>().ok() != Some(body_len) {
            return Err(invalid(format!(
                "Content-Length `{value}` is not the body's length, {body_len}"
            )));
        }
        map.append(header, parsed);
    }
    Ok(map)
}

/// Sends a prepared request and reads its response within what is left of the budget.
/// Runs on the egress runtime; dropped (aborted) there when the caller gives up.
pub(crate) async fn exchange(
    client: reqwest::Client,
    prepared: Prepared,
) -> Result<EgressResponse, EgressError> {
    let Prepared {
        line,
        method,
        url,
        headers,
        body,
        bytes_sent,
        max_bytes,
        budget,
    } = prepared;
    let failed = |e: reqwest::Error| failure(&line, e);
    let sent = client
        .request(method, url)
        .headers(headers)
        .body(body)
        .send();
    let mut response = match sent.await {
        Ok(response) => response,
        Err(e) => {
            // Never connected: nothing left the host, its bytes are the budget's again.
            if e.is_connect() {
                budget.refund(bytes_sent);
                return Err(failed(e));
            }
            let spent = WireBytes {
                sent: bytes_sent,
                received: 0,
            };
            return Err(failed(e).having_spent(spent));
        }
    };
    let left = budget.left();
    // Atomic only to be shared by the closures below across the awaits (Send + Sync).
    let received = std::sync::atomic::AtomicU64::new(0);
    let spent = || WireBytes {
        sent: bytes_sent,
        received: received.load(std::sync::atomic::Ordering::Relaxed),
    };
    let over = |what: String| {
        EgressError::Limit(
            format!(
                "{line}: max_bytes {max_bytes} reached: {what}, and {left} bytes were left after the request's {bytes_sent}"
            ),
            spent(),
        )
    };
    // What passes the budget is counted; the piece that would pass it is thrown away,
    // so a task's counted bytes never exceed its max_bytes.
    let take = |n: usize| -> Result<(), super::budget::Spent> {
        budget.take(n as u64)?;
        received.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    };
    let mut header_list = Vec::with_capacity(response.headers().len());
    for (name, value) in response.headers() {
        take(name.as_str().len() + value.len())
            .map_err(|_| over("the response's headers alone are past it".to_owned()))?;
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        header_list.push((name.as_str().to_owned(), value));
    }
    let declared = response.content_length();
    if declared.is_some_and(|declared| declared > budget.left()) {
        return Err(over(format!(
            "the response's Content-Length is {}",
            declared.unwrap_or_default()
        )));
    }
    let mut body_bytes = 0u64;
    // Reserving what the server declared is safe now that it fits the budget.
    let mut body = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(chunk) = (response.chunk().await).map_err(|e| failed(e).having_spent(spent()))? {
        take(chunk.len()).map_err(|_| {
            over(format!(
                "the response's body was cut after {body_bytes} bytes"
            ))
        })?;
        body_bytes += chunk.len() as u64;
        body.extend_from_slice(&chunk);
    }
    Ok(EgressResponse {
        status: response.status().as_u16(),
        headers: header_list,
        body,
        bytes_sent,
        bytes_received: received.into_inner(),
    })
}

/// reqwest's error as ours: a refusal by the resolver, found among its sources, is a
/// denial like any other; the rest is I/O, its causes spelt out.
fn failure(line: &RequestLine, error: reqwest::Error) -> EgressError {
    let error = error.without_url();
    let mut causes = vec![error.to_string()];
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&error);
    while let Some(cause) = source {
        let answer = cause.downcast_ref::<ForbiddenAnswer>().or_else(|| {
            cause
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<ForbiddenAnswer>())
        });
        if let Some(answer) = answer {
            return EgressError::Denied(resolved(line, answer));
        }
        causes.push(cause.to_string());
        source = cause.source();
    }
    EgressError::Io(
        format!("{line}: {}", causes.join(": ")),
        WireBytes::default(),
    )
}

fn resolved(line: &RequestLine, answer: &ForbiddenAnswer) -> EgressRefusal {
    EgressRefusal::Resolved {
        request: Box::new(line.clone()),
        host: answer.host.clone(),
        addr: answer.addr,
        class: answer.class,
        block: answer.block,
    }
}
