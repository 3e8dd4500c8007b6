//! `slurm`: each executor one Slurm batch job (as HyperQueue's workers, Dask's
//! jobqueue and Ray's Slurm launcher run inside allocations). A launch is an `sbatch`
//! of a script that `exec`s `flint executor`; one `squeue` a round (`--slurm-poll-
//! interval-ms`) turns the jobs' states into executor events; a kill is an `scancel`,
//! repeated until Slurm says the job ended.
//!
//! What Slurm decides is read as Slurm's, not the executor's: a job pending is waiting
//! (the launch timeout waits for it, up to `--executor-pending-timeout-ms`), an `sbatch`
//! refused for now (the controller away, a submit limit) is back-pressure, retried with
//! a backoff; a job ended by its time limit, a cancel, its node's failure or preemption
//! is an executor lost with that reason (replaced, not counted as a failure). Only an
//! executor's own unclean exit, or an `sbatch` no retry can fix (an unknown partition),
//! counts towards `--max-executor-failures`.
//!
//! Jobs outlive a driver that dies (a SIGKILL): the next one on its data dir finds them
//! by name, `flint-<app>-<executor>`, adopts one job per executor and cancels the rest.
//! A driver that stops (SIGTERM, for good or not) cancels every job it has: a batch job
//! holds an allocation charged to its account, so none is left to the next driver.
//!
//! The cluster secret reaches executors through a file only its owner can read, on the
//! shared work dir, named on their command line: never the secret in the script (which
//! slurmctld keeps and shows), the command line (`ps`) or the job's environment
//! (`--export=NONE`).

mod job;
mod submit;
mod tools;
mod watch;

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use flint_protocol::ExecutorId;
use futures_util::future::BoxFuture;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use self::job::Phase;
use super::{ClusterManager, Departure, Dial, ExecutorEvent, LaunchRequest};
use crate::config::SlurmConfig;

pub struct SlurmManager {
    inner: Arc<Inner>,
    task: Mutex<Option<JoinHandle<()>>>,
}

struct Inner {
    config: SlurmConfig,
    app_id: String,
    /// The driver instance's short id, in job names and the app dir.
    instance: String,
    flint: PathBuf,
    driver_url: String,
    /// `<work>/<app>-<instance>/`: one dir per executor, and the secret's file.
    app_dir: PathBuf,
    secret_file: Option<PathBuf>,
    events: mpsc::UnboundedSender<ExecutorEvent>,
    state: Mutex<State>,
    wake: Notify,
}

#[derive(Default)]
struct State {
    /// Asked for, not submitted yet.
    queue: VecDeque<LaunchRequest>,
    /// Why `sbatch` was last refused for now, and when to try again.
    refused: Option<Refusal>,
    jobs: HashMap<ExecutorId, Tracked>,
}

struct Refusal {
    why: String,
    retry_at: Instant,
    wait: Duration,
}

#[derive(Default)]
struct Tracked {
    /// Slurm's job id, once submitted.
    job: Option<String>,
    /// Why Slurm has not started it, while it has not.
    waiting: Option<String>,
    /// The driver asked it to go: cancelled until it is seen ended.
    cancel: bool,
    cancel_sent: Option<Instant>,
    missing: u32,
    /// Slurm ran it: a job seen pending again after that was requeued, and its executor
    /// is gone with the run.
    ran: bool,
}

impl SlurmManager {
    /// Checks the settings, writes the secret's file, adopts the jobs an earlier run of
    /// this driver left (their events queued before this returns) and starts the loop.
    pub async fn start(
        config: &SlurmConfig,
        app_id: &str,
        dial: &Dial,
        work_root: &Path,
        events: mpsc::UnboundedSender<ExecutorEvent>,
    ) -> anyhow::Result<Self> {
        job::check_app_id(app_id).map_err(|e| anyhow::anyhow!(e))?;
        job::check_extra(&config.extra).map_err(|e| anyhow::anyhow!(e))?;
        let flint = match &config.flint_path {
            Some(path) => path.clone(),
            None => std::env::current_exe().context("the driver's own binary")?,
        };
        let work = config
            .work_dir
            .clone()
            .unwrap_or_else(|| work_root.to_path_buf());
        let driver_url = (config.driver_url.clone()).unwrap_or_else(|| dial.driver_url.clone());
        let instance = super::kubernetes::instance::driver_instance(Some(work_root), &driver_url)?;
        // Its random end: a v7 uuid begins with its time, the same for drivers made
        // within a minute of each other.
        let instance = instance[instance.len().saturating_sub(8)..].to_owned();
        let app_dir = work.join(format!("{app_id}-{instance}"));
        std::fs::create_dir_all(&app_dir)
            .with_context(|| format!("creating {}", app_dir.display()))?;
        std::fs::set_permissions(&app_dir, std::fs::Permissions::from_mode(0o700))?;
        let secret_file = match &dial.cluster_secret {
            Some(secret) => Some(write_secret(&app_dir, secret)?),
            None => None,
        };
        tracing::info!(flint = %flint.display(), work = %app_dir.display(),
            partition = config.partition, "slurm cluster manager");
        let inner = Arc::new(Inner {
            config: config.clone(),
            app_id: app_id.to_owned(),
            instance,
            flint,
            driver_url,
            app_dir,
            secret_file,
            events,
            state: Mutex::default(),
            wake: Notify::new(),
        });
        inner.adopt().await?;
        let task = tokio::spawn(inner.clone().run());
        Ok(SlurmManager {
            inner,
            task: Mutex::new(Some(task)),
        })
    }
}

