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
mod tools;

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

use self::job::{End, Phase, Submission};
use super::{ClusterManager, Departure, Dial, ExecutorEvent, LaunchRequest};
use crate::config::SlurmConfig;

/// Backoff of `sbatch` while Slurm refuses for now.
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// A cancel not yet seen through is asked again this often.
const CANCEL_AGAIN: Duration = Duration::from_secs(5);
/// Rounds a submitted job may be missing from `squeue` before it is taken as gone (a job
/// just submitted can miss one answer; one purged past MinJobAge misses all).
const MISSING_ROUNDS: u32 = 3;

pub struct SlurmManager {
    inner: Arc<Inner>,
    task: Mutex<Option<JoinHandle<()>>>,
}

struct Inner {
    config: SlurmConfig,
    app_id: String,
    flint: PathBuf,
    driver_url: String,
    /// `<work>/<app>/`: one dir per executor, and the secret's file.
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
        let flint = match &config.flint_path {
            Some(path) => path.clone(),
            None => std::env::current_exe().context("the driver's own binary")?,
        };
        let work = config
            .work_dir
            .clone()
            .unwrap_or_else(|| work_root.to_path_buf());
        let app_dir = work.join(app_id);
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
            flint,
            driver_url: dial.driver_url.clone(),
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

    /// The jobs of this app an earlier run left: one per executor adopted (running
    /// before pending, then the newest), the rest cancelled.
    async fn adopt(&self) -> anyhow::Result<()> {
        let listed = self.squeue().await.map_err(|e| {
            anyhow::anyhow!("listing this driver's Slurm jobs at its start (squeue): {e}")
        })?;
        let mut best: HashMap<ExecutorId, job::Seen> = HashMap::new();
        let mut strays = Vec::new();
        for seen in listed {
            let Some(id) = job::executor_of(&self.app_id, &seen.name) else {
                continue;
            };
            match job::phase(&seen, None) {
                Phase::Ended(_) => continue,
                Phase::Never(_) => {
                    strays.push(seen.job.clone());
                    continue;
                }
                _ => {}
            }
            let keep = |old: &job::Seen| {
                let running = |s: &job::Seen| job::phase(s, None) == Phase::Running;
                (running(&seen), job_number(&seen)) > (running(old), job_number(old))
            };
            match best.get(&id) {
                Some(old) if !keep(old) => strays.push(seen.job.clone()),
                Some(old) => {
                    strays.push(old.job.clone());
                    best.insert(id, seen);
                }
                None => {
                    best.insert(id, seen);
                }
            }
        }
        if !strays.is_empty() {
            tracing::warn!(jobs = ?strays, "cancelling duplicate Slurm jobs of this app");
            self.scancel(&strays).await;
        }
        let mut state = self.lock();
        for (id, seen) in best {
            tracing::info!(executor = %id, job = seen.job, state = seen.state,
                "adopting a Slurm job of an earlier run");
            let waiting = match job::phase(&seen, None) {
                Phase::Waiting(why) => Some(why),
                _ => None,
            };
            let worker = (!seen.node.is_empty() && waiting.is_none()).then(|| seen.node.clone());
            state.jobs.insert(
                id.clone(),
                Tracked {
                    job: Some(seen.job),
                    waiting,
                    ..Tracked::default()
                },
            );
            self.send(ExecutorEvent::Adopted { id, worker });
        }
        Ok(())
    }

    async fn run(self: Arc<Self>) {
        loop {
            self.submit_queued().await;
            self.cancel_asked().await;
            self.poll().await;
            let _ = tokio::time::timeout(self.config.poll_interval, self.wake.notified()).await;
        }
    }

    /// Submits what is queued, unless Slurm refused for now and the backoff runs.
    async fn submit_queued(&self) {
        loop {
            let request = {
                let mut state = self.lock();
                if state
                    .refused
                    .as_ref()
                    .is_some_and(|r| r.retry_at > Instant::now())
                {
                    return;
                }
                let Some(request) = state.queue.pop_front() else {
                    return;
                };
                request
            };
            self.submit(request).await;
        }
    }

