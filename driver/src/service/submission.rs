//! Job submission: admitting a spec, storing its record while its first tasks start, and
//! what a submission came to. Apart from [`super::actions`] because this is the one
//! place that awaits: it races the job store's commit against the job's first tasks,
//! then settles an end that `actions` held back meanwhile (`storing`, `deferred`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use flint_fetch_cache::egress::AllowList;
use flint_protocol::api::{CodedError, ErrorCode, TaskState};
use flint_protocol::{Digest, JobId, TaskInput, TaskResult};

use super::idempotency_key::IdempotencyKey;
use super::tenancy;
use super::{Deferred, Driver};
use crate::admission::{self, Rejection};
use crate::scheduler::{NewJob, memo};
use crate::store::StoreError;
use crate::store::durable;
use crate::store::usage::OverQuota;
use crate::tenants::{Caller, Tenant};

/// What a submission came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// A new job, stored.
    Accepted(JobId),
    /// The job an earlier submission with the same idempotency key and spec made.
    Repeated(JobId),
}

/// Why a submission made no job.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The spec is not a job Flint can run.
    #[error("{}", .0.message)]
    Rejected(Rejection),
    /// The job could not be stored, so it was not accepted.
    #[error("job not accepted: {0}")]
    Storage(#[from] StoreError),
    /// The data dir is at its quota: no new job until there is room.
    #[error("job not accepted: {0}")]
    OverQuota(#[from] OverQuota),
    /// The key belongs to a job submitted with another spec.
    #[error(
        "Idempotency-Key {key:?} belongs to job {job}, which was submitted with another \
         spec; use a new key for a new job"
    )]
    Conflict { key: IdempotencyKey, job: JobId },
}

/// Refused by admission as it said; not stored: the disk's fault when it is full
/// (507), the driver's otherwise (500); the key taken by another spec (422).
impl CodedError for SubmitError {
    fn code(&self) -> ErrorCode {
        match self {
            SubmitError::Rejected(rejection) => rejection.code,
            SubmitError::Storage(e) => e.code(),
            SubmitError::OverQuota(_) => ErrorCode::StorageFull,
            SubmitError::Conflict { .. } => ErrorCode::IdempotencyConflict,
        }
    }
}

impl From<Rejection> for SubmitError {
    fn from(r: Rejection) -> Self {
        SubmitError::Rejected(r)
    }
}

/// The most a task of `caller` may be given (see [`admission::Ceiling`]), under the
/// operator's `--egress-allow`.
pub(super) fn ceiling(caller: &Caller, egress_allow: &Arc<AllowList>) -> admission::Ceiling {
    let operator = egress_allow.clone();
    caller.tenant().map_or_else(
        || admission::Ceiling {
            egress: admission::EgressCeiling {
                operator: operator.clone(),
                ..Default::default()
            },
            ..Default::default()
        },
        |t| admission::Ceiling {
            tenant: Some(t.name.to_string()),
            memory_mb: t.limits.max_task_memory_mb,
            timeout_ms: t.limits.max_task_timeout_ms,
            egress: admission::EgressCeiling {
                operator: operator.clone(),
                tenant: Some(admission::TenantEgress {
                    entries: t.egress_allow.entries.clone(),
                    list: t.egress_allow.list.clone(),
                }),
                max_requests: t.limits.max_egress_requests,
                max_bytes: t.limits.max_egress_bytes,
                max_concurrent: t.limits.max_egress_concurrent,
            },
        },
    )
}

impl Driver {
    /// Accepts a job: its record is made durable (synced to the job store's journal, or
    /// with an idempotency key committed with it) while its first tasks start, and this
    /// returns (and the API answers 202) only once it is. The sync was a third of a
    /// single-task job's round trip when it came first. A job whose record cannot be stored was never accepted: it is killed where
    /// it stands and the error returned. Its tasks may have run meanwhile, which changes
    /// nothing outside (a guest's only effect is its result); one that already ended
    /// stays as it ended, in memory only.
    pub async fn submit(self: &Arc<Self>, job: NewJob) -> Result<(), StoreError> {
        self.submit_keyed(job, None, None)
            .await
            .map_err(|e| match e {
                SubmitError::Storage(e) => e,
                other => StoreError::Db(other.to_string()),
            })
    }

