//! Standalone workers (`flint worker`) registered with the driver, as Spark's Master
//! keeps its Workers: what each offers and what it runs, its connection's outbox, and
//! where a new executor goes. The `standalone` cluster manager attaches to hear what
//! the workers say; without it, workers are refused. The executors a worker lists when
//! it registers (they outlived a connection, or the last driver) take their room on it
//! at once, before anything else can be placed there.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use flint_protocol::ExecutorId;
use flint_protocol::api::WorkerView;
use flint_protocol::messages::{
    DriverToWorker, WorkerExecutorState, WorkerMessage, WorkerRegistration,
};
use tokio::sync::mpsc;

/// What the workers said, for the `standalone` cluster manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerEvent {
    /// A worker registered (again): `reported` are the executors it still runs.
    Registered {
        worker: String,
        reported: Vec<ExecutorId>,
    },
    ExecutorState {
        worker: String,
        executor: ExecutorId,
        state: WorkerExecutorState,
    },
    /// Its connection is gone: the executors it ran are lost with it.
    Lost {
        worker: String,
        executors: Vec<ExecutorId>,
        reason: String,
    },
}

/// One executor asked of a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub executor: ExecutorId,
    pub app_id: String,
    pub cores: u32,
    pub memory_mb: u64,
}

/// Live workers the driver takes; a registration past it is refused, naming it.
pub const MAX_WORKERS: usize = 10_000;
/// Lost workers still listed (for `GET /v1/workers`); the longest lost go first, so
/// workers that come and go with new ids for months cost a bounded map.
pub const LOST_WORKERS_KEPT: usize = 256;
/// Longest worker id or host name (a DNS name's limit).
pub const MAX_WORKER_NAME_BYTES: usize = 253;

#[derive(Default)]
pub struct Workers {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    workers: BTreeMap<String, Worker>,
    notify: Option<mpsc::UnboundedSender<WorkerEvent>>,
    /// The cores and memory an executor a worker lists is taken to hold: what the
    /// driver launches each one with.
    listed: (u32, u64),
    next_generation: u64,
}

struct Worker {
    host: String,
    cores: u32,
    memory_mb: u64,
    pid: u32,
    generation: u64,
    alive: bool,
    /// Executors placed here and not yet exited: their cores and memory.
    executors: BTreeMap<ExecutorId, (u32, u64)>,
    outbox: Option<mpsc::UnboundedSender<DriverToWorker>>,
    last_heartbeat: Instant,
    registered_at: SystemTime,
    lost_reason: Option<String>,
    lost_at: Option<Instant>,
}

impl Worker {
    fn free(&self) -> (u32, u64) {
        let (cores, memory) = self
            .executors
            .values()
            .fold((0u32, 0u64), |(c, m), (ec, em)| (c + ec, m + em));
        (
            self.cores.saturating_sub(cores),
            self.memory_mb.saturating_sub(memory),
        )
    }
}

impl Workers {
    /// The standalone cluster manager listens from here on; `listed` is the cores and
    /// memory of each executor it launches (what one a worker lists holds).
    pub fn attach(&self, notify: mpsc::UnboundedSender<WorkerEvent>, listed: (u32, u64)) {
        let mut inner = self.lock();
        inner.notify = Some(notify);
        inner.listed = listed;
    }

