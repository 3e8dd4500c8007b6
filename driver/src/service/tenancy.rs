//! What tenancy asks of the service: whose a job or an upload is, what a tenant may
//! name in a job (admission looks through [`TenantCatalog`], which shows a tenant only
//! its own uploads and jobs), its quotas at submission, and its usage.

use std::collections::HashMap;
use std::sync::Arc;

use flint_protocol::api::{ErrorCode, JobState, TenantUsage};
use flint_protocol::{Digest, JobId};

use super::Driver;
use super::reads::{ReadError, off_runtime};
use crate::admission::{Catalog, Rejection};
use crate::scheduler::fair_share::{Share, Shares};
use crate::scheduler::{ClusterState, Job, NewJob};
use crate::store::blobs::ModuleInfo;
use crate::store::{SHARED, StoreError, blob_key};
use crate::tenants::{ADMIN, Caller, Tenant, Tenants};

/// Tests count the reads of a job's owner from the store, and make them fail.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct OwnerReads {
    pub count: std::sync::atomic::AtomicU64,
    pub refuse: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
impl OwnerReads {
    fn read(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        self.count.fetch_add(1, Relaxed);
        match self.refuse.load(Relaxed) {
            true => Err(StoreError::Db("an I/O error (a test's)".into())),
            false => Ok(()),
        }
    }
}

/// Who uploaded each module and file: blob key -> tenants (or [`SHARED`]).
#[derive(Default)]
pub struct UploadOwners {
    owners: std::sync::Mutex<HashMap<String, Vec<String>>>,
    /// Held across a storage-limited tenant's upload: check, write, owner's row.
    quota: std::sync::Mutex<()>,
}

