//! The state machine's unit tests: every rule of scheduling, retries, exclusion,
//! speculation and pipelining, driven through `ClusterState`'s methods.

use std::collections::BTreeSet;

use flint_protocol::{ModuleRef, Resources, TaskEnd};

use super::*;
use crate::speculation::SpeculationConfig;

fn exec(n: u32) -> ExecutorId {
    ExecutorId(format!("exec-{n}"))
}

pub(crate) fn job(id: &str, tasks: usize, cores: u32) -> NewJob {
    NewJob {
        def: JobDef {
            id: JobId(id.into()),
            name: id.into(),
            module: ModuleRef {
                digest: Some(Digest::of(b"m")),
                url: "http://driver/v1/modules/m".into(),
                timestamp_ms: 1,
                size: Some(1),
            },
            files: vec![],
            args: vec![],
            env: vec![],
            resources: Resources {
                cores,
                ..Resources::default()
            },
            max_failures: 3,
            max_result_bytes: u64::MAX,
            created_at_ms: 0,
        },
        tasks: (0..tasks)
            .map(|_| NewTask {
                input: TaskInput::Inline(vec![]),
                args: vec![],
                env: vec![],
            })
            .collect(),
    }
}

fn launches(actions: &[Action]) -> Vec<(ExecutorId, u32, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Launch {
                executor, launch, ..
            } => Some((executor.clone(), launch.index, launch.attempt)),
            _ => None,
        })
        .collect()
}

fn status(job: &str, index: u32, attempt: u32, outcome: Result<(), TaskFailure>) -> TaskStatus {
    TaskStatus {
        task: TaskId {
            job: JobId(job.into()),
            index,
        },
        attempt,
        generation: 0,
        end: TaskEnd {
            started_at_us: 1,
            finished_at_us: 2,
            outcome: outcome.map(|()| TaskResult::Inline(b"ok".to_vec())),
            log: vec![],
            log_truncated: false,
        },
    }
}

/// An executor's report, stamped with the generation its launch carried.
fn report(
    state: &mut ClusterState,
    executor: &ExecutorId,
    generation: u64,
    mut status: TaskStatus,
    now: SystemTime,
) -> Vec<Action> {
    status.generation = generation;
    state.status_update(executor, generation, status, now)
}

fn cluster(executors: u32, cores: u32) -> (ClusterState, Vec<u64>) {
    // Launches only onto free cores unless a test asks for pipelining.
    let config = SchedulingConfig {
        launch_ahead: 0,
        launch_ahead_max: 0,
        ..SchedulingConfig::default()
    };
    let mut state = ClusterState::new(0, config, Instant::now());
    let generations = (1..=executors)
        .map(|n| {
            state
                .register_executor(exec(n), "h".into(), cores, n, false)
                .unwrap()
                .0
        })
        .collect();
    (state, generations)
}

fn free(state: &ClusterState, n: u32) -> u32 {
    state.executors[&exec(n)].free_cores
}

#[test]
fn a_duplicate_live_id_is_refused_and_a_lost_one_comes_back_newer() {
    let (mut state, gens) = cluster(1, 2);
    let err = state
        .register_executor(exec(1), "h".into(), 2, 9, false)
        .unwrap_err();
    assert!(err.contains("already registered"), "{err}");
    state.executor_lost(&exec(1), gens[0]);
    let (again, _) = state
        .register_executor(exec(1), "h".into(), 2, 9, false)
        .unwrap();
    assert!(again > gens[0]);
    // The same process (host and pid) coming back supersedes its live registration.
    let (third, _) = state
        .register_executor(exec(1), "h".into(), 2, 9, false)
        .unwrap();
    assert!(third > again);
}

#[test]
fn tasks_take_cores_until_their_final_status() {
    let (mut state, gens) = cluster(2, 2);
    let placed = launches(&state.submit_job(job("j", 3, 2)));
    assert_eq!(placed.len(), 2, "one 2-core task per 2-core executor");
    assert_eq!((free(&state, 1), free(&state, 2)), (0, 0));
    let (first, index, attempt) = placed[0].clone();
    let n = if first == exec(1) { 1 } else { 2 };
    let next = launches(&report(
        &mut state,
        &first,
        gens[n as usize - 1],
        status("j", index, attempt, Ok(())),
        SystemTime::UNIX_EPOCH,
    ));
    assert_eq!(
        next,
        vec![(first.clone(), 2, 1)],
        "the freed executor takes the last task"
    );
    assert_eq!(free(&state, n), 0);
}

