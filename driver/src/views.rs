//! What the JSON API shows of the scheduler's state: jobs, tasks and executors as
//! `flint_protocol::api` defines their views. Times are RFC 3339 (UTC); durations are
//! measured from the `now` the caller passes.

use std::time::{Duration, Instant, SystemTime};

use flint_protocol::Usage;
use flint_protocol::api::{
    AttemptView, EgressPinView, ErrorBody, ExecutorView, JobView, MemoSource, PinsView, ResultInfo,
    TaskAttemptView, TaskState, TaskView, TimelineView,
};
use flint_protocol::exit::ProcessExit;
use flint_protocol::records::{JobSummaryRecord, Owner};
use flint_protocol::{ExecutorId, JobId, TaskInput};

use crate::scheduler::exclusion::ExclusionConfig;
use crate::scheduler::{ExecutorData, Job};

/// A job as `GET /v1/jobs/{id}` shows it.
pub fn job_view(job: &Job) -> JobView {
    JobView {
        id: job.def.id.clone(),
        name: job.def.name.clone(),
        state: job.state,
        created_at: rfc3339_ms(job.def.created_at_ms),
        finished_at: job
            .finished_at
            .map(|t| humantime::format_rfc3339_millis(t).to_string()),
        tasks: job.tasks.len() as u32,
        counts: job.counts(),
        error: job.error.as_ref().map(|(kind, message)| ErrorBody {
            kind: kind.clone(),
            message: message.clone(),
        }),
        usage: job.usage,
        seed: job.def.options.determinism.map(|d| d.seed),
        tenant: job.def.owner.tenant.clone(),
        priority: job.def.owner.priority,
        waits_for: waits_for(job),
    }
}

/// The most jobs a view lists as waited for.
const WAITS_FOR_SHOWN: usize = 100;

/// The jobs whose results a job's waiting tasks read, in the order first named (at most
/// [`WAITS_FOR_SHOWN`]).
fn waits_for(job: &Job) -> Vec<JobId> {
    if job.counts().waiting == 0 {
        return Vec::new();
    }
    let mut seen = std::collections::HashSet::new();
    (job.tasks.iter())
        .filter(|t| t.state == TaskState::Waiting)
        .filter_map(|t| match &t.input {
            TaskInput::Upstream(u) => Some(u.job()),
            _ => None,
        })
        .filter(|id| seen.insert(*id))
        .take(WAITS_FOR_SHOWN)
        .cloned()
        .collect()
}

/// A stored job as listed from its summary (a finished job, not read whole).
pub fn summary_view(id: &JobId, summary: &JobSummaryRecord, owner: &Owner) -> JobView {
    JobView {
        id: id.clone(),
        name: summary.name.clone(),
        state: summary.state,
        created_at: rfc3339_ms(summary.created_at_ms),
        finished_at: summary.finished_at_ms.map(rfc3339_ms),
        tasks: summary.tasks,
        counts: summary.counts.into(),
        error: summary.error.as_ref().map(|(kind, message)| ErrorBody {
            kind: kind.clone(),
            message: message.clone(),
        }),
        usage: None,
        seed: None,
        tenant: owner.tenant.clone(),
        priority: owner.priority,
        waits_for: Vec::new(),
    }
}

