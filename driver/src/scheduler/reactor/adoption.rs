//! An executor registering again with attempts it kept (the driver restarted, or its
//! connection broke): each is adopted as its task's running attempt, or dropped; and,
//! after a restart, the short wait for the executors the last driver knew before the
//! tasks they may still be running are launched again elsewhere.

use flint_protocol::HeldAttempt;

use super::*;

/// Why an attempt an executor listed is not adopted (its `dropped` event's reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// Its job was deleted or ended (and left the state): nothing wants it.
    JobGone,
    /// Its job has no such task (a job id reused by nothing: a bug or a forgery).
    NoSuchTask,
    /// Its task ended meanwhile (its end was stored before the restart, or another
    /// attempt's end won).
    TaskEnded,
    /// Another attempt of its task runs (launched after the wait for this executor).
    RunsElsewhere,
    /// Its task waits for the results it reads: no attempt of it can be right.
    TaskWaiting,
    /// Its end was applied already (the acknowledgement was lost with the connection):
    /// sent again, it must not count twice.
    EndApplied,
}

impl Dropped {
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::JobGone => "job_gone",
            Dropped::NoSuchTask => "no_such_task",
            Dropped::TaskEnded => "task_ended",
            Dropped::RunsElsewhere => "runs_elsewhere",
            Dropped::TaskWaiting => "task_waiting",
            Dropped::EndApplied => "end_applied",
        }
    }

    fn sentence(self) -> &'static str {
        match self {
            Dropped::JobGone => "its job is gone (deleted, or ended)",
            Dropped::NoSuchTask => "its job has no such task",
            Dropped::TaskEnded => "its task has ended",
            Dropped::RunsElsewhere => "another attempt of its task runs",
            Dropped::TaskWaiting => "its task waits for its inputs",
            Dropped::EndApplied => "its end was applied already",
        }
    }
}

/// The wait after a restart (`--adopt-wait-ms`): the restored jobs launch nothing until
/// every executor the last driver knew has registered again, or `until`.
#[derive(Debug)]
pub struct Adopting {
    until: Instant,
    expected: std::collections::HashSet<ExecutorId>,
    /// The restored jobs with tasks that were not final: what their executors may run.
    jobs: std::collections::HashSet<JobId>,
}

impl Adopting {
    /// Whether launches of `job` wait for executors to come back.
    pub fn holds(&self, job: &JobId) -> bool {
        self.jobs.contains(job)
    }
}

impl ClusterState {
    /// After a restore: hold the restored jobs' launches until the executors in
    /// `expected` are back, or `wait` has passed. Nothing is held without either.
    pub fn begin_adopting(&mut self, expected: Vec<ExecutorId>, wait: Duration) {
        // Waiting tasks too: a graph's downstream task is waiting again after a restart
        // until its inputs are made once more, and may be running somewhere meanwhile.
        let jobs: std::collections::HashSet<JobId> = (self.jobs.iter())
            .filter(|(_, j)| !j.state.is_final() && j.counts.pending + j.counts.waiting > 0)
            .map(|(id, _)| id.clone())
            .collect();
        if expected.is_empty() || jobs.is_empty() || wait.is_zero() {
            return;
        }
        let expected = (expected.into_iter())
            .filter(|id| {
                !self
                    .executors
                    .get(id)
                    .is_some_and(|e| e.state == ExecutorState::Alive)
            })
            .collect();
        self.adopting = Some(Adopting {
            until: self.now + wait,
            expected,
            jobs,
        });
    }

    /// The executors still waited for, if the wait is on.
    pub fn adoption_waits_for(&self) -> Option<Vec<ExecutorId>> {
        let a = self.adopting.as_ref()?;
        let mut ids: Vec<ExecutorId> = a.expected.iter().cloned().collect();
        ids.sort();
        Some(ids)
    }

    /// Executors the wait after a restart ended without: for the job store to forget.
    pub fn take_given_up(&mut self) -> Vec<ExecutorId> {
        std::mem::take(&mut self.given_up)
    }

    /// `id` registered: one fewer to wait for.
    pub(super) fn adopting_registered(&mut self, id: &ExecutorId) {
        if let Some(a) = &mut self.adopting {
            a.expected.remove(id);
            if a.expected.is_empty() {
                self.end_adopting();
            }
        }
    }

