//! Placement: locality, speculation, lost executors, kills, definitions, queue depth
//! and the order jobs are served in.

use super::*;

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
    state.set_clock(t0 + Duration::from_millis(50), SystemTime::now());
    assert!(launches(&state.make_offers()).is_empty());
    let next = finish(&mut state, &first[0], "a", Ok(()));
    assert_eq!(next, vec![(exec(1), 0, 1)], "the warm executor takes one");
    state.set_clock(t0 + state.config.locality_wait, SystemTime::now());
    let late = launches(&state.make_offers());
    assert_eq!(
        late,
        vec![(exec(2), 1, 1)],
        "the wait is over: the cold one too"
    );
    let module = job("b", 1, 1).def.module.locality_key();
    assert!(state.executors[&exec(2)].modules.contains(&module));
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
    state.set_clock(t0 + Duration::from_millis(200), SystemTime::now());
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
    // Its timeline: the original killed, the copy marked and the winner.
    let spans: Vec<_> = job
        .attempts
        .iter()
        .filter(|s| s.task == slow.1)
        .map(|s| {
            (
                s.attempt,
                s.speculative,
                s.outcome,
                job.attempt_executors[s.executor as usize].clone(),
            )
        })
        .collect();
    assert_eq!(
        spans,
        vec![
            (
                1,
                false,
                Some(Outcome::Failed(FailureKind::Killed)),
                exec(1)
            ),
            (2, true, Some(Outcome::Succeeded), exec(2)),
        ]
    );
    assert_eq!(job.attempts.len(), 5, "four tasks, one copy");
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
    state.set_clock(t0 + Duration::from_millis(200), SystemTime::now());
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
    state.set_clock(t0 + Duration::from_secs(7), SystemTime::now());
    state.heartbeat(&exec(2), gens[1], None);
    let (expired, _) = state.expire_executors(timeout);
    assert!(expired.is_empty(), "nobody is late yet");
    state.set_clock(t0 + Duration::from_secs(9), SystemTime::now());
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
        .register_executor(exec(1), "h".into(), 1, 1, false, Vec::new())
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

    // A second job whose run time is unknown queues only up to launch_ahead (2) of the
    // executor's queue: with 7 queued it gets none, and the known job keeps its depth.
    state.submit_job(job("new", 10, 1));
    let next = ended(&mut state, "short", &placed[1], 10);
    assert_eq!(
        next.len(),
        1,
        "one ended, one more of short queued: {next:?}"
    );
    assert_eq!(state.executors[&exec(1)].queued_ahead, 8);
    let new_running = state.executors[&exec(1)]
        .running
        .keys()
        .filter(|t| t.job.0 == "new")
        .count();
    assert_eq!(new_running, 0, "nothing of the unknown job queued 8 deep");

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
    state.set_clock(state.now() + Duration::from_millis(3), SystemTime::now());
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

#[test]
fn a_module_by_url_with_anothers_digest_is_not_warm_where_the_other_ran() {
    // Job a ran its (uploaded) module on exec-1. Job b names a URL with that module's
    // digest: placement must not prefer exec-1 for it (which would tell b where a's
    // module ran), and must wait for no warm executor.
    let (mut state, _) = cluster(2, 1);
    let first = launches(&state.submit_job(job("a", 1, 1)));
    assert_eq!(first, vec![(exec(1), 0, 1)]);
    finish(&mut state, &first[0], "a", Ok(()));
    let mut by_url = job("b", 2, 1);
    by_url.def.module.url = "https://example.com/m.wasm".into();
    by_url.def.module.size = None;
    let placed = launches(&state.submit_job(by_url));
    assert_eq!(
        placed.len(),
        2,
        "both executors are as cold for it: {placed:?}"
    );
}
