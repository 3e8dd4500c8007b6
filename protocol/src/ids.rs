//! Typed identifiers. Never pass a bare `String` or `u64` where one of these is meant.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

/// A job, named by the driver when it accepts the job.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub String);

/// An executor, named by whoever starts it (`--executor-id`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ExecutorId(pub String);

/// One task of a job: the job and the task's index in it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskId {
    pub job: JobId,
    pub index: u32,
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for ExecutorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.job, self.index)
    }
}

/// A SHA-256 digest, written `sha256:<64 hex digits>` wherever people see it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a digest: expected `sha256:` followed by 64 hex digits")]
pub struct ParseDigestError(pub String);

impl FromStr for Digest {
    type Err = ParseDigestError;

    /// Accepts `sha256:<hex>` and, for convenience, the bare hex.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex_part = s.strip_prefix("sha256:").unwrap_or(s);
        let mut out = [0u8; 32];
        if hex_part.len() != 64 || hex::decode_to_slice(hex_part, &mut out).is_err() {
            return Err(ParseDigestError(s.to_owned()));
        }
        Ok(Digest(out))
    }
}

// Text formats (JSON) see the `sha256:` string; binary frames carry the 32 raw bytes.
impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.collect_str(self)
        } else {
            self.0.serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            let s = String::deserialize(d)?;
            s.parse().map_err(serde::de::Error::custom)
        } else {
            <[u8; 32]>::deserialize(d).map(Digest)
        }
    }
}

/// OpenAPI schemas of the ids: all are strings on the wire.
#[cfg(feature = "openapi")]
mod openapi {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

    fn string(description: &str, pattern: Option<&str>) -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(description))
            .pattern(pattern)
            .into()
    }

    impl utoipa::PartialSchema for super::JobId {
        fn schema() -> RefOr<Schema> {
            string("A job's id, `job-<hex>`.", None)
        }
    }
    impl utoipa::ToSchema for super::JobId {}

    impl utoipa::PartialSchema for super::ExecutorId {
        fn schema() -> RefOr<Schema> {
            string("An executor's id, as it registered.", None)
        }
    }
    impl utoipa::ToSchema for super::ExecutorId {}

    impl utoipa::PartialSchema for super::Digest {
        fn schema() -> RefOr<Schema> {
            string("A SHA-256 content id.", Some("^sha256:[0-9a-f]{64}$"))
        }
    }
    impl utoipa::ToSchema for super::Digest {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_parses_what_it_prints() {
        let d = Digest::of(b"flint");
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        assert_eq!(d.hex().parse::<Digest>().unwrap(), d);
    }

    #[test]
    fn digest_rejects_wrong_length_and_non_hex() {
        assert!("sha256:abcd".parse::<Digest>().is_err());
        assert!(
            format!("sha256:{}", "zz".repeat(32))
                .parse::<Digest>()
                .is_err()
        );
        assert!("md5:00".parse::<Digest>().is_err());
    }

    #[test]
    fn digest_is_a_string_in_json_and_raw_bytes_in_frames() {
        let d = Digest::of(b"x");
        assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{d}\""));
        assert_eq!(
            serde_json::from_str::<Digest>(&format!("\"{d}\"")).unwrap(),
            d
        );
        let bin = postcard::to_stdvec(&d).unwrap();
        assert_eq!(bin.len(), 32);
        assert_eq!(postcard::from_bytes::<Digest>(&bin).unwrap(), d);
    }
}
