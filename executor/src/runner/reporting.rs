//! How each attempt's end reaches the driver: exactly one status per attempt, sent at
//! once or held briefly and batched. Kept apart from running tasks because the batching
//! has its own thread and its own timing rules, and every path that ends an attempt
//! (killed, failed to prepare, ran) goes through the one `report` here.

use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flint_protocol::{ExecutorMessage, TaskDescription, TaskEnd, TaskFailure, TaskStatus, Usage};

use super::TaskRunner;
use crate::sandbox::RunReport;

/// Status updates held back while task threads have more work queued, so that a burst
/// of short tasks wakes the connection's writer once per batch instead of once per task
/// (that wake-up, a futex call, cost as much as running a no-op task). A status is held
/// at most [`HOLD_FOR`] (the flusher thread sends it then) and never when its thread's
/// queue is empty, so a lone task's status goes out at once.
#[derive(Default)]
pub(super) struct Held {
    statuses: Mutex<Vec<ExecutorMessage>>,
    /// Signalled when the first status is held, to start the flusher's clock.
    first: Condvar,
}

/// The most statuses held before they are sent anyway.
const HOLD_MAX: usize = 64;
/// The longest a status is held.
const HOLD_FOR: Duration = Duration::from_millis(1);

impl TaskRunner {
    /// Reports an attempt that ended before its guest ran (killed while queued, its
    /// module or input not to be had).
    pub(super) fn report_unrun(
        &self,
        desc: TaskDescription,
        failure: TaskFailure,
        fetched_bytes: u64,
        more_queued: bool,
    ) {
        let report = RunReport {
            outcome: Err(failure),
            log: Vec::new(),
            log_truncated: false,
            usage: Usage {
                fetched_bytes,
                ..Usage::default()
            },
            pins: None,
        };
        self.report(desc, 0, report, more_queued)
    }

    pub(super) fn report(
        &self,
        desc: TaskDescription,
        started_at_us: u64,
        report: RunReport,
        more_queued: bool,
    ) {
        let RunReport {
            outcome,
            log,
            log_truncated,
            usage,
            pins,
        } = report;
        {
            let mut attempts = self.lock_attempts();
            if let Some(held) = attempts.get_mut(&desc.task) {
                held.retain(|(a, _)| *a != desc.attempt);
                if held.is_empty() {
                    attempts.remove(&desc.task);
                }
            }
        }
        let finished_at_us = now_us();
        // The sandbox holds a task to the executor's largest memory (see `Sandbox::run`).
        let largest_mb = (self.sandbox.max_memory_bytes() >> 20) as u32;
        let memory_mb = (desc.resources.memory_mb > largest_mb).then_some(largest_mb);
        self.tasks_completed.fetch_add(1, Ordering::Relaxed);
        if let Ok(result) = &outcome {
            self.result_bytes.fetch_add(result.len(), Ordering::Relaxed);
        }
        let status = TaskStatus {
            task: desc.task,
            attempt: desc.attempt,
            generation: desc.generation,
            end: TaskEnd {
                started_at_us: if started_at_us == 0 {
                    finished_at_us
                } else {
                    started_at_us
                },
                finished_at_us,
                outcome,
                log,
                log_truncated,
                usage,
                pins,
                memory_mb,
            },
        };
        let message = ExecutorMessage::StatusUpdate(status);
        let mut held = self
            .held
            .statuses
            .lock()
            .expect("held statuses lock poisoned");
        if more_queued && held.len() < HOLD_MAX {
            held.push(message);
            if held.len() == 1 {
                self.held.first.notify_one();
            }
            return;
        }
        for earlier in held.drain(..) {
            self.send(earlier);
        }
        drop(held);
        self.send(message);
    }

    fn send(&self, message: ExecutorMessage) {
        // A closed channel means the connection is gone and the driver will treat the
        // attempt as lost with this executor; nothing else to do with the status.
        let _ = self.updates.send(message);
    }
}

/// Sends held statuses no later than [`HOLD_FOR`] after the first of them was held. Ends
/// with the runner.
pub(super) fn flush_held(runner: Weak<TaskRunner>) {
    while let Some(runner) = runner.upgrade() {
        let held = runner
            .held
            .statuses
            .lock()
            .expect("held statuses lock poisoned");
        // Wakes now and then to notice that the runner is gone.
        let (held, _) = runner
            .held
            .first
            .wait_timeout_while(held, Duration::from_millis(200), |h| h.is_empty())
            .expect("held statuses lock poisoned");
        if held.is_empty() {
            continue;
        }
        drop(held);
        std::thread::sleep(HOLD_FOR);
        let batch = std::mem::take(
            &mut *runner
                .held
                .statuses
                .lock()
                .expect("held statuses lock poisoned"),
        );
        for message in batch {
            runner.send(message);
        }
    }
}

pub(super) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
