//! Sharing between tenants: weights, core limits, priorities.

use super::*;
use crate::scheduler::fair_share::{Share, Shares};

/// A launched attempt: (executor, job, task, attempt).
type Launched = (ExecutorId, String, u32, u32);

fn launched(actions: &[Action]) -> Vec<Launched> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Launch {
                executor,
                job,
                launch,
            } => Some((
                executor.clone(),
                job.0.clone(),
                launch.index,
                launch.attempt,
            )),
            _ => None,
        })
        .collect()
}

fn tenant_job(id: &str, tasks: usize, tenant: Option<&str>, priority: i32) -> NewJob {
    let mut job = job(id, tasks, 1);
    job.def.owner = flint_protocol::records::Owner {
        tenant: tenant.map(str::to_owned),
        priority,
    };
    job
}

fn shares(list: &[(&str, f64, Option<u32>)]) -> Shares {
    Shares(
        list.iter()
            .map(|&(name, weight, max_cores)| {
                (
                    name.to_owned(),
                    Share {
                        weight,
                        max_cores,
                        max_task_memory_mb: None,
                        max_task_timeout_ms: None,
                    },
                )
            })
            .collect(),
    )
}

fn end(state: &mut ClusterState, l: &Launched) -> Vec<Launched> {
    let generation = generation_of(state, &l.0);
    launched(&report(
        state,
        &l.0,
        generation,
        status(&l.1, l.2, l.3, Ok(())),
        SystemTime::UNIX_EPOCH,
    ))
}

/// Cores each job's tasks hold, by job id prefix (its tenant's letter).
fn held(running: &[Launched], prefix: &str) -> usize {
    running.iter().filter(|l| l.1.starts_with(prefix)).count()
}

/// Ends the oldest running attempt `rounds` times, launching what each end lets in.
fn churn(state: &mut ClusterState, running: &mut Vec<Launched>, rounds: usize) {
    for _ in 0..rounds {
        let done = running.remove(0);
        let next = end(state, &done);
        running.extend(next);
    }
}

#[test]
fn a_tenants_backlog_gives_way_to_another_tenant_down_to_equal_shares() {
    let (mut state, _) = cluster(4, 2);
    state.config.locality_wait = Duration::ZERO;
    let mut running = launched(&state.submit_job(tenant_job("a-big", 1000, Some("a"), 0)));
    assert_eq!(running.len(), 8, "alone, the backlog takes every core");
    running.extend(launched(&state.submit_job(tenant_job(
        "b-small",
        100,
        Some("b"),
        0,
    ))));
    assert_eq!(held(&running, "b"), 0, "no core is free yet");
    // Each core that frees goes to the tenant below its share until both hold 4.
    churn(&mut state, &mut running, 4);
    assert_eq!((held(&running, "a"), held(&running, "b")), (4, 4));
    churn(&mut state, &mut running, 40);
    assert_eq!((held(&running, "a"), held(&running, "b")), (4, 4));
}

#[test]
fn weights_split_the_cores_and_the_admins_jobs_weigh_one() {
    let (mut state, _) = cluster(4, 2);
    state.config.locality_wait = Duration::ZERO;
    state.set_shares(shares(&[("a", 3.0, None), ("b", 1.0, None)]));
    let mut running = launched(&state.submit_job(tenant_job("b-1", 1000, Some("b"), 0)));
    running.extend(launched(&state.submit_job(tenant_job(
        "a-1",
        1000,
        Some("a"),
        0,
    ))));
    churn(&mut state, &mut running, 40);
    assert_eq!((held(&running, "a"), held(&running, "b")), (6, 2));
    // The admin's jobs (no tenant) come in at weight 1: 8 cores by 3:1:1.
    running.extend(launched(
        &state.submit_job(tenant_job("z-admin", 1000, None, 0)),
    ));
    churn(&mut state, &mut running, 60);
    let split = (
        held(&running, "a"),
        held(&running, "b"),
        held(&running, "z"),
    );
    assert!(
        [(5, 1, 2), (5, 2, 1), (4, 2, 2)].contains(&split),
        "3:1:1 of 8 cores, rounded: {split:?}"
    );
}

#[test]
fn a_tenant_never_holds_more_than_its_max_cores_even_on_an_idle_cluster() {
    let (mut state, _) = cluster(4, 2);
    state.config.locality_wait = Duration::ZERO;
    state.set_shares(shares(&[("a", 1.0, Some(3))]));
    let mut running = launched(&state.submit_job(tenant_job("a-1", 100, Some("a"), 0)));
    assert_eq!(running.len(), 3);
    churn(&mut state, &mut running, 20);
    assert_eq!(running.len(), 3, "each end lets exactly one more in");
    // The rest of the cluster still serves others.
    running.extend(launched(&state.submit_job(tenant_job(
        "b-1",
        100,
        Some("b"),
        0,
    ))));
    assert_eq!(held(&running, "b"), 5);
    // A limit raised in the file lets more in at the next round.
    state.set_shares(shares(&[("a", 1.0, Some(4))]));
    churn(&mut state, &mut running, 10);
    assert_eq!(held(&running, "a"), 4);
}

