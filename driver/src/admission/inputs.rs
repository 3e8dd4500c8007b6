//! Task inputs made of earlier results (`result` and `results` in a job spec): checked
//! at submit against the jobs the driver holds, turned into what executors fetch or
//! are handed. Where every named task has succeeded the sizes are known, so the limits
//! (`MAX_TASK_INPUT_BYTES`, `MAX_INPUT_PARTS_PER_JOB`, the inline budget) are checked
//! here, before anything runs. Where some are still to come the task waits
//! ([`TaskInput::Upstream`]), and the same functions make its input once they are
//! there ([`resolve`]); a named task that ended without a result refuses the spec.

use flint_protocol::api::{ErrorCode, ResultsRef, TaskState};
use flint_protocol::{
    Digest, FetchRef, InputPart, JobId, TaskInput, TaskResult, Upstream, defaults,
};

use super::{Catalog, Rejection};
use crate::scheduler::Job;

/// What a job's `results` inputs may still take, counted down as they are decoded.
pub(crate) struct InputBudget {
    /// Results they may name.
    pub parts_left: usize,
    /// Bytes of inline results they may copy (into the job store, and into launches);
    /// the rest the executors fetch.
    pub inline_left: u64,
}

/// A `results` input: the chosen results one after the other, as the parts of one input.
/// Inline results travel in the launch while the job's inline budget lasts; the rest the
/// executor fetches, so neither the job store nor a launch frame grows with the job
/// being reduced.
pub(crate) fn results_input(
    catalog: &impl Catalog,
    job: &Job,
    r: &ResultsRef,
    at: &str,
    budget: &mut InputBudget,
) -> Result<TaskInput, Rejection> {
    let tasks = job.tasks.len() as u32;
    let count = count_parts(r, tasks, at, budget)?;
    let indices = || named_tasks(r, tasks);
    // Results still to come make a waiting task; one that never will refuses the spec.
    let mut coming = false;
    for index in indices() {
        match ready_result(job, index, at) {
            Ok(_) => {}
            Err(e) if e.code == ErrorCode::ResultNotReady => coming = true,
            Err(e) => return Err(e),
        }
    }
    if coming {
        return Ok(TaskInput::Upstream(Box::new(Upstream::Results {
            job: r.job.clone(),
            tasks: r.tasks.clone(),
        })));
    }
    let mut parts = Vec::with_capacity(count);
    let mut total = 0u64;
    for index in indices() {
        let result = ready_result(job, index, at)?;
        total += result.len();
        if total > defaults::MAX_TASK_INPUT_BYTES {
            return Err(Rejection::new(
                ErrorCode::InputTooLarge,
                format!(
                    "{at}: the results of {} come to more than {} bytes by task {index}, the \
                     limit of one task's input (MAX_TASK_INPUT_BYTES); split the reduce \
                     over several tasks with `results.tasks`",
                    r.job,
                    defaults::MAX_TASK_INPUT_BYTES
                ),
            ));
        }
        parts.push(match result {
            TaskResult::Inline(bytes) if bytes.len() as u64 <= budget.inline_left => {
                budget.inline_left -= bytes.len() as u64;
                InputPart::Inline(bytes.clone())
            }
            TaskResult::Inline(bytes) => InputPart::Fetch(FetchRef {
                url: format!(
                    "{}/v1/jobs/{}/tasks/{index}/result",
                    catalog.http_base(),
                    r.job
                ),
                // A succeeded task's result never changes; and the driver made this ref.
                timestamp_ms: FetchRef::DRIVER_MADE,
                digest: Some(
                    job.tasks[index as usize]
                        .result_digest
                        .unwrap_or_else(|| Digest::of(bytes)),
                ),
            }),
            TaskResult::Block(block) => InputPart::Fetch(block_fetch(catalog, block)),
        });
    }
    Ok(TaskInput::Parts(parts))
}

/// The tasks a `results` input names, in its order: `tasks`, or all `count` of them.
fn named_tasks(r: &ResultsRef, count: u32) -> Box<dyn Iterator<Item = u32> + '_> {
    match &r.tasks {
        Some(tasks) => Box::new(tasks.iter().copied()),
        None => Box::new(0..count),
    }
}

