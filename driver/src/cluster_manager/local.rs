//! `local`: executor processes on the driver's own host, started the way Spark's Worker
//! starts executors through ExecutorRunner: `WORK/<app-id>/<executor-id>/` holds each
//! one's stdout and stderr, and its exit (code or signal) is reported. Nothing outlives
//! the driver: children get SIGKILL from the kernel if it dies (PR_SET_PDEATHSIG), and
//! are stopped when it stops, whether or not it is coming back: a restarted `flint dev`
//! starts executors of its own (ids from `exec-1` again), and their tasks run again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flint_protocol::ExecutorId;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::runner::{ExecutorCommand, spawn_executor};
use super::{ClusterManager, Departure, Dial, ExecutorEvent, LaunchRequest};

pub struct LocalManager {
    exe: PathBuf,
    extra_args: Vec<String>,
    dial: Dial,
    work_root: PathBuf,
    events: mpsc::UnboundedSender<ExecutorEvent>,
    children: Arc<Mutex<HashMap<ExecutorId, Child>>>,
}

/// A running child: signals for it go through its monitor, which alone waits on it, so
/// a signal never reaches a pid that was reaped and reused.
struct Child {
    signals: mpsc::UnboundedSender<i32>,
    monitor: JoinHandle<()>,
}

impl LocalManager {
    pub fn new(
        exe: PathBuf,
        extra_args: Vec<String>,
        dial: Dial,
        work_root: PathBuf,
        events: mpsc::UnboundedSender<ExecutorEvent>,
    ) -> Self {
        LocalManager {
            exe,
            extra_args,
            dial,
            work_root,
            events,
            children: Default::default(),
        }
    }

    fn spawn(&self, request: &LaunchRequest) -> anyhow::Result<(u32, PathBuf)> {
        let id = request.id.clone();
        let events = self.events.clone();
        let children = self.children.clone();
        let running = spawn_executor(
            ExecutorCommand {
                exe: &self.exe,
                driver_url: &self.dial.driver_url,
                id: &request.id,
                cores: request.cores,
                app_id: &request.app_id,
                hostname: "127.0.0.1",
                work_root: &self.work_root,
                extra_args: &self.extra_args,
                cluster_secret: self.dial.cluster_secret.as_deref(),
            },
            move |exit| {
                lock(&children).remove(&id);
                let _ = events.send(ExecutorEvent::Exited {
                    id,
                    exit,
                    cause: None,
                });
            },
        )?;
        let log = running.work_dir.join("stderr");
        lock(&self.children).insert(
            request.id.clone(),
            Child {
                signals: running.signals,
                monitor: running.monitor,
            },
        );
        Ok((running.pid, log))
    }

    fn signal_all(&self, signal: i32) {
        for child in lock(&self.children).values() {
            let _ = child.signals.send(signal);
        }
    }
}

impl ClusterManager for LocalManager {
    fn name(&self) -> &'static str {
        "local"
    }

    fn launch(&self, request: LaunchRequest) {
        let event = match self.spawn(&request) {
            Ok((pid, log)) => ExecutorEvent::Launched {
                id: request.id,
                worker: None,
                pid: Some(pid),
                log: Some(log),
            },
            Err(e) => ExecutorEvent::LaunchFailed {
                id: request.id,
                reason: format!("{e:#}"),
            },
        };
        let _ = self.events.send(event);
    }

    fn kill(&self, id: &ExecutorId) {
        if let Some(child) = lock(&self.children).get(id) {
            let _ = child.signals.send(libc::SIGKILL);
        }
    }

    /// Children cannot outlive the driver (PR_SET_PDEATHSIG): stopped either way.
    fn stop(&self, grace: Duration, _departure: Departure) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.signal_all(libc::SIGTERM);
            let deadline = tokio::time::Instant::now() + grace;
            while !lock(&self.children).is_empty() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let left: Vec<JoinHandle<()>> = {
                let mut children = lock(&self.children);
                for (id, child) in children.iter() {
                    tracing::warn!(executor = %id, "executor did not stop; killing it");
                    let _ = child.signals.send(libc::SIGKILL);
                }
                children.drain().map(|(_, c)| c.monitor).collect()
            };
            for monitor in left {
                let _ = monitor.await;
            }
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().expect("local cluster manager lock poisoned")
}
