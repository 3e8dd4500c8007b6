//! A spec's tasks: one per entry of `inputs`, or each as `tasks` gives it (its own
//! input, args and env), every input decoded into what an executor fetches or is handed
//! inline. Inputs made of earlier results share one budget per job ([`InputBudget`]).

use base64::Engine as _;
use flint_protocol::api::{ErrorCode, InputSpec, ResultRef, ResultsRef, TaskSpec};
use flint_protocol::{FetchRef, JobId, TaskInput, TaskResult, Upstream, defaults};

use super::inputs::{
    InputBudget, block_fetch, coming_result, coming_results, ready_result, results_input,
};
use super::sources::{check_url, parse_sha256};
use super::{Catalog, Rejection, guest_env};
use crate::scheduler::NewTask;

/// The job's tasks, from `inputs` or `tasks` (one of them, and at least one task, at
/// most [`defaults::MAX_TASKS_PER_JOB`]).
pub(super) fn of(
    catalog: &impl Catalog,
    inputs: Option<Vec<InputSpec>>,
    tasks: Option<Vec<TaskSpec>>,
) -> Result<Vec<NewTask>, Rejection> {
    let mut budget = InputBudget {
        parts_left: defaults::MAX_INPUT_PARTS_PER_JOB,
        inline_left: defaults::INLINE_INPUT_PART_BYTES,
    };
    let mut decode = |input, at: &str| decode_input(catalog, input, at, &mut budget);
    let tasks: Vec<NewTask> = match (inputs, tasks) {
        (Some(_), Some(_)) => {
            return Err(Rejection::new(
                ErrorCode::InvalidSpec,
                "give either `inputs` or `tasks`, not both",
            ));
        }
        (None, None) => Vec::new(),
        (Some(inputs), None) => inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                Ok(NewTask {
                    input: decode(input, &format!("inputs[{i}]"))?,
                    args: Vec::new(),
                    env: Vec::new(),
                    memoized: None,
                })
            })
            .collect::<Result<_, Rejection>>()?,
        (None, Some(tasks)) => tasks
            .into_iter()
            .enumerate()
            .map(|(i, task)| {
                guest_env::check_args(format_args!("tasks[{i}].args"), &task.args)?;
                guest_env::check_env(format_args!("tasks[{i}].env"), &task.env)?;
                let input = match task.input {
                    Some(input) => decode(input, &format!("tasks[{i}].input"))?,
                    None => TaskInput::Inline(Vec::new()),
                };
                Ok(NewTask {
                    input,
                    args: task.args,
                    env: task.env.into_iter().collect(),
                    memoized: None,
                })
            })
            .collect::<Result<_, Rejection>>()?,
    };
    if tasks.is_empty() {
        return Err(Rejection::new(
            ErrorCode::NoTasks,
            "a job needs at least one task: give a non-empty `inputs` or `tasks`",
        ));
    }
    if tasks.len() > defaults::MAX_TASKS_PER_JOB {
        return Err(Rejection::new(
            ErrorCode::TooManyTasks,
            format!(
                "{} tasks; a job may have at most {}",
                tasks.len(),
                defaults::MAX_TASKS_PER_JOB
            ),
        ));
    }
    Ok(tasks)
}

/// One input as the executor gets it: inline bytes, or what to fetch; `at` names it in a
/// refusal.
pub(crate) fn decode_input(
    catalog: &impl Catalog,
    input: InputSpec,
    at: &str,
    budget: &mut InputBudget,
) -> Result<TaskInput, Rejection> {
    match input {
        InputSpec::Text(text) => Ok(TaskInput::Inline(text.into_bytes())),
        InputSpec::Base64(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map(TaskInput::Inline)
            .map_err(|e| {
                Rejection::new(ErrorCode::InvalidSpec, format!("{at}: invalid base64: {e}"))
            }),
        InputSpec::Url { url, sha256 } => {
            check_url(&url, at)?;
            Ok(TaskInput::Fetch(Box::new(FetchRef {
                digest: parse_sha256(sha256.as_deref(), at)?,
                timestamp_ms: catalog.url_timestamp(&url, None),
                url,
            })))
        }
        InputSpec::Result(r) => {
            if let Some(count) = catalog.coming(&r.job) {
                return coming_result(&r.job, r.task, count, at);
            }
            catalog
                .job(&r.job, |job| {
                    Ok(match ready_result(job, r.task, at) {
                        Ok(TaskResult::Inline(bytes)) => TaskInput::Inline(bytes.clone()),
                        Ok(TaskResult::Block(block)) => {
                            TaskInput::Fetch(Box::new(block_fetch(catalog, block)))
                        }
                        // Still to run: the task waits for it.
                        Err(e) if e.code == ErrorCode::ResultNotReady => {
                            TaskInput::Upstream(Box::new(Upstream::Result {
                                job: r.job.clone(),
                                task: r.task,
                            }))
                        }
                        Err(e) => return Err(e),
                    })
                })?
                .unwrap_or_else(|| Err(unknown_result(at, &r.job)))
        }
        InputSpec::Results(r) => {
            if let Some(count) = catalog.coming(&r.job) {
                return coming_results(&r, count, at, budget);
            }
            catalog
                .job(&r.job, |job| results_input(catalog, job, &r, at, budget))?
                .unwrap_or_else(|| Err(unknown_result(at, &r.job)))
        }
    }
}

/// The input of a waiting task whose named results have all succeeded, made as it
/// would have been had they been there at submit. Results that are still not there (a
/// job read back after a restart that has them running again) or never will be are a
/// refusal, which fails the task.
pub(crate) fn resolve(
    catalog: &impl Catalog,
    upstream: &Upstream,
    at: &str,
    budget: &mut InputBudget,
) -> Result<TaskInput, Rejection> {
    let spec = match upstream {
        Upstream::Result { job, task } => InputSpec::Result(ResultRef {
            job: job.clone(),
            task: *task,
        }),
        Upstream::Results { job, tasks } => InputSpec::Results(ResultsRef {
            job: job.clone(),
            tasks: tasks.clone(),
        }),
    };
    match decode_input(catalog, spec, at, budget)? {
        TaskInput::Upstream(u) => Err(Rejection::new(
            ErrorCode::ResultNotReady,
            format!("{at}: the results of {} are not all there", u.job()),
        )),
        input => Ok(input),
    }
}

/// A `result`/`results` input naming a job the driver does not hold (never submitted,
/// or deleted).
fn unknown_result(at: &str, job: &JobId) -> Rejection {
    Rejection::new(ErrorCode::UnknownResult, format!("{at}: no job {job}"))
}
