//! An attempt's end, the event every executor's report is. The attempt leaves its
//! executor (its core comes back), what it used and how long it ran are recorded, and
//! then one outcome decides what happens to its task: an attempt of a task already final
//! is set aside, and the others are told apart by [`verdict`], in the order it checks
//! them, each carried out by its own function (`task_final`, `task_requeued`).

use flint_protocol::{Resources, TaskEnd};

use super::task_final::{on_result_over_limit, on_task_failed, on_task_succeeded};
use super::task_requeued::{on_attempt_withdrawn, on_task_escalated, on_task_retried};
use super::*;

/// What an attempt's end decides for a task not yet final, in the order [`verdict`]
/// tells them apart.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// Its executor withdrew it (stopping, cut off, or told to by a preemption): the task
    /// runs again, held against nobody.
    Withdrawn(TaskFailure),
    /// A success whose result takes the job's results past `max_result_bytes`: the task
    /// fails, and its job with it.
    ResultOverLimit(TaskResult),
    Succeeded(TaskResult),
    /// A source's or an executor's failure, with attempts left: the task runs again.
    Retried(TaskFailure),
    /// The guest ran out of memory or time, its job escalates, and attempts are left:
    /// the task runs again with this budget.
    Escalated(TaskFailure, Resources),
    /// The task fails, and its job with it.
    Failed(TaskFailure),
}

impl ClusterState {
    /// A task attempt ended on an executor. Stale reports (an old attempt, another
    /// executor, a lost generation) change nothing. The first success of a task wins; a
    /// copy still running elsewhere is killed.
    pub fn status_update(
        &mut self,
        executor_id: &ExecutorId,
        generation: u64,
        status: TaskStatus,
        now: SystemTime,
    ) -> Vec<Action> {
        self.status_updates(executor_id, generation, vec![status], now)
    }

    /// Several ends from one executor, as they arrived, then one round of offers for
    /// the cores they gave back: placement once per burst, not once per task.
    pub fn status_updates(
        &mut self,
        executor_id: &ExecutorId,
        generation: u64,
        statuses: Vec<TaskStatus>,
        now: SystemTime,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut requeued = false;
        for status in statuses {
            requeued |= self.on_task_ended(executor_id, generation, status, now, &mut actions);
        }
        actions.extend(self.stop_drained());
        // Ends that put tasks back (or whose executor is gone) may have work for any
        // executor; otherwise only this one's cores came back.
        let only = (!requeued).then_some(executor_id);
        actions.extend(self.make_offers_at(now, only));
        actions
    }

    /// One attempt's end; returns whether it put its task back to pending.
    fn on_task_ended(
        &mut self,
        executor_id: &ExecutorId,
        generation: u64,
        status: TaskStatus,
        now: SystemTime,
        out: &mut Vec<Action>,
    ) -> bool {
        let Some(running) = self.take_attempt(executor_id, generation, &status) else {
            return false;
        };
        let clock = self.now;
        let ClusterState {
            jobs,
            executors,
            queue,
            config,
            shares,
            usage,
            attempts_measured,
            tenant_spent,
            ..
        } = self;
        // A job that ended has left the state (its attempts were killed with it): the
        // cores given back are all that this report still means.
        let Some(job) = jobs.get_mut(&status.task.job) else {
            return false;
        };
        let TaskStatus {
            task, end: ended, ..
        } = status;
        let outcome = span_outcome(job, task.index, &ended.outcome, running.preempted);
        usage.add(&ended.usage);
        *attempts_measured += 1;
        add_spent(tenant_spent, &job.def.owner.tenant, outcome, &ended.usage);
        let peak_memory_bytes = ended.usage.peak_memory_bytes;
        let result = record_attempt(job, task.index, &running, outcome, ended, now);
        if job.tasks[task.index as usize].state.is_final() {
            // A kill (of this task or its job), or the other attempt's success, got here
            // first: the cores are back now, and whatever this attempt did is not taken.
            return false;
        }
        let end = End {
            task: &task,
            executor: executor_id,
            preempted: running.preempted,
            copy_running: copy_running(config, executors, &task),
            now,
            clock,
        };
        let put_back = match verdict(job, task.index, result, peak_memory_bytes, shares) {
            Verdict::Withdrawn(failure) => {
                return on_attempt_withdrawn(queue, job, &end, &failure, out);
            }
            Verdict::ResultOverLimit(result) => {
                on_result_over_limit(job, executors, &end, &result, out);
                false
            }
            Verdict::Succeeded(result) => {
                on_task_succeeded(job, executors, config, &end, result, out);
                false
            }
            Verdict::Retried(failure) => {
                on_task_retried(job, queue, executors, &config.exclusion, &end, failure, out)
            }
            Verdict::Escalated(failure, next) => {
                on_task_escalated(job, queue, &end, failure, next, out)
            }
            Verdict::Failed(failure) => {
                on_task_failed(job, executors, &end, failure, out);
                false
            }
        };
        if !job.state.is_final() && job.all_final() {
            out.extend(Self::end_job(job, JobState::Succeeded, None, now));
        }
        put_back
    }

