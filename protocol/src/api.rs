//! JSON shapes of the driver's HTTP API (see API.md). Fields may be added, not renamed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{Digest, ExecutorId, JobId};

/// `POST /v1/jobs`. Exactly one of `inputs` (one task per input) and `tasks` is given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An uploaded module's id, `sha256:<hex>`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^sha256:[0-9a-f]{64}$"))]
    pub module: String,
    /// Files the tasks read at `/files/<name>`: name -> an uploaded file's id
    /// (`PUT /v1/files`). Names are 1-128 of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
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
}

/// A task's input: `{"text": "..."}` or `{"base64": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum InputSpec {
    Text(String),
    Base64(String),
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
    #[cfg_attr(feature = "openapi", schema(maximum = 16_777_216))]
    pub max_output_bytes: Option<u64>,
    /// Wasm work the task may do (wasmtime fuel); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub fuel: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Killed,
}

impl JobState {
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Killed
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Pending,
    Running,
    Succeeded,
    Failed,
    Killed,
}

impl TaskState {
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Killed
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub kind: String,
    pub message: String,
}

/// Every error response: `{"error": {"kind": ..., "message": ...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskCounts {
    pub pending: u32,
    pub running: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub killed: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    pub id: JobId,
    pub name: String,
    pub state: JobState,
    /// RFC 3339.
    pub created_at: String,
    pub finished_at: Option<String>,
    pub tasks: u32,
    pub counts: TaskCounts,
    pub error: Option<ErrorBody>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResultInfo {
    pub size: u64,
    pub sha256: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskView {
    pub index: u32,
    pub state: TaskState,
    pub attempts: u32,
    pub executor: Option<ExecutorId>,
    pub exit_code: Option<i32>,
    pub error: Option<ErrorBody>,
    pub result: Option<ResultInfo>,
    /// RFC 3339 with microseconds, from the executor's clock: when the guest of the latest
    /// attempt started and ended.
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecutorState {
    /// Registered and connected.
    Alive,
    /// Its connection closed; its running tasks went back to pending.
    Lost,
    /// A process `flint dev` started has exited (see `exit_code`).
    Exited,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecutorView {
    pub id: ExecutorId,
    pub host: String,
    pub state: ExecutorState,
    pub cores: u32,
    pub free_cores: u32,
    pub running: u32,
    pub generation: u64,
    /// Milliseconds since the last heartbeat (or registration).
    pub last_heartbeat_ms: Option<u64>,
    pub pid: Option<u32>,
    /// Exit code of an executor process started by `flint dev`, once it has exited.
    pub exit_code: Option<i32>,
    pub tasks_finished: u64,
    /// Started with `--fuel`: takes tasks with fuel budgets.
    pub meters_fuel: bool,
    /// From its latest heartbeat: modules it compiled, and tasks that found their module
    /// already compiled in memory.
    pub modules_compiled: u64,
    pub module_cache_hits: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct List<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

/// `PUT /v1/modules` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Uploaded {
    pub id: Digest,
    pub size: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_spec_reads_the_documented_shape() {
        let spec: JobSpec = serde_json::from_str(
            r#"{"name":"wc","module":"sha256:00","args":["--top","10"],"env":{"LANG":"C"},
                "inputs":[{"text":"a b"},{"base64":"YQ=="}],
                "resources":{"cores":2,"timeout_ms":1000},"max_failures":2}"#,
        )
        .unwrap();
        assert_eq!(
            spec.inputs.unwrap(),
            vec![
                InputSpec::Text("a b".into()),
                InputSpec::Base64("YQ==".into())
            ]
        );
        assert_eq!(spec.resources.cores, Some(2));
        assert_eq!(spec.resources.memory_mb, None);
    }

    #[test]
    fn job_spec_names_unknown_fields() {
        let err = serde_json::from_str::<JobSpec>(r#"{"module":"m","colour":"red"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `colour`"), "{err}");
        let err = serde_json::from_str::<JobSpec>(r#"{"module":"m","inputs":[{"txt":"a"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `txt`"), "{err}");
    }
}