    /// Registers a worker and its connection's outbox; returns its generation. The
    /// same process registering again (a reconnect seen before its old connection
    /// closed) replaces its old registration; another live worker of that id is refused.
    pub fn register(
        &self,
        registration: WorkerRegistration,
        outbox: mpsc::UnboundedSender<DriverToWorker>,
        app_id: &str,
        heartbeat_interval: Duration,
    ) -> Result<u64, String> {
        let mut inner = self.lock();
        let Some(notify) = inner.notify.clone() else {
            return Err(
                "this driver launches no executors on workers: start it with --cluster-manager standalone"
                    .into(),
            );
        };
        if registration.cores == 0 {
            return Err("a worker needs at least one core".into());
        }
        for (what, name) in [
            ("worker id", &registration.worker_id),
            ("host", &registration.host),
        ] {
            if name.is_empty()
                || name.len() > MAX_WORKER_NAME_BYTES
                || name.chars().any(|c| c.is_control() || c.is_whitespace())
            {
                return Err(format!(
                    "a worker's {what} must be 1 to {MAX_WORKER_NAME_BYTES} bytes without spaces or control characters (MAX_WORKER_NAME_BYTES), not {:?}",
                    name.chars().take(64).collect::<String>()
                ));
            }
        }
        let id = registration.worker_id.clone();
        let live = inner.workers.values().filter(|w| w.alive).count();
        if live >= MAX_WORKERS && !inner.workers.get(&id).is_some_and(|w| w.alive) {
            return Err(format!(
                "the driver already has {live} live workers (MAX_WORKERS {MAX_WORKERS})"
            ));
        }
        if let Some(old) = inner.workers.get(&id)
            && old.alive
            && (old.pid != registration.pid || old.host != registration.host)
        {
            return Err(format!(
                "worker id {id} is already registered (host {}, pid {})",
                old.host, old.pid
            ));
        }
        inner.next_generation += 1;
        let generation = inner.next_generation;
        let _ = outbox.send(DriverToWorker::RegisteredWorker {
            app_id: app_id.to_owned(),
            heartbeat_interval_ms: heartbeat_interval.as_millis() as u64,
        });
        // A re-registration's executors are what it says it runs, not what the old
        // connection had placed; those the driver did not place (an earlier driver did)
        // hold an executor's room too, until the manager adopts or kills them.
        let previous = inner.workers.remove(&id);
        let mut kept: BTreeMap<ExecutorId, (u32, u64)> = (registration.executors.iter())
            .map(|e| (e.clone(), inner.listed))
            .collect();
        if let Some(old) = previous.filter(|w| w.alive) {
            let (still, lost): (Vec<_>, Vec<_>) = old
                .executors
                .into_iter()
                .partition(|(e, _)| registration.executors.contains(e));
            kept.extend(still);
            let lost: Vec<ExecutorId> = lost.into_iter().map(|(e, _)| e).collect();
            if !lost.is_empty() {
                let _ = notify.send(WorkerEvent::Lost {
                    worker: id.clone(),
                    executors: lost,
                    reason: "its worker re-registered without it".into(),
                });
            }
        }
        inner.workers.insert(
            id.clone(),
            Worker {
                host: registration.host,
                cores: registration.cores,
                memory_mb: registration.memory_mb,
                pid: registration.pid,
                generation,
                alive: true,
                executors: kept,
                outbox: Some(outbox),
                last_heartbeat: Instant::now(),
                registered_at: SystemTime::now(),
                lost_reason: None,
                lost_at: None,
            },
        );
        let _ = notify.send(WorkerEvent::Registered {
            worker: id,
            reported: registration.executors,
        });
        Ok(generation)
    }

    pub fn message(&self, worker: &str, generation: u64, message: WorkerMessage) {
        let mut inner = self.lock();
        let notify = inner.notify.clone();
        let Some(w) = inner
            .workers
            .get_mut(worker)
            .filter(|w| w.alive && w.generation == generation)
        else {
            return;
        };
        w.last_heartbeat = Instant::now();
        let WorkerMessage::ExecutorStateChanged { executor_id, state } = message else {
            return;
        };
        // A worker speaks only for the executors placed on it: not for another worker's,
        // nor for one that dialled in.
        if !w.executors.contains_key(&executor_id) {
            tracing::warn!(worker, executor = %executor_id, "worker reported an executor not placed on it");
            return;
        }
        if !matches!(state, WorkerExecutorState::Running { .. }) {
            w.executors.remove(&executor_id);
        }
        if let Some(notify) = notify {
            let _ = notify.send(WorkerEvent::ExecutorState {
                worker: worker.to_owned(),
                executor: executor_id,
                state,
            });
        }
    }

    /// The worker's connection is gone (or it went silent): its executors are lost.
    pub fn lost(&self, worker: &str, generation: u64, reason: &str) {
        let mut inner = self.lock();
        let notify = inner.notify.clone();
        let Some(w) = inner
            .workers
            .get_mut(worker)
            .filter(|w| w.alive && w.generation == generation)
        else {
            return;
        };
        w.alive = false;
        w.outbox = None;
        w.lost_reason = Some(reason.to_owned());
        w.lost_at = Some(Instant::now());
        let executors: Vec<ExecutorId> = std::mem::take(&mut w.executors).into_keys().collect();
        forget_lost_beyond(&mut inner.workers, LOST_WORKERS_KEPT);
        if let Some(notify) = notify {
            let _ = notify.send(WorkerEvent::Lost {
                worker: worker.to_owned(),
                executors,
                reason: reason.to_owned(),
            });
        }
    }

