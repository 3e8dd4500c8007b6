//! Between the scheduler's state and the job store's records: the one place where
//! in-memory jobs and tasks become records and records become jobs again after a restart.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flint_protocol::api::{JobState, TaskCounts, TaskState};
use flint_protocol::records::{
    AttemptRecord, JobDef, JobEndRecord, JobRecord, JobSummaryRecord, TaskEndRecord,
    TaskInputRecord,
};
use flint_protocol::{JobId, TaskResult};

use crate::scheduler::{Action, AttemptSpan, ClusterState, Job, NewJob, NewTask, Task};
use crate::store::StoredJob;

pub fn job_record(job: &NewJob) -> JobRecord {
    JobRecord {
        def: job.def.clone(),
        tasks: job
            .tasks
            .iter()
            .map(|t| TaskInputRecord {
                input: t.input.clone(),
                args: t.args.clone(),
                env: t.env.clone(),
            })
            .collect(),
    }
}

/// The ends a job's tasks have as it is accepted: its memoized tasks', taken from
/// earlier ones. Stored with its record, so that after a restart they are the memoized
/// copies still, never pending (see `insert_job` in the store).
pub fn accepted_ends(job: &NewJob) -> Vec<(u32, TaskEndRecord)> {
    (job.tasks.iter().enumerate())
        .filter_map(|(index, task)| {
            let result = task.memoized.clone()?;
            let end = TaskEndRecord {
                state: TaskState::Succeeded,
                attempts: 0,
                executor: None,
                failure: None,
                started_at_us: None,
                finished_at_us: None,
                result: Some(result),
                log: Vec::new(),
            };
            Some((index as u32, end))
        })
        .collect()
}

/// Whether task `index` of a job was taken from an earlier task at submission: its end
/// is stored with the job's record (see [`accepted_ends`]), not on its own.
pub fn is_memoized(def: &JobDef, index: u32) -> bool {
    (def.options.memoized)
        .binary_search_by_key(&index, |(task, _, _)| *task)
        .is_ok()
}

pub fn task_end_record(task: &Task) -> TaskEndRecord {
    TaskEndRecord {
        state: task.state,
        attempts: task.attempts,
        executor: task.executor.clone(),
        failure: task.failure.clone(),
        started_at_us: task.started_at_us,
        finished_at_us: task.finished_at_us,
        result: task.result.clone(),
        log: task.log.clone(),
    }
}

pub fn job_end_record(job: &Job) -> JobEndRecord {
    JobEndRecord {
        state: job.state,
        finished_at_ms: job.finished_at.map_or(0, unix_ms),
        error: job.error.clone(),
    }
}

/// What listing the job shows, as of now.
pub fn job_summary(job: &Job) -> JobSummaryRecord {
    JobSummaryRecord {
        name: job.def.name.clone(),
        state: job.state,
        created_at_ms: job.def.created_at_ms,
        finished_at_ms: job.finished_at.map(unix_ms),
        tasks: job.tasks.len() as u32,
        counts: job.counts().into(),
        error: job.error.clone(),
    }
}

/// A job's attempts as the store keeps them.
pub fn attempt_records(job: &Job) -> Vec<AttemptRecord> {
    job.attempts
        .iter()
        .enumerate()
        .map(|(at, s)| AttemptRecord {
            task: s.task,
            attempt: s.attempt,
            executor: job.attempt_executors[s.executor as usize].clone(),
            start_us: s.start_us,
            end_us: s.end_us,
            outcome: s.outcome,
            speculative: s.speculative,
            memory_mb: s.memory_mb,
            timeout_ms: s.timeout_ms,
            usage: s.usage,
            pins: job.pins.get(&(at as u32)).cloned(),
        })
        .collect()
}

/// The attempts read back, as the job held them.
fn restore_attempts(job: &mut Job, records: Vec<AttemptRecord>) {
    job.attempts = Vec::with_capacity(records.len());
    for r in records {
        let executor = match job.attempt_executor_at.get(&r.executor) {
            Some(&at) => at,
            None => {
                let at = job.attempt_executors.len() as u32;
                job.attempt_executor_at.insert(r.executor.clone(), at);
                job.attempt_executors.push(r.executor);
                at
            }
        };
        job.attempts.push(AttemptSpan {
            task: r.task,
            attempt: r.attempt,
            executor,
            speculative: r.speculative,
            start_us: r.start_us,
            end_us: r.end_us,
            outcome: r.outcome,
            memory_mb: r.memory_mb,
            timeout_ms: r.timeout_ms,
            usage: r.usage,
        });
        if let Some(usage) = &r.usage {
            job.usage.get_or_insert_with(Default::default).add(usage);
        }
        if let Some(pins) = r.pins {
            job.pins.insert(job.attempts.len() as u32 - 1, pins);
        }
    }
}

