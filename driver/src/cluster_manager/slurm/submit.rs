//! Submitting executor jobs: the queue drained with `sbatch`, one at a time, a refusal
//! for now backed off and retried (back-pressure), any other refusal a failed launch.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::job::{self, Submission};
use super::{Inner, Refusal, State, Tracked, tools};
use crate::cluster_manager::{ExecutorEvent, LaunchRequest};

/// Backoff of `sbatch` while Slurm refuses for now.
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(30);
impl Inner {
    /// Submits what is queued, unless Slurm refused for now and the backoff runs.
    pub(super) async fn submit_queued(&self) {
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
            instance: &self.instance,
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
