//! Attempts an executor kept through a lost connection or a driver's restart: adopted
//! (never launched twice, their ends applied once) or dropped (killed, with a reason),
//! and the wait after a restart for the executors the last driver knew.

use flint_protocol::HeldAttempt;

use super::*;

fn held(job: &str, index: u32, attempt: u32, generation: u64, ended: bool) -> HeldAttempt {
    HeldAttempt {
        task: TaskId {
            job: JobId(job.into()),
            index,
        },
        attempt,
        generation,
        started_at_us: 1_700_000_000_000_000,
        ended,
    }
}

/// A state as a restart leaves it: the job's tasks pending, no executor yet.
fn restarted(tasks: usize) -> ClusterState {
    let config = SchedulingConfig {
        launch_ahead: 0,
        launch_ahead_max: 0,
        ..SchedulingConfig::default()
    };
    let mut state = ClusterState::new(1_000, config, Instant::now(), SystemTime::now());
    assert!(launches(&state.submit_job(job("j", tasks, 1))).is_empty());
    state
}

fn register(
    state: &mut ClusterState,
    n: u32,
    cores: u32,
    held: Vec<HeldAttempt>,
) -> (u64, Vec<Action>) {
    let (generation, mut actions) = state
        .register_executor(exec(n), "h".into(), cores, n, false, held)
        .unwrap();
    actions.extend(state.make_offers());
    (generation, actions)
}

fn reconciled(actions: &[Action]) -> Vec<(u32, Option<Dropped>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Reconciled { task, dropped, .. } => Some((task.index, *dropped)),
            _ => None,
        })
        .collect()
}

fn kills(actions: &[Action]) -> Vec<(ExecutorId, u32, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Kill {
                executor,
                task,
                attempt,
                ..
            } => Some((executor.clone(), task.index, *attempt)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_running_attempt_listed_at_registration_is_adopted_not_launched_again() {
    let mut state = restarted(3);
    let old = 7;
    let (_, actions) = register(
        &mut state,
        1,
        2,
        vec![held("j", 0, 1, old, false), held("j", 1, 2, old, false)],
    );
    assert_eq!(reconciled(&actions), [(0, None), (1, None)]);
    assert!(kills(&actions).is_empty());
    // Both cores are the adopted attempts': the third task waits, nothing runs twice.
    assert!(launches(&actions).is_empty(), "{actions:?}");
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.counts.running, 2);
    assert_eq!(job.counts.pending, 1);
    assert_eq!(job.tasks[1].attempts, 2, "the attempt keeps its number");
    assert_eq!(job.state, JobState::Running);
    assert_eq!(free(&state, 1), 0);
    assert_eq!(job.pending.iter().copied().collect::<Vec<_>>(), [2]);
}

#[test]
fn an_adopted_attempts_end_is_applied_once_under_its_launch_generation() {
    let mut state = restarted(2);
    let (generation, _) = register(&mut state, 1, 1, vec![held("j", 0, 1, 7, true)]);
    let mut end = status("j", 0, 1, Ok(()));
    end.generation = 7;
    let next = launches(&state.status_update(&exec(1), generation, end.clone(), SystemTime::now()));
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.tasks[0].state, TaskState::Succeeded);
    assert_eq!(job.tasks[0].attempts, 1);
    assert_eq!(
        next,
        [(exec(1), 1, 1)],
        "the core it gave back runs the next task"
    );
    // The same end sent again (its acknowledgement was lost): nothing changes.
    let again = state.status_update(&exec(1), generation, end, SystemTime::now());
    assert!(launches(&again).is_empty());
    assert_eq!(state.jobs[&JobId("j".into())].counts.succeeded, 1);
    // An end naming the new registration's generation is not this attempt's.
    let mut forged = status("j", 1, 1, Ok(()));
    forged.generation = 7;
    state.status_update(&exec(1), generation, forged, SystemTime::now());
    assert_eq!(
        state.jobs[&JobId("j".into())].tasks[1].state,
        TaskState::Running
    );
}

