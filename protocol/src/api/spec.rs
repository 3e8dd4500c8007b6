//! What a client submits: `POST /v1/jobs` and the shapes inside it (files, inputs, tasks,
//! resources). Apart from the views because these are read from untrusted JSON (unknown
//! fields refused, inputs checked for exactly one shape) where views are only written.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::JobId;

/// `POST /v1/jobs`. Exactly one of `inputs` (one task per input) and `tasks` is given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An uploaded module's id, `sha256:<hex>`, or a URL (`http://`, `https://`,
    /// `s3://`, `file://`) the executors fetch where their URL policy allows it, cached by
    /// (URL, the time the driver first saw it). No pattern in the OpenAPI document: one
    /// for URLs would have API fuzzers make executors dial whatever address they invent.
    pub module: String,
    /// For a module by URL: what its bytes must hash to (`<hex>` or `sha256:<hex>`). An
    /// executor that fetches other bytes fails the task as `fetch_error`, naming both
    /// digests. Refused with an uploaded module's id (that id is its digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_sha256: Option<String>,
    /// For a module by URL: when its content was (re)published, ms since the Unix
    /// epoch. Executors cache a module by (URL, timestamp), so a newer timestamp makes
    /// them fetch it again. Left out, it is when the driver first saw the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_timestamp_ms: Option<u64>,
    /// Files the tasks read at `/files/<name>`: name -> an uploaded file's id
    /// (`PUT /v1/files`) or `{"url": ..., "sha256": ...}`. Names are 1-128 of
    /// `A-Z a-z 0-9 . _ -`, not `.` or `..`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, FileSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1_000_000))]
    pub inputs: Option<Vec<InputSpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1_000_000))]
    pub tasks: Option<Vec<TaskSpec>>,
    #[serde(default)]
    pub resources: ResourcesSpec,
    /// Attempts per task when the host fails it (executor lost, fetch error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_failures: Option<u32>,
    /// Cap on the sum of the job's results (Spark's `maxResultSize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_result_bytes: Option<u64>,
    /// `"exact"`: count each attempt's wasm work in fuel too (`usage.fuel`); the job
    /// then runs only on executors that meter fuel (`--fuel`). `"standard"` (the default)
    /// counts time, memory and bytes, which cost nothing measurable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounting: Option<Accounting>,
    /// Run every task with a virtual clock (from 2000-01-01T00:00:00Z, moved only by the
    /// guest's own sleeps), a random source seeded from `seed` and the task's index, no
    /// `FLINT_JOB_ID` or `FLINT_ATTEMPT`, and its module, files and input pinned by
    /// digest (each attempt's `pins`): two runs of a task see the same bytes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deterministic: bool,
    /// The seed of a deterministic job (derived from the spec and recorded when left
    /// out: the same spec, the same seed). Only with `deterministic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Take a task's result from an earlier task that ran the same (module, input, args,
    /// env, files, seed, index and limits, all by SHA-256) and succeeded, instead of
    /// running it. Only with `deterministic`; a module, file or input by URL needs its
    /// `sha256`. Results up to the inline limit are kept for this.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memoize: bool,
    /// What a task that fails by running out of memory or time does next: see
    /// [`RetrySpec`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// Among its tenant's jobs, higher goes first (0 by default; at most the tenant's
    /// `max_priority`, a negative one waits behind the rest). Between tenants, cores are
    /// shared by weight whatever the priorities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Outbound HTTP the tasks may make: none without it. Only within the tenant's
    /// `egress_allow` and the operator's `--egress-allow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
}

/// `"network": {"allow": [...]}`: the origins a job's tasks may call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// Origins, `scheme://host[:port]` (http or https; `*.` as the first label of a host
    /// admits its subdomains): `["https://api.example.com", "https://*.example.org:8443"]`.
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 64))]
    pub allow: Vec<String>,
}

/// A task's outbound HTTP budget (`resources.egress`); each left out is the default,
/// at most the tenant's maximum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EgressSpec {
    /// Requests per attempt (100 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_requests: Option<u32>,
    /// Bytes sent plus received per attempt (16 MiB by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_bytes: Option<u64>,
    /// Requests in flight at once (4 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_concurrent: Option<u32>,
}

/// How much a job's attempts are counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Accounting {
    #[default]
    Standard,
    Exact,
}

/// How a job retries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate: Option<EscalateSpec>,
}

/// Retries that learn: a task that failed with `memory_limit` (or `timeout`) runs again
/// with its memory (or time) multiplied by the factor, from the peak it was seen to
/// reach where that is more, up to the caps and the cluster's limits. Each attempt's
/// budget is in the task's `history`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EscalateSpec {
    /// Factor for memory after `memory_limit`, more than 1 and at most 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Factor>,
    /// Factor for the time limit after `timeout`, more than 1 and at most 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Factor>,
    /// The most memory an escalated attempt may have (default: the cluster's largest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_memory_mb: Option<u32>,
    /// The longest time limit an escalated attempt may have (default: the cluster's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_timeout_ms: Option<u64>,
}

