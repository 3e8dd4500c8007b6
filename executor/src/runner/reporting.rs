//! How each attempt's end reaches the driver: exactly one end per attempt, handed to
//! the [`EndBuffer`](crate::ends::EndBuffer), which numbers it, sends it (batched) and
//! keeps it until the driver says it is durable. Every path that ends an attempt
//! (killed, failed to prepare, ran) goes through the one `report` here, and a
//! registration lists the attempts held here from here too.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use flint_protocol::{
    FailureKind, HeldAttempt, TaskDescription, TaskEnd, TaskFailure, TaskStatus, Usage,
};

use super::TaskRunner;
use crate::sandbox::RunReport;

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
            egress_denied: Default::default(),
            egress_tape: None,
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
            egress_denied,
            // Stored and pinned by `keep_tape` already.
            egress_tape: _,
        } = report;
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
                // The rest are counted only: an end's size stays bounded however many
                // requests a guest had refused.
                egress_denied: egress_denied.first,
            },
        };
        // A result block or an egress tape that waits on this disk for the driver holds
        // its end back.
        let held_block = crate::ends::held_blocks(&status)
            .filter_map(|id| self.blocks.as_ref().and_then(|b| b.held(id)))
            .reduce(|a, b| a + b);
        // The runner forgets the attempt only once its end is held: a registration
        // lists every attempt as running or ended, never neither.
        self.ends.take(status, held_block, more_queued, |status| {
            self.forget(status);
        });
    }

    /// Reports from the async runtime: the end buffer may make its reporter wait for
    /// room, which must never stop a runtime thread.
    pub(super) async fn report_unrun_async(
        self: &Arc<Self>,
        desc: TaskDescription,
        failure: TaskFailure,
        fetched_bytes: u64,
    ) {
        let runner = self.clone();
        let report = move || runner.report_unrun(desc, failure, fetched_bytes, false);
        let _ = tokio::task::spawn_blocking(report).await;
    }

    /// Every attempt held here, running, waiting, or ended with its end not yet durable
    /// with the driver: what a registration lists. Each is listed once.
    pub fn held_attempts(&self) -> Vec<HeldAttempt> {
        self.ends.held_attempts(|| {
            let attempts = self.lock_attempts();
            let held = attempts.iter().flat_map(|(task, held)| {
                held.iter().map(move |live| HeldAttempt {
                    task: task.clone(),
                    attempt: live.attempt,
                    generation: live.generation,
                    started_at_us: live.started_at_us.load(Ordering::Relaxed),
                    ended: false,
                })
            });
            held.collect()
        })
    }

    fn forget(&self, status: &TaskStatus) {
        let mut attempts = self.lock_attempts();
        if let Some(held) = attempts.get_mut(&status.task) {
            held.retain(|live| {
                (live.attempt, live.generation) != (status.attempt, status.generation)
            });
            if held.is_empty() {
                attempts.remove(&status.task);
            }
        }
    }
}

/// Runs an attempt so that a bug of ours costs that attempt (retried elsewhere), never
/// the task thread and with it every status this thread would have sent.
pub(super) fn caught(run: impl FnOnce() -> RunReport) -> RunReport {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        RunReport {
            outcome: Err(TaskFailure::new(
                FailureKind::HostError,
                format!("the executor failed running the task: {what}"),
            )),
            log: Vec::new(),
            log_truncated: false,
            usage: Usage::default(),
            pins: None,
            egress_denied: Default::default(),
            egress_tape: None,
        }
    })
}

pub(super) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