#[test]
fn stale_reports_change_nothing() {
    let (mut state, gens) = cluster(1, 1);
    state.submit_job(job("j", 1, 1));
    let wrong_attempt = report(
        &mut state,
        &exec(1),
        gens[0],
        status("j", 0, 7, Ok(())),
        SystemTime::UNIX_EPOCH,
    );
    let wrong_generation = report(
        &mut state,
        &exec(1),
        gens[0] + 1,
        status("j", 0, 1, Ok(())),
        SystemTime::UNIX_EPOCH,
    );
    // A status of an earlier registration arriving on the current connection.
    let mut earlier = status("j", 0, 1, Ok(()));
    earlier.generation = gens[0] - 1;
    let earlier = state.status_update(&exec(1), gens[0], earlier, SystemTime::UNIX_EPOCH);
    assert!(wrong_attempt.is_empty() && wrong_generation.is_empty() && earlier.is_empty());
    assert_eq!(
        state.jobs[&JobId("j".into())].tasks[0].state,
        TaskState::Running
    );
    assert_eq!(free(&state, 1), 0);
}

#[test]
fn a_lost_executors_tasks_run_again_elsewhere_without_counting_as_failures() {
    let (mut state, gens) = cluster(2, 1);
    let placed = launches(&state.submit_job(job("j", 2, 1)));
    assert_eq!(placed.len(), 2);
    let relaunched = launches(&state.executor_lost(&exec(1), gens[0]));
    assert!(relaunched.is_empty(), "exec-2 is still busy");
    let lost_index = placed.iter().find(|p| p.0 == exec(1)).unwrap().1;
    let other = placed.iter().find(|p| p.0 == exec(2)).unwrap().1;
    let relaunched = launches(&report(
        &mut state,
        &exec(2),
        gens[1],
        status("j", other, 1, Ok(())),
        SystemTime::UNIX_EPOCH,
    ));
    assert_eq!(relaunched, vec![(exec(2), lost_index, 2)]);
    let task = &state.jobs[&JobId("j".into())].tasks[lost_index as usize];
    assert_eq!(task.host_failures, 0);
}

#[test]
fn an_attempt_its_executor_killed_runs_again_without_counting_as_a_failure() {
    let (mut state, gens) = cluster(1, 1);
    let placed = launches(&state.submit_job(job("j", 1, 1)));
    assert_eq!(placed, vec![(exec(1), 0, 1)]);
    // The executor is stopping (SIGTERM): it kills what runs and says so.
    let stopped = TaskFailure::new(FailureKind::Killed, "killed");
    let actions = report(
        &mut state,
        &exec(1),
        gens[0],
        status("j", 0, 1, Err(stopped)),
        SystemTime::UNIX_EPOCH,
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::TaskRequeued { event, .. }
            if event.error.as_ref().is_some_and(|e| e.kind == "executor_stopped"))),
        "{actions:?}"
    );
    assert!(
        !actions.iter().any(|a| matches!(a, Action::JobFinished(_))),
        "the job goes on"
    );
    assert_eq!(
        launches(&actions),
        vec![(exec(1), 0, 2)],
        "and the task runs again"
    );
    let job = &state.jobs[&JobId("j".into())];
    let task = &job.tasks[0];
    assert_eq!((task.host_failures, task.failed_on.len()), (0, 0));
    assert_eq!(job.state, JobState::Running);
    finish(&mut state, &(exec(1), 0, 2), "j", Ok(()));
    assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Succeeded);
}

#[test]
fn a_guest_failure_fails_the_job_and_kills_the_rest_holding_their_cores() {
    let (mut state, gens) = cluster(2, 1);
    let placed = launches(&state.submit_job(job("j", 3, 1)));
    let (failing, index, _) = placed[0].clone();
    let failure = TaskFailure {
        kind: FailureKind::Exit,
        message: "exited with code 3".into(),
        exit_code: Some(3),
    };
    let g = |e: &ExecutorId| if *e == exec(1) { gens[0] } else { gens[1] };
    let actions = report(
        &mut state,
        &failing,
        g(&failing),
        status("j", index, 1, Err(failure)),
        SystemTime::UNIX_EPOCH,
    );
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.state, JobState::Failed);
    assert!(job.error.as_ref().unwrap().1.contains("task 0 failed"));
    assert_eq!(job.counts().killed, 2, "one running, one never started");
    let (other, other_index, _) = placed[1].clone();
    assert!(actions.contains(&Action::Kill {
        executor: other.clone(),
        task: TaskId {
            job: JobId("j".into()),
            index: other_index
        },
        attempt: 1,
        reason: "job ended",
    }));
    let n = if other == exec(1) { 1 } else { 2 };
    assert_eq!(
        free(&state, n),
        0,
        "held until the executor confirms the kill"
    );
    // Even a success arriving now leaves the task killed; the core comes back.
    report(
        &mut state,
        &other,
        g(&other),
        status("j", other_index, 1, Ok(())),
        SystemTime::UNIX_EPOCH,
    );
    assert_eq!(free(&state, n), 1);
    let task = &state.jobs[&JobId("j".into())].tasks[other_index as usize];
    assert_eq!(task.state, TaskState::Killed);
}