/// A `results` input naming a job of the same graph, which is not stored yet: its
/// tasks are checked against the job's `count`, and the task waits for them.
pub(crate) fn coming_results(
    r: &ResultsRef,
    count: u32,
    at: &str,
    budget: &mut InputBudget,
) -> Result<TaskInput, Rejection> {
    count_parts(r, count, at, budget)?;
    if let Some(index) = r.tasks.iter().flatten().find(|&&i| i >= count) {
        return Err(past_the_count(at, &r.job, *index, count));
    }
    Ok(TaskInput::Upstream(Box::new(Upstream::Results {
        job: r.job.clone(),
        tasks: r.tasks.clone(),
    })))
}

/// A `result` input naming task `index` of a job of the same graph (see
/// [`coming_results`]).
pub(crate) fn coming_result(
    job: &JobId,
    index: u32,
    count: u32,
    at: &str,
) -> Result<TaskInput, Rejection> {
    if index >= count {
        return Err(past_the_count(at, job, index, count));
    }
    Ok(TaskInput::Upstream(Box::new(Upstream::Result {
        job: job.clone(),
        task: index,
    })))
}

fn past_the_count(at: &str, job: &JobId, index: u32, count: u32) -> Rejection {
    Rejection::new(
        ErrorCode::UnknownResult,
        format!("{at}: job {job} has no task {index} (it has {count})"),
    )
}

/// How many results a `results` input names, taken from the job's budget of parts.
fn count_parts(
    r: &ResultsRef,
    tasks: u32,
    at: &str,
    budget: &mut InputBudget,
) -> Result<usize, Rejection> {
    let count = r.tasks.as_ref().map_or(tasks as usize, Vec::len);
    if count == 0 {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!("{at}: `results.tasks` is empty; leave it out for every task of the job"),
        ));
    }
    if count > budget.parts_left {
        return Err(Rejection::new(
            ErrorCode::TooManyInputParts,
            format!(
                "{at}: the job's `results` inputs name more than {} results together \
                 (MAX_INPUT_PARTS_PER_JOB); reduce in stages",
                defaults::MAX_INPUT_PARTS_PER_JOB
            ),
        ));
    }
    budget.parts_left -= count;
    Ok(count)
}

/// Task `index`'s result, if it has one to give: 422 `unknown_result` for a task the job
/// does not have, `result_not_ready` for one still to run (a task naming it waits for
/// it), `no_result` for one that ended without a result.
pub(crate) fn ready_result<'j>(
    job: &'j Job,
    index: u32,
    at: &str,
) -> Result<&'j TaskResult, Rejection> {
    let id = &job.def.id;
    let task = job.tasks.get(index as usize).ok_or_else(|| {
        Rejection::new(
            ErrorCode::UnknownResult,
            format!("{at}: job {id} has no task {index}"),
        )
    })?;
    match (&task.result, task.state) {
        (Some(result), TaskState::Succeeded) => Ok(result),
        (_, state @ (TaskState::Waiting | TaskState::Pending | TaskState::Running)) => {
            Err(Rejection::new(
                ErrorCode::ResultNotReady,
                format!(
                    "{at}: task {index} of {id} is {} and has no result yet",
                    state.as_str()
                ),
            ))
        }
        (_, state) => Err(Rejection::new(
            ErrorCode::NoResult,
            format!(
                "{at}: task {index} of {id} is {} and has no result (job {id} is {})",
                state.as_str(),
                job.state.as_str()
            ),
        )),
    }
}

/// Where an executor reads a result kept in the block store.
pub(crate) fn block_fetch(catalog: &impl Catalog, block: &flint_protocol::BlockRef) -> FetchRef {
    FetchRef {
        url: catalog.block_url(&block.id),
        // A block never changes under its id; and the driver made this ref.
        timestamp_ms: FetchRef::DRIVER_MADE,
        digest: Some(block.digest),
    }
}
