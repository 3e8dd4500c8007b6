//! The driver as a service: the scheduler's state behind one lock (a `std::sync::Mutex`
//! never held across an `.await`), the actions its changes ask for carried out under
//! that lock (messages to executors, events, job store writes), and the entry points
//! the front ends call: admit and submit, register, heartbeat, status updates, lose.
//! Submissions under an idempotency key are [`idempotency`]'s.
//!
//! This module holds the state and its construction; `submission` the submit path,
//! `actions` what a state change is carried out as, `executors` the executors'
//! lifecycle.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use flint_protocol::api::JobView;
use flint_protocol::records::{
    AttemptRecord, JobEndRecord, JobRecord, JobSummaryRecord, TaskEndRecord,
};
use flint_protocol::{Digest, DriverMessage, ExecutorId, JobId};
use tokio::sync::{mpsc, watch};

use crate::admission::UrlTimestamps;
use crate::config::DriverConfig;
use crate::events::JobEvents;
use crate::scheduler::{ClusterState, Job};
use crate::store::blobs::ModuleStore;
use crate::store::blocks::BlockStore;
use crate::store::durable;
use crate::store::usage::DataDirUsage;
use crate::store::{JobStore, StoreError, Stored, Totals};

mod actions;
mod archive;
mod catalog;
mod deletion;
mod executors;
mod graphs;
pub mod idempotency;
mod idempotency_key;
mod listing;
mod parts;
mod reads;
mod replay;
mod resolve;
mod submission;
pub mod tenancy;
mod uploads;
pub mod workers;

pub use deletion::DeleteError;
pub use executors::{AllocationCommand, ExecutorRefusal, LogError};
pub use graphs::{GraphError, GraphSubmitted};
use idempotency::IdempotencyKeys;
pub use idempotency_key::{BadKey, IdempotencyKey};
pub use listing::ListError;
use parts::JobRecords;
pub use parts::{ClusterParts, Uploads};
pub use reads::{Panicked, ReadError};
pub use replay::ReplayError;
pub use submission::{SubmitError, Submitted};
pub use uploads::{DownloadError, UploadError};

use catalog::{advertised_base, host_name};

/// A live connection's outbox, tagged with the registration it belongs to.
struct Link {
    generation: u64,
    outbox: mpsc::UnboundedSender<DriverMessage>,
}

/// The task ends (each with the memo entry it makes, if any) of a job whose record is
/// being committed (`submit_keyed`), held until the record is in: a job never stored
/// leaves no task end and no memo entry behind.
type Held = Vec<(u32, TaskEndRecord, Option<Digest>)>;

/// A job's end held back until its record is committed (see `submit_keyed`).
struct Deferred {
    end: JobEndRecord,
    summary: JobSummaryRecord,
    attempts: Option<Vec<AttemptRecord>>,
}

struct Inner {
    state: ClusterState,
    links: HashMap<ExecutorId, Link>,
    /// Finished jobs still in memory (see [`archive`]).
    archive: archive::Archive,
    /// Final jobs still in the scheduler's state (their attempts being killed), with
    /// the number of their end's write to the job store.
    ending: HashMap<JobId, u64>,
    /// Jobs whose record is being committed (`submit_keyed`) with their task ends and
    /// memo entries so far, and the ends of those among them that ended meanwhile, sent
    /// once the record is in (with their attempts, once archived: the writer skips what
    /// belongs to a job it does not hold), or dropped if it never is.
    storing: HashMap<JobId, Held>,
    deferred: HashMap<JobId, Deferred>,
    /// The stored finished jobs' figures, for `/metrics`.
    finished: Totals,
}