    async fn submit(&self, request: LaunchRequest) {
        let id = request.id.clone();
        let dir = self.app_dir.join(&id.0);
        let submission = Submission {
            id: &id,
            app_id: &self.app_id,
            cores: request.cores,
            memory_mb: request.memory_mb,
            flint: &self.flint,
            driver_url: &self.driver_url,
            dir: &dir,
            secret_file: self.secret_file.as_deref(),
        };
        let script = dir.join("executor.sh");
        if let Err(e) = write_script(&dir, &script, &job::script(&submission)) {
            self.lock().jobs.remove(&id);
            return self.send(ExecutorEvent::LaunchFailed {
                id,
                reason: format!("writing its Slurm script {}: {e}", script.display()),
            });
        }
        let args = job::sbatch_args(&self.config, &submission, &script);
        let answer = tools::run("sbatch", &args).await;
        let mut state = self.lock();
        if state.jobs.get(&id).is_none_or(|t| t.cancel) {
            // Killed while being submitted: a job that was made is cancelled (its end
            // heard by the polls); else it is over now.
            match answer.ok().and_then(|a| job::parse_job_id(&a.stdout)) {
                Some(job) => {
                    let tracked = Tracked {
                        job: Some(job),
                        cancel: true,
                        ..Default::default()
                    };
                    state.jobs.insert(id, tracked);
                    drop(state);
                    self.wake.notify_one();
                }
                None => {
                    state.jobs.remove(&id);
                    drop(state);
                    self.send(ExecutorEvent::Lost {
                        id,
                        reason: "killed while its Slurm job was being submitted".into(),
                    });
                }
            }
            return;
        }
        let failed = match answer {
            Ok(answer) if answer.ok => match job::parse_job_id(&answer.stdout) {
                Some(job) => {
                    tracing::info!(executor = %id, job, "executor submitted to Slurm");
                    state.refused = None;
                    let tracked = state.jobs.entry(id.clone()).or_default();
                    tracked.job = Some(job.clone());
                    tracked.waiting = Some(format!("Slurm job {job} submitted"));
                    drop(state);
                    return self.send(ExecutorEvent::Launched {
                        id,
                        worker: None,
                        pid: None,
                        log: Some(dir.join("stderr")),
                    });
                }
                None => Some(format!(
                    "sbatch answered no job id: {:?}",
                    answer.stdout.trim()
                )),
            },
            Ok(answer) if job::refused_for_now(&answer.stderr) => {
                let why = format!("sbatch refused for now: {}", answer.error());
                refuse(&mut state, request, why);
                None
            }
            Ok(answer) => Some(format!("sbatch refused it: {}", answer.error())),
            // sbatch missing or not answering: as a controller away, for now.
            Err(e) => {
                refuse(&mut state, request, e);
                None
            }
        };
        let Some(reason) = failed else {
            return;
        };
        state.jobs.remove(&id);
        drop(state);
        self.send(ExecutorEvent::LaunchFailed { id, reason });
    }

    /// Cancels what the driver asked to go, again while Slurm has not ended it.
    async fn cancel_asked(&self) {
        let now = Instant::now();
        let due: Vec<String> = {
            let mut state = self.lock();
            state
                .jobs
                .values_mut()
                .filter(|t| t.cancel && t.cancel_sent.is_none_or(|at| now >= at + CANCEL_AGAIN))
                .filter_map(|t| {
                    t.cancel_sent = Some(now);
                    t.job.clone()
                })
                .collect()
        };
        if !due.is_empty() {
            self.scancel(&due).await;
        }
    }

    async fn scancel(&self, jobs: &[String]) {
        match tools::run("scancel", jobs).await {
            Ok(answer) if answer.ok => {}
            Ok(answer) => tracing::warn!(jobs = ?jobs, error = answer.error(), "scancel"),
            Err(e) => tracing::warn!(jobs = ?jobs, error = e, "scancel"),
        }
    }

    /// This uid's jobs, as `squeue` lists them (ended ones while Slurm keeps them).
    async fn squeue(&self) -> Result<Vec<job::Seen>, String> {
        let args = [
            "--noheader".to_owned(),
            "--all".to_owned(),
            "--states=all".to_owned(),
            format!("--user={}", tools::uid()),
            format!("--format={}", job::SQUEUE_FORMAT),
        ];
        let answer = tools::run("squeue", &args).await?;
        if !answer.ok {
            return Err(answer.error());
        }
        Ok(job::parse_squeue(&answer.stdout))
    }

    /// One round: every tracked job's state, and an event for each that started or ended.
    async fn poll(&self) {
        if self.lock().jobs.values().all(|t| t.job.is_none()) {
            return;
        }
        let listed = match self.squeue().await {
            Ok(listed) => listed,
            Err(e) => {
                return tracing::warn!(error = e, "asking Slurm about the executor jobs (squeue)");
            }
        };
        let by_job: HashMap<&str, &job::Seen> =
            listed.iter().map(|s| (s.job.as_str(), s)).collect();
        let tracked: Vec<(ExecutorId, String)> = self
            .lock()
            .jobs
            .iter()
            .filter_map(|(id, t)| Some((id.clone(), t.job.clone()?)))
            .collect();
        for (id, job_id) in tracked {
            match by_job.get(job_id.as_str()) {
                Some(seen) => self.observe(&id, seen).await,
                None => self.missing(&id, &job_id),
            }
        }
    }

