//! Deleting jobs (`DELETE /v1/jobs/{id}` and retention) with everything they own, and
//! the uploads no stored job names any more.
//!
//! A job's blocks go first (local or in the object store), then everything the job store
//! holds of it in one transaction (record, task ends with their inline results and logs,
//! end, summary, index entries, idempotency key). A crash in between leaves a job whose
//! blocks are gone but which is still listed, finished and old: the next retention round
//! (or a repeated `DELETE`) finishes the deletion. The other order would leave blocks no
//! job names, which nothing would ever find again.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::collections::HashMap;

use flint_protocol::api::{CodedError, ErrorCode};
use flint_protocol::{FetchRef, InputPart, JobId, TaskInput};

use super::Driver;
use crate::scheduler::ClusterState;
use crate::store::{Deleted, StoreError};

/// Why a job was not deleted.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error("no job {0}")]
    NotFound(JobId),
    #[error("job {0} is still running; kill it first (POST /v1/jobs/{0}/kill)")]
    Running(JobId),
    #[error(
        "job {job} is an input of job {reader}, which has not ended; delete it once that \
         job has (or kill that job first)"
    )]
    InUse { job: JobId, reader: JobId },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("job {job}: deleting its blocks: {message}")]
    Blocks { job: JobId, message: String },
}

/// Refused (404, 409) or failed (500, 507).
impl CodedError for DeleteError {
    fn code(&self) -> ErrorCode {
        match self {
            DeleteError::NotFound(_) => ErrorCode::JobNotFound,
            DeleteError::Running(_) => ErrorCode::JobRunning,
            DeleteError::InUse { .. } => ErrorCode::JobInUse,
            DeleteError::Store(e) => e.code(),
            DeleteError::Blocks { .. } => ErrorCode::Storage,
        }
    }
}

/// How long a deletion waits for the killed attempts of an ended job to stop.
const STOPPING: Duration = Duration::from_secs(10);

/// Jobs retention deletes per store read.
const SWEEP_PAGE: usize = 256;

