//! `standalone`: executors launched on `flint worker`s (Spark's standalone Master and
//! Worker). A launch goes to the worker with the most free cores that fits it, or waits
//! for one; the worker reports the executor running, exited (code or signal) or failed
//! to launch; a lost worker's executors are lost. A worker keeps its executors through
//! the driver's restart and lists them when it registers again: those this driver never
//! placed (they outlived its earlier run) are adopted as its own, counted towards the
//! target and never launched again; until their workers are back, the supervisor waits
//! for the executors the last run had registered instead of replacing them. One listed
//! by a worker that this driver placed on another is killed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flint_protocol::ExecutorId;
use flint_protocol::messages::WorkerExecutorState;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use super::{ClusterManager, Departure, ExecutorEvent, LaunchRequest};
use crate::service::Driver;
use crate::service::workers::{Placement, WorkerEvent};

pub struct StandaloneManager {
    driver: Arc<Driver>,
    events: mpsc::UnboundedSender<ExecutorEvent>,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// Asked for, waiting for a worker with room.
    pending: VecDeque<LaunchRequest>,
    /// Placed: on which worker.
    placed: HashMap<ExecutorId, String>,
}

impl StandaloneManager {
    /// Attaches to the driver's worker registry and starts hearing from it.
    pub fn start(driver: Arc<Driver>, events: mpsc::UnboundedSender<ExecutorEvent>) -> Self {
        let (notify, heard) = mpsc::unbounded_channel();
        let allocation = &driver.config.allocation;
        let shape = (allocation.executor_cores, allocation.executor_memory_mb);
        driver.cluster.workers.attach(notify, shape);
        let state: Arc<Mutex<State>> = Default::default();
        tokio::spawn(listen(driver.clone(), heard, events.clone(), state.clone()));
        StandaloneManager {
            driver,
            events,
            state,
        }
    }
}

/// Places what is pending, in order, while workers have room.
fn place_pending(driver: &Driver, state: &mut State) {
    while let Some(request) = state.pending.front() {
        let Some(worker) = driver.cluster.workers.place(&placement(request)) else {
            return;
        };
        let request = state.pending.pop_front().expect("front exists");
        tracing::info!(executor = %request.id, worker, "executor placed");
        state.placed.insert(request.id, worker);
    }
}

fn placement(request: &LaunchRequest) -> Placement {
    Placement {
        executor: request.id.clone(),
        app_id: request.app_id.clone(),
        cores: request.cores,
        memory_mb: request.memory_mb,
    }
}

async fn listen(
    driver: Arc<Driver>,
    mut heard: mpsc::UnboundedReceiver<WorkerEvent>,
    events: mpsc::UnboundedSender<ExecutorEvent>,
    state: Arc<Mutex<State>>,
) {
    // Silent workers (partitioned, stopped) are lost as silent executors are.
    let timeout = driver.config.executor_timeout;
    let mut tick = tokio::time::interval((timeout / 4).max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let event = tokio::select! {
            event = heard.recv() => match event {
                Some(event) => event,
                None => return,
            },
            _ = tick.tick() => {
                for (worker, generation) in driver.cluster.workers.silent(timeout) {
                    tracing::warn!(worker, ?timeout, "no heartbeat from worker; lost");
                    driver.cluster.workers.lost(&worker, generation, "no heartbeat");
                }
                continue;
            }
        };
        let mut state = state.lock().expect("standalone state lock poisoned");
        match event {
            WorkerEvent::Registered { worker, reported } => {
                on_registered(&driver, &events, &mut state, &worker, reported);
            }
            WorkerEvent::ExecutorState {
                worker,
                executor,
                state: executor_state,
            } => {
                let event = match executor_state {
                    WorkerExecutorState::Running { pid } => ExecutorEvent::Launched {
                        id: executor,
                        worker: Some(worker),
                        pid: Some(pid),
                        log: None,
                    },
                    WorkerExecutorState::FailedToLaunch(reason) => {
                        state.placed.remove(&executor);
                        ExecutorEvent::LaunchFailed {
                            id: executor,
                            reason: format!("on worker {worker}: {reason}"),
                        }
                    }
                    WorkerExecutorState::Exited(exit) => {
                        state.placed.remove(&executor);
                        ExecutorEvent::Exited {
                            id: executor,
                            exit,
                            cause: None,
                        }
                    }
                };
                let _ = events.send(event);
            }
            WorkerEvent::Lost {
                worker,
                executors,
                reason,
            } => {
                for executor in executors {
                    state.placed.remove(&executor);
                    let _ = events.send(ExecutorEvent::Lost {
                        id: executor,
                        reason: format!("worker {worker} lost: {reason}"),
                    });
                }
            }
        }
        // A worker came, or an executor's room was freed.
        place_pending(&driver, &mut state);
    }
}

/// A worker registered, listing the executors it runs: each is already placed there
/// (a reconnect), adopted (an earlier driver run placed it), or killed (this run placed
/// it on another worker: two processes of one id).
fn on_registered(
    driver: &Driver,
    events: &mpsc::UnboundedSender<ExecutorEvent>,
    state: &mut State,
    worker: &str,
    reported: Vec<ExecutorId>,
) {
    for executor in reported {
        match state.placed.get(&executor) {
            Some(on) if on == worker => {}
            Some(on) => {
                tracing::warn!(executor = %executor, worker, placed_on = on,
                    "worker runs an executor this driver placed elsewhere; killing it");
                driver.cluster.workers.kill_on(worker, &executor);
            }
            None => {
                state.placed.insert(executor.clone(), worker.to_owned());
                let _ = events.send(ExecutorEvent::Adopted {
                    id: executor,
                    worker: Some(worker.to_owned()),
                });
            }
        }
    }
}

impl ClusterManager for StandaloneManager {
    fn name(&self) -> &'static str {
        "standalone"
    }

    fn launch(&self, request: LaunchRequest) {
        let mut state = self.state.lock().expect("standalone state lock poisoned");
        tracing::info!(executor = %request.id, cores = request.cores,
            memory_mb = request.memory_mb, "waiting for a worker with room");
        state.pending.push_back(request);
        place_pending(&self.driver, &mut state);
    }

    fn kill(&self, id: &ExecutorId) {
        let mut state = self.state.lock().expect("standalone state lock poisoned");
        if let Some(at) = state.pending.iter().position(|r| r.id == *id) {
            state.pending.remove(at);
            let _ = self.events.send(ExecutorEvent::Lost {
                id: id.clone(),
                reason: "killed before a worker took it".into(),
            });
            return;
        }
        self.driver.cluster.workers.kill(id);
    }

    fn executors_outlive_driver(&self) -> bool {
        true
    }

    fn finds_executors_late(&self) -> bool {
        true
    }

    fn stop(&self, _grace: Duration, _departure: Departure) -> BoxFuture<'_, ()> {
        // For good, the workers were told to stop their executors with the driver's
        // Shutdown; coming back, they keep them for the next driver. What is still
        // pending never started.
        self.state
            .lock()
            .expect("standalone state lock poisoned")
            .pending
            .clear();
        Box::pin(async {})
    }
}
