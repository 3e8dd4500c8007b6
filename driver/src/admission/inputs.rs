//! Task inputs made of earlier results (`result` and `results` in a job spec): checked
//! at submit against the jobs the driver holds, turned into what executors fetch or
//! are handed. Each named task must have succeeded; the sizes are known then, so the
//! limits (`MAX_TASK_INPUT_BYTES`, `MAX_INPUT_PARTS_PER_JOB`, the inline budget) are
//! checked here, before anything runs.

use flint_protocol::api::{ErrorCode, ResultsRef, TaskState};
use flint_protocol::{Digest, FetchRef, InputPart, TaskInput, TaskResult, defaults};

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
    let count = r.tasks.as_ref().map_or(job.tasks.len(), Vec::len);
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
    let all = || 0..job.tasks.len() as u32;
    let indices: Box<dyn Iterator<Item = u32> + '_> = match &r.tasks {
        Some(tasks) => Box::new(tasks.iter().copied()),
        None => Box::new(all()),
    };
    let mut parts = Vec::with_capacity(count);
    let mut total = 0u64;
    for index in indices {
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

/// Task `index`'s result, if it has one to give: 422 `unknown_result` for a task the job
/// does not have, `result_not_ready` for one still to run, `no_result` for one that
/// ended without a result.
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
        (_, state @ (TaskState::Pending | TaskState::Running)) => Err(Rejection::new(
            ErrorCode::ResultNotReady,
            format!(
                "{at}: task {index} of {id} is {} and has no result yet; submit this job once \
                 that one has succeeded",
                state.as_str()
            ),
        )),
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
