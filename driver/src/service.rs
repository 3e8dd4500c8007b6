//! The driver as a service: listeners, the state behind its lock, and action dispatch.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use flint_protocol::api::{TaskEvent, TaskState};
use flint_protocol::messages::{ExecutorConfig, Heartbeat};
use flint_protocol::{DriverMessage, ExecutorId, TaskId, defaults};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::blocks::BlockStore;
use crate::durable;
use crate::events::{JobEvent, JobEvents};
use crate::modules::ModuleStore;
use crate::state::{Action, ClusterState, NewJob, SchedulingConfig};
use crate::store::{JobStore, StoreError};

/// Settings of one driver, validated by whoever parsed them.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub data_dir: PathBuf,
    pub app_id: String,
    /// Required in every executor's hello when set, and accepted (besides the API
    /// token) on module and file downloads.
    pub cluster_secret: Option<String>,
    /// Bearer token every API request must carry when set (`/healthz`,
    /// `/v1/openapi.json` and the web UI's page `/ui` excepted).
    pub api_token: Option<String>,
    /// Timeouts and concurrency of the HTTP edge.
    pub edge: crate::edge::EdgeLimits,
    pub heartbeat_interval: Duration,
    /// How often offers are made even when nothing happened (Spark's revive interval).
    pub revive_interval: Duration,
    /// An executor silent for longer than this is lost (its connection is dropped and
    /// its tasks run elsewhere).
    pub executor_timeout: Duration,
    /// Origins executors may fetch from besides the driver (`--fetch-allow`).
    pub fetch_allow: Vec<String>,
    /// `driver` or an object store URL (`--block-store`).
    pub block_store: String,
    /// Results larger than this go to the block store.
    pub inline_result_bytes: u64,
    /// Exclusion, locality wait and speculation.
    pub scheduling: SchedulingConfig,
    /// Event streams (`GET /v1/jobs/{id}/events`) open at once; more get 503.
    pub max_event_streams: usize,
    /// The base URL executors reach the HTTP API at (module, file and block
    /// downloads and uploads), when the listen address is not it (`--advertise-url`).
    pub advertise_url: Option<String>,
    /// Task and job ends are group-committed to the job store at most this often
    /// (`--commit-interval-ms`).
    pub commit_interval: Duration,
}

impl DriverConfig {
    pub fn new(data_dir: PathBuf) -> Self {
        DriverConfig {
            data_dir,
            app_id: "flint".into(),
            cluster_secret: None,
            api_token: None,
            edge: crate::edge::EdgeLimits::default(),
            heartbeat_interval: Duration::from_millis(defaults::HEARTBEAT_INTERVAL_MS),
            revive_interval: Duration::from_secs(1),
            executor_timeout: Duration::from_millis(defaults::EXECUTOR_TIMEOUT_MS),
            fetch_allow: Vec::new(),
            block_store: crate::blocks::DRIVER_BLOCK_STORE.into(),
            inline_result_bytes: defaults::INLINE_RESULT_BYTES,
            scheduling: SchedulingConfig::default(),
            max_event_streams: defaults::MAX_EVENT_STREAMS,
            advertise_url: None,
            commit_interval: Duration::from_millis(defaults::COMMIT_INTERVAL_MS),
        }
    }
}

/// Where executors reach the HTTP API: the advertised URL if there is one; else the
/// listen address, unless that is a wildcard (0.0.0.0, ::), which means "this host" to
/// a local client only: then this machine's host name, as Spark's driver host defaults
/// to it.
fn advertised_base(
    advertise: Option<&str>,
    listen: SocketAddr,
    host_name: impl FnOnce() -> Option<String>,
) -> String {
    if let Some(url) = advertise {
        return url.trim_end_matches('/').to_owned();
    }
    if listen.ip().is_unspecified()
        && let Some(host) = host_name().filter(|h| !h.is_empty())
    {
        return format!("http://{host}:{}", listen.port());
    }
    format!("http://{listen}")
}