pub struct Driver {
    pub config: DriverConfig,
    /// `http://HOST:PORT` of the API, from which executors fetch modules.
    pub http_base: String,
    /// The scheduler's state and the executors' connections, behind the one lock.
    inner: Mutex<Inner>,
    pub uploads: Uploads,
    jobs: JobRecords,
    pub cluster: ClusterParts,
    /// The tenants in force (`--tenants`); none on a driver without them.
    pub tenants: Arc<crate::tenants::Registry>,
    /// `--egress-allow`, parsed: the ceiling of every job's `network`.
    egress_allow: Arc<flint_fetch_cache::egress::AllowList>,
    pub metrics: crate::metrics::Metrics,
    /// Jobs' event streams.
    pub events: Arc<JobEvents>,
    /// To the thread that makes the inputs of waiting tasks once their results are
    /// there (see [`resolve`]).
    resolver: std::sync::mpsc::Sender<(JobId, Vec<u32>)>,
}

impl Driver {
    /// Opens the data dir and rebuilds every stored job: tasks that had ended keep their
    /// results, the rest run again once executors register.
    pub fn new(config: DriverConfig, http_addr: SocketAddr) -> anyhow::Result<Arc<Self>> {
        let egress_allow = flint_fetch_cache::egress::AllowList::parse(&config.egress_allow)
            .map_err(|e| anyhow::anyhow!("--egress-allow: {e}"))?;
        let egress_allow = Arc::new(egress_allow);
        let job_store = config.data_dir.join("jobs.redb");
        let usage = Arc::new(DataDirUsage::new(
            config.data_dir_max_bytes,
            job_store.clone(),
        ));
        let modules = ModuleStore::open(config.data_dir.join("modules"), usage.clone())?;
        let files = ModuleStore::open_files(config.data_dir.join("files"), usage.clone())?;
        std::fs::create_dir_all(&config.data_dir)?;
        let store = JobStore::open(&job_store, config.commit_interval)?;
        let Stored {
            jobs: mut stored,
            keys,
        } = store.load()?;
        let finished = store.totals()?;
        let upload_owners = tenancy::UploadOwners::restore(store.upload_owners()?);
        let restored = stored.len();
        let http_base = advertised_base(config.advertise_url.as_deref(), http_addr, host_name);
        for job in &mut stored {
            catalog::rebase(&mut job.job, &http_base);
        }
        let blocks = BlockStore::open(&config.block_store, &config.data_dir, &http_base, &usage)?;
        let scheduling = config.scheduling.clone();
        let events = JobEvents::new(config.max_event_streams);
        let (resolver, requests) = std::sync::mpsc::channel();
        let driver = Arc::new(Driver {
            config,
            http_base,
            inner: Mutex::new(Inner {
                state: ClusterState::new(
                    SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(1, |d| d.as_micros() as u64),
                    scheduling,
                    Instant::now(),
                    SystemTime::now(),
                ),
                links: HashMap::new(),
                archive: archive::Archive::new(archive::CACHE_BYTES),
                ending: HashMap::new(),
                storing: HashMap::new(),
                deferred: HashMap::new(),
                finished,
            }),
            uploads: Uploads {
                modules,
                files,
                blocks,
                usage,
                owners: upload_owners,
                url_timestamps: UrlTimestamps::default(),
                #[cfg(test)]
                owner_reads: Default::default(),
            },
            jobs: JobRecords::new(store, IdempotencyKeys::restore(keys)),
            cluster: ClusterParts::default(),
            tenants: Default::default(),
            egress_allow,
            metrics: crate::metrics::Metrics::default(),
            events,
            resolver,
        });
        resolve::start(&driver, requests)?;
        let known = driver.jobs.store.known_executors()?;
        let wait = driver.config.adopt_wait;
        driver.apply(|s| {
            let actions = s.restore(stored, SystemTime::now());
            s.begin_adopting(known.into_iter().map(ExecutorId).collect(), wait);
            ((), actions)
        });
        if let Some(expected) = driver.read(|s| s.adoption_waits_for()) {
            tracing::info!(
                executors = ?expected, wait_ms = wait.as_millis() as u64,
                "waiting for the last driver's executors before launching what they may still run"
            );
        }
        if restored > 0 {
            tracing::info!(jobs = restored, "restored the live jobs from the job store");
        }
        Ok(driver)
    }