    /// Takes a reported attempt off its executor, whose core comes back (or goes to the
    /// attempt queued behind it), and records its launch-to-status time. `None` for a
    /// stale report: an old attempt, or one of a lost registration.
    fn take_attempt(
        &mut self,
        executor_id: &ExecutorId,
        generation: u64,
        status: &TaskStatus,
    ) -> Option<RunningAttempt> {
        let clock = self.now;
        let executor = self.live_executor(executor_id, generation)?;
        let running = executor
            .running
            .get(&status.task)
            .filter(|r| r.attempt == status.attempt && r.generation == status.generation)
            .copied()?;
        executor.running.remove(&status.task);
        executor.tasks_finished += 1;
        if executor.queued_ahead > 0 {
            // A queued attempt takes the thread this one leaves.
            executor.queued_ahead -= 1;
        } else {
            // Never past its cores: attempts adopted beyond them (several multi-core ones
            // held at a registration) took queue slots, not cores.
            executor.free_cores = (executor.free_cores + running.cores).min(executor.cores);
        }
        self.launch_to_status
            .record(clock.saturating_duration_since(running.since));
        Some(running)
    }
}

/// The attempt's outcome as its span shows it.
fn span_outcome(
    job: &Job,
    index: u32,
    result: &Result<TaskResult, TaskFailure>,
    preempted: bool,
) -> Outcome {
    match result {
        Ok(_) => Outcome::Succeeded,
        // Not the driver's kill (it kills only tasks already final): the executor
        // withdrew it, and the task runs again.
        Err(f) if f.kind == FailureKind::Killed && !job.tasks[index as usize].state.is_final() => {
            match preempted {
                true => Outcome::Preempted,
                false => Outcome::Lost,
            }
        }
        Err(f) => Outcome::Failed(f.kind),
    }
}

/// Adds an attempt to what its tenant's attempts used.
fn add_spent(
    spent: &mut FastMap<Option<String>, Spent>,
    tenant: &Option<String>,
    outcome: Outcome,
    usage: &Usage,
) {
    // The tenant's name is copied into the map only on its first attempt.
    let spent = match spent.get_mut(tenant) {
        Some(spent) => spent,
        None => spent.entry(tenant.clone()).or_default(),
    };
    spent.attempts += 1;
    spent.succeeded += u64::from(matches!(outcome, Outcome::Succeeded));
    spent.preempted += u64::from(matches!(outcome, Outcome::Preempted));
    spent.cpu_us += usage.cpu_us;
    spent.wall_us += usage.wall_us;
    spent.output_bytes += usage.output_bytes;
    spent.egress_requests += usage.egress_requests;
    spent.egress_bytes_sent += usage.egress_bytes_sent;
    spent.egress_bytes_received += usage.egress_bytes_received;
}

