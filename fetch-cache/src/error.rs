//! What a failed fetch was, and whose fault: the source's, or the executor's own disk.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flint_protocol::Digest;

use crate::policy::{FileProblem, Refusal};

/// Whose fault a failed fetch is: a task whose input is bad fails wherever it runs,
/// while a host whose disk is bad fails every task it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    /// What the job or the driver referred to: the URL, the policy's verdict on it, its
    /// name, server, file or bucket, its bytes, its size, how long it took.
    Source,
    /// The executor's own cache directory: its disk, temp files, index and key records.
    Executor,
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("fetching {url}: refused: {reason}")]
    Refused { url: String, reason: Refusal },
    #[error("fetching {url}: resolving the host: {source}")]
    Resolve {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("fetching {url}: {source}")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("fetching {url}: object store: {message}")]
    ObjectStore { url: String, message: String },
    #[error("fetching {url}: HTTP status {status}")]
    Status { url: String, status: u16 },
    #[error("fetching {url}: more than the {max_bytes}-byte limit")]
    TooLarge { url: String, max_bytes: u64 },
    #[error("fetching {url}: not done within the {timeout:?} deadline")]
    Deadline { url: String, timeout: Duration },
    #[error("fetching {url}: expected {expected} but the bytes hash to {actual}")]
    DigestMismatch {
        url: String,
        expected: Digest,
        actual: Digest,
    },
    /// A `file://` source that cannot be read as a file; the canonical path it resolved
    /// to is the host's business and stays out of the message.
    #[error("fetching {url}: {problem}")]
    File {
        url: String,
        #[source]
        problem: FileProblem,
    },
    /// I/O on the cache's own directory, the only failure that is the executor's.
    #[error("cache at {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl FetchError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        FetchError::Io {
            path: path.to_owned(),
            source,
        }
    }

    /// Whether trying the same fetch again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            FetchError::Resolve { .. }
            | FetchError::Request { .. }
            | FetchError::Deadline { .. }
            | FetchError::Io { .. }
            | FetchError::ObjectStore { .. } => true,
            FetchError::Status { status, .. } => *status >= 500 || *status == 429,
            // A missing file may be on another host, or there once a mount is up; a FIFO
            // or a directory stays one.
            FetchError::File { problem, .. } => matches!(problem, FileProblem::Unreadable(_)),
            FetchError::Refused { .. }
            | FetchError::TooLarge { .. }
            | FetchError::DigestMismatch { .. } => false,
        }
    }

    /// Whose fault this failure is.
    pub fn blame(&self) -> Blame {
        match self {
            // A disk filled by what jobs fetched (pinned blobs are never evicted) says
            // more about the jobs than the host; blaming the host would let one job
            // fetching gigabytes exclude every executor it lands on.
            FetchError::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
                Blame::Source
            }
            FetchError::Io { .. } => Blame::Executor,
            FetchError::Refused { .. }
            | FetchError::Resolve { .. }
            | FetchError::Request { .. }
            | FetchError::ObjectStore { .. }
            | FetchError::Status { .. }
            | FetchError::TooLarge { .. }
            | FetchError::Deadline { .. }
            | FetchError::DigestMismatch { .. }
            | FetchError::File { .. } => Blame::Source,
        }
    }
}