    /// Ends the wait once it is due (the tick); whether it ended now.
    pub(super) fn end_adopting_if_due(&mut self) -> bool {
        match &self.adopting {
            Some(a) if self.now >= a.until => {
                tracing::info!(
                    missing = ?a.expected,
                    "the wait for executors to come back is over; their tasks run again"
                );
                // Not waited for again after another restart: they are gone.
                self.given_up.extend(a.expected.iter().cloned());
                self.end_adopting();
                true
            }
            _ => false,
        }
    }

    fn end_adopting(&mut self) {
        let Some(a) = self.adopting.take() else {
            return;
        };
        for id in a.jobs {
            if self.jobs.get(&id).is_some_and(Job::has_work) && !self.queue.contains(&id) {
                self.queue.push_back(id);
            }
        }
    }

    /// The attempts executor `id` (just registered) listed: each adopted, or dropped
    /// (a running one killed). Its events go to each job's watchers; the pending lists
    /// of the jobs that gave up tasks are compacted once, not once per task.
    pub(super) fn adopt(&mut self, id: &ExecutorId, held: Vec<HeldAttempt>, out: &mut Vec<Action>) {
        let mut touched: Vec<JobId> = Vec::new();
        for attempt in held {
            let verdict = self.adopt_one(id, &attempt);
            if verdict.is_ok() && touched.last() != Some(&attempt.task.job) {
                touched.push(attempt.task.job.clone());
            }
            if let Err(why) = verdict
                && !attempt.ended
            {
                out.push(Action::Kill {
                    executor: id.clone(),
                    task: attempt.task.clone(),
                    attempt: attempt.attempt,
                    reason: why.sentence(),
                });
            }
            out.push(Action::Reconciled {
                task: attempt.task,
                attempt: attempt.attempt,
                executor: id.clone(),
                dropped: verdict.err(),
            });
        }
        touched.sort();
        touched.dedup();
        for job in touched {
            if let Some(job) = self.jobs.get_mut(&job) {
                let tasks = &job.tasks;
                let pending = |i: &u32| tasks[*i as usize].state == TaskState::Pending;
                job.pending.retain(pending);
                job.constrained.retain(pending);
            }
        }
    }

    /// Adopts one attempt if its task is pending (restored, or put back when its
    /// executor's connection broke): it runs again here as it was, with its own attempt
    /// number and generation, its cores taken.
    fn adopt_one(&mut self, id: &ExecutorId, held: &HeldAttempt) -> Result<(), Dropped> {
        let ClusterState {
            jobs,
            executors,
            now,
            wall,
            ..
        } = self;
        let job = jobs.get_mut(&held.task.job).ok_or(Dropped::JobGone)?;
        if job.state.is_final() {
            return Err(Dropped::JobGone);
        }
        let task = (job.tasks)
            .get(held.task.index as usize)
            .ok_or(Dropped::NoSuchTask)?;
        match task.state {
            TaskState::Pending => {}
            TaskState::Running => return Err(Dropped::RunsElsewhere),
            TaskState::Waiting => return Err(Dropped::TaskWaiting),
            _ => return Err(Dropped::TaskEnded),
        }
        // This driver closed the attempt's span before: an end it applied (a failure it
        // put the task back for) must not count twice; an attempt it took for lost, with
        // its executor, is taken back in the same span.
        let index = held.task.index;
        let earlier = job.span_of(index, held.attempt, id);
        if let Some(at) = earlier
            && job.attempts[at as usize].outcome != Some(Outcome::Lost)
        {
            return Err(Dropped::EndApplied);
        }
        let executor = executors.get_mut(id).expect("registered just now");
        let cores = job.def.resources.cores;
        executor.take_slot(cores, job.locality);
        if job.state == JobState::Queued {
            job.state = JobState::Running;
        }
        let task = &mut job.tasks[index as usize];
        set_state(&mut job.counts, task, TaskState::Running);
        task.attempts = task.attempts.max(held.attempt);
        task.executor = Some(id.clone());
        let span = match earlier {
            Some(at) => {
                job.reopen_span(at);
                at
            }
            None => {
                let started = match held.started_at_us {
                    0 => *wall,
                    us => std::time::UNIX_EPOCH + Duration::from_micros(us),
                };
                job.open_span(index, id, false, started)
            }
        };
        executor.running.insert(
            held.task.clone(),
            RunningAttempt {
                attempt: held.attempt,
                generation: held.generation,
                since: *now,
                span,
                cores,
                preempted: false,
            },
        );
        Ok(())
    }
}