/// Records what the attempt was and did, whatever its outcome: its span (the executor's
/// times and usage, the memory it really ran with, what a deterministic job's attempt
/// pinned), the job's average run time, and the task's times and log unless an earlier
/// attempt decided it. Returns the attempt's result.
fn record_attempt(
    job: &mut Job,
    index: u32,
    running: &RunningAttempt,
    outcome: Outcome,
    ended: TaskEnd,
    now: SystemTime,
) -> Result<TaskResult, TaskFailure> {
    let TaskEnd {
        started_at_us,
        finished_at_us,
        outcome: result,
        log,
        usage,
        pins,
        memory_mb,
        ..
    } = ended;
    job.close_span(
        running.span,
        outcome,
        Some((started_at_us, finished_at_us, usage)),
        now,
    );
    // What it really ran with: an executor holds a task to its largest memory.
    if let Some(given) = memory_mb
        && let Some(span) = job.attempts.get_mut(running.span as usize)
    {
        span.memory_mb = span.memory_mb.min(given);
    }
    if let Some(pins) = pins {
        job.pins.insert(running.span, *pins);
    }
    let run = finished_at_us.saturating_sub(started_at_us) as f64;
    // A short memory (weight 0.2 for the newest): a job whose tasks slow down stops
    // queueing deep within a few ends.
    job.run_time_us = Some(job.run_time_us.map_or(run, |avg| avg + 0.2 * (run - avg)));
    let task = &mut job.tasks[index as usize];
    // A killed task's times and log are its last attempt's; a succeeded or failed one
    // keeps those of the attempt that decided it.
    if !matches!(task.state, TaskState::Succeeded | TaskState::Failed) {
        task.started_at_us = Some(started_at_us);
        task.finished_at_us = Some(finished_at_us);
        task.log = log;
    }
    result
}

/// Whether another attempt of `task` still runs. Only speculation runs a task twice at
/// once: without it there is no copy to look for on every executor, once per end.
fn copy_running(
    config: &SchedulingConfig,
    executors: &BTreeMap<ExecutorId, ExecutorData>,
    task: &TaskId,
) -> bool {
    let running = |e: &ExecutorData| e.running.contains_key(task);
    let copy = config.speculation.is_some() && executors.values().any(running);
    debug_assert!(
        copy || !executors.values().any(running),
        "a second attempt of {task} runs without speculation"
    );
    copy
}

/// The outcome of an attempt of task `index` (not yet final) that ended with `result`.
/// The order of the checks is the rules': a withdrawal is nobody's failure, a result is
/// taken only within the job's limit, and a failure runs again while the job's
/// `max_failures` allows, retried as it was when a source or an executor failed, or with
/// a bigger budget when the job escalates what the guest ran out of.
pub(super) fn verdict(
    job: &Job,
    index: u32,
    result: Result<TaskResult, TaskFailure>,
    peak_memory_bytes: u64,
    shares: &fair_share::Shares,
) -> Verdict {
    let task = &job.tasks[index as usize];
    let attempts_left = task.host_failures + 1 < job.def.max_failures;
    match result {
        // The driver kills attempts only of tasks already final, so a killed attempt of
        // a live task was withdrawn by its executor: stopping (SIGTERM, a pod evicted),
        // cut off from us, or preempted. A loss of the host, as if the executor had gone.
        Err(failure) if failure.kind == FailureKind::Killed => Verdict::Withdrawn(failure),
        Ok(result) if job.result_bytes + result.len() > job.def.max_result_bytes => {
            Verdict::ResultOverLimit(result)
        }
        Ok(result) => Verdict::Succeeded(result),
        Err(failure) if failure.kind.is_retryable() && attempts_left => Verdict::Retried(failure),
        Err(failure) => {
            let next = attempts_left
                .then(|| escalated(job, index, failure.kind, peak_memory_bytes, shares))
                .flatten();
            match next {
                Some(next) => Verdict::Escalated(failure, next),
                None => Verdict::Failed(failure),
            }
        }
    }
}

/// What the next attempt gets after running out of memory or time, when the job
/// escalates (`None`: it fails as before), held to its tenant's per-task limits as the
/// tenants file says now.
fn escalated(
    job: &Job,
    index: u32,
    kind: FailureKind,
    peak_memory_bytes: u64,
    shares: &fair_share::Shares,
) -> Option<Resources> {
    let policy = job.def.options.escalate?;
    let held = shares.of(job.def.owner.tenant.as_deref()).hold(policy);
    escalation::next_budget(&held, kind, job.budget(index), peak_memory_bytes)
}
