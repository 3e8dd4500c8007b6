//! wasm32-wasip1: the executor's `flint` import module. WASI preview 1 has no sockets,
//! so the executor makes the request and the guest collects it in two calls:
//! `http_send` blocks until the whole response is in and says how long its headers
//! (JSON) and body are, `http_take` copies both into buffers of exactly that size and
//! frees the handle. `http_error` holds the message of the last call that failed.

use super::wire;
use super::{Error, Request, Response};

#[link(wasm_import_module = "flint")]
unsafe extern "C" {
    fn http_send(
        head_ptr: *const u8,
        head_len: u32,
        body_ptr: *const u8,
        body_len: u32,
        out_ptr: *mut u8,
    ) -> i32;
    fn http_take(
        handle: u32,
        headers_ptr: *mut u8,
        headers_cap: u32,
        body_ptr: *mut u8,
        body_cap: u32,
    ) -> i32;
    fn http_error(buf_ptr: *mut u8, buf_cap: u32) -> i32;
}

/// A response the executor holds for us: it counts against `max_concurrent` until
/// taken, so a dropped one is taken and thrown away.
pub(crate) struct Sent {
    sent: wire::Sent,
    taken: bool,
}

pub(crate) fn send(request: &Request) -> Result<Sent, Error> {
    let head = wire::encode_head(request);
    let mut out = [0u8; 16];
    // SAFETY: the pointers and lengths describe live buffers (`head`, the request's
    // body, `out`'s 16 bytes) for the length of the call; the executor reads the first
    // two and writes only `out`.
    let errno = unsafe {
        http_send(
            head.as_ptr(),
            len32(head.len()),
            request.body.as_ptr(),
            len32(request.body.len()),
            out.as_mut_ptr(),
        )
    };
    wire::check(errno, last_error)?;
    Ok(Sent {
        sent: wire::decode_sent(&out)?,
        taken: false,
    })
}

impl Sent {
    pub(crate) fn take(mut self) -> Result<Response, Error> {
        self.taken = true;
        let (headers, body) = take(&self.sent)?;
        Ok(Response {
            status: self.sent.status,
            headers: wire::decode_headers(&headers)?,
            body,
        })
    }
}

impl Drop for Sent {
    fn drop(&mut self) {
        if !self.taken {
            // Nothing to report to: the caller gave the response up.
            let _ = take(&self.sent);
        }
    }
}

/// Copies the handle's headers JSON and body out, which frees it on the executor.
fn take(sent: &wire::Sent) -> Result<(Vec<u8>, Vec<u8>), Error> {
    let mut headers = vec![0u8; sent.headers_len];
    let mut body = vec![0u8; sent.body_len];
    // SAFETY: each pointer and capacity describe a live, initialised buffer the
    // executor may write up to its capacity into.
    let errno = unsafe {
        http_take(
            sent.handle,
            headers.as_mut_ptr(),
            len32(headers.len()),
            body.as_mut_ptr(),
            len32(body.len()),
        )
    };
    wire::check(errno, last_error)?;
    Ok((headers, body))
}

/// The message of the call that just failed. Most fit the first buffer; a longer one
/// is read again at its full length, which `http_error` returns.
fn last_error() -> String {
    let mut message = vec![0u8; 512];
    let mut len = error_into(&mut message);
    if len > message.len() {
        message.resize(len, 0);
        len = error_into(&mut message).min(message.len());
    }
    message.truncate(len);
    String::from_utf8_lossy(&message).into_owned()
}

/// Copies as much of the last error's message as fits; returns its full length.
fn error_into(buf: &mut [u8]) -> usize {
    // SAFETY: `buf` is a live buffer of that capacity.
    let len = unsafe { http_error(buf.as_mut_ptr(), len32(buf.len())) };
    usize::try_from(len).unwrap_or(0)
}

fn len32(len: usize) -> u32 {
    u32::try_from(len).expect("a wasm32 length fits in u32")
}