fn rfc3339_ms(ms: u64) -> String {
    humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Tasks `range` of a job as `GET /v1/jobs/{id}/tasks` lists them, each with its
/// attempts (one pass over the job's attempts for the page).
pub fn task_views(job: &Job, range: std::ops::Range<usize>) -> Vec<TaskView> {
    let mut views: Vec<TaskView> = range.clone().map(|i| task_view(job, i)).collect();
    // A task that ended before a restart while its job ran on has no span: its one known
    // attempt comes from its end, as the timeline shows it.
    let from = job.rebuilt.partition_point(|&i| (i as usize) < range.start);
    for &index in job.rebuilt[from..]
        .iter()
        .take_while(|&&i| range.contains(&(i as usize)))
    {
        let task = &job.tasks[index as usize];
        let budget = job.budget(index);
        views[index as usize - range.start]
            .history
            .push(TaskAttemptView {
                attempt: task.attempts.max(1),
                executor: task
                    .executor
                    .clone()
                    .unwrap_or_else(|| ExecutorId(String::new())),
                memory_mb: budget.memory_mb,
                timeout_ms: budget.timeout_ms,
                outcome: Some(rebuilt_outcome(task)),
                speculative: false,
                usage: None,
                pins: None,
            });
    }
    let spans = job.attempts.iter().enumerate();
    for (at, span) in spans.filter(|(_, s)| range.contains(&(s.task as usize))) {
        let view = &mut views[span.task as usize - range.start];
        if let Some(usage) = &span.usage {
            view.usage.get_or_insert_with(Usage::default).add(usage);
        }
        view.history.push(TaskAttemptView {
            attempt: span.attempt,
            executor: job.attempt_executors[span.executor as usize].clone(),
            memory_mb: span.memory_mb,
            timeout_ms: span.timeout_ms,
            outcome: span.outcome.map(|o| o.as_str().to_owned()),
            speculative: span.speculative,
            usage: span.usage,
            pins: job.pins.get(&(at as u32)).map(|p| PinsView {
                module: p.module.to_string(),
                files: (job.def.files.iter().zip(&p.files))
                    .map(|(f, d)| (f.name.clone(), d.to_string()))
                    .collect(),
                input: p.input.to_string(),
                egress: (p.egress.iter())
                    .map(|pin| EgressPinView {
                        method: pin.method.clone(),
                        url: pin.url.clone(),
                        request_sha256: pin.request_sha256.to_string(),
                        status: pin.status,
                        response: pin.response.to_string(),
                    })
                    .collect(),
            }),
        });
    }
    views
}

/// Task `index` of a job, without its attempts (see [`task_views`]).
fn task_view(job: &Job, index: usize) -> TaskView {
    let task = &job.tasks[index];
    let micros = |us: u64| {
        humantime::format_rfc3339_micros(SystemTime::UNIX_EPOCH + Duration::from_micros(us))
            .to_string()
    };
    TaskView {
        index: index as u32,
        state: task.state,
        attempts: task.attempts,
        executor: task.executor.clone(),
        // A task succeeds only when its guest exits 0 (or returns from `_start`).
        exit_code: match task.state {
            TaskState::Succeeded => Some(0),
            _ => task.failure.as_ref().and_then(|f| f.exit_code),
        },
        error: task.error_body(),
        result: task
            .result
            .as_ref()
            .zip(task.result_digest)
            .map(|(result, digest)| ResultInfo {
                size: result.len(),
                sha256: digest.hex(),
            }),
        started_at: task.started_at_us.map(micros),
        finished_at: task.finished_at_us.map(micros),
        usage: None,
        history: Vec::new(),
        memoized_from: job
            .def
            .options
            .memoized
            .binary_search_by_key(&(index as u32), |(task, _, _)| *task)
            .ok()
            .map(|at| {
                let (_, job, task) = &job.def.options.memoized[at];
                MemoSource {
                    job: job.clone(),
                    task: *task,
                }
            }),
    }
}

/// An executor as `GET /v1/executors` lists it; `log_url` where the driver has its log.
pub fn executor_view(
    id: &ExecutorId,
    e: &ExecutorData,
    exclusion: &ExclusionConfig,
    now: Instant,
    log_url: Option<String>,
) -> ExecutorView {
    ExecutorView {
        id: id.clone(),
        host: e.host.clone(),
        state: e.state,
        cores: e.cores,
        free_cores: e.free_cores,
        running: e.running.len() as u32,
        generation: e.generation,
        last_heartbeat_ms: Some(now.saturating_duration_since(e.last_heartbeat).as_millis() as u64),
        pid: e.pid,
        exit_code: match e.exit {
            Some(ProcessExit::Code(code)) => Some(code),
            _ => None,
        },
        exit_signal: match e.exit {
            Some(ProcessExit::Signal(signal)) => Some(signal),
            _ => None,
        },
        exit_reason: match &e.end_note {
            Some((reason, _)) => Some(reason.clone()),
            None => e.exit.map(|x| x.reason().to_owned()),
        },
        exit_description: match &e.end_note {
            Some((_, description)) => Some(description.clone()),
            None => e.exit.map(ProcessExit::describe),
        },
        cluster_manager: e.launched_by.as_ref().map(|b| b.cluster_manager.to_owned()),
        worker: e.launched_by.as_ref().and_then(|b| b.worker.clone()),
        tasks_finished: e.tasks_finished,
        meters_fuel: e.meters_fuel,
        modules_compiled: e.reported.modules_compiled,
        module_cache_hits: e.reported.module_cache_hits,
        compile_cache_hits: e.reported.compile_cache_hits,
        fetch_hits: e.reported.fetch_hits,
        fetch_misses: e.reported.fetch_misses,
        task_cpu_us: e.reported.task_cpu_us,
        bytes_fetched: e.reported.bytes_fetched,
        result_bytes: e.reported.result_bytes,
        tasks_active: e.reported.running,
        tasks_completed: e.reported.tasks_completed,
        ends_held: e.reported.ends_held,
        ends_memory_bytes: e.reported.ends_memory_bytes,
        ends_disk_bytes: e.reported.ends_disk_bytes,
        ends_peak_memory_bytes: e.reported.ends_peak_memory_bytes,
        ends_peak_disk_bytes: e.reported.ends_peak_disk_bytes,
        ends_waited: e.reported.ends_waited,
        excluded_for_ms: e
            .health
            .excluded_until
            .filter(|until| *until > now)
            .map(|until| (until - now).as_millis() as u64),
        recent_task_failures: e.health.recent_failures(exclusion, now) as u32,
        log_url,
    }
}

/// How a task that ended without a span ended, as its one attempt's outcome.
fn rebuilt_outcome(task: &crate::scheduler::Task) -> String {
    match task.state {
        TaskState::Succeeded => "succeeded".to_owned(),
        _ => (task.failure.as_ref())
            .map_or("killed", |f| f.kind.as_str())
            .to_owned(),
    }
}

/// Attempts a timeline page holds at most.
pub const TIMELINE_PAGE: usize = 100_000;

/// A page of a job's attempts as `GET /v1/jobs/{id}/timeline` shows them: from the
/// `first`, at most `limit`. Tasks that ended without a span (see [`Job::rebuilt`])
/// come first, as one attempt each from their task's times, then the spans in launch
/// order: both only grow at the end, so a cursor taken from a live job stays put.
pub fn timeline_view(job: &Job, now: SystemTime, first: usize, limit: usize) -> TimelineView {
    // Pages are sliced, not skipped through: a late page of a big job costs its own
    // attempts only (this runs under the driver's lock for a live job).
    let rebuilt = &job.rebuilt[first.min(job.rebuilt.len())..];
    let mut attempts: Vec<AttemptView> = rebuilt
        .iter()
        .take(limit)
        .map(|&index| {
            let task = &job.tasks[index as usize];
            AttemptView {
                task: index,
                attempt: task.attempts.max(1),
                executor: task
                    .executor
                    .clone()
                    .unwrap_or_else(|| ExecutorId(String::new())),
                start_us: task.started_at_us.unwrap_or(0),
                end_us: task.finished_at_us,
                outcome: Some(rebuilt_outcome(task)),
                speculative: false,
            }
        })
        .collect();
    let from = first
        .saturating_sub(job.rebuilt.len())
        .min(job.attempts.len());
    let spans = job.attempts[from..]
        .iter()
        .take(limit - attempts.len())
        .map(|s| AttemptView {
            task: s.task,
            attempt: s.attempt,
            executor: job.attempt_executors[s.executor as usize].clone(),
            start_us: s.start_us,
            end_us: s.end_us,
            outcome: s.outcome.map(|o| o.as_str().to_owned()),
            speculative: s.speculative,
        });
    attempts.extend(spans);
    let more = first.saturating_add(attempts.len()) < job.rebuilt.len() + job.attempts.len();
    let next = more.then(|| (first + attempts.len()).to_string());
    let us = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    };
    TimelineView {
        job: job.def.id.clone(),
        now_us: us(now),
        created_us: job.def.created_at_ms.saturating_mul(1000),
        finished_us: job.finished_at.map(us),
        attempts,
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::tests::job;
    use crate::scheduler::{ClusterState, SchedulingConfig, set_state};

    #[test]
    fn a_succeeded_task_exited_0_and_a_pending_one_has_no_exit_code() {
        let mut state = ClusterState::new(
            0,
            SchedulingConfig::default(),
            Instant::now(),
            SystemTime::now(),
        );
        state.insert_job(job("j", 2, 1));
        let j = state.jobs.get_mut(&JobId("j".into())).unwrap();
        set_state(&mut j.counts, &mut j.tasks[0], TaskState::Succeeded);
        assert_eq!(task_view(j, 0).exit_code, Some(0));
        assert_eq!(task_view(j, 1).exit_code, None);
    }

    #[test]
    fn a_timeline_pages_through_tasks_that_ended_without_a_span_then_spans() {
        let mut state = ClusterState::new(
            0,
            SchedulingConfig::default(),
            Instant::now(),
            SystemTime::now(),
        );
        state.insert_job(job("j", 6, 1));
        let j = state.jobs.get_mut(&JobId("j".into())).unwrap();
        // Tasks 2 and 3 ended before a restart (their task records only); 0 and 1 ran
        // after it (spans); 4 and 5 are pending.
        for index in [2, 3] {
            let task = &mut j.tasks[index];
            set_state(&mut j.counts, task, TaskState::Succeeded);
            task.attempts = 2;
            task.executor = Some(ExecutorId("exec-2".into()));
            task.started_at_us = Some(30);
            task.finished_at_us = Some(40);
        }
        j.note_rebuilt();
        let run = |j: &mut Job, index: u32| {
            j.tasks[index as usize].attempts = 1;
            let span = j.open_span(
                index,
                &ExecutorId("exec-1".into()),
                false,
                SystemTime::now(),
            );
            j.close_span(
                span,
                crate::scheduler::Outcome::Succeeded,
                Some((10, 20, Usage::default())),
                SystemTime::now(),
            );
        };
        run(j, 0);
        run(j, 1);
        let page = |j: &Job, first, limit| {
            let v = timeline_view(j, SystemTime::now(), first, limit);
            let got: Vec<(u32, u32, String)> = v
                .attempts
                .iter()
                .map(|a| (a.task, a.attempt, a.executor.0.clone()))
                .collect();
            (got, v.next)
        };
        let e = |t: u32, a: u32, x: &str| (t, a, x.to_owned());
        assert_eq!(
            page(j, 0, 3),
            (
                vec![e(2, 2, "exec-2"), e(3, 2, "exec-2"), e(0, 1, "exec-1")],
                Some("3".into())
            )
        );
        assert_eq!(page(j, 3, 3), (vec![e(1, 1, "exec-1")], None));
        assert_eq!(
            page(j, 0, 2),
            (vec![e(2, 2, "exec-2"), e(3, 2, "exec-2")], Some("2".into()))
        );
        assert_eq!(page(j, 2, 1), (vec![e(0, 1, "exec-1")], Some("3".into())));
        assert_eq!(page(j, usize::MAX, 10), (vec![], None));
        // Attempts launched while a client pages: the cursor it holds still points at
        // the next one, nothing skipped or sent twice.
        let (_, next) = page(j, 0, 3);
        run(j, 4);
        run(j, 5);
        let after: usize = next.unwrap().parse().unwrap();
        assert_eq!(
            page(j, after, 10),
            (
                vec![e(1, 1, "exec-1"), e(4, 1, "exec-1"), e(5, 1, "exec-1")],
                None
            )
        );
        let all = timeline_view(j, SystemTime::now(), 0, 10);
        assert_eq!(
            (all.attempts[0].start_us, all.attempts[0].end_us),
            (30, Some(40))
        );
        assert_eq!(all.attempts[0].outcome.as_deref(), Some("succeeded"));
        assert_eq!(
            (all.attempts[2].start_us, all.attempts[2].end_us),
            (10, Some(20))
        );
    }
}