    /// Group commits of task and job ends to the job store since the driver started.
    pub fn store_commits(&self) -> u64 {
        self.jobs.store.commits()
    }

    /// Commits the task and job ends still waiting for the next group commit (blocking),
    /// so that after a clean stop no finished task runs again.
    pub fn flush_store(&self) {
        self.jobs.store.flush();
    }

    /// Reads the state. Keep the closure short: the scheduler waits on this lock.
    pub fn read<R>(&self, f: impl FnOnce(&ClusterState) -> R) -> R {
        f(&self.lock().state)
    }

    /// Runs `f` on a job, live or finished: live and recently finished ones from memory,
    /// others read from the job store (and kept in the small cache of finished jobs).
    /// `Ok(None)` when there is no such job.
    pub fn job<R>(&self, id: &JobId, f: impl FnOnce(&Job) -> R) -> Result<Option<R>, StoreError> {
        let deletions = {
            let mut inner = self.lock();
            inner
                .archive
                .settle(|write| self.jobs.store.is_durable(write));
            if let Some(job) = inner.state.jobs.get(id) {
                return Ok(Some(f(job)));
            }
            match inner.archive.get(id) {
                Some(job) => {
                    drop(inner);
                    return Ok(Some(f(&job)));
                }
                None => inner.archive.deletions,
            }
        };
        let Some(stored) = self.jobs.store.job(id)? else {
            return Ok(None);
        };
        let attempts = self.jobs.store.attempts(id)?;
        let job = Arc::new(durable::finished_job(stored, attempts));
        let mut inner = self.lock();
        // Ended and removed meanwhile? Only cache what no deletion may have raced.
        if inner.archive.deletions == deletions && !inner.state.jobs.contains_key(id) {
            inner.archive.cache(id.clone(), job.clone());
        }
        drop(inner);
        Ok(Some(f(&job)))
    }

    /// The tenant of a job held in memory (live, or finished and still kept there). Both
    /// places are looked in whatever the first holds, so that a live job and none take
    /// the same lookups (see [`Driver::job_owned`]).
    fn held_owner(&self, id: &JobId) -> Option<Option<String>> {
        let mut inner = self.lock();
        let live = inner.state.jobs.get(id).map(|j| j.def.owner.tenant.clone());
        let archived = inner.archive.get(id).map(|j| j.def.owner.tenant.clone());
        live.or(archived)
    }

    /// A job as it was submitted (its tasks' inputs, args and env), from the job store,
    /// live or finished. Blocks on the store: call it off the runtime.
    pub fn job_record(&self, id: &JobId) -> Result<Option<JobRecord>, StoreError> {
        Ok(self.jobs.store.job(id)?.map(|stored| stored.job))
    }

    /// The job's view, live or finished.
    pub fn job_view(&self, id: &JobId) -> Result<Option<JobView>, StoreError> {
        self.job(id, crate::views::job_view)
    }

    /// The figures of the finished jobs stored, and of those held in memory, for
    /// `/metrics`: (totals, not yet committed, cached, cached bytes).
    pub fn finished_figures(&self) -> (Totals, (usize, usize, usize)) {
        let inner = self.lock();
        (inner.finished, inner.archive.sizes())
    }

    /// A receiver that changes whenever a job ends.
    pub fn job_endings(&self) -> watch::Receiver<u64> {
        self.jobs.endings.subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("driver state lock poisoned")
    }
}

impl Inner {
    /// Whether a job's end may not be in the store's indexes yet.
    fn has_unsaved_ends(&self) -> bool {
        self.archive.has_unsaved() || !self.ending.is_empty() || !self.deferred.is_empty()
    }

    fn send(&self, executor: &ExecutorId, message: DriverMessage) {
        match self.links.get(executor) {
            // A closed outbox means the connection is ending; its loss re-queues the task.
            Some(link) => {
                let _ = link.outbox.send(message);
            }
            None => tracing::warn!(executor = %executor, "no connection for a message"),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