    /// Submits the job spec in `body`: admitted and stored ([`Self::submit`]), or with an
    /// idempotency `key`, that and no more than once per key (see [`idempotency`]).
    pub async fn submit_spec(
        self: &Arc<Self>,
        body: bytes::Bytes,
        key: Option<IdempotencyKey>,
        caller: &Caller,
    ) -> Result<Submitted, SubmitError> {
        match key {
            // A tenant's keys are its own: the same key from two tenants is two keys.
            Some(key) => {
                let key = match caller.tenant() {
                    Some(t) => key.scoped(&t.name),
                    None => key,
                };
                self.submit_once(body, key, caller.clone()).await
            }
            None => {
                self.uploads.usage.check_not_full()?;
                let job = self.admit(&body, caller)?;
                let id = job.def.id.clone();
                self.submit_keyed(job, None, caller.tenant().cloned())
                    .await?;
                Ok(Submitted::Accepted(id))
            }
        }
    }

    /// [`Self::submit`], storing the idempotency key and its spec's digest (if any) with
    /// the job, in the one write.
    pub(super) async fn submit_keyed(
        self: &Arc<Self>,
        job: NewJob,
        key: Option<(String, Digest)>,
        tenant: Option<Arc<Tenant>>,
    ) -> Result<(), SubmitError> {
        let record = durable::job_record(&job);
        let ends = durable::accepted_ends(&job);
        let id = job.def.id.clone();
        // A tenant's live jobs and tasks are counted where the job joins them, under the
        // state's lock: two submissions at once cannot both pass the last free place.
        self.apply_inner(|inner| {
            if let Some(tenant) = &tenant
                && let Err(over) = tenancy::check_live_quotas(&inner.state, tenant, &job)
            {
                return (Err(over), Vec::new());
            }
            inner.storing.insert(id.clone(), Vec::new());
            (Ok(()), inner.state.submit_job(job))
        })?;
        // Settled in a task of its own, not in the request's future: a client that hangs
        // up mid-commit must not leave the job held as being stored (its task ends, and
        // their acknowledgement to executors, would wait for it for good).
        let driver = self.clone();
        let settled = tokio::spawn(async move {
            let store = driver.clone();
            let commit = tokio::task::spawn_blocking(move || match &key {
                Some((key, spec)) => {
                    store
                        .jobs
                        .store
                        .put_job(&record, &ends, Some((key.as_str(), spec)))
                }
                None => store.jobs.store.accept_job(record, &ends),
            });
            let stored = match commit.await {
                Ok(stored) => stored,
                Err(e) => Err(StoreError::Db(format!("job store thread: {e}"))),
            };
            driver.settle_commit(&id, &stored);
            stored
        });
        let stored = match settled.await {
            Ok(stored) => stored,
            Err(e) => Err(StoreError::Db(format!("job store task: {e}"))),
        };
        Ok(stored?)
    }

    /// After a job's record was committed, or refused: the task and job ends held back
    /// meanwhile are stored (or, for a job never stored, dropped and the job stopped).
    pub(super) fn settle_commit(&self, id: &JobId, stored: &Result<(), StoreError>) {
        // A job that ended before its record was committed had its end held back: the
        // writer could otherwise commit the end first and find no job to end.
        let mut inner = self.lock();
        let held = inner.storing.remove(id).unwrap_or_default();
        if stored.is_ok() {
            // Before the job's end, which the writer stores with (or after) its tasks'.
            for (index, end, memo) in held {
                self.store_task_end(id, index, end, memo);
            }
        }
        if let Some(Deferred {
            end,
            summary,
            attempts,
        }) = inner.deferred.remove(id)
        {
            let write = match stored {
                Ok(()) => {
                    let write = self.jobs.store.job_ended(id.clone(), end, summary);
                    match attempts {
                        Some(attempts) => self.jobs.store.attempts_ended(id.clone(), attempts),
                        None => write,
                    }
                }
                // Never accepted: nothing to store, and it is not among the totals.
                Err(_) => {
                    inner.finished.add(&summary, -1);
                    0
                }
            };
            inner.set_end_write(id, write);
        }
        drop(inner);
        if let Err(e) = stored {
            let reason = format!("not accepted: the job store could not record it: {e}");
            self.apply(|s| {
                let actions = s.stop_job(id, reason, SystemTime::now());
                ((), actions.unwrap_or_default())
            });
        }
    }