/// A multiplier. Compared by its bits, so that a spec is `Eq` (the idempotency check
/// compares specs).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct Factor(pub f64);

impl PartialEq for Factor {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Factor {}

/// A job file: an uploaded file's id (`sha256:<hex>`), or a URL the executors fetch
/// (through their fetch cache and URL policy).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum FileSpec {
    Id(String),
    Url(UrlFileSpec),
}

impl From<&str> for FileSpec {
    fn from(id: &str) -> Self {
        FileSpec::Id(id.to_owned())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UrlFileSpec {
    pub url: String,
    /// What the bytes must hash to (`<hex>` or `sha256:<hex>`); checked by executors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// When the URL's content was (re)published, ms since the Unix epoch. Executors
    /// cache by (url, timestamp): a newer timestamp makes them fetch again. Left out,
    /// it is when the driver first saw the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_ms: Option<u64>,
}

/// A task's input (its stdin): `{"text": "..."}`, `{"base64": "..."}`,
/// `{"url": "...", "sha256": "<hex>"}` (fetched by the executor; `sha256` optional),
/// `{"result": {"job": "<id>", "task": N}}` (an earlier task's result: chained jobs), or
/// `{"results": {"job": "<id>", "tasks": [N, ...]}}` (several earlier results, one after
/// the other: a reduce over a map job).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawInput", into = "RawInput")]
pub enum InputSpec {
    Text(String),
    Base64(String),
    Url { url: String, sha256: Option<String> },
    Result(ResultRef),
    Results(ResultsRef),
}

/// An earlier task's result, by job and task index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResultRef {
    pub job: JobId,
    pub task: u32,
}

/// Earlier results concatenated in the order given: every task of `job` in index order
/// when `tasks` is left out, else the tasks it lists (repeats allowed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResultsRef {
    pub job: JobId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub tasks: Option<Vec<u32>>,
}

/// [`InputSpec`]'s JSON form: one object whose one key says which kind it is, so that a
/// wrong input gets an error naming the keys rather than "no variant matched".
#[derive(Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
struct RawInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<ResultRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    results: Option<ResultsRef>,
}

// The document shows the JSON form, which is what clients send.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for InputSpec {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <RawInput as utoipa::PartialSchema>::schema()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for InputSpec {
    fn name() -> std::borrow::Cow<'static, str> {
        "InputSpec".into()
    }
}

impl TryFrom<RawInput> for InputSpec {
    type Error = String;

    fn try_from(raw: RawInput) -> Result<Self, String> {
        let kinds = [
            raw.text.is_some(),
            raw.base64.is_some(),
            raw.url.is_some(),
            raw.result.is_some(),
            raw.results.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(
                "an input has exactly one of `text`, `base64`, `url` (with optional `sha256`), \
                 `result` and `results`"
                    .into(),
            );
        }
        if raw.sha256.is_some() && raw.url.is_none() {
            return Err("`sha256` goes with `url`".into());
        }
        Ok(match raw {
            RawInput { text: Some(t), .. } => InputSpec::Text(t),
            RawInput {
                base64: Some(b), ..
            } => InputSpec::Base64(b),
            RawInput {
                url: Some(url),
                sha256,
                ..
            } => InputSpec::Url { url, sha256 },
            RawInput {
                result: Some(r), ..
            } => InputSpec::Result(r),
            RawInput {
                results: Some(r), ..
            } => InputSpec::Results(r),
            RawInput { .. } => unreachable!("exactly one kind checked above"),
        })
    }
}

impl From<InputSpec> for RawInput {
    fn from(input: InputSpec) -> Self {
        match input {
            InputSpec::Text(text) => RawInput {
                text: Some(text),
                ..RawInput::default()
            },
            InputSpec::Base64(b) => RawInput {
                base64: Some(b),
                ..RawInput::default()
            },
            InputSpec::Url { url, sha256 } => RawInput {
                url: Some(url),
                sha256,
                ..RawInput::default()
            },
            InputSpec::Result(r) => RawInput {
                result: Some(r),
                ..RawInput::default()
            },
            InputSpec::Results(r) => RawInput {
                results: Some(r),
                ..RawInput::default()
            },
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// No input means empty stdin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<InputSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// Per-task needs; anything left out takes its default (README, limits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResourcesSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub cores: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub memory_mb: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 1_073_741_824))]
    pub max_output_bytes: Option<u64>,
    /// Wasm work the task may do (wasmtime fuel); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub fuel: Option<u64>,
    /// Outbound HTTP limits per attempt; only with `network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressSpec>,
}
