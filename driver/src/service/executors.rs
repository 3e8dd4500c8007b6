//! The executors' lifecycle as the driver sees it: registration and its connection's
//! outbox, heartbeats and status frames, loss, decommission and kill, what the cluster
//! manager's supervisor reports and is asked for, and the credentials pushed to every
//! connection. Apart from submission because each entry point here starts from an
//! executor (its connection, its process, its supervisor); what that does to jobs goes
//! through `apply` like any other change.

use std::time::{Instant, SystemTime};

use flint_protocol::api::{CodedError, ErrorCode, ExecutorState};
use flint_protocol::messages::{ExecutorConfig, Heartbeat};
use flint_protocol::{DriverMessage, ExecutorId, JobId, defaults};
use tokio::sync::mpsc;

use super::reads::{Panicked, off_runtime};
use super::{Driver, Link};
use crate::executor_logs::{self, EXECUTOR_LOG_TAIL_BYTES};

/// What the API asks of the cluster manager's supervisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllocationCommand {
    /// Kill this executor now; its exit is no failure.
    Kill(ExecutorId),
    /// It was declared lost (no heartbeat): release it from its resource manager (its
    /// process killed, its pod deleted, its batch job cancelled) and launch another.
    Release(ExecutorId),
}

/// Why an executor cannot be decommissioned or killed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecutorRefusal {
    #[error("no executor {0}")]
    NotFound(ExecutorId),
    #[error("{0}")]
    NotAlive(String),
}

impl CodedError for ExecutorRefusal {
    fn code(&self) -> ErrorCode {
        match self {
            ExecutorRefusal::NotFound(_) => ErrorCode::ExecutorNotFound,
            ExecutorRefusal::NotAlive(_) => ErrorCode::ExecutorNotAlive,
        }
    }
}

/// Why an executor's log cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("no executor {0}")]
    NotFound(ExecutorId),
    #[error(
        "executor {0} was not launched by this driver's cluster manager: its log is wherever \
         its own stderr goes"
    )]
    NoLog(ExecutorId),
    /// The driver launched it, but its log file cannot be read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Panicked(#[from] Panicked),
}

impl CodedError for LogError {
    fn code(&self) -> ErrorCode {
        match self {
            LogError::NotFound(_) => ErrorCode::ExecutorNotFound,
            LogError::NoLog(_) => ErrorCode::NoLog,
            LogError::Io(_) => ErrorCode::Storage,
            LogError::Panicked(e) => e.code(),
        }
    }
}

/// A registration: its generation, its connection's outbox, and a weak sender to it.
pub type Registered = (
    u64,
    mpsc::UnboundedReceiver<DriverMessage>,
    mpsc::WeakUnboundedSender<DriverMessage>,
);

impl Driver {
    pub fn executor_config(&self) -> ExecutorConfig {
        ExecutorConfig {
            app_id: self.config.app_id.clone(),
            heartbeat_interval_ms: self.config.heartbeat_interval.as_millis() as u64,
            max_log_bytes: defaults::TASK_MAX_LOG_BYTES,
            driver_http_url: self.http_base.clone(),
            fetch_allow: self.config.fetch_allow.clone(),
            egress_allow: self.config.egress_allow.clone(),
            block_store: self.uploads.blocks.spec().to_owned(),
            inline_result_bytes: self.config.inline_result_bytes,
            credentials_pushed: self.config.executor_credentials.is_some(),
        }
    }

