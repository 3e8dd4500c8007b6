//! Arbitrary bytes into the frame decoder, as a peer would send them.
//!
//! The first byte picks the message type the decoder reads (the executor's end reads
//! `DriverMessage`s, the driver's end `ExecutorMessage`s, and each reads its half of
//! the hello) and how the rest arrives: all at once, or in chunks of 1 to 15 bytes.
//! Properties:
//! - decoding never panics, and stops at the first error as a connection does;
//! - the outcome does not depend on how the bytes were chunked (a partial frame is
//!   `Ok(None)`, never an error or a different message);
//! - every decoded message encodes to a frame that decodes to an equal message.

use std::fmt::Debug;

use bytes::BytesMut;
use flint_protocol::codec::{FrameCodec, FrameError};
use flint_protocol::{DriverMessage, ExecutorMessage, Hello, HelloReply};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// One input, as the cargo-fuzz target and the corpus replay
/// (tests/e2e/fuzz_corpora.rs) give it: panics where a property fails.
pub fn check_input(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(selector >> 4);
    match selector % 4 {
        0 => check::<DriverMessage>(bytes, chunk),
        1 => check::<ExecutorMessage>(bytes, chunk),
        2 => check::<Hello>(bytes, chunk),
        _ => check::<HelloReply>(bytes, chunk),
    }
}

const MAX_FRAME: usize = 64 << 10;

/// What decoding a byte stream came to: the messages before the first error or the
/// first incomplete frame, and the error's kind if there was one.
#[derive(Debug, PartialEq)]
struct Decoded<T> {
    messages: Vec<T>,
    error: Option<&'static str>,
}

fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(bytes: &[u8], chunk: usize) {
    // Both ends' codec, with a smaller limit than their 64 MiB: a partial frame reserves
    // room for all of it, and a 64 MiB allocation per input would be most of the time
    // spent (inputs stay far below either limit, so nothing else changes).
    let codec = FrameCodec::<T, T>::with_max_frame(MAX_FRAME);
    let whole = decode(&codec, bytes, bytes.len().max(1));
    if chunk > 0 {
        assert_eq!(
            decode(&codec, bytes, chunk),
            whole,
            "chunks of {chunk} bytes"
        );
    }
    for message in &whole.messages {
        let mut frame = BytesMut::new();
        codec
            .encode_frame(message, &mut frame)
            .expect("a decoded message encodes");
        let again = codec
            .decode_frame(&mut frame)
            .expect("a re-encoded message decodes")
            .expect("a re-encoded frame is whole");
        assert_eq!(&again, message);
        assert!(frame.is_empty(), "the frame is consumed exactly");
    }
}

fn decode<T: Serialize + DeserializeOwned>(
    codec: &FrameCodec<T, T>,
    bytes: &[u8],
    chunk: usize,
) -> Decoded<T> {
    let mut src = BytesMut::new();
    let mut messages = Vec::new();
    for piece in bytes.chunks(chunk) {
        src.extend_from_slice(piece);
        loop {
            match codec.decode_frame(&mut src) {
                Ok(Some(message)) => messages.push(message),
                Ok(None) => break,
                Err(e) => {
                    let kind = match e {
                        FrameError::TooLarge { .. } => "too large",
                        FrameError::Malformed(_) => "malformed",
                        FrameError::Io(_) => "io",
                    };
                    return Decoded {
                        messages,
                        error: Some(kind),
                    };
                }
            }
        }
    }
    Decoded {
        messages,
        error: None,
    }
}
