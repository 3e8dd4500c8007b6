//! The driver as a service: the scheduler's state behind one lock (a `std::sync::Mutex`
//! never held across an `.await`), the actions its changes ask for carried out under
//! that lock (messages to executors, events, job store writes), and the entry points
//! the front ends call: admit and submit, register, heartbeat, status updates, lose.
//! Submissions under an idempotency key are [`idempotency`]'s.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use flint_protocol::api::{ExecutorState, JobView, TaskEvent, TaskState};
use flint_protocol::messages::{ExecutorConfig, Heartbeat};
use flint_protocol::records::{AttemptRecord, JobEndRecord, JobSummaryRecord};
use flint_protocol::{Digest, DriverMessage, ExecutorId, JobId, TaskId, defaults};
use tokio::sync::{mpsc, watch};

use crate::admission::{self, Rejection, UrlTimestamps};
use crate::config::DriverConfig;
use crate::events::{JobEvent, JobEvents};
use crate::scheduler::{Action, ClusterState, Job, NewJob};
use crate::store::blobs::ModuleStore;
use crate::store::blocks::BlockStore;
use crate::store::durable;
use crate::store::usage::{DataDirUsage, OverQuota};
use crate::store::{JobStore, StoreError, Stored, Totals};

mod archive;
mod catalog;
mod deletion;
pub mod idempotency;
mod listing;
pub mod workers;

pub use deletion::DeleteError;
use idempotency::IdempotencyKeys;
pub use idempotency::{BadKey, IdempotencyKey};
pub use listing::ListError;

use catalog::{advertised_base, host_name};

/// A live connection's outbox, tagged with the registration it belongs to.
struct Link {
    generation: u64,
    outbox: mpsc::UnboundedSender<DriverMessage>,
}

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
    #[error(transparent)]
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

impl From<Rejection> for SubmitError {
    fn from(r: Rejection) -> Self {
        SubmitError::Rejected(r)
    }
}

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
    /// Jobs whose record is being committed (`submit_keyed`), and the ends of those
    /// among them that ended meanwhile, sent once the record is in (with their attempts,
    /// once archived: the writer skips the attempts of a job it does not hold).
    storing: std::collections::HashSet<JobId>,
    deferred: HashMap<JobId, Deferred>,
    /// The stored finished jobs' figures, for `/metrics`.
    finished: Totals,
}

pub struct Driver {
    pub config: DriverConfig,
    pub modules: ModuleStore,
    pub files: ModuleStore,
    pub blocks: BlockStore,
    /// What the data dir holds, against its quota.
    pub usage: Arc<DataDirUsage>,
    /// The fetch timestamps of the URLs jobs named.
    url_timestamps: UrlTimestamps,
    store: JobStore,
    /// The idempotency keys in use, and the job each stored one belongs to.
    idempotency: IdempotencyKeys,
    /// `http://HOST:PORT` of the API, from which executors fetch modules.
    pub http_base: String,
    inner: Mutex<Inner>,
    /// Bumped whenever a job reaches a final state, for `?wait=` callers.
    jobs_finished: watch::Sender<u64>,
    pub metrics: crate::metrics::Metrics,
    /// Jobs' event streams.
    pub events: Arc<JobEvents>,
    /// Executors' stderr files, for those the driver's cluster manager launched.
    pub executor_logs: crate::executor_logs::ExecutorLogs,
    /// What the cluster manager is asked for, as its supervisor last said.
    allocation: std::sync::Mutex<Option<flint_protocol::api::AllocationView>>,
    /// Standalone workers, for the `standalone` cluster manager.
    pub workers: workers::Workers,
    /// To the cluster manager's supervisor, when there is one.
    commands: std::sync::Mutex<Option<mpsc::UnboundedSender<AllocationCommand>>>,
    /// What `UpdateCredentials` carries, once `--executor-credentials` was read.
    credentials: std::sync::Mutex<Option<flint_protocol::messages::Credentials>>,
    /// The cluster once a second, for `GET /v1/cluster/history`.
    pub history: crate::history::History,
}

