//! The reactor's own tests: each event's or outcome's function called directly, with a
//! state set up by hand and its actions and changes looked at. The scheduler's tests
//! (`scheduler::tests`) drive the same rules through whole reports.

use std::time::{Instant, SystemTime};

use flint_protocol::records::Escalation;
use flint_protocol::{Resources, TaskFailure};

use super::End;
use super::task_ended::{Verdict, verdict};
use super::task_final::{on_result_over_limit, on_task_failed, on_task_succeeded};
use super::task_requeued::{on_attempt_withdrawn, on_task_escalated, on_task_retried};
use super::*;
use crate::scheduler::fair_share::Shares;
use crate::scheduler::speculation::SpeculationConfig;
use crate::scheduler::tests::job;

fn exec(n: u32) -> ExecutorId {
    ExecutorId(format!("exec-{n}"))
}

fn task(index: u32) -> TaskId {
    TaskId {
        job: JobId("j".into()),
        index,
    }
}

/// `executors` one-core executors and job `j` of `tasks` tasks (at most three
/// failures), its first tasks launched on them.
fn launched(executors: u32, tasks: usize, config: SchedulingConfig) -> ClusterState {
    let mut state = ClusterState::new(0, config, Instant::now(), SystemTime::UNIX_EPOCH);
    for n in 1..=executors {
        state
            .register_executor(exec(n), "h".into(), 1, n, false, Vec::new())
            .expect("a new id");
    }
    state.submit_job(job("j", tasks, 1));
    state
}

fn plain() -> SchedulingConfig {
    SchedulingConfig {
        launch_ahead: 0,
        launch_ahead_max: 0,
        ..SchedulingConfig::default()
    }
}

/// Takes task `index`'s attempt off `executor`, as an end does before its outcome.
fn take(state: &mut ClusterState, executor: u32, index: u32) {
    let e = state
        .executors
        .get_mut(&exec(executor))
        .expect("registered");
    e.running.remove(&task(index)).expect("running there");
    e.free_cores += 1;
}

fn end<'a>(task: &'a TaskId, executor: &'a ExecutorId) -> End<'a> {
    End {
        task,
        executor,
        preempted: false,
        copy_running: false,
        now: SystemTime::UNIX_EPOCH,
        clock: Instant::now(),
    }
}

fn failure(kind: FailureKind) -> TaskFailure {
    TaskFailure::new(kind, "it broke")
}

/// The kinds of the requeue events among `actions`, in order.
fn requeued(actions: &[Action]) -> Vec<(u32, String)> {
    (actions.iter())
        .filter_map(|a| match a {
            Action::TaskRequeued { event, .. } => {
                Some((event.index, event.error.as_ref()?.kind.clone()))
            }
            _ => None,
        })
        .collect()
}

fn kills(actions: &[Action]) -> Vec<(ExecutorId, u32)> {
    (actions.iter())
        .filter_map(|a| match a {
            Action::Kill { executor, task, .. } => Some((executor.clone(), task.index)),
            _ => None,
        })
        .collect()
}

fn the_job(state: &ClusterState) -> &Job {
    &state.jobs[&JobId("j".into())]
}

#[test]
fn requeue_puts_a_task_back_once_and_its_job_in_the_queue_where_it_rejoins() {
    let mut state = launched(2, 2, plain());
    state.queue.clear();
    let why = || ErrorBody {
        kind: "k".into(),
        message: String::new(),
    };
    let job = state.jobs.get_mut(&JobId("j".into())).expect("submitted");
    let action = requeue(&mut state.queue, job, 1, Rejoin::Back, why());
    assert_eq!(requeued(&[action]), [(1, "k".to_owned())]);
    requeue(&mut state.queue, job, 0, Rejoin::Front, why());
    assert_eq!(job.pending, [0, 1], "a taken attempt runs again first");
    assert_eq!(job.counts.pending, 2);
    assert_eq!(state.queue, [JobId("j".into())], "the job queued once");

    // A task that failed on an executor waits among the constrained ones.
    let mut state = launched(1, 1, plain());
    let job = state.jobs.get_mut(&JobId("j".into())).expect("submitted");
    job.tasks[0].failed_on.push(exec(1));
    requeue(&mut state.queue, job, 0, Rejoin::Back, why());
    assert_eq!(
        (job.constrained.as_slice(), job.pending.len()),
        (&[0][..], 0)
    );
}

