//! `GET /v1/jobs`: live jobs from memory, finished ones from the job store's indexes,
//! newest first, a page at a time.
//!
//! The cursor (`next`, given back as `after`) is `<created_ms>.<job id>`: the place in
//! the creation-time order, which stays valid when the job it names is deleted. A bare
//! job id is taken too (the cursor of earlier releases), and placed by its creation time;
//! one the driver does not hold ends the listing, as it did before.

use std::sync::Arc;

use flint_protocol::JobId;
use flint_protocol::api::{CodedError, ErrorCode, JobState, JobView};

use super::Driver;
use super::reads::{Panicked, off_runtime};
use crate::store::{JobFilter, StoreError};
use crate::views::{job_view, summary_view};

/// Why a listing could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("listing jobs: {0}")]
    Panicked(#[from] Panicked),
}

impl CodedError for ListError {
    fn code(&self) -> ErrorCode {
        match self {
            ListError::Store(e) => e.code(),
            ListError::Panicked(e) => e.code(),
        }
    }
}

impl Driver {
    /// [`Driver::list_jobs`], off the runtime.
    pub async fn jobs_page(
        self: &Arc<Self>,
        filter: JobFilter,
        after: Option<String>,
        limit: usize,
    ) -> Result<(Vec<JobView>, Option<String>), ListError> {
        let driver = self.clone();
        off_runtime(move || driver.list_jobs(&filter, after.as_deref(), limit)).await?
    }

    /// Up to `limit` jobs passing `filter`, newest first, after the cursor `after`, and
    /// the cursor of the next page if there is one. May wait for a commit: call it off
    /// the runtime.
    pub fn list_jobs(
        &self,
        filter: &JobFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<JobView>, Option<String>), ListError> {
        // Jobs that ended a moment ago are in the store's indexes once their end is
        // committed: commit now rather than list a job as running that its client has
        // seen end (a sync, only when such a job exists).
        if self.lock().has_unsaved_ends() {
            self.jobs.store.flush();
        }
        let before = match after.filter(|a| !a.is_empty()) {
            Some(cursor) => match self.place(cursor, filter.owner.as_ref())? {
                Some(place) => Some(place),
                // A cursor naming no job (deleted since, or never one): nothing after it.
                None => return Ok((Vec::new(), None)),
            },
            None => None,
        };
        let before = before.as_ref().map(|(ms, id)| (*ms, id.as_str()));
        let (items, more) = match filter.state {
            // Live states change in memory only: answered from there.
            Some(JobState::Queued | JobState::Running) => self.list_live(filter, before, limit),
            _ => {
                let page = self.jobs.store.list(filter, before, limit)?;
                let items = self.read(|s| {
                    (page.items.iter().zip(&page.owners))
                        .map(|((id, summary), owner)| match s.jobs.get(id) {
                            Some(live) => job_view(live),
                            None => summary_view(id, summary, owner),
                        })
                        .collect()
                });
                (items, page.more)
            }
        };
        let next = more
            .then(|| items.last().map(cursor_of))
            .flatten()
            .flatten();
        Ok((items, next))
    }

    fn list_live(
        &self,
        filter: &JobFilter,
        before: Option<(u64, &str)>,
        limit: usize,
    ) -> (Vec<JobView>, bool) {
        self.read(|s| {
            let mut live: Vec<(u64, &JobId)> = s
                .jobs
                .values()
                .filter(|j| {
                    filter
                        .owner
                        .as_ref()
                        .is_none_or(|o| o.admits(j.def.owner.tenant.as_deref()))
                        && filter.admits(&crate::store::durable::job_summary(j))
                })
                .map(|j| (j.def.created_at_ms, &j.def.id))
                .filter(|(ms, id)| before.is_none_or(|b| (*ms, id.0.as_str()) < b))
                .collect();
            live.sort_unstable_by(|a, b| b.cmp(a));
            let more = live.len() > limit;
            let items = live
                .into_iter()
                .take(limit)
                .map(|(_, id)| job_view(&s.jobs[id]))
                .collect();
            (items, more)
        })
    }

    /// Where a cursor points: a creation time and a job id; `None` for a bare job id
    /// the driver does not hold, or that is not the listed owner's (a tenant's listing
    /// must not tell another tenant's job ids from none).
    fn place(
        &self,
        cursor: &str,
        owner: Option<&crate::store::OwnerFilter>,
    ) -> Result<Option<(u64, String)>, ListError> {
        if let Some((ms, id)) = cursor.split_once('.')
            && let Ok(ms) = ms.parse::<u64>()
        {
            return Ok(Some((ms, id.to_owned())));
        }
        let id = JobId(cursor.to_owned());
        if let Some(owner) = owner
            && !self.job_owned(&id, |tenant| owner.admits(tenant))?
        {
            return Ok(None);
        }
        let created = match self.read(|s| s.jobs.get(&id).map(|j| j.def.created_at_ms)) {
            Some(ms) => Some(ms),
            None => self.jobs.store.summary(&id)?.map(|s| s.created_at_ms),
        };
        Ok(created.map(|ms| (ms, cursor.to_owned())))
    }
}

/// The cursor after a listed job.
fn cursor_of(view: &JobView) -> Option<String> {
    let created = humantime::parse_rfc3339(&view.created_at).ok()?;
    let ms = created
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis();
    Some(format!("{ms}.{}", view.id))
}
