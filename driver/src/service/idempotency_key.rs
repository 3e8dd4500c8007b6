//! What a client names one submission by: an `Idempotency-Key`, and why a string is
//! not one. Apart from [`super::idempotency`] (what a key does at submission) so that the
//! submission path can name a key without naming the idempotency machinery that calls it.

use std::fmt;
use std::str::FromStr;

use flint_protocol::api::{CodedError, ErrorCode};

/// Longest key, in bytes (Stripe's limit, which clients already live with).
pub const MAX_KEY_BYTES: usize = 255;

/// What a key may be, as every error about one says.
const KEY_RULE: &str = "an Idempotency-Key is 1 to 255 bytes of visible ASCII (0x21-0x7e)";

/// A client's name for one submission: 1 to [`MAX_KEY_BYTES`] bytes of visible ASCII
/// (0x21-0x7e: no spaces, no control characters, nothing outside ASCII).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a string is not an [`IdempotencyKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadKey {
    #[error("the Idempotency-Key is empty: {rule}", rule = KEY_RULE)]
    Empty,
    #[error(
        "the Idempotency-Key is {bytes} bytes, over the limit of {MAX_KEY_BYTES}: {rule}",
        rule = KEY_RULE
    )]
    TooLong { bytes: usize },
    #[error("byte {at} of the Idempotency-Key is {byte:#04x}: {rule}", rule = KEY_RULE)]
    NotVisibleAscii { at: usize, byte: u8 },
}

impl CodedError for BadKey {
    fn code(&self) -> ErrorCode {
        ErrorCode::BadIdempotencyKey
    }
}

impl IdempotencyKey {
    /// A key from a header's bytes, if they follow the rule.
    pub fn parse(bytes: &[u8]) -> Result<Self, BadKey> {
        if bytes.is_empty() {
            return Err(BadKey::Empty);
        }
        if bytes.len() > MAX_KEY_BYTES {
            return Err(BadKey::TooLong { bytes: bytes.len() });
        }
        if let Some(at) = bytes.iter().position(|b| !(0x21..=0x7e).contains(b)) {
            return Err(BadKey::NotVisibleAscii {
                at,
                byte: bytes[at],
            });
        }
        let key = std::str::from_utf8(bytes).expect("ASCII is UTF-8");
        Ok(IdempotencyKey(key.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key in a tenant's own space: `<tenant> <key>`. A space is in no key a client
    /// gives, so no tenant's key (nor the admin's) can be another's.
    pub fn scoped(self, tenant: &str) -> Self {
        IdempotencyKey(format!("{tenant} {}", self.0))
    }

    /// A stored key, scoped or not, if it follows the rule.
    pub(super) fn restored(key: &str) -> Result<Self, BadKey> {
        match key.split_once(' ') {
            Some((tenant, key)) if !tenant.is_empty() => {
                Self::parse(key.as_bytes()).map(|k| k.scoped(tenant))
            }
            _ => Self::parse(key.as_bytes()),
        }
    }
}

impl FromStr for IdempotencyKey {
    type Err = BadKey;

    fn from_str(s: &str) -> Result<Self, BadKey> {
        Self::parse(s.as_bytes())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_1_to_255_bytes_of_visible_ascii() {
        assert_eq!(IdempotencyKey::parse(b"a").unwrap().as_str(), "a");
        let longest = "~".repeat(MAX_KEY_BYTES);
        assert_eq!(
            IdempotencyKey::parse(longest.as_bytes()).unwrap().0,
            longest
        );
        let all: Vec<u8> = (0x21..=0x7e).collect();
        assert!(IdempotencyKey::parse(&all).is_ok(), "every visible byte");

        assert_eq!(IdempotencyKey::parse(b""), Err(BadKey::Empty));
        assert_eq!(
            IdempotencyKey::parse("k".repeat(256).as_bytes()),
            Err(BadKey::TooLong { bytes: 256 })
        );
        for (key, at, byte) in [
            (&b"a b"[..], 1, b' '),
            (b"tab\t", 3, b'\t'),
            (b"\x7f", 0, 0x7f),
            ("caf\u{e9}".as_bytes(), 3, 0xc3),
        ] {
            assert_eq!(
                IdempotencyKey::parse(key),
                Err(BadKey::NotVisibleAscii { at, byte })
            );
        }
        let message = BadKey::TooLong { bytes: 256 }.to_string();
        assert!(
            message.contains("256 bytes, over the limit of 255"),
            "{message}"
        );
        assert!(message.contains("0x21-0x7e"), "{message}");
        assert_eq!(
            BadKey::NotVisibleAscii { at: 1, byte: b' ' }.to_string(),
            "byte 1 of the Idempotency-Key is 0x20: an Idempotency-Key is 1 to 255 bytes \
             of visible ASCII (0x21-0x7e)"
        );
    }
}