#[test]
fn attempts_of_a_gone_job_an_ended_task_or_a_task_running_elsewhere_are_dropped() {
    let mut state = restarted(3);
    // Task 0 ran elsewhere and succeeded; task 1 runs on executor 2 now.
    let (g2, actions) = register(&mut state, 2, 2, Vec::new());
    let placed = launches(&actions);
    assert_eq!(placed.len(), 2);
    finish(&mut state, &placed[0], "j", Ok(()));
    let (_, actions) = register(
        &mut state,
        1,
        2,
        vec![
            held("gone", 0, 1, 7, false),
            held("j", placed[0].1, 1, 7, false),
            held("j", placed[1].1, 1, 7, false),
            held("j", 99, 1, 7, true),
        ],
    );
    assert_eq!(
        reconciled(&actions),
        [
            (0, Some(Dropped::JobGone)),
            (placed[0].1, Some(Dropped::TaskEnded)),
            (placed[1].1, Some(Dropped::RunsElsewhere)),
            (99, Some(Dropped::NoSuchTask)),
        ]
    );
    // Every one still running is killed where it runs; a held end needs no kill.
    assert_eq!(
        kills(&actions),
        [
            (exec(1), 0, 1),
            (exec(1), placed[0].1, 1),
            (exec(1), placed[1].1, 1)
        ]
    );
    assert_eq!(state.executors[&exec(2)].generation, g2);
    assert!(state.executors[&exec(2)].running.contains_key(&TaskId {
        job: JobId("j".into()),
        index: placed[1].1
    }));
}

#[test]
fn a_reconnect_without_a_restart_takes_back_the_attempts_its_loss_put_back() {
    let (mut state, _) = cluster(1, 1);
    let placed = launches(&state.submit_job(job("j", 2, 1)));
    let old = generation_of(&state, &exec(1));
    // The same process registers again before its old connection was seen to close.
    let (_, actions) = state
        .register_executor(
            exec(1),
            "h".into(),
            1,
            1,
            false,
            vec![held("j", placed[0].1, 1, old, false)],
        )
        .unwrap();
    assert_eq!(reconciled(&actions), [(placed[0].1, None)]);
    let actions = state.make_offers();
    assert!(launches(&actions).is_empty(), "no second copy: {actions:?}");
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.tasks[placed[0].1 as usize].state, TaskState::Running);
    assert_eq!(job.counts.pending, 1);
}

#[test]
fn after_a_restart_nothing_restored_launches_until_the_known_executors_are_back() {
    let mut state = restarted(6);
    state.begin_adopting(vec![exec(1), exec(2)], Duration::from_secs(5));
    assert_eq!(state.adoption_waits_for(), Some(vec![exec(1), exec(2)]));
    // An executor the last driver did not know gets nothing of the restored job yet.
    let (_, actions) = register(&mut state, 3, 2, Vec::new());
    assert!(launches(&actions).is_empty(), "{actions:?}");
    // A job submitted after the restart is not held.
    assert_eq!(launches(&state.submit_job(job("new", 1, 1))).len(), 1);
    let (_, actions) = register(&mut state, 1, 2, vec![held("j", 0, 1, 7, false)]);
    assert!(
        launches(&actions).is_empty(),
        "exec-2 may still run the others"
    );
    let (_, actions) = register(&mut state, 2, 2, vec![held("j", 1, 1, 7, false)]);
    assert_eq!(state.adoption_waits_for(), None);
    let placed = launches(&actions);
    // Six cores, two adopted attempts and the new job's task: three free.
    assert_eq!(placed.len(), 3, "the wait is over: {placed:?}");
    assert!(placed.iter().all(|(_, index, _)| *index >= 2));
}

#[test]
fn the_wait_for_executors_that_never_come_back_ends_at_adopt_wait() {
    let mut state = restarted(2);
    state.begin_adopting(vec![exec(1)], Duration::from_secs(5));
    let (_, actions) = register(&mut state, 2, 2, Vec::new());
    assert!(launches(&actions).is_empty());
    let (_, actions) = state.tick(Duration::from_secs(60));
    assert!(launches(&actions).is_empty(), "not due yet");
    state.set_clock(Instant::now() + Duration::from_secs(6), SystemTime::now());
    let (_, actions) = state.tick(Duration::from_secs(60));
    assert_eq!(launches(&actions).len(), 2, "{actions:?}");
    // Nothing is held without executors to wait for, or without a wait.
    let mut state = restarted(1);
    state.begin_adopting(Vec::new(), Duration::from_secs(5));
    assert_eq!(state.adoption_waits_for(), None);
}

