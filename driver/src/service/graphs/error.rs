//! Why a graph could not be submitted, read, killed, recovered or deleted, and the code
//! each reason answers with.

use flint_protocol::JobId;
use flint_protocol::api::{CodedError, ErrorCode};

use crate::admission::Rejection;
use crate::service::deletion::DeleteError;
use crate::service::submission::SubmitError;
use crate::store::StoreError;

/// Why a graph could not be submitted, read, killed, recovered or deleted.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("no graph {0}")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Deleting one of its jobs was refused (it runs, or a job outside the graph that
    /// has not ended reads it).
    #[error("graph {graph}: {error}")]
    Delete { graph: String, error: DeleteError },
    #[error(
        "graph {0} has jobs that have not ended; kill it first (POST /v1/graphs/{0}/kill), or wait"
    )]
    Running(String),
    #[error("graph {0} succeeded: there is nothing to recover")]
    Succeeded(String),
    #[error("graph {graph}: its job {job} was deleted, so it cannot be recovered")]
    Gone { graph: String, job: JobId },
    /// The recovered graph was refused as a new one would be.
    #[error(transparent)]
    Submit(#[from] SubmitError),
}

impl From<Rejection> for GraphError {
    fn from(r: Rejection) -> Self {
        GraphError::Submit(SubmitError::Rejected(r))
    }
}

impl CodedError for GraphError {
    fn code(&self) -> ErrorCode {
        match self {
            GraphError::NotFound(_) => ErrorCode::GraphNotFound,
            GraphError::Store(e) => e.code(),
            GraphError::Delete { error, .. } => error.code(),
            GraphError::Running(_) => ErrorCode::JobRunning,
            GraphError::Succeeded(_) => ErrorCode::InvalidSpec,
            GraphError::Gone { .. } => ErrorCode::JobNotFound,
            GraphError::Submit(e) => e.code(),
        }
    }
}