    async fn observe(&self, id: &ExecutorId, seen: &job::Seen) {
        let exit_needed = matches!(
            seen.state.as_str(),
            "COMPLETED" | "FAILED" | "OUT_OF_MEMORY"
        );
        let exit = match exit_needed {
            true => self.exit_code(&seen.job).await,
            false => None,
        };
        let phase = job::phase(seen, exit.as_deref());
        let (end, asked) = {
            let mut state = self.lock();
            let Some(tracked) = state.jobs.get_mut(id) else {
                return;
            };
            tracked.missing = 0;
            match phase {
                Phase::Waiting(why) => return tracked.waiting = Some(why),
                Phase::Running => return tracked.waiting = None,
                Phase::Never(reason) => {
                    state.jobs.remove(id);
                    (Err(reason), false)
                }
                Phase::Ended(end) => {
                    let asked = tracked.cancel;
                    state.jobs.remove(id);
                    (Ok(end), asked)
                }
            }
        };
        let id = id.clone();
        let end = match end {
            Ok(end) => end,
            Err(reason) => {
                tracing::error!(executor = %id, reason, "cancelling an executor job");
                self.scancel(std::slice::from_ref(&seen.job)).await;
                return self.send(ExecutorEvent::LaunchFailed { id, reason });
            }
        };
        self.send(match end {
            End::Exited(exit, cause) => ExecutorEvent::Exited { id, exit, cause },
            End::Ended(reason) if asked => ExecutorEvent::Lost {
                id,
                reason: format!("{reason}, as the driver asked"),
            },
            End::Ended(reason) => ExecutorEvent::Lost { id, reason },
        });
    }

    fn missing(&self, id: &ExecutorId, job_id: &str) {
        let mut state = self.lock();
        let Some(tracked) = state.jobs.get_mut(id) else {
            return;
        };
        tracked.missing += 1;
        if tracked.missing < MISSING_ROUNDS {
            return;
        }
        state.jobs.remove(id);
        drop(state);
        self.send(ExecutorEvent::Lost {
            id: id.clone(),
            reason: format!("Slurm no longer knows job {job_id} (purged, or its state was lost)"),
        });
    }

    /// `ExitCode` (`CODE:SIGNAL`) of an ended job, from `scontrol show job -o`.
    async fn exit_code(&self, job: &str) -> Option<String> {
        let args = [
            "show".to_owned(),
            "job".to_owned(),
            "-o".to_owned(),
            job.to_owned(),
        ];
        let answer = tools::run("scontrol", &args).await.ok().filter(|a| a.ok)?;
        job::scontrol_field(&answer.stdout, "ExitCode").map(str::to_owned)
    }
}

/// Keeps `request` queued after a refusal for now, and backs off.
fn refuse(state: &mut State, request: LaunchRequest, why: String) {
    let wait = state
        .refused
        .as_ref()
        .map_or(FIRST_RETRY, |r| (r.wait * 2).min(MAX_RETRY));
    tracing::warn!(executor = %request.id, why, retry_in = ?wait, "Slurm refused an executor job for now");
    state.queue.push_front(request);
    state.refused = Some(Refusal {
        why,
        retry_at: Instant::now() + wait,
        wait,
    });
}

fn job_number(seen: &job::Seen) -> u64 {
    seen.job.parse().unwrap_or(0)
}

/// The executor's dir and its script (owner only: it names the secret's file).
fn write_script(dir: &Path, path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(path)?;
    file.write_all(text.as_bytes())
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
            let jobs: Vec<String> = {
                let mut state = self.inner.lock();
                state.queue.clear();
                state.jobs.values().filter_map(|t| t.job.clone()).collect()
            };
            if jobs.is_empty() {
                return;
            }
            tracing::info!(jobs = ?jobs, "cancelling the executors' Slurm jobs");
            self.inner.scancel(&jobs).await;
            let deadline = Instant::now() + grace + Duration::from_secs(5);
            while Instant::now() < deadline {
                let active = match self.inner.squeue().await {
                    Ok(listed) => listed
                        .iter()
                        .filter(|s| jobs.contains(&s.job))
                        .any(|s| matches!(job::phase(s, None), Phase::Waiting(_) | Phase::Running)),
                    Err(_) => true,
                };
                if !active {
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
}