/// The secret in `<app dir>/cluster-secret`, created readable by its owner only.
fn write_secret(app_dir: &Path, secret: &str) -> anyhow::Result<PathBuf> {
    let path = app_dir.join("cluster-secret");
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(file, "{secret}")?;
    Ok(path)
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("slurm state lock poisoned")
    }

    fn send(&self, event: ExecutorEvent) {
        let _ = self.events.send(event);
    }

    /// The executor a listed job is this driver's job for, if it is one.
    fn ours(&self, seen: &job::Seen) -> Option<ExecutorId> {
        job::executor_of(&self.app_id, &self.instance, &seen.name)
    }

    /// `<app dir>/<executor>/`.
    fn dir(&self, id: &ExecutorId) -> PathBuf {
        self.app_dir.join(&id.0)
    }

    async fn run(self: Arc<Self>) {
        loop {
            self.submit_queued().await;
            self.cancel_asked().await;
            self.poll().await;
            let _ = tokio::time::timeout(self.config.poll_interval, self.wake.notified()).await;
        }
    }
}

impl ClusterManager for SlurmManager {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn launch(&self, request: LaunchRequest) {
        let mut state = self.inner.lock();
        state.jobs.insert(request.id.clone(), Tracked::default());
        state.queue.push_back(request);
        drop(state);
        self.inner.wake.notify_one();
    }

    fn kill(&self, id: &ExecutorId) {
        let mut state = self.inner.lock();
        if let Some(at) = state.queue.iter().position(|r| r.id == *id) {
            state.queue.remove(at);
            state.jobs.remove(id);
            drop(state);
            return self.inner.send(ExecutorEvent::Lost {
                id: id.clone(),
                reason: "killed before its Slurm job was submitted".into(),
            });
        }
        if let Some(tracked) = state.jobs.get_mut(id) {
            tracked.cancel = true;
            drop(state);
            self.inner.wake.notify_one();
        }
    }

    fn waiting(&self, id: &ExecutorId) -> Option<String> {
        let state = self.inner.lock();
        let tracked = state.jobs.get(id)?;
        if tracked.job.is_none() {
            return Some(match &state.refused {
                Some(refusal) => refusal.why.clone(),
                None => "its Slurm job not submitted yet".to_owned(),
            });
        }
        tracked.waiting.clone()
    }

    fn pending_reason(&self, id: &ExecutorId) -> Option<String> {
        self.waiting(id)
    }

    fn executors_outlive_driver(&self) -> bool {
        // A driver SIGKILLed leaves its jobs running; the next one adopts them.
        true
    }

    /// Cancels every job it has, whether the driver is coming back or not (a batch job
    /// holds an allocation), and waits up to `grace` (and a little) for Slurm to end them.
    fn stop(&self, grace: Duration, _departure: Departure) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(task) = self.task.lock().expect("slurm task lock poisoned").take() {
                task.abort();
            }
            let mut jobs: Vec<String> = {
                let mut state = self.inner.lock();
                state.queue.clear();
                state.jobs.values().filter_map(|t| t.job.clone()).collect()
            };
            // And what Slurm lists of this driver's that it did not track: a submission
            // the abort cut short after Slurm had made the job, say.
            if let Ok(listed) = self.inner.squeue().await {
                for seen in listed
                    .iter()
                    .filter(|s| self.inner.ours(s).is_some() && active(s))
                {
                    if !jobs.contains(&seen.job) {
                        jobs.push(seen.job.clone());
                    }
                }
            }
            if jobs.is_empty() {
                return;
            }
            tracing::info!(jobs = ?jobs, "cancelling the executors' Slurm jobs");
            self.inner.scancel(&jobs).await;
            let deadline = Instant::now() + grace + Duration::from_secs(5);
            while Instant::now() < deadline {
                let left = match self.inner.squeue().await {
                    Ok(listed) => listed.iter().any(|s| jobs.contains(&s.job) && active(s)),
                    Err(_) => true,
                };
                if !left {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            tracing::error!(jobs = ?jobs, "executor Slurm jobs not ended in time; cancelling with SIGKILL");
            let mut args = vec!["--signal=KILL".to_owned(), "--full".to_owned()];
            args.extend(jobs);
            let _ = tools::run("scancel", &args).await;
        })
    }

    fn default_pending_timeout(&self) -> Duration {
        // A batch queue's wait is hours at a busy site, and a job cancelled and submitted
        // again starts at the back of it (its age priority lost): waited for a day.
        Duration::from_secs(24 * 3600)
    }
}

/// Not ended by Slurm.
fn active(seen: &job::Seen) -> bool {
    !matches!(job::phase(seen, None), Phase::Ended(_))
}
