//! The state machine's unit tests: every rule of scheduling, retries, exclusion,
//! speculation and pipelining, driven through `ClusterState`'s methods.

use std::collections::BTreeSet;

use flint_protocol::{ModuleRef, Resources, TaskEnd};

use super::*;
use crate::scheduler::speculation::SpeculationConfig;
use flint_protocol::{Digest, TaskInput, TaskResult};

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
            options: Default::default(),
            owner: Default::default(),
            network: None,
            created_at_ms: 0,
        },
        tasks: (0..tasks)
            .map(|_| NewTask {
                input: TaskInput::Inline(vec![]),
                args: vec![],
                env: vec![],
                memoized: None,
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

pub(crate) fn status(
    job: &str,
    index: u32,
    attempt: u32,
    outcome: Result<(), TaskFailure>,
) -> TaskStatus {
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
            usage: Default::default(),
            pins: None,
            memory_mb: None,
            egress_denied: Vec::new(),
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
    let mut state = ClusterState::new(0, config, Instant::now(), SystemTime::now());
    let generations = (1..=executors)
        .map(|n| {
            state
                .register_executor(exec(n), "h".into(), cores, n, false, Vec::new())
                .unwrap()
                .0
        })
        .collect();
    (state, generations)
}

fn free(state: &ClusterState, n: u32) -> u32 {
    state.executors[&exec(n)].free_cores
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

mod adoption;
mod failures;
mod placement;
mod shares;
mod waits;

#[test]
fn a_duplicate_live_id_is_refused_and_a_lost_one_comes_back_newer() {
    let (mut state, gens) = cluster(1, 2);
    let err = state
        .register_executor(exec(1), "h".into(), 2, 9, false, Vec::new())
        .unwrap_err();
    assert!(err.contains("already registered"), "{err}");
    state.executor_lost(&exec(1), gens[0]);
    let (again, _) = state
        .register_executor(exec(1), "h".into(), 2, 9, false, Vec::new())
        .unwrap();
    assert!(again > gens[0]);
    // The same process (host and pid) coming back supersedes its live registration.
    let (third, _) = state
        .register_executor(exec(1), "h".into(), 2, 9, false, Vec::new())
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

#[test]
fn a_launched_executor_is_launching_until_it_registers_and_keeps_where_it_came_from() {
    use flint_protocol::exit::ProcessExit;
    let (mut state, _) = cluster(0, 1);
    let by = LaunchedBy {
        cluster_manager: "local",
        worker: Some("host-a".into()),
    };
    state.executor_launched(&exec(1), by.clone(), Some(41));
    let e = &state.executors[&exec(1)];
    assert_eq!(e.state, ExecutorState::Launching);
    assert_eq!(
        (e.cores, e.free_cores),
        (0, 0),
        "no offers before it registers"
    );
    let (generation, _) = state
        .register_executor(exec(1), "h".into(), 2, 41, false, Vec::new())
        .unwrap();
    let e = &state.executors[&exec(1)];
    assert_eq!(e.state, ExecutorState::Alive);
    assert_eq!(e.free_cores, 2);
    assert_eq!(e.launched_by.as_ref(), Some(&by));
    // Its process is seen to exit before its connection closes: alive until then.
    state.executor_exited(&exec(1), ProcessExit::Signal(9), None);
    assert_eq!(state.executors[&exec(1)].state, ExecutorState::Alive);
    state.executor_lost(&exec(1), generation);
    let e = &state.executors[&exec(1)];
    assert_eq!(e.state, ExecutorState::Exited);
    assert_eq!(e.exit, Some(ProcessExit::Signal(9)));
    // One that exits before it registers is listed as exited, with where it came from.
    state.executor_launched(&exec(2), by.clone(), Some(42));
    state.executor_exited(&exec(2), ProcessExit::Code(2), None);
    let e = &state.executors[&exec(2)];
    assert_eq!(e.state, ExecutorState::Exited);
    assert_eq!(e.launched_by.as_ref(), Some(&by));
    // A launch never downgrades a registered executor of that id.
    let (mut state, _) = cluster(1, 1);
    state.executor_launched(&exec(1), by, None);
    assert_eq!(state.executors[&exec(1)].state, ExecutorState::Alive);
}

#[test]
fn every_attempt_is_a_span_with_its_executor_times_and_outcome() {
    let (mut state, gens) = cluster(2, 1);
    let placed = launches(&state.submit_job(job("j", 2, 1)));
    let on1 = placed.iter().find(|p| p.0 == exec(1)).unwrap().clone();
    let on2 = placed.iter().find(|p| p.0 == exec(2)).unwrap().clone();
    // exec-1 is lost: its attempt ends `lost`, at the driver's time.
    state.executor_lost(&exec(1), gens[0]);
    // exec-2's attempt fails on the job's budget, then both tasks run there again.
    let next = finish(&mut state, &on2, "j", fetch_error("http://o/x"));
    assert_eq!(next, vec![(exec(2), on1.1, 2)]);
    let next = finish(&mut state, &next[0], "j", Ok(()));
    assert_eq!(next, vec![(exec(2), on2.1, 2)]);
    finish(&mut state, &next[0], "j", Ok(()));
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.state, JobState::Succeeded);
    // In launch order: the first two in either order, then the relaunches.
    let spans: Vec<_> = job
        .attempts
        .iter()
        .map(|s| {
            let executor = job.attempt_executors[s.executor as usize].clone();
            (s.task, s.attempt, executor, s.outcome, s.speculative)
        })
        .collect();
    let mut first_two = spans[..2].to_vec();
    first_two.sort_by_key(|s| s.2.clone());
    assert_eq!(
        first_two,
        vec![
            (on1.1, 1, exec(1), Some(Outcome::Lost), false),
            (
                on2.1,
                1,
                exec(2),
                Some(Outcome::Failed(FailureKind::FetchError)),
                false
            ),
        ]
    );
    assert_eq!(
        spans[2..],
        [
            (on1.1, 2, exec(2), Some(Outcome::Succeeded), false),
            (on2.1, 2, exec(2), Some(Outcome::Succeeded), false),
        ]
    );
    // Reported attempts carry the executor's clock (the test's reports say 1..2 µs);
    // the lost one the driver's.
    for s in &job.attempts {
        match s.outcome {
            Some(Outcome::Lost) => {
                assert!(s.start_us > 2 && s.end_us.unwrap() >= s.start_us, "{s:?}")
            }
            _ => assert_eq!((s.start_us, s.end_us), (1, Some(2)), "{s:?}"),
        }
    }
    // Two executors named, each once.
    let mut named = job.attempt_executors.clone();
    named.sort();
    assert_eq!(named, vec![exec(1), exec(2)]);
}
