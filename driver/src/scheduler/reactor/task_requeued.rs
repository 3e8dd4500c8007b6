//! The outcomes that put a task back to pending: its attempt was withdrawn (held against
//! nobody), or it failed in a way worth another attempt (a source's or an executor's
//! failure, or a guest out of memory or time when its job escalates), counted against
//! the job's `max_failures`. While a speculative copy still runs, the copy decides
//! instead and nothing is put back.

use super::*;
use crate::scheduler::exclusion::ExclusionConfig;
use flint_protocol::Resources;

/// Its executor withdrew the attempt: stopping (SIGTERM, a pod evicted) or cut off from
/// us, or told to by a preemption. A loss of the host, as if the executor had gone: the
/// task runs again first, and neither the task nor the executor is held to account.
pub(super) fn on_attempt_withdrawn(
    queue: &mut VecDeque<JobId>,
    job: &mut Job,
    end: &End,
    failure: &TaskFailure,
    out: &mut Vec<Action>,
) -> bool {
    if end.copy_running {
        return false;
    }
    let why = match end.preempted {
        true => ErrorBody {
            kind: "preempted".into(),
            message: format!(
                "preempted on executor {}: its cores went to a tenant below its share; the task runs again",
                end.executor
            ),
        },
        false => ErrorBody {
            kind: "executor_stopped".into(),
            message: format!(
                "executor {} stopped the attempt ({}); the task runs again",
                end.executor, failure.message
            ),
        },
    };
    out.push(requeue(queue, job, end.task.index, Rejoin::Front, why));
    true
}

/// A source's or an executor's failure with attempts left: the task runs again, last.
/// A host error also counts against the executor, towards excluding it for the task and
/// then for everything.
pub(super) fn on_task_retried(
    job: &mut Job,
    queue: &mut VecDeque<JobId>,
    executors: &mut BTreeMap<ExecutorId, ExecutorData>,
    exclusion: &ExclusionConfig,
    end: &End,
    failure: TaskFailure,
    out: &mut Vec<Action>,
) -> bool {
    let task = &mut job.tasks[end.task.index as usize];
    task.host_failures += 1;
    let blames_executor = failure.kind.blames_executor();
    task.failure = Some(failure);
    // A source's failure (`fetch_error`: the job's URL answered 500, hashed wrong, ...)
    // costs the job its budget and nothing more: held against the executor, one job
    // naming bad URLs would take executors from every job.
    if blames_executor {
        hold_against_executor(task, executors, exclusion, end);
    }
    if end.copy_running {
        return false;
    }
    let failure = task.failure.as_ref().expect("stored above");
    let why = ErrorBody {
        kind: failure.kind.as_str().into(),
        message: failure.message.clone(),
    };
    out.push(requeue(queue, job, end.task.index, Rejoin::Back, why));
    true
}

/// The guest's own failure, but one a bigger budget may cure: the task runs again, last,
/// with `next`, counted against `max_failures` like a host's failure.
pub(super) fn on_task_escalated(
    job: &mut Job,
    queue: &mut VecDeque<JobId>,
    end: &End,
    failure: TaskFailure,
    next: Resources,
    out: &mut Vec<Action>,
) -> bool {
    let why = ErrorBody {
        kind: failure.kind.as_str().into(),
        message: format!(
            "{}; retrying with {} MiB and {} ms",
            failure.message, next.memory_mb, next.timeout_ms
        ),
    };
    let task = &mut job.tasks[end.task.index as usize];
    task.host_failures += 1;
    task.failure = Some(failure);
    job.budgets.insert(end.task.index, next);
    if end.copy_running {
        return false;
    }
    out.push(requeue(queue, job, end.task.index, Rejoin::Back, why));
    true
}

/// Holds a host error against the executor it happened on: once per failure for the
/// task (excluded there after `task_failures_per_executor`), and in the executor's own
/// record (excluded for a period after failures of distinct tasks within a window).
fn hold_against_executor(
    task: &mut Task,
    executors: &mut BTreeMap<ExecutorId, ExecutorData>,
    exclusion: &ExclusionConfig,
    end: &End,
) {
    // Once excluded for the task it cannot have run here: nothing more to learn.
    if !excluded_for_task(exclusion, &task.failed_on, end.executor) {
        task.failed_on.push(end.executor.clone());
    }
    let executor = executors
        .get_mut(end.executor)
        .expect("the attempt's executor is live");
    if executor
        .health
        .record_failure(exclusion, end.task.clone(), end.clock)
    {
        tracing::warn!(
            executor = %end.executor,
            failures = exclusion.executor_failures,
            window = ?exclusion.window,
            period = ?exclusion.period,
            "executor excluded after repeated host errors"
        );
    }
}