/// A finished job read back from the store, as the API shows it: its tasks' ends and
/// attempts (when stored), no inputs (nothing runs it again).
pub fn finished_job(stored: StoredJob, attempts: Option<Vec<AttemptRecord>>) -> Job {
    let StoredJob { job, tasks, end } = stored;
    let mut state = ClusterState::new(
        0,
        crate::scheduler::SchedulingConfig::default(),
        std::time::Instant::now(),
        SystemTime::now(),
    );
    let id = job.def.id.clone();
    let mut job = job;
    for task in &mut job.tasks {
        task.input = flint_protocol::TaskInput::Inline(Vec::new());
        task.args = Vec::new();
        task.env = Vec::new();
    }
    // A stored job always has an end once it is finished; one without is shown as its
    // tasks leave it (pending ones killed), the way a restart would end it.
    let end = end.unwrap_or(JobEndRecord {
        state: JobState::Killed,
        finished_at_ms: 0,
        error: None,
    });
    state.restore(
        vec![StoredJob {
            job,
            tasks,
            end: Some(end),
        }],
        SystemTime::now(),
    );
    let mut job = state
        .jobs
        .remove(&id)
        .expect("a restored job is in the state");
    if let Some(attempts) = attempts {
        restore_attempts(&mut job, attempts);
    }
    job.note_rebuilt();
    job
}

impl ClusterState {
    /// Rebuilds jobs from the store. Tasks that had ended keep their end; every other
    /// task is pending again (whatever ran it belonged to the previous driver). Returns
    /// the actions for jobs found complete whose end had not been stored yet.
    pub fn restore(&mut self, mut stored: Vec<StoredJob>, now: SystemTime) -> Vec<Action> {
        stored.sort_by_key(|s| s.job.def.created_at_ms);
        let mut actions = Vec::new();
        for StoredJob { job, tasks, end } in stored {
            let id = job.def.id.clone();
            self.insert_job(new_job(job));
            let entry = self.jobs.get_mut(&id).expect("just inserted");
            for (index, record) in tasks {
                let Some(task) = entry.tasks.get_mut(index as usize) else {
                    continue;
                };
                entry.result_bytes += restore_task(task, &mut entry.counts, record);
            }
            entry
                .pending
                .retain(|&i| !entry.tasks[i as usize].state.is_final());
            // A job stored before memoized ends were stored with its record may have
            // lost a memoized task's end in a crash: that task runs, so it is no copy.
            let tasks = &entry.tasks;
            entry.def.options.memoized.retain(|(index, _, _)| {
                tasks
                    .get(*index as usize)
                    .is_some_and(|t| t.state == TaskState::Succeeded && t.attempts == 0)
            });
            // A live job's spans are not stored: its tasks ended so far are shown from
            // their ends.
            entry.note_rebuilt();
            match end {
                Some(end) => {
                    entry.state = end.state;
                    entry.finished_at =
                        Some(UNIX_EPOCH + Duration::from_millis(end.finished_at_ms));
                    entry.error = end.error;
                    entry.kill_pending();
                }
                None if entry.all_final() => {
                    let failed = entry
                        .tasks
                        .iter()
                        .enumerate()
                        .find(|(_, t)| t.state == TaskState::Failed);
                    let (state, reason) = match failed {
                        Some((index, task)) => (
                            JobState::Failed,
                            Some(format!(
                                "task {index} failed: {}",
                                task.failure.as_ref().map_or("", |f| f.message.as_str())
                            )),
                        ),
                        None => (JobState::Succeeded, None),
                    };
                    actions.extend(Self::end_job(entry, state, reason, now));
                }
                None => {
                    let c = entry.counts();
                    if c.succeeded + c.failed + c.killed > 0 {
                        entry.state = JobState::Running;
                    }
                }
            }
            if entry.state.is_final() || entry.pending.is_empty() {
                self.queue.retain(|q| *q != id);
            }
        }
        // Every job is back: waiting tasks are linked to what they wait for, which may
        // have ended before the restart (then they are resolved, or fail, now).
        let waiting: Vec<JobId> = (self.jobs.iter())
            .filter(|(_, j)| j.counts.waiting > 0 && !j.state.is_final())
            .map(|(id, _)| id.clone())
            .collect();
        for id in waiting {
            self.link_waiting(&id, &mut actions);
        }
        actions
    }
}

fn new_job(job: JobRecord) -> NewJob {
    NewJob {
        def: job.def,
        tasks: job
            .tasks
            .into_iter()
            .map(|t| NewTask {
                input: t.input,
                args: t.args,
                env: t.env,
                memoized: None,
            })
            .collect(),
    }
}

/// Returns the size of the task's result.
fn restore_task(task: &mut Task, counts: &mut TaskCounts, record: TaskEndRecord) -> u64 {
    let mut job_result_bytes = 0;
    crate::scheduler::set_state(counts, task, record.state);
    task.attempts = record.attempts;
    task.executor = record.executor;
    task.failure = record.failure;
    task.started_at_us = record.started_at_us;
    task.finished_at_us = record.finished_at_us;
    task.result_digest = record.result.as_ref().map(TaskResult::digest);
    if let Some(result) = &record.result {
        job_result_bytes += result.len();
    }
    task.result = record.result;
    task.log = record.log;
    job_result_bytes
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