#[test]
fn a_failed_attempt_with_retries_left_requeues_once_and_counts() {
    let mut state = launched(1, 1, plain());
    take(&mut state, 1, 0);
    let failed = failure(FailureKind::HostError);
    let job = the_job(&state);
    assert_eq!(
        verdict(job, 0, Err(failed.clone()), 0, &Shares::default()),
        Verdict::Retried(failed.clone())
    );
    let (t, e) = (task(0), exec(1));
    let mut out = Vec::new();
    let ClusterState {
        jobs,
        queue,
        executors,
        config,
        ..
    } = &mut state;
    let job = jobs.get_mut(&t.job).expect("submitted");
    let put_back = on_task_retried(
        job,
        queue,
        executors,
        &config.exclusion,
        &end(&t, &e),
        failed,
        &mut out,
    );
    assert!(put_back);
    assert_eq!(requeued(&out), [(0, "host_error".to_owned())]);
    assert_eq!(out.len(), 1, "nothing but the requeue: {out:?}");
    let task = &the_job(&state).tasks[0];
    assert_eq!((task.state, task.host_failures), (TaskState::Pending, 1));
    assert_eq!(task.failed_on, [exec(1)], "a host error is held against it");
}

#[test]
fn a_failed_attempt_with_escalation_requeues_with_the_escalated_budget() {
    let mut state = ClusterState::new(0, plain(), Instant::now(), SystemTime::UNIX_EPOCH);
    state
        .register_executor(exec(1), "h".into(), 1, 1, false, Vec::new())
        .expect("a new id");
    let mut escalating = job("j", 1, 1);
    escalating.def.resources.memory_mb = 128;
    escalating.def.options.escalate = Some(Escalation {
        memory: 2.0,
        timeout: 1.0,
        max_memory_mb: 1024,
        max_timeout_ms: 1_000,
    });
    state.submit_job(escalating);
    take(&mut state, 1, 0);
    let failed = failure(FailureKind::MemoryLimit);
    let shares = Shares::default();
    let Verdict::Escalated(_, next) = verdict(the_job(&state), 0, Err(failed.clone()), 0, &shares)
    else {
        panic!("out of memory with escalation is escalated");
    };
    assert_eq!(next.memory_mb, 256);
    let (t, e) = (task(0), exec(1));
    let mut out = Vec::new();
    let job = state.jobs.get_mut(&t.job).expect("submitted");
    assert!(on_task_escalated(
        job,
        &mut state.queue,
        &end(&t, &e),
        failed,
        next,
        &mut out
    ));
    assert_eq!(requeued(&out), [(0, "memory_limit".to_owned())]);
    let job = the_job(&state);
    assert_eq!(job.budgets.get(&0), Some(&next));
    assert_eq!(job.tasks[0].host_failures, 1);
    // The next round launches it with that budget.
    let actions = state.make_offers();
    let budgets: Vec<Option<Resources>> = (actions.iter())
        .filter_map(|a| match a {
            Action::Launch { launch, .. } => Some(launch.resources),
            _ => None,
        })
        .collect();
    assert_eq!(budgets, [Some(next)]);
}

#[test]
fn the_last_failure_fails_the_job_and_kills_its_running_attempts() {
    let mut state = launched(2, 3, plain());
    state
        .jobs
        .get_mut(&JobId("j".into()))
        .expect("submitted")
        .tasks[0]
        .host_failures = 2;
    take(&mut state, 1, 0);
    let failed = failure(FailureKind::HostError);
    assert_eq!(
        verdict(
            the_job(&state),
            0,
            Err(failed.clone()),
            0,
            &Shares::default()
        ),
        Verdict::Failed(failed.clone()),
        "max_failures (3) spent: no retry"
    );
    let (t, e) = (task(0), exec(1));
    let mut out = Vec::new();
    let job = state.jobs.get_mut(&t.job).expect("submitted");
    on_task_failed(job, &state.executors, &end(&t, &e), failed, &mut out);
    assert!(matches!(&out[0], Action::TaskEnded(ended) if *ended == t));
    assert!(matches!(&out[1], Action::JobFinished(_)));
    assert_eq!(kills(&out), [(exec(2), 1)], "the other running attempt");
    let job = the_job(&state);
    assert_eq!(job.state, JobState::Failed);
    let states: Vec<TaskState> = job.tasks.iter().map(|t| t.state).collect();
    assert_eq!(
        states,
        [TaskState::Failed, TaskState::Killed, TaskState::Killed]
    );
}