#[test]
fn within_a_tenant_the_higher_priority_job_goes_first_whenever_it_was_submitted() {
    let (mut state, _) = cluster(1, 2);
    state.config.locality_wait = Duration::ZERO;
    let mut running = launched(&state.submit_job(tenant_job("a-low", 10, Some("a"), 0)));
    assert_eq!(running.len(), 2);
    launched(&state.submit_job(tenant_job("a-high", 4, Some("a"), 5)));
    churn(&mut state, &mut running, 4);
    let order: Vec<&str> = running.iter().map(|l| l.1.as_str()).collect();
    assert_eq!(order, ["a-high", "a-high"], "the newer, higher job first");
    churn(&mut state, &mut running, 2);
    assert!(
        running.iter().all(|l| l.1 == "a-low"),
        "then the low one again: {running:?}"
    );
}

fn kills(actions: &[Action]) -> Vec<(ExecutorId, String, u32, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Kill {
                executor,
                task,
                attempt,
                ..
            } => Some((executor.clone(), task.job.0.clone(), task.index, *attempt)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_tenant_below_its_share_past_the_timeout_gets_the_youngest_attempts_of_the_one_over_it() {
    let (mut state, _) = cluster(4, 2);
    state.config.locality_wait = Duration::ZERO;
    state.config.preemption = Some(Duration::from_millis(100));
    let t0 = state.now();
    let mut running = Vec::new();
    // A's attempts start a millisecond apart: the last ones are the youngest.
    for i in 0..8 {
        state.set_clock(t0 + Duration::from_millis(i), SystemTime::now());
        let placed = launched(&state.submit_job(tenant_job(&format!("a-{i}"), 1, Some("a"), 0)));
        running.extend(placed);
    }
    assert_eq!(running.len(), 8);
    launched(&state.submit_job(tenant_job("b-1", 4, Some("b"), 0)));
    state.set_clock(t0 + Duration::from_millis(60), SystemTime::now());
    assert!(
        kills(&state.make_offers()).is_empty(),
        "b has not waited long"
    );
    state.set_clock(t0 + Duration::from_millis(200), SystemTime::now());
    let killed = kills(&state.make_offers());
    let mut jobs: Vec<&str> = killed.iter().map(|k| k.1.as_str()).collect();
    jobs.sort();
    assert_eq!(
        jobs,
        ["a-4", "a-5", "a-6", "a-7"],
        "A's four youngest, down to its share"
    );
    assert!(
        kills(&state.make_offers()).is_empty(),
        "what is being preempted is not preempted twice"
    );
    // The executors report the kills; B takes the cores, A's tasks wait, unfailed.
    let mut b_launched = Vec::new();
    for (executor, job, index, attempt) in &killed {
        let generation = generation_of(&state, executor);
        let failure = TaskFailure::new(FailureKind::Killed, "killed by the driver");
        let mut ended = status(job, *index, *attempt, Err(failure));
        ended.generation = generation;
        b_launched.extend(launched(&state.status_update(
            executor,
            generation,
            ended,
            SystemTime::UNIX_EPOCH,
        )));
    }
    assert_eq!(held(&b_launched, "b"), 4, "{b_launched:?}");
    let a7 = &state.jobs[&JobId("a-7".into())];
    assert_eq!(a7.tasks[0].state, TaskState::Pending);
    assert_eq!(a7.tasks[0].host_failures, 0, "a preemption is no failure");
    let outcome = a7.attempts.last().unwrap().outcome;
    assert_eq!(outcome, Some(Outcome::Preempted));
    // A at its share (4 of 8) is not preempted further however long B waits.
    launched(&state.submit_job(tenant_job("b-2", 4, Some("b"), 0)));
    state.set_clock(t0 + Duration::from_secs(5), SystemTime::now());
    assert!(kills(&state.make_offers()).is_empty());
}

#[test]
fn without_a_preemption_timeout_nothing_is_ever_killed_for_a_share() {
    let (mut state, _) = cluster(1, 2);
    state.config.locality_wait = Duration::ZERO;
    let t0 = state.now();
    launched(&state.submit_job(tenant_job("a-1", 2, Some("a"), 0)));
    launched(&state.submit_job(tenant_job("b-1", 2, Some("b"), 0)));
    state.set_clock(t0 + Duration::from_secs(3600), SystemTime::now());
    assert!(kills(&state.make_offers()).is_empty());
}

#[test]
fn preemption_takes_back_queued_attempts_first_and_long_tasks_queue_none_while_shared() {
    let config = SchedulingConfig {
        locality_wait: Duration::ZERO,
        preemption: Some(Duration::from_millis(100)),
        ..SchedulingConfig::default()
    };
    let mut state = ClusterState::new(0, config, Instant::now(), SystemTime::now());
    state
        .register_executor(exec(1), "h".into(), 2, 1, false, Vec::new())
        .unwrap();
    let t0 = state.now();
    // Alone, B's tasks of unknown length queue `launch_ahead` deep beyond its 2 cores.
    let mut running = launched(&state.submit_job(tenant_job("b-1", 100, Some("b"), 0)));
    // Queued only once the executor is warm (it has the module): the next round.
    running.extend(launched(&state.make_offers()));
    let ahead = SchedulingConfig::default().launch_ahead as usize;
    assert_eq!(running.len(), 2 + ahead);
    launched(&state.submit_job(tenant_job("a-1", 1, Some("a"), 0)));
    state.set_clock(t0 + Duration::from_millis(200), SystemTime::now());
    let killed = kills(&state.make_offers());
    // The queued ones (the youngest two launched), then one running, for A's one core.
    let mut indices: Vec<u32> = killed.iter().map(|k| k.2).collect();
    indices.sort();
    let mut expected: Vec<u32> = (1..2 + ahead as u32).collect();
    expected.sort();
    assert_eq!(indices, expected, "{killed:?}");
}

#[test]
fn when_every_task_ends_before_the_next_round_what_each_tenant_was_given_decides() {
    // One core: every round finds both tenants holding nothing, so held cores cannot
    // tell them apart; the cores each was given, over its weight, do.
    let (mut state, _) = cluster(1, 1);
    state.config.locality_wait = Duration::ZERO;
    state.set_shares(shares(&[("a", 2.0, None), ("b", 1.0, None)]));
    let mut running = launched(&state.submit_job(tenant_job("a-1", 1000, Some("a"), 0)));
    running.extend(launched(&state.submit_job(tenant_job(
        "b-1",
        1000,
        Some("b"),
        0,
    ))));
    let mut given = (0, 0);
    for _ in 0..300 {
        let done = running.remove(0);
        for next in end(&mut state, &done) {
            match next.1.starts_with('a') {
                true => given.0 += 1,
                false => given.1 += 1,
            }
            running.push(next);
        }
    }
    assert_eq!(given, (200, 100), "2:1 by weight");
}

#[test]
fn shares_of_less_than_a_core_are_not_taken_back_and_forth() {
    // Three tenants on two cores: a share of two thirds each. Whoever waits is owed a
    // core, but nobody holds more than its share rounded up: nothing is preempted, and
    // the one waiting gets a core as they free.
    let (mut state, _) = cluster(2, 1);
    state.config.locality_wait = Duration::ZERO;
    state.config.preemption = Some(Duration::from_millis(10));
    let t0 = state.now();
    let mut running = launched(&state.submit_job(tenant_job("a-1", 10, Some("a"), 0)));
    assert_eq!(running.len(), 2);
    // b comes while a holds both cores: the first to free goes to b.
    launched(&state.submit_job(tenant_job("b-1", 10, Some("b"), 0)));
    let first = running.remove(0);
    running.extend(end(&mut state, &first));
    assert_eq!(held(&running, "a"), 1);
    assert_eq!(held(&running, "b"), 1);
    launched(&state.submit_job(tenant_job("c-1", 10, Some("c"), 0)));
    state.set_clock(t0 + Duration::from_secs(10), SystemTime::now());
    assert!(kills(&state.make_offers()).is_empty());
    // c is owed as much as a (both hold none, both were given as little lately): one of
    // the next two cores is c's, whichever frees first.
    let mut next = Vec::new();
    for _ in 0..2 {
        let done = running.remove(0);
        let launched = end(&mut state, &done);
        running.extend(launched.iter().cloned());
        next.extend(launched);
    }
    assert_eq!(held(&next, "c"), 1, "{next:?}");
}

#[test]
fn nothing_is_preempted_for_tasks_of_several_cores() {
    // B's 2-core tasks would need both cores of one executor: cores freed one here and
    // one there would be killed for nothing, again and again.
    let (mut state, _) = cluster(2, 2);
    state.config.locality_wait = Duration::ZERO;
    state.config.preemption = Some(Duration::from_millis(10));
    let t0 = state.now();
    let running = launched(&state.submit_job(tenant_job("a-1", 100, Some("a"), 0)));
    assert_eq!(running.len(), 4);
    let mut wide = tenant_job("b-1", 10, Some("b"), 0);
    wide.def.resources.cores = 2;
    launched(&state.submit_job(wide));
    state.set_clock(t0 + Duration::from_secs(10), SystemTime::now());
    assert!(kills(&state.make_offers()).is_empty());
}
