//! Preemption: a tenant held below its fair share of the cores for longer than the
//! preemption timeout gets cores back by force. The youngest attempts (the least work
//! lost) of the tenant furthest over its share are killed, never taking that tenant
//! below its own share; their tasks go back to pending as `preempted`, which counts as
//! no failure. A killed attempt's cores come back with its end (the executor interrupts
//! the guest at once), and the tenant below its share takes them in the next round's
//! first pass.

use std::collections::HashSet;

use super::fair_share::fair_shares;
use super::*;

/// An attempt that may be preempted: (queued rather than running, its age as (launch
/// time, span), where, which, its attempt number and cores).
type Victim = (bool, (Instant, u32), ExecutorId, TaskId, u32, u32);

/// What one tenant has in this round: its weight, cores held, core cap, and cores its
/// pending tasks want: all of them for its share, and those of 1-core tasks, the only
/// ones preemption works for (the cores it frees may be spread over executors, and a
/// 4-core task needs them on one: killing for it could kill again and again for nothing).
struct Standing {
    tenant: Option<String>,
    weight: f64,
    held: u32,
    pending: u64,
    pending_single: u32,
    cap: u32,
}

impl ClusterState {
    /// Kills what must be killed for tenants that waited below their share for longer
    /// than the timeout; a full round of offers calls it first.
    pub(super) fn preempt(&mut self, actions: &mut Vec<Action>) {
        let Some(timeout) = self.config.preemption else {
            return;
        };
        let now = self.now;
        let standings = self.standings();
        if standings.len() < 2 {
            self.starving.clear();
            return;
        }
        let total: u32 = (self.executors.values())
            .filter(|e| e.takes_tasks())
            .map(|e| e.cores)
            .sum();
        let wants: Vec<(f64, f64)> = (standings.iter())
            .map(|s| {
                (
                    s.weight,
                    (s.held as f64 + s.pending as f64).min(f64::from(s.cap)),
                )
            })
            .collect();
        let fair = fair_shares(f64::from(total), &wants);
        let need = self.cores_owed(&standings, &fair, timeout);
        // Cores free now go to those tenants without killing anything.
        let free: u32 = (self.executors.values())
            .filter(|e| e.takes_tasks() && !e.health.is_excluded(now))
            .map(|e| e.free_cores)
            .sum();
        let mut need = need.saturating_sub(free);
        if need == 0 {
            return;
        }
        let queued = self.queued_attempts();
        for (tenant, spare) in self.over_share(&standings, &fair) {
            if need == 0 {
                break;
            }
            need = self.preempt_from(&tenant, spare, need, &queued, actions);
        }
        // Those that waited have been served: their wait starts again from here.
        for since in self.starving.values_mut() {
            if now.saturating_duration_since(*since) >= timeout {
                *since = now;
            }
        }
    }

    /// Cores owed to the tenants that have been below their share, with 1-core work
    /// waiting, for the timeout or longer. Notes who is below its share since when, and
    /// forgets who is not.
    fn cores_owed(&mut self, standings: &[Standing], fair: &[f64], timeout: Duration) -> u32 {
        let now = self.now;
        let mut need = 0u32;
        for (s, fair) in standings.iter().zip(fair) {
            // A share of 0.7 cores is owed a core: rounded up, as a victim keeps its own
            // share rounded up (below), so two tenants never take one core back and forth.
            let short = (fair.ceil() as u32)
                .min(s.cap)
                .saturating_sub(s.held)
                .min(s.pending_single);
            if short == 0 {
                self.starving.remove(&s.tenant);
                continue;
            }
            let since = *self.starving.entry(s.tenant.clone()).or_insert(now);
            if now.saturating_duration_since(since) >= timeout {
                need += short;
            }
        }
        need
    }

    /// Tenants at or over their share, furthest over first, and how many cores each may
    /// give without going below it.
    fn over_share(&self, standings: &[Standing], fair: &[f64]) -> Vec<(Option<String>, u32)> {
        let mut over: Vec<(f64, Option<String>, u32)> = (standings.iter().zip(fair))
            .filter(|(s, fair)| {
                f64::from(s.held) >= **fair && !self.starving.contains_key(&s.tenant)
            })
            .map(|(s, fair)| {
                let spare = s.held - (fair.ceil() as u32).min(s.held);
                (f64::from(s.held) / fair.max(1e-9), s.tenant.clone(), spare)
            })
            .collect();
        over.sort_by(|a, b| b.0.total_cmp(&a.0));
        over.into_iter().map(|(_, t, spare)| (t, spare)).collect()
    }

