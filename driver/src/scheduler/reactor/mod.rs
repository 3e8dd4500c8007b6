//! The scheduler as a reactor (hyperqueue's `tako` server reactor): one function per
//! event, each reading as what happens when that event arrives and returning its
//! [`Action`]s. Steps that several events share are helpers here, not copies: a task goes
//! back to pending only through [`requeue`].
//!
//! | event | function | file |
//! |---|---|---|
//! | an executor registers, beats, is lost, expires, is decommissioned; a cluster manager launched it, lost it, saw it exit | `register_executor`, `heartbeat`, `executor_lost`, `expire_executors`, `decommission_executor`, `stop_drained`, `executor_launched`, `executor_gone`, `executor_exited` | `executor_lifecycle.rs` |
//! | an executor registers again with the attempts it kept; the wait for them after a restart ends | `adopt`, `begin_adopting`, `end_adopting_if_due` | `adoption.rs` |
//! | a job (or a graph's jobs) is submitted, killed or stopped; a final job's last attempt reported | `submit_job`, `submit_jobs`, `kill_job`, `stop_job`, `retire_job`, `take_drained` | `job_lifecycle.rs` |
//! | attempts end (a burst from one executor) | `status_updates`, then per attempt `on_task_ended`, which tells its outcome apart | `task_ended.rs` |
//! | ... and the outcome decides the task | `on_task_succeeded`, `on_result_over_limit`, `on_task_failed` | `task_final.rs` |
//! | ... or puts it back | `on_attempt_withdrawn` (its executor stopped, or it was preempted), `on_task_retried`, `on_task_escalated` | `task_requeued.rs` |
//! | a task or job ends that waiting tasks read; the service made a waiting task's input | `settle_waits` (on every batch of actions), `inputs_ready` | `../waits.rs` |
//! | the service's tick | `tick`: silent executors lost, drained ones stopped, a full round of offers, slow tasks copied | `tick.rs` |
//!
//! Placement itself (a round of offers) is `offers`, which every event that frees cores
//! or adds work ends with.

use super::*;

pub use adoption::{Adopting, Dropped};

mod adoption;
mod executor_lifecycle;
mod job_lifecycle;
mod task_ended;
mod task_final;
mod task_requeued;
mod tick;

#[cfg(test)]
mod tests;

/// One attempt's end, as the function of its outcome needs it.
pub(super) struct End<'a> {
    pub task: &'a TaskId,
    pub executor: &'a ExecutorId,
    /// The driver killed it for another tenant (see `preemption`).
    pub preempted: bool,
    /// Another attempt of the task still runs (a speculative copy): that one, not this
    /// end, decides whether the task runs again.
    pub copy_running: bool,
    /// The wall clock (a job's end time) and the scheduler's (exclusion windows).
    pub now: SystemTime,
    pub clock: Instant,
}

/// Where a task put back to pending waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rejoin {
    /// First of its job, and its job first in the queue: its attempt was taken from it
    /// (its executor lost or stopping, its cores preempted), through no fault of its own.
    Front,
    /// Last: it failed, and runs again behind what has not run yet.
    Back,
}

/// Puts task `index` of `job` back to pending, and its job back in the queue if it had
/// left it: the one way a task goes back. A task that failed on some executor waits
/// among the constrained ones (placed first, never where it is excluded). Returns the
/// event that tells its watchers why.
pub(super) fn requeue(
    queue: &mut VecDeque<JobId>,
    job: &mut Job,
    index: u32,
    rejoin: Rejoin,
    why: ErrorBody,
) -> Action {
    let task = &mut job.tasks[index as usize];
    set_state(&mut job.counts, task, TaskState::Pending);
    job.speculative.retain(|&i| i != index);
    if !task.failed_on.is_empty() {
        job.constrained.push(index);
    } else if rejoin == Rejoin::Front {
        job.pending.push_front(index);
    } else {
        job.pending.push_back(index);
    }
    if !queue.contains(&job.def.id) {
        match rejoin {
            Rejoin::Front => queue.push_front(job.def.id.clone()),
            Rejoin::Back => queue.push_back(job.def.id.clone()),
        }
    }
    Action::TaskRequeued {
        job: job.def.id.clone(),
        event: TaskEvent {
            index,
            state: TaskState::Pending,
            attempt: job.tasks[index as usize].attempts,
            executor: None,
            error: Some(why),
        },
    }
}