/// A failure of the source, not the executor: the job's URL answered 500.
fn fetch_error(url: &str) -> Result<(), TaskFailure> {
    Err(TaskFailure::new(
        FailureKind::FetchError,
        format!("fetching {url}: HTTP status 500"),
    ))
}

/// A failure of the executor itself: its cache's disk is full.
fn host_error() -> Result<(), TaskFailure> {
    Err(TaskFailure::new(
        FailureKind::HostError,
        "cache at /var/cache/flint: No space left on device",
    ))
}

fn generation_of(state: &ClusterState, e: &ExecutorId) -> u64 {
    state.executors[e].generation
}

/// Reports the attempt `placed` with `outcome`, returning the launches that follow.
fn finish(
    state: &mut ClusterState,
    placed: &(ExecutorId, u32, u32),
    job: &str,
    outcome: Result<(), TaskFailure>,
) -> Vec<(ExecutorId, u32, u32)> {
    let generation = generation_of(state, &placed.0);
    launches(&report(
        state,
        &placed.0,
        generation,
        status(job, placed.1, placed.2, outcome),
        SystemTime::UNIX_EPOCH,
    ))
}

#[test]
fn host_failures_are_retried_up_to_max_failures() {
    // Three executors, so that no executor fails the task twice and exclusion does
    // not end the job before max_failures (3) does.
    let (mut state, _) = cluster(3, 1);
    let mut placed = launches(&state.submit_job(job("j", 1, 1)));
    for attempt in 1..=3 {
        assert_eq!(placed.len(), 1, "attempt {attempt}");
        assert_eq!(placed[0].2, attempt);
        placed = finish(&mut state, &placed[0].clone(), "j", host_error());
    }
    assert!(placed.is_empty());
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.state, JobState::Failed);
    let error = &job.error.as_ref().unwrap().1;
    assert!(error.contains("after 3 attempt(s): host_error"), "{error}");
}

#[test]
fn a_fetch_error_is_retried_on_the_same_executor_up_to_max_failures() {
    // One executor: were fetch errors held against it, the task would be excluded
    // there after two and the job would fail saying every executor is excluded.
    let (mut state, _) = cluster(1, 1);
    let url = "http://data.example/in";
    let mut placed = launches(&state.submit_job(job("j", 1, 1)));
    for attempt in 1..=3 {
        assert_eq!(placed, vec![(exec(1), 0, attempt)], "attempt {attempt}");
        placed = finish(&mut state, &placed[0].clone(), "j", fetch_error(url));
    }
    assert!(placed.is_empty());
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(
        job.error.as_ref().unwrap().1,
        format!("task 0 failed after 3 attempt(s): fetch_error: fetching {url}: HTTP status 500")
    );
    assert!(job.tasks[0].failed_on.is_empty());
}

