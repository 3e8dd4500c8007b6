//! The outcomes that decide a task: it succeeded (the first success wins, and a copy
//! still running is killed), or it failed, its result over the job's limit or its
//! failure past retrying, and its job fails with it.

use super::*;

/// The task's result is taken: the task has succeeded, and a speculative copy of it
/// still running anywhere is killed.
pub(super) fn on_task_succeeded(
    job: &mut Job,
    executors: &BTreeMap<ExecutorId, ExecutorData>,
    config: &SchedulingConfig,
    end: &End,
    result: TaskResult,
    out: &mut Vec<Action>,
) {
    let task = &mut job.tasks[end.task.index as usize];
    job.result_bytes += result.len();
    set_state(&mut job.counts, task, TaskState::Succeeded);
    task.executor = Some(end.executor.clone());
    task.result_digest = Some(result.digest());
    task.result = Some(result);
    task.failure = None;
    job.speculative.retain(|&i| i != end.task.index);
    out.push(Action::TaskEnded(end.task.clone()));
    let copies = config.speculation.is_some().then_some(executors);
    for (other, e) in copies.into_iter().flatten() {
        if let Some(running) = e.running.get(end.task) {
            out.push(Action::Kill {
                executor: other.clone(),
                task: end.task.clone(),
                attempt: running.attempt,
                reason: "another attempt of this task succeeded",
            });
        }
    }
}

/// A success whose result would take the job's results past `max_result_bytes`: the
/// result is not kept, and the task fails as `result_limit`.
pub(super) fn on_result_over_limit(
    job: &mut Job,
    executors: &BTreeMap<ExecutorId, ExecutorData>,
    end: &End,
    result: &TaskResult,
    out: &mut Vec<Action>,
) {
    let task = &mut job.tasks[end.task.index as usize];
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
        end.task.index, failure.kind, failure.message
    );
    task.failure = Some(failure);
    fail_job(job, executors, end, reason, out);
}

/// A failure with no retry left (or one no retry cures): the task fails.
pub(super) fn on_task_failed(
    job: &mut Job,
    executors: &BTreeMap<ExecutorId, ExecutorData>,
    end: &End,
    failure: TaskFailure,
    out: &mut Vec<Action>,
) {
    let task = &mut job.tasks[end.task.index as usize];
    set_state(&mut job.counts, task, TaskState::Failed);
    let reason = format!(
        "task {} failed after {} attempt(s): {}: {}",
        end.task.index, task.attempts, failure.kind, failure.message
    );
    task.failure = Some(failure);
    fail_job(job, executors, end, reason, out);
}

/// The failed task's end is told, and its job fails for `reason`: its pending tasks are
/// killed unrun and its running attempts killed.
fn fail_job(
    job: &mut Job,
    executors: &BTreeMap<ExecutorId, ExecutorData>,
    end: &End,
    reason: String,
    out: &mut Vec<Action>,
) {
    out.push(Action::TaskEnded(end.task.clone()));
    out.extend(ClusterState::end_job(
        job,
        JobState::Failed,
        Some(reason),
        end.now,
    ));
    ClusterState::kill_running_attempts(job, executors, out);
}
