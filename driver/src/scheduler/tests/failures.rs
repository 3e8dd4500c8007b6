//! Failures: retries, what counts against an executor, and exclusion.

use super::*;

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
    state.set_clock(t0 + Duration::from_secs(61), SystemTime::now());
    let next = launches(&state.make_offers());
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].0, exec(1));
}

/// The launches in `actions`, with the budget each carries (None: the job's).
fn budgets(actions: &[Action]) -> Vec<(u32, Option<(u32, u64)>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Launch { launch, .. } => Some((
                launch.attempt,
                launch.resources.map(|r| (r.memory_mb, r.timeout_ms)),
            )),
            _ => None,
        })
        .collect()
}

fn escalating(memory: f64, timeout: f64) -> NewJob {
    let mut job = job("j", 1, 1);
    job.def.resources.memory_mb = 128;
    job.def.resources.timeout_ms = 1_000;
    job.def.max_failures = 4;
    job.def.options.escalate = Some(flint_protocol::records::Escalation {
        memory,
        timeout,
        max_memory_mb: 512,
        max_timeout_ms: 2_500,
    });
    job
}

fn failed(kind: FailureKind, peak_memory_bytes: u64) -> TaskStatus {
    let mut s = status("j", 0, 0, Err(TaskFailure::new(kind, "over")));
    s.end.usage.peak_memory_bytes = peak_memory_bytes;
    s
}

/// Reports `status` for the attempt `placed` and returns the actions.
fn end_with(state: &mut ClusterState, attempt: u32, mut s: TaskStatus) -> Vec<Action> {
    let generation = generation_of(state, &exec(1));
    s.attempt = attempt;
    report(state, &exec(1), generation, s, SystemTime::UNIX_EPOCH)
}

#[test]
fn a_task_out_of_memory_retries_with_its_memory_doubled_up_to_the_cap_then_fails() {
    let (mut state, _) = cluster(1, 1);
    let first = state.submit_job(escalating(2.0, 1.0));
    assert_eq!(
        budgets(&first),
        [(1, None)],
        "the first attempt has the job's"
    );
    let second = end_with(&mut state, 1, failed(FailureKind::MemoryLimit, 128 << 20));
    assert_eq!(budgets(&second), [(2, Some((256, 1_000)))]);
    let third = end_with(&mut state, 2, failed(FailureKind::MemoryLimit, 256 << 20));
    assert_eq!(budgets(&third), [(3, Some((512, 1_000)))]);
    // At the cap (512): no bigger budget to give, so the task fails.
    let after = end_with(&mut state, 3, failed(FailureKind::MemoryLimit, 512 << 20));
    assert!(budgets(&after).is_empty());
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.state, JobState::Failed);
    let budgets: Vec<(u32, u32)> = job
        .attempts
        .iter()
        .map(|a| (a.attempt, a.memory_mb))
        .collect();
    assert_eq!(
        budgets,
        [(1, 128), (2, 256), (3, 512)],
        "each attempt's budget kept"
    );
}

#[test]
fn a_task_that_times_out_retries_with_more_time_and_succeeds() {
    let (mut state, _) = cluster(1, 1);
    state.submit_job(escalating(1.0, 2.0));
    let second = end_with(&mut state, 1, failed(FailureKind::Timeout, 0));
    assert_eq!(budgets(&second), [(2, Some((128, 2_000)))]);
    let third = end_with(&mut state, 2, failed(FailureKind::Timeout, 0));
    assert_eq!(
        budgets(&third),
        [(3, Some((128, 2_500)))],
        "held to max_timeout_ms"
    );
    end_with(&mut state, 3, status("j", 0, 3, Ok(())));
    assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Succeeded);
}

#[test]
fn escalation_is_bounded_by_max_failures_and_cures_nothing_else() {
    let (mut state, _) = cluster(1, 1);
    let mut job = escalating(2.0, 2.0);
    job.def.options.escalate.as_mut().unwrap().max_memory_mb = 4096;
    job.def.max_failures = 2;
    state.submit_job(job);
    let second = end_with(&mut state, 1, failed(FailureKind::MemoryLimit, 0));
    assert_eq!(budgets(&second), [(2, Some((256, 1_000)))]);
    // Two attempts are all max_failures allows, however much memory is left to give.
    assert!(
        budgets(&end_with(
            &mut state,
            2,
            failed(FailureKind::MemoryLimit, 0)
        ))
        .is_empty()
    );
    assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Failed);

    // A guest's other failures are not retried, escalation or not.
    let (mut state, _) = cluster(1, 1);
    state.submit_job(escalating(2.0, 2.0));
    assert!(budgets(&end_with(&mut state, 1, failed(FailureKind::Exit, 0))).is_empty());
    assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Failed);

    // Without escalation, running out of memory fails the task at once.
    let (mut state, _) = cluster(1, 1);
    state.submit_job(job_without_escalation());
    assert!(
        budgets(&end_with(
            &mut state,
            1,
            failed(FailureKind::MemoryLimit, 0)
        ))
        .is_empty()
    );
    assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Failed);
}

