//! Making the inputs of waiting tasks once the results they name are there
//! ([`Action::Resolve`](crate::scheduler::Action::Resolve)): on a thread of its own,
//! off the state's lock, since a named job that has ended is read from the job store.
//! The inputs are made by admission's own functions, as they would have been had the
//! results been there at submit, and handed to the scheduler, which makes the tasks
//! pending.

use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Weak};

use flint_protocol::api::{ErrorCode, TaskState};
use flint_protocol::records::JobDef;
use flint_protocol::{FailureKind, JobId, TaskFailure, TaskInput, Upstream, defaults};

use super::Driver;
use crate::admission::inputs::InputBudget;
use crate::admission::{self, Rejection};
use crate::scheduler::{Resolved, memo};

/// Starts the thread that serves `requests` for as long as the driver lives.
pub(super) fn start(
    driver: &Arc<Driver>,
    requests: Receiver<(JobId, Vec<u32>)>,
) -> std::io::Result<()> {
    let driver: Weak<Driver> = Arc::downgrade(driver);
    std::thread::Builder::new()
        .name("flint-resolver".into())
        .spawn(move || {
            while let Ok((job, tasks)) = requests.recv() {
                let Some(driver) = driver.upgrade() else {
                    return;
                };
                // A bug here must not leave tasks waiting forever, nor stop the thread
                // that every later waiting task needs: the tasks fail, and it goes on.
                let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    driver.resolve_waiting(&job, &tasks)
                }));
                if made.is_err() {
                    tracing::error!(job = %job, "making waiting tasks' inputs panicked; they fail");
                    let failed = (tasks.iter())
                        .map(|&index| {
                            let failure = TaskFailure::new(
                                FailureKind::HostError,
                                "not run: the driver failed making this task's input (a bug: see its log)",
                            );
                            (index, Resolved::Failed(failure))
                        })
                        .collect();
                    driver.apply(|s| ((), s.inputs_ready(&job, failed)));
                }
            }
        })?;
    Ok(())
}

/// A waiting task as the resolver reads it, under the lock.
struct Waiting {
    index: u32,
    upstream: Upstream,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Driver {
    /// Makes the inputs of `tasks` of `job`, which wait for results that are all there
    /// now, and hands them to the scheduler. A memoized job's task is looked up by its
    /// key, which is known now: one with an entry takes its result and never runs.
    fn resolve_waiting(&self, job: &JobId, tasks: &[u32]) {
        let Some((def, count, waiting)) = self.read(|s| {
            let j = s.jobs.get(job)?;
            let waiting: Vec<Waiting> = (tasks.iter())
                .filter_map(|&index| {
                    let task = j.tasks.get(index as usize)?;
                    match (&task.state, &task.input) {
                        (TaskState::Waiting, TaskInput::Upstream(u)) => Some(Waiting {
                            index,
                            upstream: (**u).clone(),
                            args: task.args.clone(),
                            env: task.env.clone(),
                        }),
                        _ => None,
                    }
                })
                .collect();
            let def = j.def.options.memoize.then(|| j.def.clone());
            Some((def, j.tasks.len() as u32, waiting))
        }) else {
            return;
        };
        if waiting.is_empty() {
            return;
        }
        // The parts were counted against the job's budget at submit; the inline bytes
        // copied are bounded per batch, the rest fetched by the executors.
        let mut budget = InputBudget {
            parts_left: usize::MAX,
            inline_left: defaults::INLINE_INPUT_PART_BYTES,
        };
        let resolved = (waiting.into_iter())
            .map(|w| {
                let at = format!("task {}'s input", w.index);
                let resolved = match admission::resolve(self, &w.upstream, &at, &mut budget) {
                    Ok(input) => match &def {
                        Some(def) => self.memoized(def, count, &w, input),
                        None => Resolved::Input(input),
                    },
                    Err(rejection) => Resolved::Failed(failure_of(rejection)),
                };
                (w.index, resolved)
            })
            .collect();
        self.apply(|s| ((), s.inputs_ready(job, resolved)));
    }

    /// A memoized job's task with its input made: its memoized result if its key has
    /// an entry, else the input to run with. A key that cannot be made (an input by URL
    /// without its digest cannot reach here: results always have one) runs the task.
    fn memoized(&self, def: &JobDef, count: u32, w: &Waiting, input: TaskInput) -> Resolved {
        let Ok(key) = memo::key(def, w.index, count, &input, &w.args, &w.env) else {
            return Resolved::Input(input);
        };
        if !self
            .jobs
            .store
            .is_durable(self.jobs.memo_writes.load(Ordering::Relaxed))
        {
            self.jobs.store.flush();
        }
        match self.memo_lookup(&key, &def.owner.tenant) {
            Ok(Some((result, _, _))) => Resolved::Memoized { input, result },
            // An entry that cannot be read runs the task: a result computed again.
            Ok(None) | Err(_) => Resolved::Input(input),
        }
    }
}

/// Why a waiting task's input could not be made, as the task's failure.
fn failure_of(rejection: Rejection) -> TaskFailure {
    let kind = match rejection.code {
        ErrorCode::InputTooLarge | ErrorCode::TooManyInputParts => FailureKind::InputTooLarge,
        _ => FailureKind::UpstreamFailed,
    };
    TaskFailure::new(kind, format!("not run: {}", rejection.message))
}