/// What the API asks of the cluster manager's supervisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllocationCommand {
    /// Kill this executor now; its exit is no failure.
    Kill(ExecutorId),
}

/// Why an executor cannot be decommissioned or killed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecutorRefusal {
    NotFound,
    NotAlive(String),
}

impl Driver {
    /// Opens the data dir and rebuilds every stored job: tasks that had ended keep their
    /// results, the rest run again once executors register.
    pub fn new(config: DriverConfig, http_addr: SocketAddr) -> anyhow::Result<Arc<Self>> {
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
        let restored = stored.len();
        let http_base = advertised_base(config.advertise_url.as_deref(), http_addr, host_name);
        for job in &mut stored {
            catalog::rebase(&mut job.job, &http_base);
        }
        let blocks = BlockStore::open(&config.block_store, &config.data_dir, &http_base, &usage)?;
        let scheduling = config.scheduling.clone();
        let events = JobEvents::new(config.max_event_streams);
        let driver = Arc::new(Driver {
            config,
            modules,
            files,
            blocks,
            usage,
            url_timestamps: UrlTimestamps::default(),
            store,
            idempotency: IdempotencyKeys::restore(keys),
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
                storing: Default::default(),
                deferred: HashMap::new(),
                finished,
            }),
            jobs_finished: watch::Sender::new(0),
            metrics: crate::metrics::Metrics::default(),
            events,
            executor_logs: Default::default(),
            history: Default::default(),
            allocation: Default::default(),
            workers: Default::default(),
            commands: Default::default(),
            credentials: Default::default(),
        });
        driver.apply(|s| ((), s.restore(stored, SystemTime::now())));
        if restored > 0 {
            tracing::info!(jobs = restored, "restored the live jobs from the job store");
        }
        Ok(driver)
    }

    /// Group commits of task and job ends to the job store since the driver started.
    pub fn store_commits(&self) -> u64 {
        self.store.commits()
    }

    /// Commits the task and job ends still waiting for the next group commit (blocking),
    /// so that after a clean stop no finished task runs again.
    pub fn flush_store(&self) {
        self.store.flush();
    }

    /// Accepts a job: its record is committed to the job store while its first tasks
    /// start, and this returns (and the API answers 202) only once the commit is done.
    /// The commit's sync was a third of a single-task job's round trip when it came
    /// first. A job whose record cannot be stored was never accepted: it is killed where
    /// it stands and the error returned. Its tasks may have run meanwhile, which changes
    /// nothing outside (a guest's only effect is its result); one that already ended
    /// stays as it ended, in memory only.
    pub async fn submit(self: &Arc<Self>, job: NewJob) -> Result<(), StoreError> {
        self.submit_keyed(job, None).await
    }

    /// Submits the job spec in `body`: admitted and stored ([`Self::submit`]), or with an
    /// idempotency `key`, that and no more than once per key (see [`idempotency`]).
    pub async fn submit_spec(
        self: &Arc<Self>,
        body: bytes::Bytes,
        key: Option<IdempotencyKey>,
    ) -> Result<Submitted, SubmitError> {
        match key {
            Some(key) => self.submit_once(body, key).await,
            None => {
                self.usage.check_not_full()?;
                let job = self.admit(&body)?;
                let id = job.def.id.clone();
                self.submit(job).await?;
                Ok(Submitted::Accepted(id))
            }
        }
    }

    /// [`Self::submit`], storing the idempotency key and its spec's digest (if any) with
    /// the job, in the one write.
    async fn submit_keyed(
        self: &Arc<Self>,
        job: NewJob,
        key: Option<(String, Digest)>,
    ) -> Result<(), StoreError> {
        let record = durable::job_record(&job);
        let id = job.def.id.clone();
        let driver = self.clone();
        let commit = tokio::task::spawn_blocking(move || {
            let key = key.as_ref().map(|(key, spec)| (key.as_str(), spec));
            driver.store.put_job(&record, key)
        });
        self.apply_inner(|inner| {
            inner.storing.insert(id.clone());
            ((), inner.state.submit_job(job))
        });
        let stored = match commit.await {
            Ok(stored) => stored,
            Err(e) => Err(StoreError::Db(format!("job store thread: {e}"))),
        };
        // A job that ended before its record was committed had its end held back: the
        // writer could otherwise commit the end first and find no job to end.
        let mut inner = self.lock();
        inner.storing.remove(&id);
        if let Some(Deferred {
            end,
            summary,
            attempts,
        }) = inner.deferred.remove(&id)
        {
            let write = match &stored {
                Ok(()) => {
                    let write = self.store.job_ended(id.clone(), end, summary);
                    match attempts {
                        Some(attempts) => self.store.attempts_ended(id.clone(), attempts),
                        None => write,
                    }
                }
                // Never accepted: nothing to store, and it is not among the totals.
                Err(_) => {
                    inner.finished.add(&summary, -1);
                    0
                }
            };
            inner.set_end_write(&id, write);
        }
        drop(inner);
        if let Err(e) = &stored {
            let reason = format!("not accepted: the job store could not record it: {e}");
            self.apply(|s| {
                let actions = s.stop_job(&id, reason, SystemTime::now());
                ((), actions.unwrap_or_default())
            });
        }
        stored
    }

    /// The timestamp to fetch `url` under ([`UrlTimestamps::timestamp`]).
    pub fn url_timestamp(&self, url: &str, given: Option<u64>) -> u64 {
        self.url_timestamps.timestamp(url, given, SystemTime::now())
    }

    /// A job spec's JSON checked and turned into a job: see [`admission`]. Also refuses
    /// a job no executor registered now could run.
    pub fn admit(&self, body: &[u8]) -> Result<NewJob, Rejection> {
        let job = admission::accept(self, admission::parse_job_spec(body)?)?;
        let (max_cores, any_fuel) =
            self.read(|s| (s.max_executor_cores(), s.any_executor_meters_fuel()));
        admission::check_schedulable(&job, max_cores, any_fuel)?;
        Ok(job)
    }

    pub fn executor_config(&self) -> ExecutorConfig {
        ExecutorConfig {
            app_id: self.config.app_id.clone(),
            heartbeat_interval_ms: self.config.heartbeat_interval.as_millis() as u64,
            max_log_bytes: defaults::TASK_MAX_LOG_BYTES,
            driver_http_url: self.http_base.clone(),
            fetch_allow: self.config.fetch_allow.clone(),
            block_store: self.blocks.spec().to_owned(),
            inline_result_bytes: self.config.inline_result_bytes,
            credentials_pushed: self.config.executor_credentials.is_some(),
        }
    }

    /// Reads the state. Keep the closure short: the scheduler waits on this lock.
    pub fn read<R>(&self, f: impl FnOnce(&ClusterState) -> R) -> R {
        f(&self.lock().state)
    }

    /// Changes the state and carries out what the change asks for, under one lock, so
    /// that messages to an executor leave in the order the state decided them.
    pub fn apply<R>(&self, f: impl FnOnce(&mut ClusterState) -> (R, Vec<Action>)) -> R {
        self.apply_inner(|inner| f(&mut inner.state))
    }

    /// [`Self::apply`], with the connections in reach too.
    fn apply_inner<R>(&self, f: impl FnOnce(&mut Inner) -> (R, Vec<Action>)) -> R {
        let mut inner = self.lock();
        inner.state.set_clock(Instant::now(), SystemTime::now());
        let (result, actions) = f(&mut inner);
        let mut finished = false;
        for action in actions {
            match action {
                Action::Define { executor, template } => {
                    inner.send(&executor, DriverMessage::DefineJob(template));
                }
                Action::Launch {
                    executor,
                    job,
                    launch,
                } => {
                    // Made from the launch itself, not the state, which may be further on.
                    let event = self.events.is_watched(&job).then(|| TaskEvent {
                        index: launch.index,
                        state: TaskState::Running,
                        attempt: launch.attempt,
                        executor: Some(executor.clone()),
                        error: None,
                    });
                    inner.send(&executor, DriverMessage::LaunchTask(launch));
                    if let Some(event) = event {
                        self.events.publish(&job, JobEvent::Task(event));
                    }
                }
                Action::Kill {
                    executor,
                    task,
                    attempt,
                    reason,
                } => inner.send(
                    &executor,
                    DriverMessage::KillTask {
                        task,
                        attempt,
                        reason: reason.into(),
                    },
                ),
                Action::Stop { executor } => {
                    tracing::info!(executor = %executor, "decommissioned executor drained; stopping it");
                    inner.send(&executor, DriverMessage::StopExecutor);
                }
                Action::TaskRequeued { job, event } => {
                    self.events.publish(&job, JobEvent::Task(event));
                }
                Action::TaskEnded(task) => {
                    self.publish_task(&inner.state, &task);
                    if let Some(t) = inner
                        .state
                        .jobs
                        .get_mut(&task.job)
                        .and_then(|j| j.tasks.get_mut(task.index as usize))
                    {
                        self.metrics.task_ended(t);
                        self.store.task_ended(
                            task.job.clone(),
                            task.index,
                            durable::task_end_record(t),
                        );
                        // Nothing runs an ended task again: its input can go.
                        t.input = flint_protocol::TaskInput::Inline(Vec::new());
                        t.args = Vec::new();
                        t.env = Vec::new();
                    }
                }
                Action::JobFinished(job) => {
                    for (executor, key) in inner.state.forget_job(&job) {
                        inner.send(&executor, DriverMessage::ForgetJob { key });
                    }
                    let ended = inner.state.jobs.get(&job).map(|j| {
                        match &j.error {
                            Some((kind, message)) => {
                                tracing::warn!(job = %job, state = ?j.state, kind, message, "job ended")
                            }
                            None => tracing::info!(job = %job, state = ?j.state, "job ended"),
                        }
                        let summary = durable::job_summary(j);
                        let end = durable::job_end_record(j);
                        self.publish_end(j);
                        (summary, end)
                    });
                    if let Some((summary, end)) = ended {
                        inner.finished.add(&summary, 1);
                        let write = match inner.storing.contains(&job) {
                            // Its record is still being committed (see `submit_keyed`).
                            true => {
                                let deferred = Deferred {
                                    end,
                                    summary,
                                    attempts: None,
                                };
                                inner.deferred.insert(job.clone(), deferred);
                                u64::MAX
                            }
                            false => self.store.job_ended(job.clone(), end, summary),
                        };
                        inner.ending.insert(job.clone(), write);
                        if let Some(j) = inner.state.retire_job(&job) {
                            self.archive_job(&mut inner, j);
                        }
                    }
                    finished = true;
                }
            }
        }
        for job in inner.state.take_drained() {
            self.archive_job(&mut inner, job);
        }
        inner.archive.settle(|write| self.store.is_durable(write));
        drop(inner);
        if finished {
            self.jobs_finished.send_modify(|n| *n += 1);
        }
        result
    }

    /// Runs `f` on a job, live or finished: live and recently finished ones from memory,
    /// others read from the job store (and kept in the small cache of finished jobs).
    /// `Ok(None)` when there is no such job.
    pub fn job<R>(&self, id: &JobId, f: impl FnOnce(&Job) -> R) -> Result<Option<R>, StoreError> {
        let deletions = {
            let mut inner = self.lock();
            inner.archive.settle(|write| self.store.is_durable(write));
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
        let Some(stored) = self.store.job(id)? else {
            return Ok(None);
        };
        let attempts = self.store.attempts(id)?;
        let job = Arc::new(durable::finished_job(stored, attempts));
        let mut inner = self.lock();
        // Ended and removed meanwhile? Only cache what no deletion may have raced.
        if inner.archive.deletions == deletions && !inner.state.jobs.contains_key(id) {
            inner.archive.cache(id.clone(), job.clone());
        }
        drop(inner);
        Ok(Some(f(&job)))
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

    /// Takes a drained final job out of the state. Its tasks killed while they ran are
    /// stored now, with their last attempt's times and log (tasks killed before they
    /// started are rebuilt as such from the job's end), so the job reads the same from
    /// the store as it did from memory.
    fn archive_job(&self, inner: &mut Inner, job: Job) {
        let mut last = inner.ending.get(&job.def.id).copied().unwrap_or(0);
        for (index, task) in job.tasks.iter().enumerate() {
            if task.state == TaskState::Killed && task.attempts > 0 {
                let write = self.store.task_ended(
                    job.def.id.clone(),
                    index as u32,
                    durable::task_end_record(task),
                );
                if last != u64::MAX {
                    last = last.max(write);
                }
            }
        }
        let attempts = durable::attempt_records(&job);
        match inner.deferred.get_mut(&job.def.id) {
            Some(deferred) => deferred.attempts = Some(attempts),
            None => last = last.max(self.store.attempts_ended(job.def.id.clone(), attempts)),
        }
        inner.archive(job, last);
    }

    /// Tells a job's watchers (if any) a task's new state.
    fn publish_task(&self, state: &ClusterState, id: &TaskId) {
        if !self.events.is_watched(&id.job) {
            return;
        }
        if let Some(task) = state
            .jobs
            .get(&id.job)
            .and_then(|j| j.tasks.get(id.index as usize))
        {
            let event = crate::events::task_event(id.index, task);
            self.events.publish(&id.job, JobEvent::Task(event));
        }
    }

    /// Tells a final job's watchers the tasks it killed, then that it ended.
    fn publish_end(&self, job: &crate::scheduler::Job) {
        let id = &job.def.id;
        if !self.events.is_watched(id) {
            return;
        }
        // Tasks killed with their job change state without an action of their own.
        for (index, task) in job.tasks.iter().enumerate() {
            if task.state == TaskState::Killed {
                let event = crate::events::task_event(index as u32, task);
                self.events.publish(id, JobEvent::Task(event));
            }
        }
        let view = crate::views::job_view(job);
        self.events.publish(id, JobEvent::End(Box::new(view)));
    }

    /// Registers an executor and returns the outbox its connection must drain. The
    /// outbox starts with RegisteredExecutor, so launches can only follow it.
    pub fn register_executor(
        &self,
        id: ExecutorId,
        host: String,
        cores: u32,
        pid: u32,
        meters_fuel: bool,
    ) -> Result<(u64, mpsc::UnboundedReceiver<DriverMessage>), String> {
        let (outbox, rx) = mpsc::unbounded_channel();
        // The registration and its connection's outbox change under one lock: placement
        // running in between would send the new registration's launches (and the jobs
        // they need defined) to the old connection, or to none.
        let generation = self.apply_inner(|inner| {
            match inner
                .state
                .register_executor(id.clone(), host, cores, pid, meters_fuel)
            {
                Ok((generation, mut actions)) => {
                    let _ = outbox.send(DriverMessage::RegisteredExecutor { generation });
                    // Before any launch, so that its first S3 access has them.
                    if let Some(credentials) = self.credentials() {
                        let _ = outbox.send(DriverMessage::UpdateCredentials(credentials));
                    }
                    // Replacing a link drops the old outbox, which ends that connection.
                    inner.links.insert(id, Link { generation, outbox });
                    actions.extend(inner.state.make_offers());
                    (Ok(generation), actions)
                }
                Err(reason) => (Err(reason), Vec::new()),
            }
        })?;
        Ok((generation, rx))
    }

    pub fn executor_lost(&self, id: &ExecutorId, generation: u64, reason: &str) {
        tracing::warn!(executor = %id, generation, reason, "executor lost");
        self.apply(|s| ((), s.executor_lost(id, generation)));
        self.drop_link(id, generation);
    }

    /// Forgets a connection's outbox; its writer ends and the connection closes, so an
    /// executor that was declared lost cannot keep talking as if it were not.
    pub fn drop_link(&self, id: &ExecutorId, generation: u64) {
        let mut inner = self.lock();
        if inner
            .links
            .get(id)
            .is_some_and(|l| l.generation == generation)
        {
            inner.links.remove(id);
        }
    }

    /// A cluster manager launched this executor; it registers later, or exits.
    pub fn executor_launched(
        &self,
        id: &ExecutorId,
        by: crate::scheduler::LaunchedBy,
        pid: Option<u32>,
    ) {
        let mut inner = self.lock();
        inner.state.set_clock(Instant::now(), SystemTime::now());
        inner.state.executor_launched(id, by, pid);
    }

    pub fn executor_exited(
        &self,
        id: &ExecutorId,
        exit: flint_protocol::exit::ProcessExit,
        cause: Option<&str>,
    ) {
        let mut inner = self.lock();
        inner.state.set_clock(Instant::now(), SystemTime::now());
        inner.state.executor_exited(id, exit, cause);
    }

    /// `POST /v1/executors/{id}/decommission`: no new tasks go to it, StopExecutor once
    /// it has drained or `--decommission-timeout-ms` has passed.
    pub fn decommission_executor(
        &self,
        id: &ExecutorId,
        only_if_idle: bool,
    ) -> Result<(), ExecutorRefusal> {
        let deadline = Instant::now() + self.config.allocation.decommission_timeout;
        self.apply(|s| match s.executors.get(id) {
            None => (Err(ExecutorRefusal::NotFound), Vec::new()),
            Some(_) => match s.decommission_executor(id, deadline, only_if_idle) {
                Ok(actions) => (Ok(()), actions),
                Err(why) => (Err(ExecutorRefusal::NotAlive(why)), Vec::new()),
            },
        })
    }

    /// `DELETE /v1/executors/{id}` (Spark's RemoveExecutor): one its cluster manager
    /// launched is killed through it (and its exit not counted as a failure); one that
    /// dialled in is told to shut down and dropped, its tasks run elsewhere.
    pub fn kill_executor(&self, id: &ExecutorId) -> Result<(), ExecutorRefusal> {
        let (managed, generation) = self.read(|s| match s.executors.get(id) {
            None => (None, 0),
            Some(e) if !matches!(e.state, ExecutorState::Alive | ExecutorState::Launching) => {
                (Some(Err(e.state)), 0)
            }
            Some(e) => (Some(Ok(e.launched_by.is_some())), e.generation),
        });
        match managed {
            None => Err(ExecutorRefusal::NotFound),
            Some(Err(state)) => Err(ExecutorRefusal::NotAlive(format!(
                "executor {id} is {}",
                state.as_str()
            ))),
            Some(Ok(true)) => {
                let commands = self.commands.lock().expect("commands lock poisoned");
                match commands.as_ref() {
                    Some(tx) if tx.send(AllocationCommand::Kill(id.clone())).is_ok() => Ok(()),
                    _ => Err(ExecutorRefusal::NotAlive(
                        "the driver's cluster manager has stopped".into(),
                    )),
                }
            }
            Some(Ok(false)) => {
                self.lock().send(id, DriverMessage::Shutdown);
                self.executor_lost(id, generation, "killed through the API");
                Ok(())
            }
        }
    }

    /// Where the cluster manager's supervisor hears the API's kills.
    pub fn set_commands(&self, commands: mpsc::UnboundedSender<AllocationCommand>) {
        *self.commands.lock().expect("commands lock poisoned") = Some(commands);
    }

    /// Lost with its host, or never launched: see `ClusterState::executor_gone`.
    /// `note`: the reason's name and a sentence, for its view.
    pub fn executor_gone(&self, id: &ExecutorId, note: Option<(&str, &str)>) {
        self.lock().state.executor_gone(id, note);
    }

    pub fn set_allocation(&self, view: flint_protocol::api::AllocationView) {
        *self.allocation.lock().expect("allocation lock poisoned") = Some(view);
    }

    /// The allocation as its supervisor last said, with the executors launching and
    /// running counted from their states now.
    pub fn allocation(&self) -> Option<flint_protocol::api::AllocationView> {
        let mut view = self
            .allocation
            .lock()
            .expect("allocation lock poisoned")
            .clone()?;
        self.read(|s| {
            for e in s.executors.values().filter(|e| e.launched_by.is_some()) {
                match e.state {
                    ExecutorState::Launching => view.launching += 1,
                    ExecutorState::Alive => {
                        view.running += 1;
                        view.decommissioning += u32::from(e.decommission_by.is_some());
                        view.idle += u32::from(e.running.is_empty());
                    }
                    _ => {}
                }
            }
        });
        Some(view)
    }

    pub fn heartbeat(&self, id: &ExecutorId, generation: u64, report: Heartbeat) {
        let mut inner = self.lock();
        inner.state.set_clock(Instant::now(), SystemTime::now());
        inner.state.heartbeat(id, generation, Some(report));
    }

    /// Task ends that arrived together from one executor: applied under one lock,
    /// with one round of placement after them.
    pub fn status_updates(
        &self,
        id: &ExecutorId,
        generation: u64,
        statuses: Vec<flint_protocol::TaskStatus>,
    ) {
        if statuses.is_empty() {
            return;
        }
        self.apply(|s| {
            // Any frame shows the executor is alive, not only heartbeats.
            s.heartbeat(id, generation, None);
            (
                (),
                s.status_updates(id, generation, statuses, SystemTime::now()),
            )
        });
    }

    /// A receiver that changes whenever a job ends.
    pub fn job_endings(&self) -> watch::Receiver<u64> {
        self.jobs_finished.subscribe()
    }

    /// Tells every executor the driver is going away.
    /// The object-store credentials executors get (`--executor-credentials`).
    pub fn credentials(&self) -> Option<flint_protocol::messages::Credentials> {
        self.credentials
            .lock()
            .expect("credentials lock poisoned")
            .clone()
    }

    /// New credentials (a refreshed file): kept for executors that register later, and
    /// sent now to every connected one. Stored before the send, so that a registration
    /// in between gets these or is on the list the send goes to.
    pub fn set_credentials(&self, credentials: flint_protocol::messages::Credentials) {
        *self.credentials.lock().expect("credentials lock poisoned") = Some(credentials.clone());
        let inner = self.lock();
        for link in inner.links.values() {
            let _ = link
                .outbox
                .send(DriverMessage::UpdateCredentials(credentials.clone()));
        }
    }

    pub fn shutdown_executors(&self) {
        let inner = self.lock();
        for link in inner.links.values() {
            let _ = link.outbox.send(DriverMessage::Shutdown);
        }
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

    /// The write that stores a job's end, now known.
    fn set_end_write(&mut self, job: &JobId, write: u64) {
        match self.ending.get_mut(job) {
            Some(at) => *at = write,
            None => self.archive.set_write(job, write),
        }
    }

    /// A final job out of the scheduler's state, into the finished jobs in memory, once
    /// `last_write` (its end, or later writes of its tasks) is committed.
    fn archive(&mut self, job: Job, last_write: u64) {
        self.ending.remove(&job.def.id);
        self.archive.finished(last_write, archive::strip(job));
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