/// This machine's host name, as the kernel has it.
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
}

/// A live connection's outbox, tagged with the registration it belongs to.
struct Link {
    generation: u64,
    outbox: mpsc::UnboundedSender<DriverMessage>,
}

struct Inner {
    state: ClusterState,
    links: HashMap<ExecutorId, Link>,
}

pub struct Driver {
    pub config: DriverConfig,
    pub modules: ModuleStore,
    pub files: ModuleStore,
    pub blocks: BlockStore,
    /// When the driver was first given each URL a job referred to (a file or an input):
    /// executors cache by (url, timestamp), so every job naming the URL shares one
    /// download until a job gives a newer timestamp.
    url_timestamps: Mutex<HashMap<String, u64>>,
    store: JobStore,
    /// `http://HOST:PORT` of the API, from which executors fetch modules.
    pub http_base: String,
    inner: Mutex<Inner>,
    /// Bumped whenever a job reaches a final state, for `?wait=` callers.
    jobs_finished: watch::Sender<u64>,
    pub metrics: crate::metrics::Metrics,
    /// Jobs' event streams.
    pub events: Arc<JobEvents>,
    /// Executors' stderr files, for those `flint dev` started.
    pub executor_logs: crate::executor_logs::ExecutorLogs,
}

impl Driver {
    /// Opens the data dir and rebuilds every stored job: tasks that had ended keep their
    /// results, the rest run again once executors register.
    pub fn new(config: DriverConfig, http_addr: SocketAddr) -> anyhow::Result<Arc<Self>> {
        let modules = ModuleStore::open(config.data_dir.join("modules"))?;
        let files = ModuleStore::open_files(config.data_dir.join("files"))?;
        std::fs::create_dir_all(&config.data_dir)?;
        let store = JobStore::open(&config.data_dir.join("jobs.redb"), config.commit_interval)?;
        let stored = store.load()?;
        let restored = stored.len();
        let http_base = advertised_base(config.advertise_url.as_deref(), http_addr, host_name);
        let blocks = BlockStore::open(&config.block_store, &config.data_dir, &http_base)?;
        let scheduling = config.scheduling.clone();
        let events = JobEvents::new(config.max_event_streams);
        let driver = Arc::new(Driver {
            config,
            modules,
            files,
            blocks,
            url_timestamps: Mutex::new(HashMap::new()),
            store,
            http_base,
            inner: Mutex::new(Inner {
                state: ClusterState::new(
                    SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(1, |d| d.as_micros() as u64),
                    scheduling,
                    Instant::now(),
                ),
                links: HashMap::new(),
            }),
            jobs_finished: watch::Sender::new(0),
            metrics: crate::metrics::Metrics::default(),
            events,
            executor_logs: Default::default(),
        });
        driver.apply(|s| ((), s.restore(stored, SystemTime::now())));
        if restored > 0 {
            tracing::info!(jobs = restored, "restored jobs from the job store");
        }
        Ok(driver)
    }

    /// Group commits of task and job ends to the job store since the driver started.
    pub fn store_commits(&self) -> u64 {
        self.store.commits()
    }

    /// Accepts a job: its record is committed to the job store while its first tasks
    /// start, and this returns (and the API answers 202) only once the commit is done.
    /// The commit's sync was a third of a single-task job's round trip when it came
    /// first. A job whose record cannot be stored was never accepted: it is killed where
    /// it stands and the error returned. Its tasks may have run meanwhile, which changes
    /// nothing outside (a guest's only effect is its result); one that already ended
    /// stays as it ended, in memory only.
    pub async fn submit(self: &Arc<Self>, job: NewJob) -> Result<(), StoreError> {
        let record = durable::job_record(&job);
        let id = job.def.id.clone();
        let driver = self.clone();
        let commit = tokio::task::spawn_blocking(move || driver.store.put_job(&record));
        self.apply(|s| ((), s.submit_job(job)));
        let stored = match commit.await {
            Ok(stored) => stored,
            Err(e) => Err(StoreError::Db(format!("job store thread: {e}"))),
        };
        if let Err(e) = &stored {
            let reason = format!("not accepted: the job store could not record it: {e}");
            self.apply(|s| {
                let actions = s.stop_job(&id, reason, SystemTime::now());
                ((), actions.unwrap_or_default())
            });
        }
        stored
    }

