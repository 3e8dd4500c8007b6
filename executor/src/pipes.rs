//! Capped in-memory stdout / stderr for guests.
//!
//! wasmtime-wasi's `MemoryOutputPipe` traps at its capacity but cannot tell the host that
//! the cap was the reason, and cannot truncate. This pipe does both: in [`Overflow::Trap`]
//! mode (stdout: a partial result is worthless) a write past the cap traps the guest and
//! marks the pipe overflowed; in [`Overflow::Truncate`] mode (stderr: a log's head is
//! still useful) the guest goes on and the excess is dropped and marked. Memory stays at
//! the cap either way.

use std::sync::{Arc, Mutex};

/// Largest write the guest is offered at once; larger writes arrive in pieces.
pub(crate) const WRITE_PERMIT: usize = 64 * 1024;

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

impl CappedPipe {
    /// Takes the guest's bytes: an error traps the guest.
    fn accept(&self, data: &[u8]) -> Result<(), &'static str> {
        if self.append(data) || !self.traps_on_overflow() {
            return Ok(());
        }
        Err("output limit exceeded")
    }
}

/// The wasmtime-wasi output traits (preview 1 and 2) for a pipe type that takes the
/// guest's bytes through `fn accept(&self, &[u8]) -> Result<(), &'static str>`.
macro_rules! guest_output_pipe {
    ($pipe:ty) => {
        impl wasmtime_wasi::p2::OutputStream for $pipe {
            fn write(&mut self, bytes: bytes::Bytes) -> Result<(), wasmtime_wasi::p2::StreamError> {
                self.accept(&bytes)
                    .map_err(wasmtime_wasi::p2::StreamError::trap)
            }

            fn flush(&mut self) -> Result<(), wasmtime_wasi::p2::StreamError> {
                Ok(())
            }

            fn check_write(&mut self) -> Result<usize, wasmtime_wasi::p2::StreamError> {
                // Always offer room: caps are enforced in `write`, where going past one
                // is a trap or a truncation, never a stall.
                Ok($crate::pipes::WRITE_PERMIT)
            }
        }

        #[wasmtime_wasi::async_trait]
        impl wasmtime_wasi::p2::Pollable for $pipe {
            async fn ready(&mut self) {}
        }

        impl tokio::io::AsyncWrite for $pipe {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
                data: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::task::Poll::Ready(
                    self.accept(data)
                        .map(|()| data.len())
                        .map_err(std::io::Error::other),
                )
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(Ok(()))
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(Ok(()))
            }
        }

        impl wasmtime_wasi::cli::IsTerminal for $pipe {
            fn is_terminal(&self) -> bool {
                false
            }
        }

        impl wasmtime_wasi::cli::StdoutStream for $pipe {
            fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::OutputStream> {
                Box::new(self.clone())
            }

            fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
                Box::new(self.clone())
            }
        }
    };
}
pub(crate) use guest_output_pipe;

guest_output_pipe!(CappedPipe);

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use wasmtime_wasi::p2::OutputStream;

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