impl UploadOwners {
    pub fn restore(rows: Vec<(String, String)>) -> Self {
        let mut owners: HashMap<String, Vec<String>> = HashMap::new();
        for (key, owner) in rows {
            owners.entry(key).or_default().push(owner);
        }
        UploadOwners {
            owners: std::sync::Mutex::new(owners),
            quota: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<String>>> {
        self.owners.lock().expect("upload owners lock poisoned")
    }
}

impl Driver {
    /// Puts a (new) version of the tenants in force: their tokens for the API, their
    /// weights and core limits for the scheduler.
    pub fn set_tenants(&self, tenants: Tenants) {
        let shares = Shares(
            tenants
                .iter()
                .map(|t| {
                    let share = Share {
                        weight: t.weight,
                        max_cores: t.limits.max_cores,
                        max_task_memory_mb: t.limits.max_task_memory_mb,
                        max_task_timeout_ms: t.limits.max_task_timeout_ms,
                    };
                    (t.name.to_string(), share)
                })
                .collect(),
        );
        self.tenants.set(tenants);
        self.apply(|s| {
            s.set_shares(shares);
            ((), s.make_offers())
        });
    }

    /// Whether job `id` is one whose owner (`None`: the admin's) `admits`. One held in
    /// memory that it admits is answered from there; every other case (another
    /// owner's job, live or finished, or no job at all) takes the same one point read
    /// of the store (never the whole job), so that asking for another tenant's job
    /// costs what asking for none does, and a store that fails fails both alike.
    pub fn job_owned(
        &self,
        id: &JobId,
        admits: impl Fn(Option<&str>) -> bool,
    ) -> Result<bool, StoreError> {
        let held = self.held_owner(id);
        if held.as_ref().is_some_and(|owner| admits(owner.as_deref())) {
            return Ok(true);
        }
        let stored = self.stored_owner(id)?;
        Ok(held.is_none() && stored.is_some_and(|owner| admits(owner.as_deref())))
    }

    /// Whether `caller` may see job `id` ([`Driver::job_owned`]), read off the runtime.
    pub async fn sees_job(
        self: &Arc<Self>,
        caller: &Caller,
        id: &JobId,
    ) -> Result<bool, ReadError> {
        let (driver, caller, id) = (self.clone(), caller.clone(), id.clone());
        Ok(off_runtime(move || driver.job_owned(&id, |owner| caller.sees(owner))).await??)
    }

    /// A stored job's tenant (`Some(None)`: the admin's), `None` when none is stored.
    fn stored_owner(&self, id: &JobId) -> Result<Option<Option<String>>, StoreError> {
        #[cfg(test)]
        self.uploads.owner_reads.read()?;
        Ok(self.jobs.store.owner(id)?.map(|o| o.tenant))
    }

    /// A storage-limited tenant's uploads one at a time (see `put_blob`); `None` for
    /// everyone else, who is not held up.
    pub fn upload_quota_lock(&self, caller: &Caller) -> Option<std::sync::MutexGuard<'_, ()>> {
        caller
            .tenant()
            .filter(|t| t.limits.max_storage_bytes.is_some())
            .map(|_| {
                self.uploads
                    .owners
                    .quota
                    .lock()
                    .expect("upload quota lock poisoned")
            })
    }

    /// Whether `caller` may see the upload: the admin and executors see all, a tenant
    /// those it uploaded and the shared ones.
    pub fn upload_visible(&self, caller: &Caller, digest: &Digest, files: bool) -> bool {
        let Some(tenant) = caller.tenant() else {
            return true;
        };
        self.uploads
            .owners
            .lock()
            .get(&blob_key(digest, files))
            .is_some_and(|o| o.iter().any(|o| o == SHARED || *o == *tenant.name))
    }

    /// Records who uploaded a blob: a tenant, or every tenant when the admin shares it.
    /// The admin's own uploads need no row. Blocks for the commit.
    pub fn record_upload(
        &self,
        caller: &Caller,
        digest: &Digest,
        files: bool,
        shared: bool,
    ) -> Result<(), StoreError> {
        let owner = match (caller.tenant(), shared) {
            (_, true) => SHARED.to_owned(),
            (Some(t), false) => t.name.to_string(),
            (None, false) => return Ok(()),
        };
        let key = blob_key(digest, files);
        if self
            .uploads
            .owners
            .lock()
            .get(&key)
            .is_some_and(|o| o.contains(&owner))
        {
            return Ok(());
        }
        self.jobs.store.add_upload_owner(digest, files, &owner)?;
        self.uploads
            .owners
            .lock()
            .entry(key)
            .or_default()
            .push(owner);
        Ok(())
    }

    /// Refuses an upload of `bytes` that would take the caller's tenant past its
    /// `max_storage_bytes` (bytes it already owns cost nothing again).
    pub fn check_upload_quota(
        &self,
        caller: &Caller,
        files: bool,
        body: &[u8],
    ) -> Result<(), Rejection> {
        let Some(tenant) = caller.tenant() else {
            return Ok(());
        };
        let Some(max) = tenant.limits.max_storage_bytes else {
            return Ok(());
        };
        // Hashed here only when a limit applies: the store hashes it again as it writes.
        let (digest, bytes) = (Digest::of(body), body.len() as u64);
        let owned = self
            .uploads
            .owners
            .lock()
            .get(&blob_key(&digest, files))
            .is_some_and(|o| o.iter().any(|o| *o == *tenant.name));
        let held = self.upload_bytes(&tenant.name);
        if !owned && held + bytes > max {
            return Err(over(tenant, "max_storage_bytes", max, held, bytes));
        }
        Ok(())
    }

    /// Forgets a deleted upload's owners.
    pub(super) fn forget_upload(&self, digest: &Digest, files: bool) -> Result<(), StoreError> {
        self.jobs.store.remove_upload_owners(digest, files)?;
        self.uploads.owners.lock().remove(&blob_key(digest, files));
        Ok(())
    }

    /// Bytes of the uploads `tenant` owns (shared ones are the admin's).
    fn upload_bytes(&self, tenant: &str) -> u64 {
        let owned: Vec<String> = self
            .uploads
            .owners
            .lock()
            .iter()
            .filter(|(_, o)| o.iter().any(|o| o == tenant))
            .map(|(k, _)| k.clone())
            .collect();
        owned
            .iter()
            .filter_map(|key| {
                let (kind, hex) = key.split_once(':')?;
                let digest: Digest = format!("sha256:{hex}").parse().ok()?;
                let store = if kind == "f" {
                    &self.uploads.files
                } else {
                    &self.uploads.modules
                };
                store.get(&digest).map(|i| i.size)
            })
            .sum()
    }

    /// Refuses a job past one of its tenant's limits on what a job may be (its tasks'
    /// memory and time, its priority) or on what the tenant stores, naming the limit.
    /// Live jobs and tasks are counted where the job joins them ([`check_live_quotas`]);
    /// `max_cores` is no refusal: past it tasks wait.
    pub(super) fn check_quotas(&self, tenant: &Tenant, job: &NewJob) -> Result<(), Rejection> {
        let limits = &tenant.limits;
        let priority = job.def.owner.priority;
        if priority > tenant.max_priority {
            return Err(Rejection::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "tenant {:?}: max_priority is {}; the job asks for priority {priority}",
                    &*tenant.name, tenant.max_priority
                ),
            ));
        }
        let r = &job.def.resources;
        if let Some(max) = limits.max_cores
            && max > 0
            && r.cores > max
        {
            // It could never be placed: past max_cores tasks wait, and these would wait
            // forever (and, owed cores, have others' attempts preempted for nothing).
            // `max_cores = 0` holds all of a tenant's tasks (a pause): those are taken.
            return Err(Rejection::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "tenant {:?}: max_cores is {max}; the job asks for {} cores a task",
                    &*tenant.name, r.cores
                ),
            ));
        }
        if let Some(max) = limits.max_task_memory_mb
            && r.memory_mb > max
        {
            return Err(Rejection::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "tenant {:?}: max_task_memory_mb is {max}; the job asks for {} MiB a task",
                    &*tenant.name, r.memory_mb
                ),
            ));
        }
        if let Some(max) = limits.max_task_timeout_ms
            && r.timeout_ms > max
        {
            return Err(Rejection::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "tenant {:?}: max_task_timeout_ms is {max}; the job asks for {} ms a task",
                    &*tenant.name, r.timeout_ms
                ),
            ));
        }
        if let Some(max) = limits.max_storage_bytes {
            let held = self.upload_bytes(&tenant.name);
            if held > max {
                return Err(over(tenant, "max_storage_bytes", max, held, 0));
            }
        }
        Ok(())
    }

    /// What a tenant (or [`ADMIN`]) has now and has used: its live jobs, tasks and
    /// cores, its uploads, and its attempts' usage summed over the jobs the driver holds
    /// in memory (live and recently finished) plus the finished ones stored, as counted
    /// since the driver started.
    pub fn tenant_usage(&self, name: &str) -> TenantUsage {
        let tenant = (name != ADMIN).then_some(name);
        let mut usage = self.read(|s| {
            let mut u = TenantUsage {
                tenant: name.to_owned(),
                ..TenantUsage::default()
            };
            for job in s.jobs.values() {
                if job.def.owner.tenant.as_deref() != tenant {
                    continue;
                }
                if is_live(job) {
                    let c = job.counts();
                    u.live_jobs += 1;
                    u.pending_tasks += u64::from(c.pending + c.waiting);
                    u.running_tasks += u64::from(c.running);
                    u.running_cores += u64::from(c.running) * u64::from(job.def.resources.cores);
                }
            }
            u
        });
        usage.storage_bytes = tenant.map_or(0, |t| self.upload_bytes(t));
        let spent = self
            .read(|s| s.tenant_spent.get(&tenant.map(str::to_owned)).copied())
            .unwrap_or_default();
        usage.cpu_seconds = spent.cpu_us as f64 / 1e6;
        usage.wall_seconds = spent.wall_us as f64 / 1e6;
        usage.attempts = spent.attempts;
        usage.tasks_succeeded = spent.succeeded;
        usage.output_bytes = spent.output_bytes;
        usage.egress_requests = spent.egress_requests;
        usage.egress_bytes_sent = spent.egress_bytes_sent;
        usage.egress_bytes_received = spent.egress_bytes_received;
        usage
    }
}