#[test]
fn a_job_naming_failing_urls_excludes_no_executor_and_the_next_job_gets_them_all() {
    // Once, one job of 8 inputs whose URLs answered 500 excluded both executors of a
    // cluster for 60 s, and every job submitted after it failed at once.
    let (mut state, _) = cluster(2, 1);
    let t0 = state.now();
    let url = |index: u32| format!("http://data.example/part-{index}");
    let mut def = job("bad", 8, 1);
    def.def.max_failures = flint_protocol::defaults::MAX_FAILURES;
    let mut running = launches(&state.submit_job(def));
    assert_eq!(running.len(), 2);
    let mut reports = 0;
    // Every attempt fails, until the job does; then the attempts it killed report.
    while let Some(attempt) = running.pop() {
        let failure = fetch_error(&url(attempt.1));
        running.extend(finish(&mut state, &attempt, "bad", failure));
        reports += 1;
        assert!(reports <= 8 * 4, "still running after {reports} failures");
    }
    let bad = &state.jobs[&JobId("bad".into())];
    assert_eq!(bad.state, JobState::Failed);
    let error = &bad.error.as_ref().unwrap().1;
    let failed = bad
        .tasks
        .iter()
        .position(|t| t.state == TaskState::Failed)
        .unwrap_or_else(|| panic!("no task failed, yet the job did: {error}"));
    assert_eq!(
        *error,
        format!(
            "task {failed} failed after {} attempt(s): fetch_error: fetching {}: HTTP status 500",
            flint_protocol::defaults::MAX_FAILURES,
            url(failed as u32)
        )
    );
    for n in [1, 2] {
        let health = &state.executors[&exec(n)].health;
        assert!(!health.is_excluded(t0), "exec-{n} excluded");
        assert_eq!(
            health.recent_failures(&state.config.exclusion, t0),
            0,
            "exec-{n}"
        );
        assert_eq!(free(&state, n), 1, "exec-{n}'s core is back");
    }
    assert!(bad.tasks.iter().all(|t| t.failed_on.is_empty()));
    let next = launches(&state.submit_job(job("next", 2, 1)));
    let on: BTreeSet<ExecutorId> = next.into_iter().map(|(e, _, _)| e).collect();
    assert_eq!(on, BTreeSet::from([exec(1), exec(2)]), "both at once");
    assert_eq!(state.jobs[&JobId("next".into())].counts().running, 2);
}

#[test]
fn a_task_that_failed_twice_on_an_executor_never_runs_there_again() {
    let (mut state, _) = cluster(2, 1);
    let mut def = job("j", 2, 1);
    def.def.max_failures = 10;
    let placed = launches(&state.submit_job(def));
    let on_1 = placed.iter().find(|p| p.0 == exec(1)).unwrap().clone();
    let on_2 = placed.iter().find(|p| p.0 == exec(2)).unwrap().clone();
    let again = finish(&mut state, &on_1, "j", host_error());
    assert_eq!(
        again,
        vec![(exec(1), on_1.1, 2)],
        "once is not enough to exclude"
    );
    let again = finish(&mut state, &again[0], "j", host_error());
    assert!(again.is_empty(), "excluded from exec-1, and exec-2 is busy");
    assert_eq!(
        free(&state, 1),
        1,
        "exec-1 idles rather than run it a third time"
    );
    assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Running);
    let again = finish(&mut state, &on_2, "j", Ok(()));
    assert_eq!(again, vec![(exec(2), on_1.1, 3)]);
}

#[test]
fn a_job_whose_task_every_executor_is_excluded_for_fails_saying_so() {
    let (mut state, _) = cluster(1, 1);
    let placed = launches(&state.submit_job(job("j", 1, 1)));
    let again = finish(&mut state, &placed[0], "j", host_error());
    let again = finish(&mut state, &again[0], "j", host_error());
    assert!(again.is_empty());
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.state, JobState::Failed);
    let error = &job.error.as_ref().unwrap().1;
    assert_eq!(
        error,
        "task 0 cannot run: every live executor is excluded for it: exec-1 (failed this \
         task 2 times); last failure: host_error: cache at /var/cache/flint: No space left \
         on device"
    );
}

#[test]
fn an_executor_failing_many_tasks_is_excluded_for_a_period() {
    let (mut state, _) = cluster(2, 1);
    let t0 = state.now();
    let mut def = job("j", 12, 1);
    def.def.max_failures = 10;
    let mut running = launches(&state.submit_job(def));
    // Every attempt on exec-1 fails, every one on exec-2 is held (not reported).
    // A task fails there twice before it moves on: 4 distinct tasks, 8 failures.
    let mut failed_on_1 = 0;
    while !state.executors[&exec(1)].health.is_excluded(t0) {
        let at = running.iter().position(|p| p.0 == exec(1)).unwrap();
        let attempt = running.remove(at);
        running.extend(finish(&mut state, &attempt, "j", host_error()));
        failed_on_1 += 1;
        assert!(
            failed_on_1 <= 8,
            "not excluded after {failed_on_1} failures"
        );
    }
    let failed: Vec<_> = state.jobs[&JobId("j".into())]
        .tasks
        .iter()
        .filter(|t| !t.failed_on.is_empty())
        .collect();
    assert_eq!(failed.len(), 4, "four distinct tasks");
    assert!(running.iter().all(|p| p.0 != exec(1)), "{running:?}");
    assert_eq!(free(&state, 1), 1, "free but excluded");
    assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Running);
    // exec-2 keeps the job going, and exec-1 is back once the period is over.
    let on_2 = running.pop().unwrap();
    let next = finish(&mut state, &on_2, "j", Ok(()));
    assert!(next.iter().all(|p| p.0 == exec(2)), "{next:?}");
    state.set_clock(t0 + Duration::from_secs(61));
    let next = launches(&state.make_offers());
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].0, exec(1));
}

