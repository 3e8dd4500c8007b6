//! The bytes of the `flint` import module's HTTP calls (wasm32-wasip1), kept apart from
//! the calls themselves so that the host's unit tests cover them: the request head as
//! JSON, the response headers JSON, the 16-byte block `http_send` writes, and errnos.
//! The executor's `flint` import module is the other side.

use std::time::Duration;

use serde::Serialize;

use super::{Error, Request};

pub(crate) const OK: i32 = 0;
pub(crate) const DENIED: i32 = 1;
pub(crate) const LIMIT: i32 = 2;
pub(crate) const TIMEOUT: i32 = 3;
pub(crate) const IO: i32 = 4;
pub(crate) const INVALID: i32 = 5;

/// The head `http_send` reads: `{"method":..,"url":..,"headers":[[n,v],..],"timeout_ms":N}`,
/// the optional fields left out when unset.
#[derive(Serialize)]
struct Head<'a> {
    method: &'a str,
    url: &'a str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    headers: &'a [(String, String)],
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<u64>,
}

pub(crate) fn encode_head(request: &Request) -> Vec<u8> {
    let head = Head {
        method: &request.method,
        url: &request.url,
        headers: &request.headers,
        timeout_ms: request.timeout.map(timeout_ms),
    };
    serde_json::to_vec(&head).expect("a struct of strings and numbers always serializes")
}

/// Rounded up, so that a timeout under a millisecond is not `0` (which a host could
/// read as "expired" or as "none").
fn timeout_ms(timeout: Duration) -> u64 {
    let ms = timeout.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The response headers `http_take` copies out: `[["name","value"],..]`.
pub(crate) fn decode_headers(json: &[u8]) -> Result<Vec<(String, String)>, Error> {
    serde_json::from_slice(json).map_err(|e| {
        Error::Invalid(format!(
            "the executor's response headers are not the JSON list of pairs the flint ABI \
             promises: {e}"
        ))
    })
}

/// What `http_send` writes at `out_ptr` on OK: four little-endian u32s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sent {
    pub handle: u32,
    pub status: u16,
    pub headers_len: usize,
    pub body_len: usize,
}

pub(crate) fn decode_sent(out: &[u8; 16]) -> Result<Sent, Error> {
    let word = |i: usize| {
        let bytes: [u8; 4] = out[i * 4..i * 4 + 4].try_into().expect("4 of 16 bytes");
        u32::from_le_bytes(bytes)
    };
    let status = u16::try_from(word(1))
        .map_err(|_| Error::Invalid(format!("the executor sent status {}", word(1))))?;
    Ok(Sent {
        handle: word(0),
        status,
        headers_len: usize::try_from(word(2)).expect("usize holds a u32 on wasm32 and up"),
        body_len: usize::try_from(word(3)).expect("usize holds a u32 on wasm32 and up"),
    })
}

/// `Ok` for OK, else the error `errno` stands for; `message` (a call to `http_error`)
/// is asked only then.
pub(crate) fn check(errno: i32, message: impl FnOnce() -> String) -> Result<(), Error> {
    if errno == OK {
        Ok(())
    } else {
        Err(error_from_errno(errno, message()))
    }
}

/// The error an errno stands for, with the message `http_error` gave. An errno this
/// SDK does not know (a newer executor's) is [`Error::Io`]: the request failed, and
/// the message still says why.
fn error_from_errno(errno: i32, message: String) -> Error {
    let message = if message.is_empty() {
        format!("errno {errno} with no message")
    } else {
        message
    };
    match errno {
        DENIED => Error::Denied(message),
        LIMIT => Error::Limit(message),
        TIMEOUT => Error::Timeout(message),
        IO => Error::Io(message),
        INVALID => Error::Invalid(message),
        _ => Error::Io(format!("errno {errno}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_head_has_method_and_url_only() {
        let head = encode_head(&Request::get("http://127.0.0.1:9/x?y=\"z\""));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            r#"{"method":"GET","url":"http://127.0.0.1:9/x?y=\"z\""}"#
        );
    }

    #[test]
    fn headers_are_pairs_in_order_and_the_timeout_is_in_ms() {
        let request = Request::new("PATCH", "https://h/")
            .with_header("B", "2")
            .with_header("a", "1 \u{e9}")
            .with_header("B", "3")
            .with_timeout(Duration::from_millis(1500));
        let head: serde_json::Value = serde_json::from_slice(&encode_head(&request)).unwrap();
        assert_eq!(
            head,
            serde_json::json!({
                "method": "PATCH",
                "url": "https://h/",
                "headers": [["B", "2"], ["a", "1 \u{e9}"], ["B", "3"]],
                "timeout_ms": 1500,
            })
        );
    }

    #[test]
    fn a_timeout_under_a_millisecond_is_not_zero() {
        assert_eq!(timeout_ms(Duration::from_micros(1)), 1);
        assert_eq!(timeout_ms(Duration::from_micros(1001)), 2);
        assert_eq!(timeout_ms(Duration::ZERO), 0);
        assert_eq!(timeout_ms(Duration::MAX), u64::MAX);
    }

    #[test]
    fn response_headers_decode_from_pairs() {
        assert_eq!(
            decode_headers(
                br#"[["content-type","text/plain"],["set-cookie","a"],["set-cookie","b"]]"#
            ),
            Ok(vec![
                ("content-type".into(), "text/plain".into()),
                ("set-cookie".into(), "a".into()),
                ("set-cookie".into(), "b".into()),
            ])
        );
        assert_eq!(decode_headers(b"[]"), Ok(vec![]));
        for bad in [
            &b""[..],
            b"{}",
            br#"[["a"]]"#,
            br#"[["a","b","c"]]"#,
            br#"[[1,2]]"#,
        ] {
            assert!(
                matches!(decode_headers(bad), Err(Error::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_sent_block_is_four_little_endian_words() {
        let mut out = [0u8; 16];
        for (i, word) in [7u32, 404, 0x0102_0304, 5].into_iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&word.to_le_bytes());
        }
        assert_eq!(
            decode_sent(&out),
            Ok(Sent {
                handle: 7,
                status: 404,
                headers_len: 0x0102_0304,
                body_len: 5,
            })
        );
        out[4..8].copy_from_slice(&70_000u32.to_le_bytes());
        assert!(matches!(decode_sent(&out), Err(Error::Invalid(_))));
    }

    #[test]
    fn errnos_map_to_their_kinds() {
        let cases = [
            (DENIED, Error::Denied("m".into())),
            (LIMIT, Error::Limit("m".into())),
            (TIMEOUT, Error::Timeout("m".into())),
            (IO, Error::Io("m".into())),
            (INVALID, Error::Invalid("m".into())),
            (99, Error::Io("errno 99: m".into())),
        ];
        for (errno, expected) in cases {
            assert_eq!(error_from_errno(errno, "m".into()), expected);
        }
        assert_eq!(
            error_from_errno(LIMIT, String::new()),
            Error::Limit("errno 2 with no message".into())
        );
    }

    #[test]
    fn the_message_is_asked_for_on_failure_only() {
        assert_eq!(check(OK, || panic!("asked on success")), Ok(()));
        assert_eq!(
            check(DENIED, || "GET http://x/: not in network.allow".into()),
            Err(Error::Denied("GET http://x/: not in network.allow".into()))
        );
    }
}