    /// Places an executor on the live worker with the most free cores that fits it
    /// (then the most free memory, then the lowest id), and asks that worker to launch
    /// it. `None` when no worker fits now.
    pub fn place(&self, placement: &Placement) -> Option<String> {
        let mut inner = self.lock();
        let (id, worker) = inner
            .workers
            .iter_mut()
            .filter(|(_, w)| w.alive)
            .filter(|(_, w)| {
                let (cores, memory) = w.free();
                cores >= placement.cores && memory >= placement.memory_mb
            })
            .max_by(|(a_id, a), (b_id, b)| {
                let (a_free, b_free) = (a.free(), b.free());
                a_free.cmp(&b_free).then_with(|| b_id.cmp(a_id))
            })?;
        let outbox = worker.outbox.as_ref()?;
        outbox
            .send(DriverToWorker::LaunchExecutor {
                executor_id: placement.executor.clone(),
                app_id: placement.app_id.clone(),
                cores: placement.cores,
                memory_mb: placement.memory_mb,
            })
            .ok()?;
        worker.executors.insert(
            placement.executor.clone(),
            (placement.cores, placement.memory_mb),
        );
        Some(id.clone())
    }

    /// Asks the worker running `executor` to kill it; false when no live worker runs it.
    pub fn kill(&self, executor: &ExecutorId) -> bool {
        let inner = self.lock();
        let Some(outbox) = inner
            .workers
            .values()
            .filter(|w| w.alive)
            .find(|w| w.executors.contains_key(executor))
            .and_then(|w| w.outbox.as_ref())
        else {
            return false;
        };
        outbox
            .send(DriverToWorker::KillExecutor {
                executor_id: executor.clone(),
            })
            .is_ok()
    }

    /// Asks a live worker to kill an executor it reported that nobody placed there.
    pub fn kill_on(&self, worker: &str, executor: &ExecutorId) {
        let inner = self.lock();
        if let Some(outbox) = inner
            .workers
            .get(worker)
            .filter(|w| w.alive)
            .and_then(|w| w.outbox.as_ref())
        {
            let _ = outbox.send(DriverToWorker::KillExecutor {
                executor_id: executor.clone(),
            });
        }
    }

    /// The executors placed on a live worker; `None` for a worker unknown or lost.
    pub fn executors_on(&self, worker: &str) -> Option<Vec<ExecutorId>> {
        self.lock()
            .workers
            .get(worker)
            .filter(|w| w.alive)
            .map(|w| w.executors.keys().cloned().collect())
    }

    /// Live workers silent for longer than `timeout`, with their generations.
    pub fn silent(&self, timeout: Duration) -> Vec<(String, u64)> {
        let now = Instant::now();
        self.lock()
            .workers
            .iter()
            .filter(|(_, w)| w.alive && now.saturating_duration_since(w.last_heartbeat) > timeout)
            .map(|(id, w)| (id.clone(), w.generation))
            .collect()
    }

    /// The driver stops for good: every worker stops its executors.
    pub fn shutdown(&self) {
        for w in self.lock().workers.values().filter(|w| w.alive) {
            if let Some(outbox) = &w.outbox {
                let _ = outbox.send(DriverToWorker::Shutdown);
            }
        }
    }

    pub fn views(&self) -> Vec<WorkerView> {
        let now = Instant::now();
        self.lock()
            .workers
            .iter()
            .map(|(id, w)| {
                let (free_cores, free_memory_mb) = w.free();
                WorkerView {
                    id: id.clone(),
                    host: w.host.clone(),
                    state: if w.alive { "alive" } else { "lost" }.to_owned(),
                    cores: w.cores,
                    free_cores: if w.alive { free_cores } else { 0 },
                    memory_mb: w.memory_mb,
                    free_memory_mb: if w.alive { free_memory_mb } else { 0 },
                    pid: w.pid,
                    executors: w.executors.keys().cloned().collect(),
                    last_heartbeat_ms: now.saturating_duration_since(w.last_heartbeat).as_millis()
                        as u64,
                    registered_at_ms: w
                        .registered_at
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64),
                    lost_reason: w.lost_reason.clone(),
                }
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("workers lock poisoned")
    }
}

impl super::Driver {
    /// The executors the job store lists as registered and not gone: after a restart,
    /// those of the last run, which workers may still run and report when they
    /// register again. Empty if the store cannot be read (nothing is waited for then).
    pub fn executors_known(&self) -> Vec<ExecutorId> {
        match self.jobs.store.known_executors() {
            Ok(ids) => ids.into_iter().map(ExecutorId).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "reading the executors the last run knew");
                Vec::new()
            }
        }
    }
}

/// Drops the longest-lost workers until at most `keep` lost ones are left.
fn forget_lost_beyond(workers: &mut BTreeMap<String, Worker>, keep: usize) {
    let mut lost: Vec<(Instant, String)> = workers
        .iter()
        .filter_map(|(id, w)| w.lost_at.map(|at| (at, id.clone())))
        .collect();
    if lost.len() <= keep {
        return;
    }
    lost.sort();
    let excess = lost.len() - keep;
    for (_, id) in lost.into_iter().take(excess) {
        workers.remove(&id);
    }
}

#[cfg(test)]
mod tests;