#[test]
fn tasks_wait_briefly_for_an_executor_that_already_ran_their_module() {
    let (mut state, _) = cluster(2, 1);
    let t0 = state.now();
    let first = launches(&state.submit_job(job("a", 1, 1)));
    assert_eq!(
        first,
        vec![(exec(1), 0, 1)],
        "nothing is warm yet: anywhere"
    );
    let waiting = launches(&state.submit_job(job("b", 2, 1)));
    assert!(
        waiting.is_empty(),
        "exec-2 is free but cold; exec-1 is warm but busy"
    );
    state.set_clock(t0 + Duration::from_millis(50));
    assert!(launches(&state.make_offers()).is_empty());
    let next = finish(&mut state, &first[0], "a", Ok(()));
    assert_eq!(next, vec![(exec(1), 0, 1)], "the warm executor takes one");
    state.set_clock(t0 + state.config.locality_wait);
    let late = launches(&state.make_offers());
    assert_eq!(
        late,
        vec![(exec(2), 1, 1)],
        "the wait is over: the cold one too"
    );
    assert!(
        state.executors[&exec(2)]
            .modules
            .contains(&Digest::of(b"m"))
    );
}

#[test]
fn with_no_locality_wait_tasks_go_anywhere_at_once() {
    let (mut state, _) = cluster(2, 1);
    state.config.locality_wait = Duration::ZERO;
    launches(&state.submit_job(job("a", 1, 1)));
    let placed = launches(&state.submit_job(job("b", 1, 1)));
    assert_eq!(placed, vec![(exec(2), 0, 1)]);
}

#[test]
fn a_slow_task_gets_a_copy_and_the_first_success_wins() {
    let (mut state, _) = cluster(2, 1);
    state.config.speculation = Some(SpeculationConfig::default());
    let t0 = state.now();
    let placed = launches(&state.submit_job(job("j", 4, 1)));
    let slow = placed.iter().find(|p| p.0 == exec(1)).unwrap().clone();
    let mut fast = placed.iter().find(|p| p.0 == exec(2)).unwrap().clone();
    for _ in 0..3 {
        let next = finish(&mut state, &fast, "j", Ok(()));
        if let Some(n) = next.first() {
            fast = n.clone();
        }
    }
    assert_eq!(state.jobs[&JobId("j".into())].counts().succeeded, 3);
    assert!(state.speculate().is_empty(), "not slow yet");
    state.set_clock(t0 + Duration::from_millis(200));
    let copy = launches(&state.speculate());
    assert_eq!(copy, vec![(exec(2), slow.1, 2)], "a copy, never on exec-1");
    assert!(state.speculate().is_empty(), "one copy only");
    let generation = generation_of(&state, &exec(2));
    let actions = report(
        &mut state,
        &exec(2),
        generation,
        status("j", slow.1, 2, Ok(())),
        SystemTime::UNIX_EPOCH,
    );
    assert!(actions.contains(&Action::Kill {
        executor: exec(1),
        task: TaskId {
            job: JobId("j".into()),
            index: slow.1
        },
        attempt: 1,
        reason: "another attempt of this task succeeded",
    }));
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.tasks[slow.1 as usize].executor, Some(exec(2)));
    assert_eq!(free(&state, 1), 0, "held until the kill is confirmed");
    // The loser's late report changes nothing but its core.
    let killed = TaskFailure::new(FailureKind::Killed, "killed");
    assert!(finish(&mut state, &slow, "j", Err(killed)).is_empty());
    assert_eq!(free(&state, 1), 1);
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.tasks[slow.1 as usize].state, TaskState::Succeeded);
    assert_eq!(job.counts().succeeded, 4);
}