    /// The timestamp to fetch `url` under: `given` when a job names one newer than what
    /// is known (and it becomes the known one), else the known one, else now.
    ///
    /// Never [`FetchRef::DRIVER_MADE`] (0), which marks the refs the driver makes itself
    /// and is what executors send the cluster secret for: a job's `timestamp_ms: 0` (or
    /// a clock before 1970) becomes 1, so that no URL a job names, even one at the
    /// driver's own routes, can pass for the driver's.
    ///
    /// [`FetchRef::DRIVER_MADE`]: flint_protocol::FetchRef::DRIVER_MADE
    pub fn url_timestamp(&self, url: &str, given: Option<u64>) -> u64 {
        let given = given.map(|t| t.max(1));
        let mut known = self
            .url_timestamps
            .lock()
            .expect("url timestamps lock poisoned");
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(1, |d| (d.as_millis() as u64).max(1));
        let entry = known.entry(url.to_owned()).or_insert(given.unwrap_or(now));
        if let Some(given) = given
            && given > *entry
        {
            *entry = given;
        }
        given.unwrap_or(*entry)
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
        inner.state.set_clock(Instant::now());
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
                Action::TaskRequeued { job, event } => {
                    self.events.publish(&job, JobEvent::Task(event));
                }
                Action::TaskEnded(task) => {
                    self.publish_task(&inner.state, &task);
                    if let Some(t) = inner
                        .state
                        .jobs
                        .get(&task.job)
                        .and_then(|j| j.tasks.get(task.index as usize))
                    {
                        self.metrics.task_ended(t);
                        self.store.task_ended(
                            task.job.clone(),
                            task.index,
                            durable::task_end_record(t),
                        );
                    }
                }
                Action::JobFinished(job) => {
                    if let Some(j) = inner.state.jobs.get(&job) {
                        match &j.error {
                            Some((kind, message)) => {
                                tracing::warn!(job = %job, state = ?j.state, kind, message, "job ended")
                            }
                            None => tracing::info!(job = %job, state = ?j.state, "job ended"),
                        }
                        self.store
                            .job_ended(job.clone(), durable::job_end_record(j));
                        self.publish_end(j);
                    }
                    for (executor, key) in inner.state.forget_job(&job) {
                        inner.send(&executor, DriverMessage::ForgetJob { key });
                    }
                    finished = true;
                }
            }
        }
        drop(inner);
        if finished {
            self.jobs_finished.send_modify(|n| *n += 1);
        }
        result
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
    fn publish_end(&self, job: &crate::state::Job) {
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
        let view = crate::api::job_view(job);
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

    pub fn executor_exited(&self, id: &ExecutorId, exit_code: Option<i32>) {
        let mut inner = self.lock();
        inner.state.set_clock(Instant::now());
        inner.state.executor_exited(id, exit_code);
    }

    pub fn heartbeat(&self, id: &ExecutorId, generation: u64, report: Heartbeat) {
        let mut inner = self.lock();
        inner.state.set_clock(Instant::now());
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

/// Both listeners of a driver, bound before it runs so callers learn the ports.
pub struct Listeners {
    pub http: TcpListener,
    pub executors: TcpListener,
}

/// Serves the API and the executor port until `shutdown` resolves, then tells executors
/// to stop.
pub async fn run(
    driver: Arc<Driver>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let executor_server = tokio::spawn(crate::executors::serve(
        listeners.executors,
        driver.clone(),
        stop_rx.clone(),
    ));
    let reviver = tokio::spawn(revive_loop(driver.clone()));
    let app = crate::api::router(driver.clone());
    let limits = driver.config.edge.clone();
    let http = tokio::spawn(async move {
        crate::edge::serve(listeners.http, app, &limits, stop_rx).await;
    });
    shutdown.await;
    tracing::info!("driver shutting down");
    driver.shutdown_executors();
    let _ = stop_tx.send(true);
    reviver.abort();
    // Give the Shutdown messages a moment to leave before connections are dropped.
    let _ = tokio::time::timeout(Duration::from_secs(2), executor_server).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), http).await;
    // Ends waiting for the next group commit are kept: after a clean stop no finished
    // task runs again.
    let store = driver.clone();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::task::spawn_blocking(move || store.store.flush()),
    )
    .await;
    Ok(())
}

