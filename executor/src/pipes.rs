//! Capped in-memory stdout / stderr for guests.
//!
//! wasmtime-wasi's `MemoryOutputPipe` traps at its capacity but cannot tell the host that
//! the cap was the reason, and cannot truncate. This pipe does both: in [`Overflow::Trap`]
//! mode (stdout: a partial result is worthless) a write past the cap traps the guest and
//! marks the pipe overflowed; in [`Overflow::Truncate`] mode (stderr: a log's head is
//! still useful) the guest goes on and the excess is dropped and marked. Memory stays at
//! the cap either way.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// Largest write the guest is offered at once; larger writes arrive in pieces.
const WRITE_PERMIT: usize = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    Trap,
    Truncate,
}

#[derive(Clone)]
pub struct CappedPipe {
    inner: Arc<Mutex<Buffer>>,
}

struct Buffer {
    bytes: Vec<u8>,
    cap: usize,
    overflow: Overflow,
    overflowed: bool,
}

impl CappedPipe {
    pub fn new(cap: usize, overflow: Overflow) -> Self {
        CappedPipe {
            inner: Arc::new(Mutex::new(Buffer {
                bytes: Vec::new(),
                cap,
                overflow,
                overflowed: false,
            })),
        }
    }

    /// The bytes kept, and whether anything was dropped.
    pub fn into_contents(self) -> (Vec<u8>, bool) {
        let mut buffer = self.lock();
        (std::mem::take(&mut buffer.bytes), buffer.overflowed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buffer> {
        // A panic while holding this lock can only come from an allocation failure inside
        // `extend_from_slice`; the bytes are still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends what fits. Returns false when the write went past the cap.
    fn append(&self, data: &[u8]) -> bool {
        let mut buffer = self.lock();
        let room = buffer.cap - buffer.bytes.len();
        if data.len() <= room {
            buffer.bytes.extend_from_slice(data);
            return true;
        }
        buffer.overflowed = true;
        if buffer.overflow == Overflow::Truncate {
            buffer.bytes.extend_from_slice(&data[..room]);
        }
        false
    }

    fn traps_on_overflow(&self) -> bool {
        self.lock().overflow == Overflow::Trap
    }
}

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        if self.append(&bytes) || !self.traps_on_overflow() {
            return Ok(());
        }
        Err(StreamError::trap("output limit exceeded"))
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        // Always offer room: the cap is enforced in `write`, where going past it is either
        // a trap or a truncation, never a stall.
        Ok(WRITE_PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for CappedPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.append(data) || !self.traps_on_overflow() {
            return Poll::Ready(Ok(data.len()));
        }
        Poll::Ready(Err(std::io::Error::other("output limit exceeded")))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trap_mode_keeps_what_fit_and_refuses_the_rest() {
        let mut pipe = CappedPipe::new(8, Overflow::Trap);
        pipe.write(Bytes::from_static(b"12345")).unwrap();
        assert!(pipe.write(Bytes::from_static(b"6789")).is_err());
        assert_eq!(pipe.into_contents(), (b"12345".to_vec(), true));
    }

    #[test]
    fn truncate_mode_keeps_the_head_and_marks_it() {
        let mut pipe = CappedPipe::new(8, Overflow::Truncate);
        pipe.write(Bytes::from_static(b"12345")).unwrap();
        pipe.write(Bytes::from_static(b"6789")).unwrap();
        pipe.write(Bytes::from_static(b"more")).unwrap();
        assert_eq!(pipe.into_contents(), (b"12345678".to_vec(), true));
    }

    #[test]
    fn exactly_at_the_cap_is_not_an_overflow() {
        let mut pipe = CappedPipe::new(4, Overflow::Trap);
        pipe.write(Bytes::from_static(b"1234")).unwrap();
        assert_eq!(pipe.into_contents(), (b"1234".to_vec(), false));
    }
}
