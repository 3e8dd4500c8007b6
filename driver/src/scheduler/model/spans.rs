//! A job's attempts as spans: opened at launch (or adoption), found again, reopened for
//! an attempt taken for lost that came back, and closed with what its executor reported.

use std::time::SystemTime;

use flint_protocol::{ExecutorId, FailureKind, Usage};

use super::{AttemptSpan, Job, Outcome, unix_us};

impl Job {
    /// Records a launch of task `index` on `executor`: its span, whose index the
    /// running attempt keeps.
    pub(crate) fn open_span(
        &mut self,
        index: u32,
        executor: &ExecutorId,
        speculative: bool,
        now: SystemTime,
    ) -> u32 {
        let at = match self.attempt_executor_at.get(executor) {
            Some(&at) => at,
            None => {
                let at = self.attempt_executors.len() as u32;
                self.attempt_executors.push(executor.clone());
                self.attempt_executor_at.insert(executor.clone(), at);
                at
            }
        };
        let task = &self.tasks[index as usize];
        let budget = self.budget(index);
        self.attempts.push(AttemptSpan {
            task: index,
            attempt: task.attempts,
            executor: at,
            speculative,
            start_us: unix_us(now),
            end_us: None,
            outcome: None,
            memory_mb: budget.memory_mb,
            timeout_ms: budget.timeout_ms,
            usage: None,
        });
        (self.attempts.len() - 1) as u32
    }

    /// The span of attempt `attempt` of task `index` on `executor`, if this driver
    /// launched or adopted it.
    pub(crate) fn span_of(&self, index: u32, attempt: u32, executor: &ExecutorId) -> Option<u32> {
        let on = *self.attempt_executor_at.get(executor)?;
        (self.attempts.iter().enumerate())
            .rev()
            .find(|(_, s)| s.task == index && s.attempt == attempt && s.executor == on)
            .map(|(at, _)| at as u32)
    }

    /// Opens a closed span again: an attempt taken for lost came back running.
    pub(crate) fn reopen_span(&mut self, span: u32) {
        if let Some(span) = self.attempts.get_mut(span as usize) {
            span.end_us = None;
            span.outcome = None;
        }
    }

    /// Closes an attempt's span; the executor's own times and usage (when it reported
    /// them) replace the driver's.
    pub(crate) fn close_span(
        &mut self,
        span: u32,
        outcome: Outcome,
        reported: Option<(u64, u64, Usage)>,
        now: SystemTime,
    ) {
        let Some(span) = self.attempts.get_mut(span as usize) else {
            return;
        };
        if span.end_us.is_some() {
            return;
        }
        match reported {
            // A guest that never started (a fetch failed) reports zeros.
            Some((start, end, _)) if start > 0 && end >= start => {
                span.start_us = start;
                span.end_us = Some(end);
            }
            _ => span.end_us = Some(unix_us(now).max(span.start_us)),
        }
        if let Some((_, _, usage)) = reported {
            span.usage = Some(usage);
            self.usage.get_or_insert_with(Usage::default).add(&usage);
        }
        span.outcome = Some(outcome);
    }

    /// Closes every span still open (the job is over and nothing will report them).
    pub(crate) fn close_open_spans(&mut self, now: SystemTime) {
        let end = unix_us(now);
        for span in self.attempts.iter_mut().filter(|s| s.end_us.is_none()) {
            span.end_us = Some(end.max(span.start_us));
            span.outcome = Some(Outcome::Failed(FailureKind::Killed));
        }
    }
}
