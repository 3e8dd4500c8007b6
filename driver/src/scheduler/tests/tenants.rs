//! Sharing between tenants: weights, core limits, priorities.

use super::*;
use crate::scheduler::tenancy::{Share, Shares};

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
            .map(|&(name, weight, max_cores)| (name.to_owned(), Share { weight, max_cores }))
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
