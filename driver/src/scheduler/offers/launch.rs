//! A round's placements carried out: each placed task's attempt starts on its executor
//! (taking a free core there, or a queue slot), its job defined on that executor's
//! connection before its first launch there, and the launch made.

use super::*;
use crate::scheduler::policy::Placement;

impl ClusterState {
    /// Launches what placement decided, in its order; the constrained and speculative
    /// tasks it took leave their lists after.
    pub(super) fn launch(
        &mut self,
        placements: Vec<Placement>,
        ids: &[ExecutorId],
        wall: SystemTime,
        actions: &mut Vec<Action>,
    ) {
        let now = self.now;
        // Constrained tasks are taken out by position, so they go last-first.
        let mut taken: Vec<(usize, usize)> = Vec::new();
        for placement in placements {
            let job_id = self.queue[placement.demand].clone();
            let executor_id = &ids[placement.offer];
            let job = self.jobs.get_mut(&job_id).expect("queued jobs exist");
            let Some(index) = placed_task(job, &placement, &mut taken) else {
                continue;
            };
            let executor = self
                .executors
                .get_mut(executor_id)
                .expect("offers come from executors");
            start_attempt(job, &job_id, index, executor_id, executor, now, wall);
            if executor.defined.insert(job.key) {
                actions.push(Action::Define {
                    executor: executor_id.clone(),
                    template: Box::new(template(job)),
                });
            }
            actions.push(Action::Launch {
                executor: executor_id.clone(),
                job: job_id.clone(),
                launch: Box::new(launch(job, index, executor.generation)),
            });
        }
        taken.sort_unstable_by(|a, b| b.cmp(a));
        for (d, c) in taken {
            let job = self
                .jobs
                .get_mut(&self.queue[d])
                .expect("queued jobs exist");
            if c < job.constrained.len() {
                job.constrained.remove(c);
            } else {
                job.speculative.remove(c - job.constrained.len());
            }
        }
    }
}

/// The task a placement names: the next unconstrained one (taken off the pending
/// list now), or a constrained or speculative one by position (noted in `taken`, to
/// leave its list once the round is over). `None` for a speculative copy of a task
/// that is no longer running: nothing to copy.
fn placed_task(
    job: &mut Job,
    placement: &Placement,
    taken: &mut Vec<(usize, usize)>,
) -> Option<u32> {
    match placement.constrained {
        None => Some(job.pending.pop_front().expect("policy respects counts")),
        Some(c) if c < job.constrained.len() => {
            taken.push((placement.demand, c));
            Some(job.constrained[c])
        }
        Some(c) => {
            taken.push((placement.demand, c));
            let index = job.speculative[c - job.constrained.len()];
            (job.tasks[index as usize].state == TaskState::Running).then_some(index)
        }
    }
}

/// Starts an attempt of task `index` on the executor: it takes a free core there, or
/// a queue slot; the task runs (a running task launched again is a speculative copy),
/// and the attempt's span opens.
fn start_attempt(
    job: &mut Job,
    job_id: &JobId,
    index: u32,
    executor_id: &ExecutorId,
    executor: &mut ExecutorData,
    now: Instant,
    wall: SystemTime,
) {
    executor.take_slot(job.def.resources.cores, job.locality);
    if job.state == JobState::Queued {
        job.state = JobState::Running;
    }
    let task = &mut job.tasks[index as usize];
    let speculative = task.state == TaskState::Running;
    set_state(&mut job.counts, task, TaskState::Running);
    task.attempts += 1;
    task.executor = Some(executor_id.clone());
    let span = job.open_span(index, executor_id, speculative, wall);
    executor.running.insert(
        TaskId {
            job: job_id.clone(),
            index,
        },
        RunningAttempt {
            attempt: job.tasks[index as usize].attempts,
            generation: executor.generation,
            since: now,
            span,
            cores: job.def.resources.cores,
            preempted: false,
        },
    );
}

/// What the job's tasks share, for the executors that run them.
fn template(job: &Job) -> JobTemplate {
    JobTemplate {
        key: job.key,
        job: job.def.id.clone(),
        task_count: job.tasks.len() as u32,
        name: job.def.name.clone(),
        module: job.def.module.clone(),
        files: job.def.files.clone(),
        args: job.def.args.clone(),
        env: job.def.env.clone(),
        resources: job.def.resources,
        determinism: job.def.options.determinism,
        network: job.def.network.clone(),
    }
}

fn launch(job: &Job, index: u32, generation: u64) -> TaskLaunch {
    let task = &job.tasks[index as usize];
    TaskLaunch {
        job: job.key,
        index,
        attempt: task.attempts,
        generation,
        args: task.args.clone(),
        env: task.env.clone(),
        input: task.input.clone(),
        // An escalated retry's budget; the job's goes with the job's template.
        resources: job.budgets.get(&index).copied(),
        pins: pinned(job, index),
    }
}

/// What an earlier attempt of a deterministic task ran, by digest, which every later
/// attempt (a retry, a speculative copy) must run too: a URL without a `sha256` may
/// serve other bytes by then. The first of its attempts that reported pins decides.
fn pinned(job: &Job, index: u32) -> Option<Box<Pins>> {
    if job.pins.is_empty() {
        return None;
    }
    (job.attempts.iter().enumerate())
        .filter(|(_, span)| span.task == index)
        .find_map(|(at, _)| job.pins.get(&(at as u32)))
        .map(|pins| {
            Box::new(Pins {
                module: pins.module,
                files: pins.files.clone(),
                input: pins.input,
                // A later attempt runs on the same bytes but calls the network anew (and
                // records anew): its launch need not carry what the earlier one got.
                egress: Vec::new(),
                egress_tape: None,
            })
        })
}