impl Driver {
    /// Deletes a finished job and everything it owns. A live one is refused: kill it
    /// first.
    pub async fn delete_job(self: &Arc<Self>, id: &JobId) -> Result<(), DeleteError> {
        // A job that has ended may still be in the scheduler's state for an epoch tick,
        // until its killed attempts report back: wait for that, not for a running job.
        let deadline = tokio::time::Instant::now() + STOPPING;
        let unsaved = loop {
            {
                let inner = self.lock();
                if let Some(reader) = readers_of(&inner.state, &[id]).remove(id) {
                    return Err(DeleteError::InUse {
                        job: id.clone(),
                        reader,
                    });
                }
                match inner.state.jobs.get(id).map(|j| j.state.is_final()) {
                    None => break inner.archive.is_unsaved(id),
                    Some(false) => return Err(DeleteError::Running(id.clone())),
                    Some(true) if tokio::time::Instant::now() >= deadline => {
                        return Err(DeleteError::Running(id.clone()));
                    }
                    Some(true) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let driver = self.clone();
        let job = id.clone();
        let exists = blocking(move || {
            if unsaved {
                // Its end is still on its way to the store: once there, it is deleted
                // with the rest, and nothing written later brings it back.
                driver.jobs.store.flush();
            }
            driver.jobs.store.summary(&job)
        })
        .await??;
        if exists.is_none() {
            return Err(DeleteError::NotFound(id.clone()));
        }
        let blocks = self.delete_blocks(id).await?;
        let driver = self.clone();
        let job = id.clone();
        let deleted = blocking(move || driver.jobs.store.delete_job(&job)).await??;
        match deleted {
            Some(deleted) => {
                self.forget_deleted(id, &deleted).await;
                tracing::info!(job = %id, blocks, "job deleted");
                Ok(())
            }
            // Deleted by another request meanwhile.
            None => Err(DeleteError::NotFound(id.clone())),
        }
    }

    /// Deletes a job's blocks; how many there were.
    async fn delete_blocks(&self, id: &JobId) -> Result<u64, DeleteError> {
        self.uploads
            .blocks
            .delete_job(id)
            .await
            .map_err(|e| DeleteError::Blocks {
                job: id.clone(),
                message: e.to_string(),
            })
    }

    /// What a deletion leaves to undo in memory: the job's cached copy, its totals, its
    /// idempotency key.
    async fn forget_deleted(&self, id: &JobId, deleted: &Deleted) {
        {
            let mut inner = self.lock();
            inner.archive.remove(id);
            inner.archive.deletions += 1;
            inner.finished.add(&deleted.summary, -1);
        }
        if let Some(key) = &deleted.key {
            self.jobs.idempotency.forget(key, id).await;
        }
        self.metrics.job_deleted();
    }

    /// Deletes finished jobs (retention's page of them) as [`Self::delete_job`] does,
    /// their store records in one transaction. Jobs still live are left for the next
    /// round. How many were deleted.
    async fn delete_finished(self: &Arc<Self>, ids: Vec<JobId>) -> Result<u64, DeleteError> {
        let ids: Vec<JobId> = {
            let inner = self.lock();
            let wanted: Vec<&JobId> = ids.iter().collect();
            let read = readers_of(&inner.state, &wanted);
            // A job still live, or one whose results a live job still reads, waits for a
            // later round.
            ids.iter()
                .filter(|id| !inner.state.jobs.contains_key(id) && !read.contains_key(id))
                .cloned()
                .collect()
        };
        if ids.iter().any(|id| self.lock().archive.is_unsaved(id)) {
            let driver = self.clone();
            blocking(move || driver.jobs.store.flush()).await?;
        }
        for id in &ids {
            self.delete_blocks(id).await?;
        }
        let driver = self.clone();
        let deleted = blocking(move || driver.jobs.store.delete_jobs(&ids)).await??;
        for (id, d) in &deleted {
            self.forget_deleted(id, d).await;
        }
        Ok(deleted.len() as u64)
    }

    /// One round of retention: deletes the jobs that finished more than `--job-retention`
    /// ago, then the uploads that no stored job names and that are older than
    /// `--blob-retention`. Returns the jobs and blobs deleted.
    pub async fn sweep(self: &Arc<Self>) -> (u64, u64) {
        let now = SystemTime::now();
        let mut jobs = 0;
        if let Some(retention) = self.config.job_retention {
            let cutoff = unix_ms(now.checked_sub(retention).unwrap_or(UNIX_EPOCH));
            loop {
                let driver = self.clone();
                let page = blocking(move || driver.jobs.store.finished_before(cutoff, SWEEP_PAGE));
                let ids = match page.await.and_then(|page| page) {
                    Ok(ids) => ids,
                    Err(e) => {
                        tracing::error!(error = %e, "retention: reading the job store");
                        break;
                    }
                };
                let full = ids.len() == SWEEP_PAGE;
                match self.delete_finished(ids).await {
                    // Nothing deletable in a full page (its jobs still stopping): the
                    // next round.
                    Ok(0) => break,
                    Ok(n) => jobs += n,
                    Err(e) => {
                        tracing::error!(error = %e, "retention: deleting jobs");
                        return (jobs, 0);
                    }
                }
                if !full {
                    break;
                }
            }
        }
        let blobs = match self.config.blob_retention {
            Some(retention) => self.sweep_blobs(now, retention).await,
            None => 0,
        };
        (jobs, blobs)
    }

    /// Deletes uploads (modules and files) that no stored job names and that were stored
    /// more than `retention` ago.
    async fn sweep_blobs(self: &Arc<Self>, now: SystemTime, retention: Duration) -> u64 {
        let cutoff = unix_ms(now.checked_sub(retention).unwrap_or(UNIX_EPOCH));
        let driver = self.clone();
        let swept = tokio::task::spawn_blocking(move || {
            // Jobs accepted into the journal are counted once folded.
            driver.jobs.store.flush();
            let mut deleted = 0;
            for (files, store) in [(false, &driver.uploads.modules), (true, &driver.uploads.files)] {
                for (digest, info) in store.list() {
                    if info.timestamp_ms >= cutoff {
                        continue;
                    }
                    match driver.jobs.store.blob_refs(&digest, files) {
                        // Unless uploaded again or named by a job admitted since.
                        Ok(0) => match store.delete_unused(&digest, cutoff) {
                            Ok(true) => {
                                deleted += 1;
                                if let Err(e) = driver.forget_upload(&digest, files) {
                                    tracing::error!(error = %e, "retention: forgetting an upload's owners");
                                }
                            }
                            Ok(false) => {}
                            Err(e) => tracing::error!(error = %e, "retention: deleting an upload"),
                        },
                        Ok(_) => {}
                        Err(e) => {
                            tracing::error!(error = %e, "retention: reading the job store");
                            return deleted;
                        }
                    }
                }
            }
            deleted
        })
        .await;
        swept.unwrap_or(0)
    }
}

/// Runs a job-store call off the runtime.
async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Db(format!("job store thread: {e}")))
}

/// Which of `jobs` a live job's unfinished task reads results of (through a `result` or
/// `results` input the executors fetch: a block, or a result too large to travel in the
/// launch; or one it waits for), and one such reader of each. A scan of the live tasks'
/// inputs.
fn readers_of(state: &ClusterState, jobs: &[&JobId]) -> HashMap<JobId, JobId> {
    let mut found = HashMap::new();
    if jobs.is_empty() {
        return found;
    }
    for (reader, job) in &state.jobs {
        for task in job.tasks.iter().filter(|t| !t.state.is_final()) {
            if let TaskInput::Upstream(u) = &task.input
                && let Some(wanted) = jobs.iter().find(|j| **j == u.job())
            {
                found
                    .entry((*wanted).clone())
                    .or_insert_with(|| reader.clone());
                continue;
            }
            let fetches: Vec<&FetchRef> = match &task.input {
                TaskInput::Fetch(f) => vec![&**f],
                TaskInput::Parts(parts) => parts
                    .iter()
                    .filter_map(|p| match p {
                        InputPart::Fetch(f) => Some(f),
                        InputPart::Inline(_) => None,
                    })
                    .collect(),
                TaskInput::Inline(_) | TaskInput::Upstream(_) => Vec::new(),
            };
            for fetch in fetches.into_iter().filter(|f| f.served_by_driver()) {
                if let Some(source) = source_job(&fetch.url)
                    && let Some(wanted) = jobs.iter().find(|j| j.0 == source)
                {
                    found
                        .entry((*wanted).clone())
                        .or_insert_with(|| reader.clone());
                }
            }
        }
    }
    found
}

/// The job whose result a driver-made fetch URL reads: `.../v1/jobs/<job>/tasks/<i>/result`,
/// or a block `.../<job>/<name>` (the driver's `/v1/blocks/` or an object store prefix).
fn source_job(url: &str) -> Option<&str> {
    if let Some((_, rest)) = url.split_once("/v1/jobs/") {
        return rest.split('/').next();
    }
    let mut segments = url.rsplit('/');
    segments.next()?;
    segments.next()
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::source_job;

    #[test]
    fn the_source_of_a_driver_made_fetch_is_the_job_it_names() {
        let cases = [
            ("http://d:7070/v1/jobs/job-a/tasks/3/result", Some("job-a")),
            ("http://d:7070/v1/blocks/job-b/0-1-17", Some("job-b")),
            ("s3://bucket/prefix/job-c/2-1-5", Some("job-c")),
            ("nonsense", None),
        ];
        for (url, job) in cases {
            assert_eq!(source_job(url), job, "{url}");
        }
    }
}