/// Periodic offers (Spark's revive), the heartbeat deadline, the end of locality waits
/// and the search for slow tasks to copy. Checked a few times per timeout, so a silent
/// executor is lost within about 1.25 timeouts.
async fn revive_loop(driver: Arc<Driver>) {
    let scheduling = &driver.config.scheduling;
    let mut every = driver
        .config
        .revive_interval
        .min(driver.config.executor_timeout / 4);
    if !scheduling.locality_wait.is_zero() {
        every = every.min(scheduling.locality_wait.max(Duration::from_millis(10)));
    }
    if let Some(speculation) = scheduling.speculation {
        every = every.min(speculation.interval.max(Duration::from_millis(10)));
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let timeout = driver.config.executor_timeout;
        let expired = driver.apply(|s| {
            let (expired, mut actions) = s.expire_executors(timeout);
            actions.extend(s.make_offers());
            actions.extend(s.speculate());
            (expired, actions)
        });
        for (id, generation) in expired {
            tracing::warn!(executor = %id, generation, ?timeout, "no heartbeat; executor lost");
            driver.drop_link(&id, generation);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use flint_protocol::JobId;
    use flint_protocol::api::JobState;

    use super::*;

    #[tokio::test]
    async fn a_job_is_answered_once_stored_and_one_that_cannot_be_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let driver = Driver::new(
            DriverConfig::new(dir.path().to_owned()),
            "127.0.0.1:7070".parse().unwrap(),
        )
        .unwrap();
        driver
            .submit(crate::state::tests::job("kept", 3, 1))
            .await
            .unwrap();
        let stored = driver.store.load().unwrap();
        assert_eq!(stored.len(), 1, "committed before submit returned");
        assert_eq!(stored[0].job.def.id, JobId("kept".into()));

        driver.store.refuse_jobs.store(true, Ordering::Relaxed);
        let err = driver
            .submit(crate::state::tests::job("lost", 3, 1))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("No space left"), "{err}");
        let (state, error, pending) = driver.read(|s| {
            let job = &s.jobs[&JobId("lost".into())];
            (job.state, job.error.clone(), job.counts().pending)
        });
        assert_eq!(state, JobState::Killed, "never accepted, so stopped");
        let (kind, message) = error.unwrap();
        assert_eq!(kind, "killed");
        assert!(
            message.contains("not accepted: the job store could not record it"),
            "{message}"
        );
        assert_eq!(pending, 0, "nothing of it left to run");
        assert_eq!(
            driver.store.load().unwrap().len(),
            1,
            "only the first is stored"
        );
    }

    #[test]
    fn executors_get_the_advertised_url_or_a_reachable_host() {
        let any = "0.0.0.0:7070".parse().unwrap();
        let local = "127.0.0.1:7070".parse().unwrap();
        let name = || Some("driver-7".to_owned());
        assert_eq!(
            advertised_base(Some("https://flint.example:443/"), any, name),
            "https://flint.example:443"
        );
        assert_eq!(advertised_base(None, any, name), "http://driver-7:7070");
        assert_eq!(
            advertised_base(None, "[::]:9".parse().unwrap(), name),
            "http://driver-7:9"
        );
        assert_eq!(advertised_base(None, local, name), "http://127.0.0.1:7070");
        assert_eq!(advertised_base(None, any, || None), "http://0.0.0.0:7070");
    }
}
