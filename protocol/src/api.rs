//! JSON shapes of the driver's HTTP API (the README's "HTTP API" is their reference).
//! Fields may be added, not renamed.
//!
//! [`spec`] holds what clients submit, [`jobs`] what the driver says about jobs and tasks,
//! [`cluster`] what it says about executors and workers, [`replay`] what one attempt ran
//! with, [`error`] what a failed request answers (its kinds and their statuses); this
//! file the shapes every endpoint shares (lists, uploads, a failure's kind and message).

mod cluster;
mod error;
mod graphs;
mod jobs;
mod replay;
mod spec;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::ids::Digest;

pub use cluster::{
    AllocationView, ClusterHistory, ClusterSample, ExecutorList, ExecutorState, ExecutorView,
    WorkerView,
};
pub use error::{CodedError, ErrorCode, ErrorResponse, RequestError};
pub use graphs::{GraphCreated, GraphEdge, GraphJobView, GraphSpec, GraphView};
pub use jobs::{
    AttemptNote, AttemptView, EgressDenial, EgressPinView, JobState, JobView, LaggedEvent,
    MemoSource, PinsView, ResultInfo, TaskAttemptView, TaskCounts, TaskEvent, TaskState, TaskView,
    TimelineView,
};
pub use replay::{ReplayBundle, ReplayEgress, ReplayInputPart, ReplayNetwork, ReplaySource};
pub use spec::{
    Accounting, EgressSpec, EscalateSpec, Factor, FileSpec, InputSpec, JobSpec, NetworkSpec,
    ResourcesSpec, ResultRef, ResultsRef, RetrySpec, TaskSpec, UrlFileSpec,
};

/// Why a job or a task failed: a kind callers can branch on (a task's failure kind,
/// `task_failed`, `executor_lost`, ...; not an [`ErrorCode`], which is a request's) and a
/// message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub kind: String,
    pub message: String,
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

/// `GET /v1/tenants/{name}/usage`: what a tenant holds now and what its attempts used.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantUsage {
    pub tenant: String,
    /// Queued and running jobs.
    pub live_jobs: u64,
    pub pending_tasks: u64,
    pub running_tasks: u64,
    /// Cores its running tasks hold.
    pub running_cores: u64,
    /// Bytes of the modules and files it uploaded (shared uploads are the admin's).
    pub storage_bytes: u64,
    /// Its attempts since the driver started: how many reported their end, how many
    /// succeeded, and their CPU time, guest run time and result bytes, summed.
    pub attempts: u64,
    pub tasks_succeeded: u64,
    pub cpu_seconds: f64,
    pub wall_seconds: f64,
    pub output_bytes: u64,
    /// Their outbound HTTP requests, and the bytes those sent and received.
    #[serde(default)]
    pub egress_requests: u64,
    #[serde(default)]
    pub egress_bytes_sent: u64,
    #[serde(default)]
    pub egress_bytes_received: u64,
}
