//! Finding jobs: `GET /v1/jobs`'s filters served from the indexes, newest first. The
//! index read is the most selective one the filter allows (a name, else a state, else
//! creation time alone), each ordered by creation time within its prefix, so a page costs
//! what it returns plus what the other filters drop, never a pass over every job.

use std::ops::Bound;

use flint_protocol::JobId;
use flint_protocol::api::JobState;
use flint_protocol::records::{JobSummaryRecord, Owner};
use redb::ReadableDatabase;

use super::schema::{BY_CREATED, BY_NAME, BY_STATE, JOB_OWNERS, SUMMARIES, state_code};
use super::{JobStore, StoreError, db_error};

/// What a listing asks for. Times are Unix milliseconds; `created_after` is inclusive,
/// `created_before` exclusive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub name: Option<String>,
    pub created_after: Option<u64>,
    pub created_before: Option<u64>,
    /// Whose jobs: everyone's when `None`.
    pub owner: Option<OwnerFilter>,
}

/// A listing of one owner's jobs: a tenant's (by name), or the admin's (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerFilter(pub Option<String>);

impl OwnerFilter {
    pub fn admits(&self, tenant: Option<&str>) -> bool {
        self.0.as_deref() == tenant
    }
}

impl JobFilter {
    /// Whether a job with this summary passes (for jobs the caller holds in memory, and
    /// for what the index read does not decide).
    pub fn admits(&self, summary: &JobSummaryRecord) -> bool {
        self.state.is_none_or(|s| s == summary.state)
            && self.name.as_ref().is_none_or(|n| *n == summary.name)
            && self
                .created_after
                .is_none_or(|t| summary.created_at_ms >= t)
            && self
                .created_before
                .is_none_or(|t| summary.created_at_ms < t)
    }
}

/// A page of jobs, newest first, and whether there are more after it.
#[derive(Debug)]
pub struct JobPage {
    pub items: Vec<(JobId, JobSummaryRecord)>,
    /// Each item's owner, in the items' order.
    pub owners: Vec<Owner>,
    pub more: bool,
}

impl JobStore {
    /// Up to `limit` stored jobs passing `filter`, newest first (by creation time, then
    /// id), strictly older than `before` (a previous page's last job's creation time and
    /// id). A live job's summary here is the one written at submit (state `queued`): the
    /// caller, which holds live jobs, shows its own view of those, and answers filters
    /// on the live states (`queued`, `running`) from memory, not from here.
    pub fn list(
        &self,
        filter: &JobFilter,
        before: Option<(u64, &str)>,
        limit: usize,
    ) -> Result<JobPage, StoreError> {
        let txn = self.folded_db()?.begin_read().map_err(db_error)?;
        let summaries = txn.open_table(SUMMARIES).map_err(db_error)?;
        // Each candidate's owner is read (a point lookup): a tenant's listing costs what
        // the other tenants' jobs in the index range cost too (an index by owner would
        // not). A data dir from before the table has none: every job is the admin's.
        let owners = match txn.open_table(JOB_OWNERS) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(db_error(e)),
        };
        let low = filter.created_after.unwrap_or(0);
        // The upper bound: the cursor or `created_before`, whichever comes first.
        let high: Bound<(u64, &str)> = match (before, filter.created_before) {
            (Some(cursor), Some(t)) if (t, "") <= cursor => Bound::Excluded((t, "")),
            (Some(cursor), _) => Bound::Excluded(cursor),
            (None, Some(t)) => Bound::Excluded((t, "")),
            (None, None) => Bound::Unbounded,
        };
        let mut page = JobPage {
            items: Vec::new(),
            owners: Vec::new(),
            more: false,
        };
        // Ids in index order, newest first; summaries read as they pass, until the page is
        // full and one more passing job shows there is a next page.
        let mut take = |id: &str| -> Result<bool, StoreError> {
            let Some(bytes) = summaries.get(id).map_err(db_error)? else {
                return Ok(true);
            };
            let summary: JobSummaryRecord = postcard::from_bytes(bytes.value())?;
            if !filter.admits(&summary) {
                return Ok(true);
            }
            let owner: Owner = match &owners {
                Some(owners) => owners
                    .get(id)
                    .map_err(db_error)?
                    .map(|v| postcard::from_bytes(v.value()))
                    .transpose()?
                    .unwrap_or_default(),
                None => Owner::default(),
            };
            if let Some(want) = &filter.owner
                && !want.admits(owner.tenant.as_deref())
            {
                return Ok(true);
            }
            if page.items.len() == limit {
                page.more = true;
                return Ok(false);
            }
            page.items.push((JobId(id.to_owned()), summary));
            page.owners.push(owner);
            Ok(true)
        };
        if let Some(name) = &filter.name {
            let table = txn.open_table(BY_NAME).map_err(db_error)?;
            let high = match high {
                Bound::Excluded((t, id)) => Bound::Excluded((name.as_str(), t, id)),
                _ => Bound::Excluded((name.as_str(), u64::MAX, "\u{10ffff}")),
            };
            let range = table
                .range::<(&str, u64, &str)>((Bound::Included((name.as_str(), low, "")), high))
                .map_err(db_error)?;
            for entry in range.rev() {
                let (key, _) = entry.map_err(db_error)?;
                if !take(key.value().2)? {
                    break;
                }
            }
        } else if let Some(state) = filter.state {
            let code = state_code(state);
            let table = txn.open_table(BY_STATE).map_err(db_error)?;
            let high = match high {
                Bound::Excluded((t, id)) => Bound::Excluded((code, t, id)),
                _ => Bound::Excluded((code + 1, 0, "")),
            };
            let range = table
                .range::<(u8, u64, &str)>((Bound::Included((code, low, "")), high))
                .map_err(db_error)?;
            for entry in range.rev() {
                let (key, _) = entry.map_err(db_error)?;
                if !take(key.value().2)? {
                    break;
                }
            }
        } else {
            let table = txn.open_table(BY_CREATED).map_err(db_error)?;
            let range = table
                .range::<(u64, &str)>((Bound::Included((low, "")), high))
                .map_err(db_error)?;
            for entry in range.rev() {
                let (key, _) = entry.map_err(db_error)?;
                if !take(key.value().1)? {
                    break;
                }
            }
        }
        Ok(page)
    }
}