#[test]
fn a_result_over_the_limit_fails_the_task_without_keeping_it() {
    let mut state = launched(1, 1, plain());
    state
        .jobs
        .get_mut(&JobId("j".into()))
        .expect("submitted")
        .def
        .max_result_bytes = 1;
    take(&mut state, 1, 0);
    let result = TaskResult::Inline(b"ok".to_vec());
    assert_eq!(
        verdict(
            the_job(&state),
            0,
            Ok(result.clone()),
            0,
            &Shares::default()
        ),
        Verdict::ResultOverLimit(result.clone())
    );
    let (t, e) = (task(0), exec(1));
    let mut out = Vec::new();
    let job = state.jobs.get_mut(&t.job).expect("submitted");
    on_result_over_limit(job, &state.executors, &end(&t, &e), &result, &mut out);
    let task = &the_job(&state).tasks[0];
    assert_eq!(task.state, TaskState::Failed);
    assert_eq!(task.result, None);
    assert_eq!(
        task.failure.as_ref().map(|f| f.kind),
        Some(FailureKind::ResultLimit)
    );
    assert_eq!(the_job(&state).state, JobState::Failed);
}

#[test]
fn a_success_is_kept_and_kills_a_copy_still_running() {
    let config = SchedulingConfig {
        speculation: Some(SpeculationConfig::default()),
        ..plain()
    };
    let mut state = launched(2, 1, config);
    // A speculative copy of task 0 on exec-2.
    let copy = *state.executors[&exec(1)]
        .running
        .get(&task(0))
        .expect("launched");
    let e2 = state.executors.get_mut(&exec(2)).expect("registered");
    e2.running
        .insert(task(0), RunningAttempt { attempt: 2, ..copy });
    take(&mut state, 1, 0);
    let (t, e) = (task(0), exec(1));
    let mut out = Vec::new();
    let job = state.jobs.get_mut(&t.job).expect("submitted");
    let result = TaskResult::Inline(b"ok".to_vec());
    on_task_succeeded(
        job,
        &state.executors,
        &state.config,
        &end(&t, &e),
        result,
        &mut out,
    );
    assert!(matches!(&out[0], Action::TaskEnded(ended) if *ended == t));
    assert_eq!(kills(&out), [(exec(2), 0)]);
    let task = &the_job(&state).tasks[0];
    assert_eq!(
        (task.state, task.executor.clone()),
        (TaskState::Succeeded, Some(exec(1)))
    );
}

#[test]
fn a_preempted_or_withdrawn_attempt_requeues_first_without_counting() {
    for (preempted, kind) in [(true, "preempted"), (false, "executor_stopped")] {
        let mut state = launched(1, 2, plain());
        take(&mut state, 1, 0);
        let killed = failure(FailureKind::Killed);
        assert_eq!(
            verdict(
                the_job(&state),
                0,
                Err(killed.clone()),
                0,
                &Shares::default()
            ),
            Verdict::Withdrawn(killed.clone())
        );
        let (t, e) = (task(0), exec(1));
        let mut out = Vec::new();
        let end = End {
            preempted,
            ..end(&t, &e)
        };
        let job = state.jobs.get_mut(&t.job).expect("submitted");
        assert!(on_attempt_withdrawn(
            &mut state.queue,
            job,
            &end,
            &killed,
            &mut out
        ));
        assert_eq!(requeued(&out), [(0, kind.to_owned())]);
        let job = the_job(&state);
        assert_eq!(job.tasks[0].host_failures, 0, "held against nobody");
        assert!(job.tasks[0].failed_on.is_empty());
        assert_eq!(
            job.pending,
            [0, 1],
            "it runs again before the task never run"
        );
    }
}

