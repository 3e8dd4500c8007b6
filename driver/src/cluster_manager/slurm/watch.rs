//! Following executor jobs through Slurm's own tools: the jobs an earlier run left found
//! and adopted at the start, one `squeue` a round read into executor events, and the
//! cancels the driver asked for repeated until Slurm has ended the jobs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use flint_protocol::ExecutorId;

use super::job::{self, End, Phase};
use super::{Inner, Tracked, active, tools};
use crate::cluster_manager::ExecutorEvent;

/// A cancel not yet seen through is asked again this often.
const CANCEL_AGAIN: Duration = Duration::from_secs(5);
/// Rounds a submitted job may be missing from `squeue` before it is taken as gone (a job
/// just submitted can miss one answer; one purged past MinJobAge misses all).
const MISSING_ROUNDS: u32 = 3;

impl Inner {
    /// The jobs of this app an earlier run left: one per executor adopted (running
    /// before pending, then the newest), the rest cancelled.
    pub(super) async fn adopt(&self) -> anyhow::Result<()> {
        let listed = self.squeue().await.map_err(|e| {
            anyhow::anyhow!("listing this driver's Slurm jobs at its start (squeue): {e}")
        })?;
        let mut best: HashMap<ExecutorId, job::Seen> = HashMap::new();
        let mut strays = Vec::new();
        for seen in listed {
            let Some(id) = self.ours(&seen) else {
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

    /// Cancels what the driver asked to go, again while Slurm has not ended it.
    pub(super) async fn cancel_asked(&self) {
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

    pub(super) async fn scancel(&self, jobs: &[String]) {
        match tools::run("scancel", jobs).await {
            Ok(answer) if answer.ok => {}
            Ok(answer) => tracing::warn!(jobs = ?jobs, error = answer.error(), "scancel"),
            Err(e) => tracing::warn!(jobs = ?jobs, error = e, "scancel"),
        }
    }

    /// This uid's jobs, as `squeue` lists them (ended ones while Slurm keeps them).
    pub(super) async fn squeue(&self) -> Result<Vec<job::Seen>, String> {
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

    /// One round: every tracked job's state, and an event for each that started or ended;
    /// this driver's jobs it does not track taken or cancelled (`sweep`).
    pub(super) async fn poll(&self) {
        if self.lock().jobs.is_empty() {
            return;
        }
        let listed = match self.squeue().await {
            Ok(listed) => listed,
            Err(e) => {
                return tracing::warn!(error = e, "asking Slurm about the executor jobs (squeue)");
            }
        };
        self.sweep(&listed).await;
        // By id and name: an id alone may be another job's after the controller lost
        // its state and counted again.
        let by_job: HashMap<&str, &job::Seen> = (listed.iter())
            .filter(|s| self.ours(s).is_some())
            .map(|s| (s.job.as_str(), s))
            .collect();
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

    /// Jobs of this driver that it does not track with their id: one whose `sbatch` it
    /// took as failed (a timeout, a lost answer: Slurm may have made the job) while its
    /// executor waits to be submitted again is taken as that submission; any other (a
    /// duplicate, one whose executor is gone) is cancelled, so that none is left.
    async fn sweep(&self, listed: &[job::Seen]) {
        let mut strays = Vec::new();
        let mut taken = Vec::new();
        {
            let mut state = self.lock();
            for seen in listed.iter().filter(|s| active(s)) {
                let Some(id) = self.ours(seen) else {
                    continue;
                };
                let queued = state.queue.iter().position(|r| r.id == id);
                match state.jobs.get_mut(&id) {
                    Some(t) if t.job.as_deref() == Some(seen.job.as_str()) => {}
                    Some(t) if t.job.is_none() && !t.cancel && queued.is_some() => {
                        t.job = Some(seen.job.clone());
                        t.waiting = Some(format!(
                            "Slurm job {} found after its sbatch failed",
                            seen.job
                        ));
                        state.queue.remove(queued.unwrap_or_default());
                        taken.push(id);
                    }
                    _ => strays.push(seen.job.clone()),
                }
            }
        }
        for id in taken {
            tracing::warn!(executor = %id, "a Slurm job whose submission seemed to fail was made; taking it");
            let log = Some(self.dir(&id).join("stderr"));
            self.send(ExecutorEvent::Launched {
                id,
                worker: None,
                pid: None,
                log,
            });
        }
        if !strays.is_empty() {
            tracing::warn!(jobs = ?strays, "cancelling Slurm jobs of this driver it does not track");
            self.scancel(&strays).await;
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
                // Pending again after it ran: requeued (by an admin, or a controller
                // that lost its record of the start), its executor gone with the run.
                Phase::Waiting(_) if tracked.ran => {
                    tracked.cancel = true;
                    state.jobs.remove(id);
                    let why = format!(
                        "Slurm put job {} back in its queue after it ran (requeued)",
                        seen.job
                    );
                    (Ok(End::Ended(why)), false)
                }
                Phase::Waiting(why) => return tracked.waiting = Some(why),
                Phase::Running => {
                    tracked.ran = true;
                    return tracked.waiting = None;
                }
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
            Ok(End::Ended(reason)) if active(seen) => {
                // Requeued: it must not run again as an executor nobody tracks.
                self.scancel(std::slice::from_ref(&seen.job)).await;
                End::Ended(reason)
            }
            Ok(end) => end,
            Err(reason) => {
                tracing::error!(executor = %id, reason, "cancelling an executor job");
                self.scancel(std::slice::from_ref(&seen.job)).await;
                return self.send(ExecutorEvent::LaunchFailed { id, reason });
            }
        };
        self.clean(&id);
        self.send(match end {
            End::Exited(exit, cause) => ExecutorEvent::Exited { id, exit, cause },
            End::Ended(reason) if asked => ExecutorEvent::Lost {
                id,
                reason: format!("{reason}, as the driver asked"),
            },
            End::Ended(reason) => ExecutorEvent::Lost { id, reason },
        });
    }

    /// Removes an ended executor's work dir (its fetch cache and spills, on the shared
    /// filesystem), keeping its logs: each executor of a burst gets a dir of its own.
    fn clean(&self, id: &ExecutorId) {
        let work = self.dir(id).join("work");
        tokio::task::spawn_blocking(move || {
            if let Err(e) = std::fs::remove_dir_all(&work)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %work.display(), error = %e, "removing an executor's work dir");
            }
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
        self.clean(id);
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

fn job_number(seen: &job::Seen) -> u64 {
    seen.job.parse().unwrap_or(0)
}
