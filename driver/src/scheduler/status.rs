//! Task ends: an attempt's final status, applied to its task, its job and its
//! executor's cores, then a round of offers for what it gave back.

use super::*;

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
            requeued |= self.attempt_ended(executor_id, generation, status, now, &mut actions);
        }
        actions.extend(self.stop_drained());
        // Ends that put tasks back (or whose executor is gone) may have work for any
        // executor; otherwise only this one's cores came back.
        let only = (!requeued).then_some(executor_id);
        actions.extend(self.make_offers_at(now, only));
        actions
    }

    fn attempt_ended(
        &mut self,
        executor_id: &ExecutorId,
        generation: u64,
        status: TaskStatus,
        now: SystemTime,
        out: &mut Vec<Action>,
    ) -> bool {
        let clock = self.now;
        let exclusion = self.config.exclusion;
        let mut put_back = false;
        let Some(executor) = self.live_executor(executor_id, generation) else {
            return false;
        };
        let Some(running) = executor
            .running
            .get(&status.task)
            .filter(|r| r.attempt == status.attempt && status.generation == generation)
            .copied()
        else {
            return false;
        };
        executor.running.remove(&status.task);
        executor.tasks_finished += 1;
        if executor.queued_ahead > 0 {
            // A queued attempt takes the thread this one leaves.
            executor.queued_ahead -= 1;
        } else {
            executor.free_cores += running.cores;
        }
        self.launch_to_status
            .record(clock.saturating_duration_since(running.since));
        // A job that ended has left the state (its attempts were killed with it): the
        // cores above are all that this report still means.
        let Some(job) = self.jobs.get_mut(&status.task.job) else {
            return false;
        };
        let outcome = match &status.end.outcome {
            Ok(_) => Outcome::Succeeded,
            // Not the driver's kill (it kills only tasks already final): the executor
            // withdrew it, and the task runs again (below).
            Err(f)
                if f.kind == FailureKind::Killed
                    && !job.tasks[status.task.index as usize].state.is_final() =>
            {
                match running.preempted {
                    true => Outcome::Preempted,
                    false => Outcome::Lost,
                }
            }
            Err(f) => Outcome::Failed(f.kind),
        };
        let usage = status.end.usage;
        self.usage.add(&usage);
        self.attempts_measured += 1;
        let spent = match self.tenant_spent.get_mut(&job.def.owner.tenant) {
            Some(spent) => spent,
            None => self
                .tenant_spent
                .entry(job.def.owner.tenant.clone())
                .or_default(),
        };
        spent.attempts += 1;
        spent.succeeded += u64::from(matches!(outcome, Outcome::Succeeded));
        spent.preempted += u64::from(matches!(outcome, Outcome::Preempted));
        spent.cpu_us += usage.cpu_us;
        spent.wall_us += usage.wall_us;
        spent.output_bytes += usage.output_bytes;
        let reported = (status.end.started_at_us, status.end.finished_at_us, usage);
        job.close_span(running.span, outcome, Some(reported), now);
        // What it really ran with: an executor holds a task to its largest memory.
        if let Some(given) = status.end.memory_mb
            && let Some(span) = job.attempts.get_mut(running.span as usize)
        {
            span.memory_mb = span.memory_mb.min(given);
        }
        let mut status = status;
        if let Some(pins) = status.end.pins.take() {
            job.pins.insert(running.span, *pins);
        }
        let run = status
            .end
            .finished_at_us
            .saturating_sub(status.end.started_at_us) as f64;
        // A short memory (weight 0.2 for the newest): a job whose tasks slow down stops
        // queueing deep within a few ends.
        job.run_time_us = Some(job.run_time_us.map_or(run, |avg| avg + 0.2 * (run - avg)));
        // What the next attempt gets after running out of memory or time, when the job
        // escalates (None: it fails as before).
        let escalated = match (&status.end.outcome, job.def.options.escalate) {
            (Err(failure), Some(policy)) => escalation::next_budget(
                &self.shares.of(job.def.owner.tenant.as_deref()).hold(policy),
                failure.kind,
                job.budget(status.task.index),
                usage.peak_memory_bytes,
            ),
            _ => None,
        };
        let task = &mut job.tasks[status.task.index as usize];
        let actions = out;
        // A killed task's times and log are its last attempt's; a succeeded or failed
        // one keeps those of the attempt that decided it.
        if !matches!(task.state, TaskState::Succeeded | TaskState::Failed) {
            task.started_at_us = Some(status.end.started_at_us);
            task.finished_at_us = Some(status.end.finished_at_us);
            task.log = status.end.log;
        }
        if task.state.is_final() {
            // A kill (of this task or its job), or the other attempt's success, got here
            // first: the cores are back now, and whatever this attempt did is not taken.
            return false;
        }
        // Only speculation runs a task twice at once: without it there is no copy to
        // look for on every executor, once per end.
        let copy_running = self.config.speculation.is_some()
            && self
                .executors
                .values()
                .any(|e| e.running.contains_key(&status.task));
        debug_assert!(
            copy_running
                || !self
                    .executors
                    .values()
                    .any(|e| e.running.contains_key(&status.task)),
            "a second attempt of {} runs without speculation",
            status.task
        );
        // The driver kills attempts only of tasks already final (above), so a killed
        // attempt of a live task was withdrawn by its executor: stopping (SIGTERM, a pod
        // evicted) or cut off from us. A loss of the host, as if the executor had gone:
        // the task runs again, and neither the task nor the executor is held to account.
        if let Err(failure) = &status.end.outcome
            && failure.kind == FailureKind::Killed
        {
            if !copy_running {
                job.requeue(status.task.index, true);
                put_back = true;
                let why = match running.preempted {
                    true => ErrorBody {
                        kind: "preempted".into(),
                        message: format!(
                            "preempted on executor {executor_id}: its cores went to a tenant below its share; the task runs again"
                        ),
                    },
                    false => ErrorBody {
                        kind: "executor_stopped".into(),
                        message: format!(
                            "executor {executor_id} stopped the attempt ({}); the task runs again",
                            failure.message
                        ),
                    },
                };
                actions.push(requeued(job, status.task.index, why));
                if !self.queue.contains(&status.task.job) {
                    self.queue.push_front(status.task.job.clone());
                }
            }
            return put_back;
        }
        match status.end.outcome {
            Ok(result) if job.result_bytes + result.len() > job.def.max_result_bytes => {
                set_state(&mut job.counts, task, TaskState::Failed);
                let failure = TaskFailure::new(
                    FailureKind::ResultLimit,
                    format!(
                        "a {} byte result takes the job's results past max_result_bytes ({} bytes)",
                        result.len(),
                        job.def.max_result_bytes
                    ),
                );
                let reason = format!(
                    "task {} failed: {}: {}",
                    status.task.index, failure.kind, failure.message
                );
                task.failure = Some(failure);
                actions.push(Action::TaskEnded(status.task.clone()));
                actions.extend(Self::end_job(job, JobState::Failed, Some(reason), now));
                self.clear_running(&status.task.job, actions);
            }
            Ok(result) => {
                job.result_bytes += result.len();
                set_state(&mut job.counts, task, TaskState::Succeeded);
                task.executor = Some(executor_id.clone());
                task.result_digest = Some(result.digest());
                task.result = Some(result);
                task.failure = None;
                job.speculative.retain(|&i| i != status.task.index);
                actions.push(Action::TaskEnded(status.task.clone()));
                let copies = self.config.speculation.is_some().then_some(&self.executors);
                for (other, e) in copies.into_iter().flatten() {
                    if let Some(running) = e.running.get(&status.task) {
                        actions.push(Action::Kill {
                            executor: other.clone(),
                            task: status.task.clone(),
                            attempt: running.attempt,
                            reason: "another attempt of this task succeeded",
                        });
                    }
                }
            }
            Err(failure)
                if failure.kind.is_retryable() && task.host_failures + 1 < job.def.max_failures =>
            {
                task.host_failures += 1;
                let blames_executor = failure.kind.blames_executor();
                task.failure = Some(failure);
                // A source's failure (`fetch_error`: the job's URL answered 500, hashed
                // wrong, ...) costs the job its budget and nothing more: held against the
                // executor, one job naming bad URLs would take executors from every job.
                if blames_executor {
                    if excluded_for_task(&exclusion, &task.failed_on, executor_id) {
                        // Already excluded: cannot have run here; nothing more to learn.
                    } else {
                        task.failed_on.push(executor_id.clone());
                    }
                    let executor = self
                        .executors
                        .get_mut(executor_id)
                        .expect("executor checked above");
                    if executor
                        .health
                        .record_failure(&exclusion, status.task.clone(), clock)
                    {
                        tracing::warn!(
                            executor = %executor_id,
                            failures = exclusion.executor_failures,
                            window = ?exclusion.window,
                            period = ?exclusion.period,
                            "executor excluded after repeated host errors"
                        );
                    }
                }
                if !copy_running {
                    job.requeue(status.task.index, false);
                    put_back = true;
                    let failure = job.tasks[status.task.index as usize].failure.as_ref();
                    let why = ErrorBody {
                        kind: failure.map_or("host_error", |f| f.kind.as_str()).into(),
                        message: failure.map_or(String::new(), |f| f.message.clone()),
                    };
                    actions.push(requeued(job, status.task.index, why));
                    if !self.queue.contains(&job.def.id) {
                        self.queue.push_back(job.def.id.clone());
                    }
                }
            }
            Err(failure)
                if escalated.is_some() && task.host_failures + 1 < job.def.max_failures =>
            {
                // The guest's own failure, but one a bigger budget may cure: retried with
                // it, counted against max_failures like a host's.
                task.host_failures += 1;
                let next = escalated.expect("checked in the guard");
                task.failure = Some(failure.clone());
                let why = ErrorBody {
                    kind: failure.kind.as_str().into(),
                    message: format!(
                        "{}; retrying with {} MiB and {} ms",
                        failure.message, next.memory_mb, next.timeout_ms
                    ),
                };
                job.budgets.insert(status.task.index, next);
                if !copy_running {
                    job.requeue(status.task.index, false);
                    put_back = true;
                    actions.push(requeued(job, status.task.index, why));
                    if !self.queue.contains(&job.def.id) {
                        self.queue.push_back(job.def.id.clone());
                    }
                }
            }
            Err(failure) => {
                set_state(&mut job.counts, task, TaskState::Failed);
                let reason = format!(
                    "task {} failed after {} attempt(s): {}: {}",
                    status.task.index, task.attempts, failure.kind, failure.message
                );
                task.failure = Some(failure);
                actions.push(Action::TaskEnded(status.task.clone()));
                actions.extend(Self::end_job(job, JobState::Failed, Some(reason), now));
                self.clear_running(&status.task.job, actions);
            }
        }
        let job = self
            .jobs
            .get_mut(&status.task.job)
            .expect("job checked above");
        if !job.state.is_final() && job.all_final() {
            actions.extend(Self::end_job(job, JobState::Succeeded, None, now));
        }
        put_back
    }
}
