//! Graphs: jobs submitted together in one request, whose inputs may name each other's
//! results by the jobs' local names (`POST /v1/graphs`), and what the driver says about
//! them (`GET /v1/graphs/{id}`). Each job of a graph is an ordinary job.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{JobSpec, JobState, TaskCounts};
use crate::ids::JobId;

/// A graph as submitted: its jobs by local name (`[A-Za-z0-9_-]{1,64}`, not starting
/// with `job-`). A `result` or `results` input may name another job of the graph by
/// that name (`{"results": {"job": "map"}}`); its tasks wait until the results they
/// read have succeeded.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GraphSpec {
    pub jobs: BTreeMap<String, JobSpec>,
}

/// What `POST /v1/graphs` answers: the graph's id, the id each job got, and the
/// graph's state (with `?wait=`, maybe ended).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GraphCreated {
    pub id: String,
    pub jobs: BTreeMap<String, JobId>,
    pub state: JobState,
}

/// A graph as it stands: its state (running until every job has ended; then succeeded,
/// or failed or killed as its jobs were), every job with its state and counts, and the
/// edges (`from` is read by `to`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GraphView {
    pub id: String,
    pub state: JobState,
    pub created_at_ms: u64,
    pub jobs: BTreeMap<String, GraphJobView>,
    pub edges: Vec<GraphEdge>,
    /// The graph this one recovers, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_from: Option<String>,
}

/// One job of a graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GraphJobView {
    pub id: JobId,
    pub state: JobState,
    pub tasks: u32,
    pub counts: TaskCounts,
    /// Why it failed or was killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<super::ErrorBody>,
}

/// Job `to` reads results of job `from` (by local names).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GraphEdge {
    pub from: String,
    pub to: String,
}

impl GraphView {
    /// A graph's state from its jobs': running while any runs (queued while none has
    /// started), else failed if any failed, killed if any was killed, else succeeded.
    pub fn state_of(jobs: impl IntoIterator<Item = JobState>) -> JobState {
        let (mut open, mut started, mut failed, mut killed) = (false, false, false, false);
        for state in jobs {
            match state {
                JobState::Queued => open = true,
                JobState::Running => (open, started) = (true, true),
                JobState::Failed => failed = true,
                JobState::Killed => killed = true,
                JobState::Succeeded => started = true,
            }
        }
        match (open, started, failed, killed) {
            (true, false, false, false) => JobState::Queued,
            (true, ..) => JobState::Running,
            (false, _, true, _) => JobState::Failed,
            (false, _, false, true) => JobState::Killed,
            _ => JobState::Succeeded,
        }
    }
}
