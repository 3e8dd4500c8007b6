//! `local`: executor processes on the driver's own host, started the way Spark's Worker
//! starts executors through ExecutorRunner: `WORK/<app-id>/<executor-id>/` holds each
//! one's stdout and stderr, and its exit (code or signal) is reported. Nothing outlives
//! the driver: children get SIGKILL from the kernel if it dies (PR_SET_PDEATHSIG).

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flint_protocol::ExecutorId;
use flint_protocol::exit::ProcessExit;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{ClusterManager, Dial, ExecutorEvent, LaunchRequest};

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
        let work_dir = self.work_root.join(&request.app_id).join(&request.id.0);
        std::fs::create_dir_all(&work_dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", work_dir.display()))?;
        let stdout = std::fs::File::create(work_dir.join("stdout"))?;
        let stderr = std::fs::File::create(work_dir.join("stderr"))?;
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .arg("executor")
            .args(["--driver-url", &self.dial.driver_url])
            .args(["--executor-id", &request.id.0])
            .args(["--cores", &request.cores.to_string()])
            .args(["--app-id", &request.app_id])
            .args(["--hostname", "127.0.0.1"])
            .arg("--work-dir")
            .arg(&work_dir)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true);
        if let Some(secret) = &self.dial.cluster_secret {
            command.env("FLINT_CLUSTER_SECRET", secret);
        }
        // SAFETY: prctl is async-signal-safe, which is all that may run between fork and
        // exec.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", self.exe.display()))?;
        let pid = child.id().unwrap_or_default();
        let (signals, mut signalled) = mpsc::unbounded_channel::<i32>();
        let id = request.id.clone();
        let events = self.events.clone();
        let children = self.children.clone();
        let monitor = tokio::spawn(async move {
            let status = loop {
                tokio::select! {
                    status = child.wait() => break status,
                    Some(signal) = signalled.recv() => {
                        if let Some(pid) = child.id() {
                            // SAFETY: a plain syscall on our own child, not yet reaped
                            // (only this task waits on it).
                            unsafe { libc::kill(pid as libc::pid_t, signal) };
                        }
                    }
                }
            };
            let exit = match status {
                Ok(status) => match (status.code(), status.signal()) {
                    (Some(code), _) => ProcessExit::Code(code),
                    (None, Some(signal)) => ProcessExit::Signal(signal),
                    (None, None) => ProcessExit::Unknown,
                },
                Err(e) => {
                    tracing::warn!(executor = %id, error = %e, "waiting for executor");
                    ProcessExit::Unknown
                }
            };
            lock(&children).remove(&id);
            let _ = events.send(ExecutorEvent::Exited { id, exit });
        });
        lock(&self.children).insert(request.id.clone(), Child { signals, monitor });
        Ok((pid, work_dir.join("stderr")))
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

    fn stop(&self, grace: Duration) -> BoxFuture<'_, ()> {
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
