//! A round's phases and its post-conditions, looked at directly.

use std::time::{Instant, SystemTime};

use super::*;
use crate::scheduler::tests::job;

fn exec(n: u32) -> ExecutorId {
    ExecutorId(format!("exec-{n}"))
}

/// Two executors of two cores, one with a core taken, and a job of `tasks` 1-core tasks
/// inserted without a round, its module warm on both (only a warm executor queues); each
/// queues up to two tasks.
fn state(tasks: usize) -> ClusterState {
    let config = SchedulingConfig {
        launch_ahead: 2,
        launch_ahead_max: 2,
        ..SchedulingConfig::default()
    };
    let mut state = ClusterState::new(0, config, Instant::now(), SystemTime::UNIX_EPOCH);
    for n in 1..=2 {
        state
            .register_executor(exec(n), "h".into(), 2, n, false, Vec::new())
            .expect("a new id");
    }
    state
        .executors
        .get_mut(&exec(2))
        .expect("registered")
        .free_cores = 1;
    state.insert_job(job("j", tasks, 1));
    let module = state.jobs[&JobId("j".into())].locality;
    for e in state.executors.values_mut() {
        e.remember_module(module);
    }
    state
}

/// The executors and offers a full round on `state` makes, then the round's actions.
fn round(state: &mut ClusterState) -> (Vec<ExecutorId>, Vec<Offer>, Vec<Action>) {
    let round = state.round();
    let ids = state.executors_with_room(None, &round);
    let offers = state.offers(&ids, &round);
    let actions = state.make_offers();
    (ids, offers, actions)
}

#[test]
fn a_round_offers_free_cores_and_queue_slots_and_keeps_within_them() {
    let mut state = state(10);
    let (ids, offers, actions) = round(&mut state);
    assert_eq!(ids, [exec(1), exec(2)]);
    let offered: Vec<(u32, u32)> = offers.iter().map(|o| (o.free_cores, o.ahead)).collect();
    assert_eq!(offered, [(2, 2), (1, 2)]);
    let launches = actions
        .iter()
        .filter(|a| matches!(a, Action::Launch { .. }))
        .count();
    assert_eq!(launches, 7, "every free core and every queue slot");
    assert_eq!(state.check_round(&ids, &offers, &actions), Ok(()));
    // Full now: the next round offers nothing.
    let (ids, _, actions) = round(&mut state);
    assert!(ids.is_empty() && actions.is_empty());
}

#[test]
fn the_post_conditions_catch_a_round_that_gave_more_than_was_offered() {
    let mut state = state(10);
    let (ids, offers, actions) = round(&mut state);
    let fewer_slots: Vec<Offer> = (offers.iter()).map(|o| Offer { ahead: 1, ..*o }).collect();
    let err = state.check_round(&ids, &fewer_slots, &actions).unwrap_err();
    assert!(err.starts_with("exec-1 was given 4 cores"), "{err}");
    let fewer_cores: Vec<Offer> = (offers.iter())
        .map(|o| Offer {
            free_cores: 0,
            ..*o
        })
        .collect();
    assert!(state.check_round(&ids, &fewer_cores, &actions).is_err());
    let err = state
        .check_round(&ids[1..], &offers[1..], &actions)
        .unwrap_err();
    assert!(err.contains("exec-1, which was not offered"), "{err}");
}

#[test]
fn a_round_for_one_executor_offers_only_it() {
    let mut state = state(1);
    let round = state.round();
    assert_eq!(state.executors_with_room(Some(&exec(2)), &round), [exec(2)]);
    state
        .executors
        .get_mut(&exec(2))
        .expect("registered")
        .free_cores = 0;
    state
        .executors
        .get_mut(&exec(2))
        .expect("registered")
        .queued_ahead = 2;
    assert!(state.executors_with_room(Some(&exec(2)), &round).is_empty());
}