#[test]
fn losing_the_original_while_its_copy_runs_does_not_launch_a_third() {
    let (mut state, _) = cluster(3, 1);
    state.config.speculation = Some(SpeculationConfig::default());
    let t0 = state.now();
    let placed = launches(&state.submit_job(job("j", 4, 1)));
    // Tasks 1 and 2 succeed on exec-2 and exec-3; task 3 then succeeds too.
    let mut done = 0;
    let mut queue: Vec<_> = placed.iter().filter(|p| p.0 != exec(1)).cloned().collect();
    while let Some(p) = queue.pop() {
        queue.extend(finish(&mut state, &p, "j", Ok(())));
        done += 1;
    }
    assert_eq!(done, 3);
    state.set_clock(t0 + Duration::from_millis(200));
    let copy = launches(&state.speculate());
    assert_eq!(copy.len(), 1);
    let generation = generation_of(&state, &exec(1));
    let relaunched = launches(&state.executor_lost(&exec(1), generation));
    assert!(relaunched.is_empty(), "the copy still runs: {relaunched:?}");
    assert_eq!(state.jobs[&JobId("j".into())].counts().running, 1);
    finish(&mut state, &copy[0], "j", Ok(()));
    assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Succeeded);
}

#[test]
fn a_silent_executor_is_lost_after_the_heartbeat_timeout() {
    let (mut state, gens) = cluster(2, 1);
    let placed = launches(&state.submit_job(job("j", 2, 1)));
    assert_eq!(placed.len(), 2);
    let t0 = state.executors[&exec(1)].last_heartbeat;
    let timeout = Duration::from_secs(8);
    state.set_clock(t0 + Duration::from_secs(7));
    state.heartbeat(&exec(2), gens[1], None);
    let (expired, _) = state.expire_executors(timeout);
    assert!(expired.is_empty(), "nobody is late yet");
    state.set_clock(t0 + Duration::from_secs(9));
    let (expired, actions) = state.expire_executors(timeout);
    assert_eq!(expired, vec![(exec(1), gens[0])]);
    assert_eq!(state.executors[&exec(1)].state, ExecutorState::Lost);
    assert!(
        launches(&actions).is_empty(),
        "exec-2 is busy; the task waits, pending"
    );
    assert_eq!(state.jobs[&JobId("j".into())].counts().pending, 1);
    // Its late result, should it come, is from a lost generation and changes nothing.
    let index = placed.iter().find(|p| p.0 == exec(1)).unwrap().1;
    let late = report(
        &mut state,
        &exec(1),
        gens[0],
        status("j", index, 1, Ok(())),
        SystemTime::UNIX_EPOCH,
    );
    assert!(late.is_empty());
    assert_eq!(state.jobs[&JobId("j".into())].counts().succeeded, 0);
}

#[test]
fn killing_a_job_stops_its_pending_and_running_tasks() {
    let (mut state, gens) = cluster(1, 1);
    state.submit_job(job("j", 2, 1));
    let actions = state
        .kill_job(&JobId("j".into()), SystemTime::UNIX_EPOCH)
        .unwrap();
    assert!(actions.iter().any(|a| matches!(a, Action::Kill { .. })));
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.state, JobState::Killed);
    assert_eq!(job.counts().killed, 2);
    assert_eq!(free(&state, 1), 0);
    let killed = TaskFailure::new(FailureKind::Killed, "killed");
    report(
        &mut state,
        &exec(1),
        gens[0],
        status("j", 0, 1, Err(killed)),
        SystemTime::UNIX_EPOCH,
    );
    assert_eq!(free(&state, 1), 1);
    // The killed attempt's report still says when the guest stopped.
    let task = &state.jobs[&JobId("j".into())].tasks[0];
    assert_eq!(
        (task.state, task.finished_at_us),
        (TaskState::Killed, Some(2))
    );
    assert!(
        state
            .kill_job(&JobId("nope".into()), SystemTime::UNIX_EPOCH)
            .is_none()
    );
}

