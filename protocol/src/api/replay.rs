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