    /// Kills `tenant`'s attempts until `need` cores are freed or it has no more `spare`:
    /// its attempts queued on executors first (they would take the cores it gives back;
    /// no work is lost, and they free none), then its running ones, youngest first.
    /// Returns the cores still needed.
    fn preempt_from(
        &mut self,
        tenant: &Option<String>,
        mut spare: u32,
        mut need: u32,
        queued: &HashSet<(ExecutorId, TaskId)>,
        actions: &mut Vec<Action>,
    ) -> u32 {
        let mine =
            |task: &TaskId| self.jobs.get(&task.job).map(|j| &j.def.owner.tenant) == Some(tenant);
        let mut victims: Vec<Victim> = Vec::new();
        for (id, e) in &self.executors {
            for (task, r) in e.running.iter().filter(|(t, r)| !r.preempted && mine(t)) {
                let is_queued = queued.contains(&(id.clone(), task.clone()));
                let age = (r.since, r.span);
                victims.push((is_queued, age, id.clone(), task.clone(), r.attempt, r.cores));
            }
        }
        victims.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
        for (is_queued, _, executor, task, attempt, cores) in victims {
            if !is_queued {
                if need == 0 || cores > spare {
                    break;
                }
                spare -= cores;
                need = need.saturating_sub(cores);
            }
            if let Some(r) = self
                .executors
                .get_mut(&executor)
                .and_then(|e| e.running.get_mut(&task))
            {
                r.preempted = true;
            }
            tracing::info!(%task, %executor, queued = is_queued, tenant = tenant.as_deref().unwrap_or("admin"), "preempting an attempt for a tenant below its share");
            actions.push(Action::Kill {
                executor,
                task,
                attempt,
                reason: "preempted: its cores go to a tenant below its share",
            });
        }
        need
    }

    /// The attempts waiting in executors' queues rather than on a core: on each
    /// executor, the `queued_ahead` youngest (its task threads take its queue in launch
    /// order).
    fn queued_attempts(&self) -> HashSet<(ExecutorId, TaskId)> {
        let mut queued = HashSet::new();
        for (id, e) in self.executors.iter().filter(|(_, e)| e.queued_ahead > 0) {
            // Launched in one round, attempts share a time: their spans (in launch
            // order within a job) break the tie.
            let mut attempts: Vec<((Instant, u32), &TaskId)> = e
                .running
                .iter()
                .map(|(t, r)| ((r.since, r.span), t))
                .collect();
            attempts.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
            let youngest = attempts.into_iter().take(e.queued_ahead as usize);
            queued.extend(youngest.map(|(_, t)| (id.clone(), t.clone())));
        }
        queued
    }

    /// Every tenant with cores held or tasks pending: cores of attempts being preempted
    /// are counted as given back already, and attempts in executors' queues hold none.
    fn standings(&self) -> Vec<Standing> {
        let mut out: Vec<Standing> = Vec::new();
        let at = |out: &mut Vec<Standing>, tenant: &Option<String>, shares: &fair_share::Shares| {
            match out.iter().position(|s| s.tenant == *tenant) {
                Some(at) => at,
                None => {
                    let share = shares.of(tenant.as_deref());
                    out.push(Standing {
                        tenant: tenant.clone(),
                        weight: share.weight,
                        held: 0,
                        pending: 0,
                        pending_single: 0,
                        cap: share.max_cores.unwrap_or(u32::MAX),
                    });
                    out.len() - 1
                }
            }
        };
        for job in self.jobs.values().filter(|j| j.counts.pending > 0) {
            let i = at(&mut out, &job.def.owner.tenant, &self.shares);
            let cores = job.def.resources.cores;
            out[i].pending += u64::from(job.counts.pending) * u64::from(cores);
            if cores == 1 {
                out[i].pending_single = out[i].pending_single.saturating_add(job.counts.pending);
            }
        }
        let queued = self.queued_attempts();
        for (id, e) in &self.executors {
            let holding = |(task, r): &(&TaskId, &RunningAttempt)| {
                !r.preempted && !queued.contains(&(id.clone(), (*task).clone()))
            };
            for (task, r) in e.running.iter().filter(holding) {
                if let Some(job) = self.jobs.get(&task.job) {
                    let i = at(&mut out, &job.def.owner.tenant, &self.shares);
                    out[i].held = out[i].held.saturating_add(r.cores);
                }
            }
        }
        out
    }
}
