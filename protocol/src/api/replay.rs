//! `GET /v1/jobs/{id}/tasks/{index}/replay`: everything one attempt of a task ran with,
//! by digest where the driver knows it, so that `flint replay` can run it again locally in
//! the same sandbox and say whether it did the same thing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ErrorBody;
use crate::ids::JobId;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplayBundle {
    pub job: JobId,
    pub task: u32,
    /// The attempt replayed: the one asked for, else the task's latest.
    pub attempt: u32,
    /// Tasks in the job (`FLINT_TASK_COUNT`).
    pub task_count: u32,
    /// The guest's `argv[0]`: the job's name.
    pub name: String,
    pub module: ReplaySource,
    /// The job's files, by the name the guest reads them at under `/files`.
    pub files: BTreeMap<String, ReplaySource>,
    /// The task's stdin, in parts to be joined in order.
    pub input: Vec<ReplayInputPart>,
    /// SHA-256 of the whole stdin, where the attempt recorded it (deterministic jobs).
    pub input_sha256: Option<String>,
    /// The job's args, then the task's.
    pub args: Vec<String>,
    /// The job's env under the task's (the `FLINT_*` ones are the sandbox's to set).
    pub env: BTreeMap<String, String>,
    pub deterministic: bool,
    pub seed: Option<u64>,
    /// The budget the attempt ran with.
    pub memory_mb: u32,
    pub timeout_ms: u64,
    pub max_output_bytes: u64,
    pub fuel: Option<u64>,
    /// How the attempt ended (`succeeded`, a failure kind, `lost`), none while it runs.
    pub outcome: Option<String>,
    /// The task's recorded failure and log, where this attempt is the one that decided
    /// the task (its last); for an earlier attempt only `outcome` was kept.
    pub error: Option<ErrorBody>,
    pub log_sha256: Option<String>,
    /// The recorded result's SHA-256, for the attempt that succeeded.
    pub result_sha256: Option<String>,
    /// The job's `network` as admitted, which a replay judges the guest's requests by
    /// (the job's and its tenant's lists, the limits); `None`: it had no network.
    #[serde(default)]
    pub network: Option<ReplayNetwork>,
    /// The attempt's outbound requests in the order its guest made them, each with
    /// where its recorded response lies on `egress_tape` (a deterministic attempt).
    #[serde(default)]
    pub egress: Vec<ReplayEgress>,
    /// The recorded responses, one after the other; `None` when the attempt made no
    /// request, or ran where there was no block store to keep them (then it cannot be
    /// replayed).
    #[serde(default)]
    pub egress_tape: Option<ReplaySource>,
}

/// A job's outbound HTTP as its attempts ran under it. The operator's `--egress-allow`
/// is not here (it is the operator's): every entry of `allow` was inside it at submit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplayNetwork {
    /// The job's `network.allow`.
    pub allow: Vec<String>,
    /// Its tenant's `egress_allow`; `None` for the admin's jobs.
    pub tenant_allow: Option<Vec<String>>,
    pub max_requests: u32,
    pub max_bytes: u64,
    pub max_concurrent: u32,
}

/// One recorded request and where its response lies on the tape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplayEgress {
    pub method: String,
    pub url: String,
    /// SHA-256 of the request's body (`sha256:<hex>`).
    pub request_sha256: String,
    /// The response's status; 0 when the guest was given an error instead.
    pub status: u16,
    /// SHA-256 of the record's bytes on the tape, `offset` and `len` bytes.
    pub response_sha256: String,
    pub offset: u64,
    pub len: u64,
}

/// Where to get a module or file, and what its bytes hash to (`sha256:<hex>`). A `url`
/// that starts with `/` is a path of the driver's API (an upload or a block it serves).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplaySource {
    pub url: String,
    pub sha256: Option<String>,
}

/// A part of a task's stdin: bytes the driver holds, or a place to fetch them from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum ReplayInputPart {
    Inline { base64: String },
    Fetch(ReplaySource),
}