/// (executor, job key) of each Define and Launch, in order.
fn definitions_and_launches(actions: &[Action]) -> Vec<(&'static str, ExecutorId, u64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Define { executor, template } => {
                Some(("define", executor.clone(), template.key))
            }
            Action::Launch {
                executor, launch, ..
            } => Some(("launch", executor.clone(), launch.job)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_job_is_defined_once_per_registration_before_its_first_launch_and_forgotten_at_its_end() {
    let (mut state, gens) = cluster(1, 1);
    let first = state.submit_job(job("j", 3, 1));
    let key = state.jobs[&JobId("j".into())].key;
    assert_eq!(
        definitions_and_launches(&first),
        [("define", exec(1), key), ("launch", exec(1), key)]
    );
    let template = first
        .iter()
        .find_map(|a| match a {
            Action::Define { template, .. } => Some(template),
            _ => None,
        })
        .unwrap();
    assert_eq!((template.job.0.as_str(), template.task_count), ("j", 3));
    let next = report(
        &mut state,
        &exec(1),
        gens[0],
        status("j", 0, 1, Ok(())),
        SystemTime::UNIX_EPOCH,
    );
    assert_eq!(
        definitions_and_launches(&next),
        [("launch", exec(1), key)],
        "defined already on this connection"
    );
    // A new registration is a new connection, which knows no jobs.
    state.executor_lost(&exec(1), gens[0]);
    let (generation, _) = state
        .register_executor(exec(1), "h".into(), 1, 1, false)
        .unwrap();
    let again = state.make_offers();
    assert_eq!(
        definitions_and_launches(&again),
        [("define", exec(1), key), ("launch", exec(1), key)]
    );
    let mut last = Vec::new();
    for index in [1, 2] {
        let attempt = state.jobs[&JobId("j".into())].tasks[index as usize].attempts;
        last = report(
            &mut state,
            &exec(1),
            generation,
            status("j", index, attempt, Ok(())),
            SystemTime::UNIX_EPOCH,
        );
    }
    assert!(last.iter().any(|a| matches!(a, Action::JobFinished(_))));
    assert_eq!(state.forget_job(&JobId("j".into())), [(exec(1), key)]);
    assert!(
        state.forget_job(&JobId("j".into())).is_empty(),
        "forgotten once"
    );
}

#[test]
fn a_pending_task_stays_within_its_memory_budget() {
    // BENCHMARKS.md measures the driver at about 300 bytes per pending task against
    // a budget of 1 KB; a field added to every task shows up here first. (336: the
    // result is inline bytes or a block reference since the block store.)
    assert!(
        std::mem::size_of::<Task>() <= 336,
        "{}",
        std::mem::size_of::<Task>()
    );
}

#[test]
fn one_core_tasks_are_launched_ahead_and_the_cores_come_back() {
    let (mut state, _) = cluster(1, 1);
    state.config.launch_ahead = 1;
    let mut placed = launches(&state.submit_job(job("j", 3, 1)));
    assert_eq!(
        placed.len(),
        1,
        "nothing queues where the module is not yet"
    );
    placed.extend(launches(&state.make_offers()));
    assert_eq!(placed.len(), 2, "one running, one queued behind it");
    let e = &state.executors[&exec(1)];
    assert_eq!((e.free_cores, e.queued_ahead), (0, 1));
    let next = finish(&mut state, &placed[0], "j", Ok(()));
    assert_eq!(next.len(), 1, "the queue is topped up");
    finish(&mut state, &placed[1], "j", Ok(()));
    finish(&mut state, &next[0], "j", Ok(()));
    let e = &state.executors[&exec(1)];
    assert_eq!((e.free_cores, e.queued_ahead), (1, 0));
    assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Succeeded);
}

#[test]
fn short_tasks_queue_deeper_and_an_unknown_job_queues_as_little_as_ever() {
    let (mut state, _) = cluster(1, 1);
    state.config.launch_ahead = 2;
    state.config.launch_ahead_max = 8;
    state.config.queue_budget = Duration::from_micros(1_000);
    let ended = |state: &mut ClusterState, job: &str, placed: &(ExecutorId, u32, u32), us| {
        let generation = generation_of(state, &placed.0);
        let mut status = status(job, placed.1, placed.2, Ok(()));
        status.end.finished_at_us = status.end.started_at_us + us;
        launches(&report(
            state,
            &placed.0,
            generation,
            status,
            SystemTime::UNIX_EPOCH,
        ))
    };
    let mut placed = launches(&state.submit_job(job("short", 100, 1)));
    placed.extend(launches(&state.make_offers()));
    assert_eq!(
        placed.len(),
        3,
        "one running, launch_ahead (2) queued: nothing known yet"
    );
    // A 10 us task: 1 ms of them is 100, capped at launch_ahead_max (8) queued.
    let topped = ended(&mut state, "short", &placed[0], 10);
    assert_eq!(
        topped.len(),
        8 - 1,
        "queue grown to 8 behind the one running"
    );
    assert_eq!(state.executors[&exec(1)].queued_ahead, 8);

    // A second job whose run time is unknown keeps everything at launch_ahead; the
    // queue drains to it rather than growing.
    state.submit_job(job("new", 10, 1));
    let next = ended(&mut state, "short", &placed[1], 10);
    assert!(next.is_empty(), "8 queued, depth back to 2: {next:?}");

    // Slow tasks (1 ms): the budget fits one, launch_ahead (2) still holds.
    let (mut state, _) = cluster(1, 1);
    state.config.launch_ahead = 2;
    state.config.launch_ahead_max = 8;
    let mut placed = launches(&state.submit_job(job("slow", 100, 1)));
    placed.extend(launches(&state.make_offers()));
    let topped = ended(&mut state, "slow", &placed[0], 1_000);
    assert_eq!(topped.len(), 1, "one ended, one launched: still 2 queued");
    assert_eq!(state.executors[&exec(1)].queued_ahead, 2);
}