#[test]
fn while_a_copy_runs_a_failed_attempt_puts_nothing_back() {
    let mut state = launched(1, 1, plain());
    take(&mut state, 1, 0);
    let (t, e) = (task(0), exec(1));
    let end = End {
        copy_running: true,
        ..end(&t, &e)
    };
    let mut out = Vec::new();
    let ClusterState {
        jobs,
        queue,
        executors,
        config,
        ..
    } = &mut state;
    let job = jobs.get_mut(&t.job).expect("submitted");
    let failed = failure(FailureKind::HostError);
    assert!(!on_task_retried(
        job,
        queue,
        executors,
        &config.exclusion,
        &end,
        failed,
        &mut out
    ));
    assert!(!on_attempt_withdrawn(
        queue,
        job,
        &end,
        &failure(FailureKind::Killed),
        &mut out
    ));
    assert!(out.is_empty());
    assert_eq!(job.tasks[0].state, TaskState::Running, "the copy decides");
    assert_eq!(job.tasks[0].host_failures, 1, "the failure still counts");
}

#[test]
fn a_lost_executor_requeues_its_tasks_without_counting_a_failure() {
    let mut state = launched(2, 2, plain());
    let generation = state.executors[&exec(1)].generation;
    let actions = state.executor_lost(&exec(1), generation);
    assert_eq!(requeued(&actions), [(0, "executor_lost".to_owned())]);
    let task = &the_job(&state).tasks[0];
    assert_eq!((task.state, task.host_failures), (TaskState::Pending, 0));
    assert!(task.failed_on.is_empty());
    assert_eq!(state.executors[&exec(1)].state, ExecutorState::Lost);
    // Lost again (a stale report of the same loss): nothing more.
    assert!(state.executor_lost(&exec(1), generation).is_empty());
}

#[test]
fn a_kill_ends_the_job_and_kills_each_running_attempt() {
    let mut state = launched(2, 3, plain());
    let actions = state
        .kill_job(&JobId("j".into()), SystemTime::UNIX_EPOCH)
        .expect("a live job");
    assert!(matches!(&actions[0], Action::JobFinished(_)));
    let mut killed = kills(&actions);
    killed.sort();
    assert_eq!(killed, [(exec(1), 0), (exec(2), 1)]);
    let job = the_job(&state);
    assert_eq!(job.state, JobState::Killed);
    assert_eq!(job.counts.killed, 3, "the pending task too, unrun");
    assert_eq!(
        state.kill_job(&JobId("j".into()), SystemTime::UNIX_EPOCH),
        Some(Vec::new()),
        "a final job is left as it is"
    );
    assert_eq!(
        state.kill_job(&JobId("x".into()), SystemTime::UNIX_EPOCH),
        None
    );
}

#[test]
fn a_submitted_job_launches_onto_free_cores_and_memoized_tasks_end_at_once() {
    let mut state = ClusterState::new(0, plain(), Instant::now(), SystemTime::UNIX_EPOCH);
    state
        .register_executor(exec(1), "h".into(), 1, 1, false, Vec::new())
        .expect("a new id");
    let mut memoized = job("j", 2, 1);
    memoized.tasks[1].memoized = Some(TaskResult::Inline(b"kept".to_vec()));
    let actions = state.submit_job(memoized);
    assert!(matches!(&actions[0], Action::TaskEnded(t) if *t == task(1)));
    let launched: Vec<u32> = (actions.iter())
        .filter_map(|a| match a {
            Action::Launch { launch, .. } => Some(launch.index),
            _ => None,
        })
        .collect();
    assert_eq!(launched, [0]);
    assert!(actions.iter().any(|a| matches!(a, Action::Define { .. })));
}

#[test]
fn a_tick_loses_silent_executors_and_requeues_their_tasks() {
    let mut state = launched(2, 2, plain());
    let later = state.now() + Duration::from_secs(10);
    state.set_clock(later, SystemTime::UNIX_EPOCH);
    state.heartbeat(&exec(2), state.executors[&exec(2)].generation, None);
    let (expired, actions) = state.tick(Duration::from_secs(5));
    assert_eq!(expired, [(exec(1), state.executors[&exec(1)].generation)]);
    assert_eq!(requeued(&actions), [(0, "executor_lost".to_owned())]);
}
