//! Reads of what the driver holds, as the API asks for them: a job that must exist, and
//! the job store read off the runtime (its reads block on the disk: they run on tokio's
//! blocking pool, [`off_runtime`], never on the threads that serve requests), with what
//! each failure answers.

use std::sync::Arc;

use flint_protocol::JobId;
use flint_protocol::api::{CodedError, ErrorCode, JobView};
use flint_protocol::records::JobRecord;

use super::Driver;
use crate::scheduler::{Job, Task};
use crate::store::StoreError;

/// Blocking work of a request that did not finish: its thread panicked (or the runtime
/// is shutting down). The driver's fault.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Panicked(String);

impl CodedError for Panicked {
    fn code(&self) -> ErrorCode {
        ErrorCode::Internal
    }
}

/// Runs `work` on tokio's blocking pool.
pub(super) async fn off_runtime<R: Send + 'static>(
    work: impl FnOnce() -> R + Send + 'static,
) -> Result<R, Panicked> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Panicked(e.to_string()))
}

/// Why a job could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Never submitted, or deleted (or another tenant's, which answers alike).
    #[error("no job {0}")]
    NotFound(JobId),
    #[error("job {job} has no task {index}")]
    NoTask { job: JobId, index: u32 },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Panicked(#[from] Panicked),
}

impl CodedError for ReadError {
    fn code(&self) -> ErrorCode {
        match self {
            ReadError::NotFound(_) => ErrorCode::JobNotFound,
            ReadError::NoTask { .. } => ErrorCode::TaskNotFound,
            ReadError::Store(e) => e.code(),
            ReadError::Panicked(e) => e.code(),
        }
    }
}

impl Driver {
    /// [`Driver::job`] of a job that must exist: one the driver does not hold is
    /// [`ReadError::NotFound`].
    pub fn existing_job<R>(&self, id: &JobId, f: impl FnOnce(&Job) -> R) -> Result<R, ReadError> {
        self.job(id, f)?
            .ok_or_else(|| ReadError::NotFound(id.clone()))
    }

    /// The view of a job that must exist.
    pub fn existing_job_view(&self, id: &JobId) -> Result<JobView, ReadError> {
        self.existing_job(id, crate::views::job_view)
    }

    /// Runs `f` on task `index` of a job that must exist, live or finished.
    pub fn existing_task<R>(
        &self,
        id: &JobId,
        index: u32,
        f: impl FnOnce(&Task) -> R,
    ) -> Result<R, ReadError> {
        self.existing_job(id, |job| job.tasks.get(index as usize).map(f))?
            .ok_or_else(|| ReadError::NoTask {
                job: id.clone(),
                index,
            })
    }

    /// A job as it was submitted ([`Driver::job_record`]), read off the runtime.
    pub async fn stored_job(self: &Arc<Self>, id: &JobId) -> Result<JobRecord, ReadError> {
        let (driver, job) = (self.clone(), id.clone());
        off_runtime(move || driver.job_record(&job))
            .await??
            .ok_or_else(|| ReadError::NotFound(id.clone()))
    }
}