fn over(tenant: &Tenant, limit: &str, max: u64, usage: u64, adding: u64) -> Rejection {
    Rejection::new(
        ErrorCode::QuotaExceeded,
        format!(
            "tenant {:?}: {limit} is {max}; it holds {usage} and this job would add {adding}",
            &*tenant.name
        ),
    )
}

/// Refuses a job that would take its tenant past `max_jobs` live jobs or
/// `max_pending_tasks` tasks not yet ended, counted in `state` (under its lock, where
/// the job joins it).
pub(super) fn check_live_quotas(
    state: &ClusterState,
    tenant: &Tenant,
    job: &NewJob,
) -> Result<(), Rejection> {
    check_live_quotas_of(state, tenant, std::slice::from_ref(job))
}

/// [`check_live_quotas`] for jobs joining together (a graph's), summed.
pub(super) fn check_live_quotas_of(
    state: &ClusterState,
    tenant: &Tenant,
    new: &[NewJob],
) -> Result<(), Rejection> {
    let limits = &tenant.limits;
    if limits.max_jobs.is_none() && limits.max_pending_tasks.is_none() {
        return Ok(());
    }
    // Waiting tasks count: they are work the tenant has asked for, and will be pending.
    let (jobs, tasks) = state
        .jobs
        .values()
        .filter(|j| is_live(j) && j.def.owner.tenant.as_deref() == Some(&*tenant.name))
        .fold((0u64, 0u64), |(jobs, tasks), j| {
            let c = j.counts;
            (
                jobs + 1,
                tasks + u64::from(c.waiting + c.pending + c.running),
            )
        });
    let adding_jobs = new.len() as u64;
    if let Some(max) = limits.max_jobs
        && jobs + adding_jobs > max
    {
        return Err(over(tenant, "max_jobs", max, jobs, adding_jobs));
    }
    let adding: u64 = (new.iter())
        .map(|job| job.tasks.iter().filter(|t| t.memoized.is_none()).count() as u64)
        .sum();
    if let Some(max) = limits.max_pending_tasks
        && tasks + adding > max
    {
        return Err(over(tenant, "max_pending_tasks", max, tasks, adding));
    }
    Ok(())
}