#[test]
fn an_end_applied_before_a_reconnect_is_not_counted_again_when_listed() {
    let (mut state, _) = cluster(1, 1);
    let placed = launches(&state.submit_job(job("j", 1, 1)));
    let generation = generation_of(&state, &exec(1));
    // Attempt 1 fails for the host's reasons: applied, the task runs again as attempt 2;
    // the acknowledgement of attempt 1's end is lost with the connection.
    let retry = finish(&mut state, &placed[0], "j", host_error());
    assert_eq!(retry, [(exec(1), 0, 2)]);
    state.executor_lost(&exec(1), generation);
    // The executor registers again listing that end and the retry it runs.
    let listed = vec![
        held("j", 0, 1, generation, true),
        held("j", 0, 2, generation, false),
    ];
    let (g2, actions) = state
        .register_executor(exec(1), "h".into(), 1, 1, false, listed)
        .unwrap();
    assert_eq!(
        reconciled(&actions),
        [(0, Some(Dropped::EndApplied)), (0, None)]
    );
    let mut again = status("j", 0, 1, host_error());
    again.generation = generation;
    state.status_update(&exec(1), g2, again, SystemTime::now());
    let task = &state.jobs[&JobId("j".into())].tasks[0];
    assert_eq!(task.host_failures, 1, "counted once");
    assert_eq!((task.state, task.attempts), (TaskState::Running, 2));
}

#[test]
fn an_attempt_taken_for_lost_comes_back_in_its_own_span() {
    let (mut state, _) = cluster(1, 1);
    let placed = launches(&state.submit_job(job("j", 1, 1)));
    let generation = generation_of(&state, &exec(1));
    state.executor_lost(&exec(1), generation);
    let (_, actions) = state
        .register_executor(
            exec(1),
            "h".into(),
            1,
            1,
            false,
            vec![held("j", placed[0].1, 1, generation, false)],
        )
        .unwrap();
    assert_eq!(reconciled(&actions), [(0, None)]);
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.attempts.len(), 1, "one attempt, one span");
    assert_eq!(job.attempts[0].outcome, None, "running again");
}

#[test]
fn multi_core_attempts_adopted_past_the_cores_never_leave_more_cores_free_than_there_are() {
    let mut state = ClusterState::new(
        1_000,
        SchedulingConfig::default(),
        Instant::now(),
        SystemTime::now(),
    );
    state.submit_job(job("two", 2, 2));
    state.submit_job(job("four", 1, 4));
    let listed = vec![
        held("two", 0, 1, 7, true),
        held("two", 1, 1, 7, true),
        held("four", 0, 1, 7, true),
    ];
    let (generation, _) = state
        .register_executor(exec(1), "h".into(), 4, 1, false, listed)
        .unwrap();
    for (job, index) in [("two", 0), ("two", 1), ("four", 0)] {
        let mut end = status(job, index, 1, Ok(()));
        end.generation = 7;
        state.status_update(&exec(1), generation, end, SystemTime::now());
        assert!(
            free(&state, 1) <= 4,
            "{} free after {job}/{index}",
            free(&state, 1)
        );
    }
    assert_eq!(free(&state, 1), 4);
}

#[test]
fn a_graphs_waiting_job_is_held_through_the_wait_too() {
    let mut state = restarted(1);
    let job = state.jobs.get_mut(&JobId("j".into())).unwrap();
    let task = &mut job.tasks[0];
    set_state(&mut job.counts, task, TaskState::Waiting);
    job.pending.clear();
    state.begin_adopting(vec![exec(1)], Duration::from_secs(5));
    assert_eq!(state.adoption_waits_for(), Some(vec![exec(1)]));
}