fn job_without_escalation() -> NewJob {
    let mut job = escalating(2.0, 2.0);
    job.def.options.escalate = None;
    job
}

#[test]
fn an_escalated_retry_stops_at_its_tenants_task_limits_even_lowered_after_acceptance() {
    let (mut state, _) = cluster(1, 1);
    let mut job = escalating(16.0, 16.0);
    job.def.owner.tenant = Some("t".into());
    // Caps as a tenants file allowed when the job was accepted...
    let escalation = job.def.options.escalate.as_mut().unwrap();
    escalation.max_memory_mb = 4096;
    escalation.max_timeout_ms = 3_600_000;
    state.submit_job(job);
    // ...and the file lowered since.
    let limited = fair_share::Share {
        weight: 1.0,
        max_cores: None,
        max_task_memory_mb: Some(200),
        max_task_timeout_ms: Some(5_000),
    };
    state.set_shares(fair_share::Shares(
        [("t".to_owned(), limited)].into_iter().collect(),
    ));
    let second = end_with(&mut state, 1, failed(FailureKind::MemoryLimit, 0));
    assert_eq!(budgets(&second), [(2, Some((200, 1_000)))], "not 2048");
    // At the tenant's limit: nothing more to give, the task fails.
    assert!(
        budgets(&end_with(
            &mut state,
            2,
            failed(FailureKind::MemoryLimit, 0)
        ))
        .is_empty()
    );
    assert_eq!(state.jobs[&JobId("j".into())].state, JobState::Failed);

    let (mut state, _) = cluster(1, 1);
    let mut job = escalating(1.0, 16.0);
    job.def.owner.tenant = Some("t".into());
    job.def.options.escalate.as_mut().unwrap().max_timeout_ms = 3_600_000;
    state.submit_job(job);
    state.set_shares(fair_share::Shares(
        [("t".to_owned(), limited)].into_iter().collect(),
    ));
    let second = end_with(&mut state, 1, failed(FailureKind::Timeout, 0));
    assert_eq!(budgets(&second), [(2, Some((128, 5_000)))], "not 16 s");
}

#[test]
fn a_retry_runs_on_the_earlier_attempts_pins_without_its_recorded_requests() {
    let (mut state, _) = cluster(1, 1);
    let placed = launches(&state.submit_job(job("j", 1, 1)));
    let generation = generation_of(&state, &placed[0].0);
    let mut failed = status("j", 0, 1, host_error());
    let tape = flint_protocol::BlockRef {
        id: "j/0-1-1.egress".into(),
        size: 10,
        digest: Digest::of(b"tape"),
    };
    failed.end.pins = Some(Box::new(flint_protocol::Pins {
        module: Digest::of(b"m"),
        files: vec![Digest::of(b"f")],
        input: Digest::of(b""),
        egress: vec![flint_protocol::EgressPin {
            method: "GET".into(),
            url: "http://api.example/".into(),
            request_sha256: Digest::of(b""),
            status: 200,
            response: Digest::of(b"r"),
            offset: 0,
            len: 10,
        }],
        egress_tape: Some(tape),
    }));
    let actions = report(
        &mut state,
        &exec(1),
        generation,
        failed,
        SystemTime::UNIX_EPOCH,
    );
    let pins = actions
        .iter()
        .find_map(|a| match a {
            Action::Launch { launch, .. } => Some(launch.pins.clone()),
            _ => None,
        })
        .expect("the task is retried")
        .expect("pinned to the first attempt's bytes");
    assert_eq!(
        (pins.module, pins.files.clone(), pins.input),
        (Digest::of(b"m"), vec![Digest::of(b"f")], Digest::of(b""))
    );
    assert!(pins.egress.is_empty(), "{:?}", pins.egress);
    assert_eq!(pins.egress_tape, None);
    // The attempt's own pins keep what it was answered, for its view and replay.
    let job = &state.jobs[&JobId("j".into())];
    assert_eq!(job.pins.values().next().unwrap().egress.len(), 1);
}