    /// Registers an executor and returns the outbox its connection must drain. The
    /// outbox starts with RegisteredExecutor, so launches can only follow it. The
    /// attempts it lists (`held`) are adopted or dropped before any placement. Known to
    /// the job store from now on, so that a restarted driver waits for it.
    pub fn register_executor(
        &self,
        id: ExecutorId,
        host: String,
        cores: u32,
        pid: u32,
        meters_fuel: bool,
        held: Vec<flint_protocol::HeldAttempt>,
    ) -> Result<Registered, String> {
        let (outbox, rx) = mpsc::unbounded_channel();
        let weak = outbox.downgrade();
        // The registration and its connection's outbox change under one lock: placement
        // running in between would send the new registration's launches (and the jobs
        // they need defined) to the old connection, or to none.
        let known = id.0.clone();
        let generation = self.apply_inner(|inner| {
            match inner
                .state
                .register_executor(id.clone(), host, cores, pid, meters_fuel, held)
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
        self.jobs.store.executor_known(&known, true);
        Ok((generation, rx, weak))
    }

    pub fn executor_lost(&self, id: &ExecutorId, generation: u64, reason: &str) {
        tracing::warn!(executor = %id, generation, reason, "executor lost");
        let lost = self.apply(|s| {
            let was_live = s
                .executors
                .get(id)
                .is_some_and(|e| e.generation == generation && e.state == ExecutorState::Alive);
            (was_live, s.executor_lost(id, generation))
        });
        // Only the registration that was live leaves the store's list: a lost old
        // generation's connection closing after its executor registered again must not
        // take the new one off it.
        if lost {
            self.executor_left(id);
        }
        self.drop_link(id, generation);
    }

    /// Where an executor's task ends are acknowledged: once every store write made
    /// before this call is committed, and no job among `jobs` is still having its record
    /// committed (`submit_keyed` holds its ends until then), the ends applied before the
    /// call are durable. `None` while such a job's record is being committed: ask again.
    pub fn end_mark(&self, jobs: &[JobId]) -> Option<u64> {
        let inner = self.lock();
        if jobs.iter().any(|job| inner.storing.contains_key(job)) {
            return None;
        }
        Some(self.jobs.store.last_write())
    }

    /// Resolves once write `mark` is committed (or the store's writer is gone).
    pub async fn durable(&self, mark: u64) {
        let mut durable = self.jobs.store.durable();
        let _ = durable.wait_for(|at| *at >= mark).await;
    }

    /// The executor is not to be waited for after a restart (lost, expired, killed).
    pub fn executor_left(&self, id: &ExecutorId) {
        self.jobs.store.executor_known(&id.0, false);
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

    /// The last [`EXECUTOR_LOG_TAIL_BYTES`] of the stderr of an executor the driver's
    /// cluster manager launched, read off the runtime.
    pub async fn executor_log(&self, id: &ExecutorId) -> Result<Vec<u8>, LogError> {
        let Some(path) = self.cluster.executor_logs.get(id) else {
            return Err(match self.read(|s| s.executors.contains_key(id)) {
                true => LogError::NoLog(id.clone()),
                false => LogError::NotFound(id.clone()),
            });
        };
        Ok(off_runtime(move || executor_logs::read_tail(&path, EXECUTOR_LOG_TAIL_BYTES)).await??)
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
            None => (Err(ExecutorRefusal::NotFound(id.clone())), Vec::new()),
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
            None => Err(ExecutorRefusal::NotFound(id.clone())),
            Some(Err(state)) => Err(ExecutorRefusal::NotAlive(format!(
                "executor {id} is {}",
                state.as_str()
            ))),
            Some(Ok(true)) => {
                let commands = self
                    .cluster
                    .commands
                    .lock()
                    .expect("commands lock poisoned");
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

    /// Its cluster manager says this executor ended (its batch job's node failed, its
    /// time limit passed) while its connection may still be up (the process outliving
    /// the allocation, as on a Slurm node whose slurmd died): it is told to stop and
    /// dropped, its tasks run elsewhere, so that it runs nothing outside an allocation.
    pub fn end_if_alive(&self, id: &ExecutorId, why: &str) {
        let alive = self.read(|s| {
            (s.executors.get(id))
                .filter(|e| e.state == ExecutorState::Alive)
                .map(|e| e.generation)
        });
        if let Some(generation) = alive {
            self.lock().send(id, DriverMessage::Shutdown);
            self.executor_lost(id, generation, why);
        }
    }

    /// An executor declared lost (no heartbeat): one its cluster manager launched is
    /// released through it and replaced (Spark's HeartbeatReceiver kills and replaces
    /// it too), so that a host gone silent holds no pod, batch job or slot for good.
    pub fn release_lost(&self, id: &ExecutorId) {
        let managed = self.read(|s| s.executors.get(id).is_some_and(|e| e.launched_by.is_some()));
        if !managed {
            return;
        }
        let commands = self
            .cluster
            .commands
            .lock()
            .expect("commands lock poisoned");
        if let Some(tx) = commands.as_ref() {
            let _ = tx.send(AllocationCommand::Release(id.clone()));
        }
    }

    /// Where the cluster manager's supervisor hears the API's kills.
    pub fn set_commands(&self, commands: mpsc::UnboundedSender<AllocationCommand>) {
        *self
            .cluster
            .commands
            .lock()
            .expect("commands lock poisoned") = Some(commands);
    }

    /// Lost with its host, or never launched: see `ClusterState::executor_gone`.
    /// `note`: the reason's name and a sentence, for its view.
    pub fn executor_gone(&self, id: &ExecutorId, note: Option<(&str, &str)>) {
        self.lock().state.executor_gone(id, note);
    }

    pub fn set_allocation(&self, view: flint_protocol::api::AllocationView) {
        *self
            .cluster
            .allocation
            .lock()
            .expect("allocation lock poisoned") = Some(view);
    }

    /// The allocation as its supervisor last said, with the executors launching and
    /// running counted from their states now.
    pub fn allocation(&self) -> Option<flint_protocol::api::AllocationView> {
        let mut view = self
            .cluster
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
        for status in &statuses {
            if !status.end.egress_denied.is_empty() && self.events.is_watched(&status.task.job) {
                let denial = flint_protocol::api::EgressDenial {
                    index: status.task.index,
                    attempt: status.attempt,
                    executor: id.clone(),
                    denied: status.end.egress_denied.clone(),
                };
                let event = crate::events::JobEvent::EgressDenied(denial);
                self.events.publish(&status.task.job, event);
            }
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

    /// The object-store credentials executors get (`--executor-credentials`).
    pub fn credentials(&self) -> Option<flint_protocol::messages::Credentials> {
        self.cluster
            .credentials
            .lock()
            .expect("credentials lock poisoned")
            .clone()
    }

    /// New credentials (a refreshed file): kept for executors that register later, and
    /// sent now to every connected one. Stored before the send, so that a registration
    /// in between gets these or is on the list the send goes to.
    pub fn set_credentials(&self, credentials: flint_protocol::messages::Credentials) {
        *self
            .cluster
            .credentials
            .lock()
            .expect("credentials lock poisoned") = Some(credentials.clone());
        let inner = self.lock();
        for link in inner.links.values() {
            let _ = link
                .outbox
                .send(DriverMessage::UpdateCredentials(credentials.clone()));
        }
    }
    /// Tells every executor the driver is going away.
    pub fn shutdown_executors(&self) {
        let inner = self.lock();
        for link in inner.links.values() {
            let _ = link.outbox.send(DriverMessage::Shutdown);
        }
    }

    /// Executors connected now (their connection ends when they hang up).
    pub fn linked_executors(&self) -> usize {
        self.lock().links.len()
    }
}