#[test]
fn nothing_more_queues_behind_a_straggler() {
    let (mut state, gens) = cluster(1, 1);
    state.config.launch_ahead = 2;
    state.config.launch_ahead_max = 8;
    state.config.queue_budget = Duration::from_micros(1_000);
    let mut placed = launches(&state.submit_job(job("j", 20, 1)));
    placed.extend(launches(&state.make_offers()));
    assert_eq!(placed.len(), 3, "one running, two queued");
    // The first ends after 100 us: 1 ms of such tasks is 10, capped at 8 queued.
    let mut first = status("j", placed[0].1, placed[0].2, Ok(()));
    first.end.finished_at_us = first.end.started_at_us + 100;
    let topped = launches(&report(
        &mut state,
        &exec(1),
        gens[0],
        first,
        SystemTime::UNIX_EPOCH,
    ));
    assert_eq!(topped.len(), 8 - 1, "the queue grows to 8");
    // The attempt now running (placed[1]) goes on and on: past 2 ms + 4 x 100 us,
    // nothing more is queued behind it, though its queue has room again once a
    // queued attempt ends.
    state.set_clock(state.now() + Duration::from_millis(3));
    let (_, index, attempt) = placed[2].clone();
    let after = launches(&report(
        &mut state,
        &exec(1),
        gens[0],
        status("j", index, attempt, Ok(())),
        SystemTime::UNIX_EPOCH,
    ));
    assert!(after.is_empty(), "queued behind a straggler: {after:?}");
    assert_eq!(state.executors[&exec(1)].queued_ahead, 7);
}

#[test]
fn fifo_serves_the_oldest_job_first_and_fair_the_one_running_least() {
    // One 2-core executor; job "a" (6 tasks) holds both cores when "b" arrives.
    let whose_next = |mode: SchedulingMode| {
        let (mut state, gens) = cluster(1, 2);
        state.config.mode = mode;
        let a = launches(&state.submit_job(job("a", 6, 1)));
        assert_eq!(a.len(), 2);
        assert!(
            launches(&state.submit_job(job("b", 6, 1))).is_empty(),
            "no core free"
        );
        let mut next = Vec::new();
        for (_, index, attempt) in &a {
            let actions = report(
                &mut state,
                &exec(1),
                gens[0],
                status("a", *index, *attempt, Ok(())),
                SystemTime::UNIX_EPOCH,
            );
            next.extend(actions.iter().filter_map(|a| match a {
                Action::Launch { job, .. } => Some(job.0.clone()),
                _ => None,
            }));
        }
        next
    };
    assert_eq!(
        whose_next(SchedulingMode::Fifo),
        ["a", "a"],
        "a until it has nothing pending"
    );
    // The first freed core goes to b (0 running against a's 1); then each has one
    // running, and the older job, a, wins the tie.
    assert_eq!(whose_next(SchedulingMode::Fair), ["b", "a"]);
}

#[test]
fn nothing_queues_beside_a_multi_core_task() {
    let (mut state, _) = cluster(1, 2);
    state.config.launch_ahead = 2;
    assert_eq!(launches(&state.submit_job(job("big", 2, 2))).len(), 1);
    assert!(launches(&state.submit_job(job("small", 2, 1))).is_empty());
    let generation = generation_of(&state, &exec(1));
    let lost = state.executor_lost(&exec(1), generation);
    // Nothing to launch on: the big task only goes back to pending.
    assert!(launches(&lost).is_empty());
    assert_eq!(
        lost,
        vec![Action::TaskRequeued {
            job: JobId("big".into()),
            event: TaskEvent {
                index: 0,
                state: TaskState::Pending,
                attempt: 1,
                executor: None,
                error: Some(ErrorBody {
                    kind: "executor_lost".into(),
                    message: "executor exec-1 was lost; the task runs again".into(),
                }),
            },
        }]
    );
    assert_eq!(state.executors[&exec(1)].queued_ahead, 0);
}