    /// The timestamp to fetch `url` under ([`crate::admission::UrlTimestamps::timestamp`]).
    pub fn url_timestamp(&self, url: &str, given: Option<u64>) -> u64 {
        self.uploads
            .url_timestamps
            .timestamp(url, given, SystemTime::now())
    }

    /// A job spec's JSON checked and turned into a job: see [`admission`]. Also refuses
    /// a job no executor registered now could run.
    pub fn admit(&self, body: &[u8], caller: &Caller) -> Result<NewJob, Rejection> {
        let catalog = tenancy::TenantCatalog {
            driver: self,
            caller,
        };
        let spec = admission::parse_job_spec(body)?;
        let mut job = admission::accept(&catalog, spec, &ceiling(caller, &self.egress_allow))?;
        self.admit_accepted(&mut job, caller)?;
        Ok(job)
    }

    /// What admission leaves to the driver: whether an executor could run the job, its
    /// tenant and the tenant's quotas, and its memoized tasks.
    pub(super) fn admit_accepted(
        &self,
        job: &mut NewJob,
        caller: &Caller,
    ) -> Result<(), Rejection> {
        let (max_cores, any_fuel) =
            self.read(|s| (s.max_executor_cores(), s.any_executor_meters_fuel()));
        admission::check_schedulable(job, max_cores, any_fuel)?;
        if let Some(tenant) = caller.tenant() {
            job.def.owner.tenant = Some(tenant.name.to_string());
            self.check_quotas(tenant, job)?;
        }
        if job.def.options.memoize {
            self.take_memoized(job)?;
        }
        Ok(())
    }

    /// Gives each task of a `"memoize": true` job that an earlier task computed the
    /// earlier result (inline results only: a block belongs to its job). An entry whose
    /// job is gone, or whose task no longer holds that result, is passed over and the
    /// task runs. A task with no key (a module, file or input by URL without its
    /// `sha256`) refuses the job, naming it.
    fn take_memoized(&self, job: &mut NewJob) -> Result<(), Rejection> {
        // A task that ended a moment ago is told (its job may even have ended) before its
        // entry is committed: commit what is queued first, so that a job submitted after
        // an identical one ended finds all of its results.
        if !self
            .jobs
            .store
            .is_durable(self.jobs.memo_writes.load(Ordering::Relaxed))
        {
            self.jobs.store.flush();
        }
        let count = job.tasks.len() as u32;
        for index in 0..count {
            let task = &job.tasks[index as usize];
            // A waiting task's key is known once its results are there.
            if matches!(task.input, TaskInput::Upstream(_)) {
                continue;
            }
            let key = memo::key(&job.def, index, count, &task.input, &task.args, &task.env)
                .map_err(|why| Rejection::new(ErrorCode::InvalidSpec, format!("memoize: {why}")))?;
            if let Some((result, from, at)) = self.memo_lookup(&key, &job.def.owner.tenant)? {
                job.tasks[index as usize].memoized = Some(result);
                job.def.options.memoized.push((index, from, at));
            }
        }
        Ok(())
    }

    /// The result a memo entry for `key` points at, if it is still there to take: an
    /// inline result of a task that succeeded, of the same tenant (another tenant's
    /// results are not this one's to see, even the same). An entry whose job is gone, or
    /// whose task no longer holds that result, is passed over.
    pub(super) fn memo_lookup(
        &self,
        key: &Digest,
        tenant: &Option<String>,
    ) -> Result<Option<(TaskResult, JobId, u32)>, Rejection> {
        let Some((from, at)) = self.jobs.store.memo(key).map_err(Rejection::from)? else {
            return Ok(None);
        };
        let result = self
            .job(&from, |j| {
                if j.def.owner.tenant != *tenant {
                    return None;
                }
                let t = j.tasks.get(at as usize)?;
                (t.state == TaskState::Succeeded).then(|| t.result.clone())?
            })
            .map_err(Rejection::from)?
            .flatten();
        Ok(match result {
            Some(result @ TaskResult::Inline(_)) => Some((result, from, at)),
            _ => None,
        })
    }
}
