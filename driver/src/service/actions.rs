//! Carrying out what the scheduler's state changes ask for, under the one lock: messages
//! to executors, events to watchers, task and job ends to the job store, and final jobs
//! into the archive. Kept apart from the entry points (submission, executors) so that
//! every change goes through one place that keeps those effects in the state's order.

use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use flint_protocol::api::{TaskEvent, TaskState};
use flint_protocol::records::TaskEndRecord;
use flint_protocol::{Digest, DriverMessage, ExecutorId, JobId, TaskId, TaskLaunch};

use super::{Deferred, Driver, Inner, archive};
use crate::events::JobEvent;
use crate::scheduler::memo;
use crate::scheduler::{Action, ClusterState, Job};
use crate::store::durable;

impl Driver {
    /// Changes the state and carries out what the change asks for, under one lock, so
    /// that messages to an executor leave in the order the state decided them.
    pub fn apply<R>(&self, f: impl FnOnce(&mut ClusterState) -> (R, Vec<Action>)) -> R {
        self.apply_inner(|inner| f(&mut inner.state))
    }

    /// [`Self::apply`], with the connections in reach too.
    pub(super) fn apply_inner<R>(&self, f: impl FnOnce(&mut Inner) -> (R, Vec<Action>)) -> R {
        let mut inner = self.lock();
        inner.state.set_clock(Instant::now(), SystemTime::now());
        let (result, mut actions) = f(&mut inner);
        inner.state.settle_waits(&mut actions);
        let mut finished = false;
        for action in actions {
            match action {
                Action::Define { executor, template } => {
                    inner.send(&executor, DriverMessage::DefineJob(template));
                }
                Action::Launch {
                    executor,
                    job,
                    launch,
                } => self.launch(&mut inner, &job, executor, launch),
                Action::Kill {
                    executor,
                    task,
                    attempt,
                    reason,
                } => inner.send(
                    &executor,
                    DriverMessage::KillTask {
                        task,
                        attempt,
                        reason: reason.into(),
                    },
                ),
                Action::Stop { executor } => {
                    tracing::info!(executor = %executor, "decommissioned executor drained; stopping it");
                    inner.send(&executor, DriverMessage::StopExecutor);
                }
                Action::TaskRequeued { job, event } => {
                    self.events.publish(&job, JobEvent::Task(event));
                }
                Action::TaskEnded(task) => self.task_ended(&mut inner, &task),
                Action::JobFinished(job) => {
                    self.job_finished(&mut inner, &job);
                    finished = true;
                }
                Action::Reconciled {
                    task,
                    attempt,
                    executor,
                    dropped,
                } => self.reconciled(task, attempt, executor, dropped),
                Action::Resolve { job, tasks } => {
                    // Off the lock: an input may name a job the store must read.
                    let _ = self.resolver.send((job, tasks));
                }
            }
        }
        for job in inner.state.take_drained() {
            self.archive_job(&mut inner, job);
        }
        inner
            .archive
            .settle(|write| self.jobs.store.is_durable(write));
        drop(inner);
        if finished {
            self.jobs.endings.send_modify(|n| *n += 1);
        }
        result
    }

    fn launch(
        &self,
        inner: &mut Inner,
        job: &JobId,
        executor: ExecutorId,
        launch: Box<TaskLaunch>,
    ) {
        // Made from the launch itself, not the state, which may be further on.
        let event = self.events.is_watched(job).then(|| TaskEvent {
            index: launch.index,
            state: TaskState::Running,
            attempt: launch.attempt,
            executor: Some(executor.clone()),
            error: None,
        });
        inner.send(&executor, DriverMessage::LaunchTask(launch));
        if let Some(event) = event {
            self.events.publish(job, JobEvent::Task(event));
        }
    }

    /// A task's end: told to its watchers, counted, sent to the job store (or held while
    /// its job's record commits), and its input dropped.
    fn task_ended(&self, inner: &mut Inner, task: &TaskId) {
        self.publish_task(&inner.state, task);
        let Some(job) = inner.state.jobs.get_mut(&task.job) else {
            return;
        };
        let count = job.tasks.len() as u32;
        let Some(t) = job.tasks.get_mut(task.index as usize) else {
            return;
        };
        self.metrics.task_ended(t);
        // A memoized task's end is stored with its job's record.
        if !durable::is_memoized(&job.def, task.index) {
            let end = durable::task_end_record(t);
            let key = memo::found(&job.def, task.index, count, t);
            match inner.storing.get_mut(&task.job) {
                Some(held) => held.push((task.index, end, key)),
                None => {
                    self.store_task_end(&task.job, task.index, end, key);
                }
            }
        }
        // Nothing runs an ended task again: its input can go.
        t.input = flint_protocol::TaskInput::Inline(Vec::new());
        t.args = Vec::new();
        t.env = Vec::new();
    }