fn is_live(job: &Job) -> bool {
    matches!(job.state, JobState::Queued | JobState::Running)
}

/// The driver's catalog as one caller sees it: a tenant finds only its own uploads
/// (and shared ones) and jobs; anything else is as if it did not exist.
pub struct TenantCatalog<'a> {
    pub driver: &'a Driver,
    pub caller: &'a Caller,
}

impl Catalog for TenantCatalog<'_> {
    fn module(&self, digest: &Digest) -> Option<ModuleInfo> {
        if !self.driver.upload_visible(self.caller, digest, false) {
            return None;
        }
        Catalog::module(self.driver, digest)
    }

    fn file(&self, digest: &Digest) -> Option<ModuleInfo> {
        if !self.driver.upload_visible(self.caller, digest, true) {
            return None;
        }
        Catalog::file(self.driver, digest)
    }

    fn http_base(&self) -> &str {
        Catalog::http_base(self.driver)
    }

    fn block_url(&self, id: &str) -> String {
        Catalog::block_url(self.driver, id)
    }

    fn url_timestamp(&self, url: &str, given: Option<u64>) -> u64 {
        Catalog::url_timestamp(self.driver, url, given)
    }

    /// Another tenant's job is found as the gate finds it ([`Driver::job_owned`]): by
    /// the reads an absent one takes, failing alike when the store does.
    fn job<R>(&self, id: &JobId, f: impl FnOnce(&Job) -> R) -> Result<Option<R>, Rejection> {
        let caller = self.caller;
        if caller.tenant().is_some() {
            let owned = self
                .driver
                .job_owned(id, |owner| caller.sees(owner))
                .map_err(Rejection::from)?;
            if !owned {
                return Ok(None);
            }
        }
        Catalog::job(self.driver, id, |j| {
            caller.sees(j.def.owner.tenant.as_deref()).then(|| f(j))
        })
        .map(Option::flatten)
    }
}