    /// A job's end: executors told to forget it, its watchers told, its end stored (or
    /// deferred while its record commits), and the job archived once drained.
    fn job_finished(&self, inner: &mut Inner, job: &JobId) {
        for (executor, key) in inner.state.forget_job(job) {
            inner.send(&executor, DriverMessage::ForgetJob { key });
        }
        let Some((summary, end)) = inner.state.jobs.get(job).map(|j| {
            match &j.error {
                Some((kind, message)) => {
                    tracing::warn!(job = %job, state = ?j.state, kind, message, "job ended")
                }
                None => tracing::info!(job = %job, state = ?j.state, "job ended"),
            }
            let summary = durable::job_summary(j);
            let end = durable::job_end_record(j);
            self.publish_end(j);
            (summary, end)
        }) else {
            return;
        };
        inner.finished.add(&summary, 1);
        let write = match inner.storing.contains_key(job) {
            // Its record is still being committed (see `submit_keyed`).
            true => {
                let deferred = Deferred {
                    end,
                    summary,
                    attempts: None,
                };
                inner.deferred.insert(job.clone(), deferred);
                u64::MAX
            }
            false => self.jobs.store.job_ended(job.clone(), end, summary),
        };
        inner.ending.insert(job.clone(), write);
        if let Some(j) = inner.state.retire_job(job) {
            self.archive_job(inner, j);
        }
    }

    /// Takes a drained final job out of the state. Its tasks killed while they ran are
    /// stored now, with their last attempt's times and log (tasks killed before they
    /// started are rebuilt as such from the job's end), so the job reads the same from
    /// the store as it did from memory.
    fn archive_job(&self, inner: &mut Inner, job: Job) {
        let mut last = inner.ending.get(&job.def.id).copied().unwrap_or(0);
        for (index, task) in job.tasks.iter().enumerate() {
            if task.state == TaskState::Killed && task.attempts > 0 {
                let end = durable::task_end_record(task);
                match inner.storing.get_mut(&job.def.id) {
                    Some(held) => held.push((index as u32, end, None)),
                    None => {
                        let write = self.store_task_end(&job.def.id, index as u32, end, None);
                        if last != u64::MAX {
                            last = last.max(write);
                        }
                    }
                }
            }
        }
        let attempts = durable::attempt_records(&job);
        match inner.deferred.get_mut(&job.def.id) {
            Some(deferred) => deferred.attempts = Some(attempts),
            None => last = last.max(self.jobs.store.attempts_ended(job.def.id.clone(), attempts)),
        }
        inner.archive(job, last);
    }

    /// Sends a task's end (and the memo entry it makes, if any) to the job store;
    /// returns the end's write number.
    pub(super) fn store_task_end(
        &self,
        job: &JobId,
        index: u32,
        end: TaskEndRecord,
        memo: Option<Digest>,
    ) -> u64 {
        let write = self.jobs.store.task_ended(job.clone(), index, end);
        if let Some(key) = memo {
            let write = self.jobs.store.memo_found(key, job.clone(), index);
            self.jobs.memo_writes.fetch_max(write, Ordering::Relaxed);
        }
        write
    }

    /// An attempt an executor listed at registration, adopted or dropped: logged,
    /// counted, and told to its job's watchers.
    fn reconciled(
        &self,
        task: TaskId,
        attempt: u32,
        executor: ExecutorId,
        dropped: Option<crate::scheduler::Dropped>,
    ) {
        self.metrics.attempt_reconciled(dropped);
        match dropped {
            None => tracing::info!(%executor, task = %task, attempt, "adopted a running attempt"),
            Some(why) => {
                tracing::info!(%executor, task = %task, attempt, reason = why.as_str(), "dropped an attempt")
            }
        }
        let note = flint_protocol::api::AttemptNote {
            index: task.index,
            attempt,
            executor,
            reason: dropped.map(|why| why.as_str().to_owned()),
        };
        let event = match dropped {
            None => JobEvent::Adopted(note),
            Some(_) => JobEvent::Dropped(note),
        };
        self.events.publish(&task.job, event);
    }

    /// Tells a job's watchers (if any) a task's new state.
    fn publish_task(&self, state: &ClusterState, id: &TaskId) {
        if !self.events.is_watched(&id.job) {
            return;
        }
        if let Some(task) = state
            .jobs
            .get(&id.job)
            .and_then(|j| j.tasks.get(id.index as usize))
        {
            let event = crate::events::task_event(id.index, task);
            self.events.publish(&id.job, JobEvent::Task(event));
        }
    }

    /// Tells a final job's watchers the tasks it killed, then that it ended.
    fn publish_end(&self, job: &crate::scheduler::Job) {
        let id = &job.def.id;
        if !self.events.is_watched(id) {
            return;
        }
        // Tasks killed with their job change state without an action of their own.
        for (index, task) in job.tasks.iter().enumerate() {
            if task.state == TaskState::Killed {
                let event = crate::events::task_event(index as u32, task);
                self.events.publish(id, JobEvent::Task(event));
            }
        }
        let view = crate::views::job_view(job);
        self.events.publish(id, JobEvent::End(Box::new(view)));
    }
}

impl Inner {
    /// The write that stores a job's end, now known.
    pub(super) fn set_end_write(&mut self, job: &JobId, write: u64) {
        match self.ending.get_mut(job) {
            Some(at) => *at = write,
            None => self.archive.set_write(job, write),
        }
    }

    /// A final job out of the scheduler's state, into the finished jobs in memory, once
    /// `last_write` (its end, or later writes of its tasks) is committed.
    fn archive(&mut self, job: Job, last_write: u64) {
        self.ending.remove(&job.def.id);
        self.archive.finished(last_write, archive::strip(job));
    }
}
