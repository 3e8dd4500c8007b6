//! Placement: which pending tasks go to which executor's free cores. Pure, so its
//! invariants are property-tested rather than hoped for.
//!
//! Spark's makeOffers in one function: every live executor offers its free cores; jobs are
//! served in the order given (oldest first, or in fair mode fewest running first); a task needing `c` cores goes only to an executor with at
//! least `c` free, which then has `c` fewer; consecutive placements rotate across
//! executors so that load spreads instead of piling onto the first one.
//!
//! Three refinements, each Spark's:
//! - exclusion (`excludeOnFailure`): an offer that is not `usable` (its executor is
//!   excluded for a period) takes nothing, and a constrained task never goes to an offer
//!   it is barred from (an executor it failed on twice, or one already running it);
//! - delay scheduling: a job's tasks go to `warm` offers (executors that already ran its
//!   module, so it is fetched and compiled there) and to cold ones only once
//!   `cold_allowed` says the job's locality wait is over;
//! - speculative copies are constrained tasks barred from where the task already runs.
//!
//! Launch pipelining: an offer may also have `ahead` slots, 1-core tasks it takes beyond
//! its free cores and queues for its task threads, so that a thread that finishes one
//! task finds the next one waiting instead of waiting a round trip for it. A task goes to
//! an idle core anywhere it may before it queues behind another; it queues only on a warm
//! executor (one compiling a module while it runs other tasks would compile under a
//! wall-clock limit against them); and a task needing more than one core never shares an
//! executor with queued ones (the executor runs whatever it is given on as many threads
//! as it has cores).

mod queue_slots;

use queue_slots::QueueSlots;

/// An executor's free cores at this moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub free_cores: u32,
    /// The executor meters fuel, so it may run tasks with fuel budgets.
    pub meters_fuel: bool,
    /// False for an executor excluded for a period: it takes nothing.
    pub usable: bool,
    /// 1-core tasks it may take beyond its free cores, queued for its task threads.
    pub ahead: u32,
    /// Of those, what a job whose run time is not known yet may take: the executor's
    /// queue up to `launch_ahead` and no deeper (its tasks may be long: nothing should
    /// wait far behind them).
    pub ahead_unknown: u32,
}

/// A job's pending tasks, all needing `cores` cores each.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Demand {
    pub cores: u32,
    /// Tasks that may go to any offer; placed after the constrained ones.
    pub count: usize,
    /// Tasks barred from some offers (indices into the offers), placed first in order.
    pub constrained: Vec<Vec<usize>>,
    /// The tasks have fuel budgets: only executors that meter fuel may take them.
    pub needs_fuel: bool,
    /// Per offer: the executor already ran this job's module. Empty: none did.
    pub warm: Vec<bool>,
    /// Cold offers may take tasks too (the locality wait is over, or nothing is warm).
    pub cold_allowed: bool,
    /// An executor that is not offered now (it has no room) already ran the module:
    /// worth waiting for, like a warm offer.
    pub warm_elsewhere: bool,
    /// No attempt of the job has ended yet: it queues only in `Offer::ahead_unknown`.
    pub run_time_unknown: bool,
}

/// One task of demand `demand` goes to offer `offer`; `constrained` says which of the
/// demand's constrained tasks, `None` for the next unconstrained one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub demand: usize,
    pub offer: usize,
    pub constrained: Option<usize>,
}

/// What placement decided: the launches, and which demands held tasks back from a cold
/// offer that had room (their locality wait is running).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub placements: Vec<Placement>,
    pub waiting_for_locality: Vec<bool>,
}

impl Demand {
    fn is_warm(&self, offer: usize) -> bool {
        self.warm.get(offer).copied().unwrap_or(false)
    }
}

/// Whether a task barred from `barred` may go to a cold offer.
fn cold_allowed(demand: &Demand, barred: &[usize]) -> bool {
    demand.cold_allowed
        || !(demand.warm_elsewhere
            || (0..demand.warm.len()).any(|e| demand.is_warm(e) && !barred.contains(&e)))
}

/// Fills `offers` from `demands` in order.
pub fn place(offers: &[Offer], demands: &[Demand]) -> Plan {
    let mut free: Vec<u32> = offers
        .iter()
        .map(|o| if o.usable { o.free_cores } else { 0 })
        .collect();
    let mut slots = QueueSlots::of(offers);
    let mut plan = Plan {
        placements: Vec::new(),
        waiting_for_locality: vec![false; demands.len()],
    };
    if free.is_empty() {
        return plan;
    }
    let n = free.len();
    let mut cursor = 0;
    for (d, demand) in demands.iter().enumerate() {
        if demand.cores == 0 {
            continue;
        }
        let fits = |free: &[u32], e: usize, barred: &[usize]| {
            free[e] >= demand.cores
                && (offers[e].meters_fuel || !demand.needs_fuel)
                && !barred.contains(&e)
        };
        // Warm offers first; cold ones only when allowed, or when every warm offer is
        // barred to the task (waiting for those would be waiting for nothing).
        let choose_in = |room: &[u32], cursor: usize, barred: &[usize]| {
            let order = (0..n).map(|k| (cursor + k) % n);
            order
                .clone()
                .find(|&e| demand.is_warm(e) && fits(room, e, barred))
                .or_else(|| {
                    cold_allowed(demand, barred)
                        .then(|| order.clone().find(|&e| fits(room, e, barred)))
                        .flatten()
                })
        };
        // An idle core first; a queue slot only for 1-core tasks, only on a warm
        // executor and only when no idle core may take the task.
        let choose = |free: &[u32], ahead: &[u32], cursor: usize, barred: &[usize]| {
            choose_in(free, cursor, barred)
                .map(|e| (e, false))
                .or_else(|| {
                    (demand.cores == 1)
                        .then(|| {
                            (0..n)
                                .map(|k| (cursor + k) % n)
                                .find(|&e| demand.is_warm(e) && fits(ahead, e, barred))
                                .map(|e| (e, true))
                        })
                        .flatten()
                })
        };
        let room = |free: &[u32], ahead: &[u32], e: usize| {
            let queue = demand.cores == 1 && demand.is_warm(e);
            free[e] + if queue { ahead[e] } else { 0 }
        };
        let mut unplaced = 0;
        let tasks = demand
            .constrained
            .iter()
            .enumerate()
            .map(|(c, barred)| (Some(c), barred.as_slice()))
            .chain(std::iter::repeat_n((None, &[][..]), demand.count));
        for (constrained, barred) in tasks {
            let queue = slots.of_demand(demand);
            if (0..n).all(|e| room(&free, queue, e) < demand.cores) {
                unplaced += 1;
                break;
            }
            let Some((e, queued)) = choose(&free, queue, cursor, barred) else {
                unplaced += 1;
                if constrained.is_none() {
                    // Unconstrained tasks are alike: if one does not fit, none will.
                    break;
                }
                continue;
            };
            if !queued {
                free[e] -= demand.cores;
            }
            slots.placed(e, queued, demand);
            plan.placements.push(Placement {
                demand: d,
                offer: e,
                constrained,
            });
            cursor = (e + 1) % n;
        }
        plan.waiting_for_locality[d] = unplaced > 0
            && !demand.cold_allowed
            && (0..n).any(|e| !demand.is_warm(e) && fits(&free, e, &[]));
        if free.iter().chain(&slots.any).all(|&f| f == 0) {
            break;
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn offers(free: &[u32]) -> Vec<Offer> {
        free.iter()
            .map(|&free_cores| Offer {
                free_cores,
                meters_fuel: false,
                usable: true,
                ahead: 0,
                ahead_unknown: 0,
            })
            .collect()
    }

    fn demand(cores: u32, count: usize) -> Demand {
        Demand {
            cores,
            count,
            cold_allowed: true,
            ..Demand::default()
        }
    }

    fn targets(plan: &Plan) -> Vec<usize> {
        plan.placements.iter().map(|p| p.offer).collect()
    }

    #[test]
    fn budgeted_tasks_go_only_to_executors_that_meter_fuel() {
        let mut metered = offers(&[2, 2]);
        metered[1].meters_fuel = true;
        let plan = place(
            &metered,
            &[Demand {
                needs_fuel: true,
                ..demand(1, 3)
            }],
        );
        assert_eq!(targets(&plan), vec![1, 1]);
    }

    #[test]
    fn two_core_tasks_take_a_whole_two_core_executor_each() {
        let plan = place(&offers(&[2, 2]), &[demand(2, 5)]);
        assert_eq!(targets(&plan), vec![0, 1]);
    }

    #[test]
    fn placements_rotate_across_executors() {
        let plan = place(&offers(&[2, 2, 2]), &[demand(1, 4)]);
        assert_eq!(targets(&plan), vec![0, 1, 2, 0]);
    }

    #[test]
    fn a_later_smaller_job_fills_what_a_larger_one_cannot_use() {
        let plan = place(&offers(&[1, 1]), &[demand(2, 3), demand(1, 3)]);
        assert_eq!(plan.placements.len(), 2);
        assert!(plan.placements.iter().all(|p| p.demand == 1));
    }

    #[test]
    fn excluded_executors_and_barred_offers_take_nothing() {
        let mut all = offers(&[1, 1, 1]);
        all[0].usable = false;
        let plan = place(
            &all,
            &[Demand {
                constrained: vec![vec![1], vec![1, 2]],
                ..demand(1, 5)
            }],
        );
        // The first retry avoids exec 1, the second has nowhere to go, the rest fill up.
        assert_eq!(
            plan.placements,
            vec![
                Placement {
                    demand: 0,
                    offer: 2,
                    constrained: Some(0)
                },
                Placement {
                    demand: 0,
                    offer: 1,
                    constrained: None
                },
            ]
        );
    }

    #[test]
    fn a_job_waits_for_its_warm_executors_until_cold_ones_are_allowed() {
        let waiting = Demand {
            warm: vec![false, true],
            cold_allowed: false,
            ..demand(1, 3)
        };
        let plan = place(&offers(&[2, 1]), std::slice::from_ref(&waiting));
        assert_eq!(targets(&plan), vec![1]);
        assert_eq!(plan.waiting_for_locality, vec![true]);
        let plan = place(
            &offers(&[2, 1]),
            &[Demand {
                cold_allowed: true,
                ..waiting
            }],
        );
        assert_eq!(targets(&plan), vec![1, 0, 0], "warm first, then anywhere");
        assert_eq!(plan.waiting_for_locality, vec![false]);
    }

    #[test]
    fn one_core_tasks_queue_ahead_only_once_every_idle_core_is_taken() {
        let mut all = offers(&[1, 0, 0]);
        all[0].ahead = 1;
        all[1].ahead = 2;
        all[2].ahead = 2;
        let warm = Demand {
            warm: vec![true, true, false],
            ..demand(1, 6)
        };
        let plan = place(&all, std::slice::from_ref(&warm));
        assert_eq!(
            targets(&plan),
            vec![0, 1, 0, 1],
            "never queued where it is cold"
        );
        // A 2-core task never queues, and never joins queued tasks.
        let plan = place(&all, &[demand(2, 1)]);
        assert!(plan.placements.is_empty());
        let mut two = offers(&[2]);
        two[0].ahead = 2;
        let plan = place(&two, &[demand(2, 1), demand(1, 2)]);
        assert_eq!(plan.placements.len(), 1, "{plan:?}");
    }

    fn arb_demand() -> impl Strategy<Value = Demand> {
        (
            1u32..4,
            0usize..8,
            proptest::collection::vec(proptest::collection::vec(0usize..6, 0..3), 0..3),
            any::<bool>(),
            proptest::collection::vec(any::<bool>(), 0..6),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                |(cores, count, constrained, needs_fuel, warm, cold_allowed, warm_elsewhere)| {
                    Demand {
                        cores,
                        count,
                        constrained,
                        needs_fuel,
                        warm,
                        cold_allowed,
                        warm_elsewhere,
                        // The model below checks queue room by `ahead`; the cap on
                        // jobs of unknown run time has its own test.
                        run_time_unknown: false,
                    }
                },
            )
    }

    #[test]
    fn a_job_of_unknown_run_time_queues_only_up_to_launch_ahead_and_a_known_one_deeper() {
        let mut one = offers(&[0]);
        one[0].ahead = 8;
        one[0].ahead_unknown = 2;
        // Only a warm executor queues.
        let warm = |count| Demand {
            warm: vec![true],
            ..demand(1, count)
        };
        let unknown = Demand {
            run_time_unknown: true,
            ..warm(5)
        };
        let plan = place(&one, &[unknown.clone(), warm(10)]);
        let by = |d: usize| plan.placements.iter().filter(|p| p.demand == d).count();
        assert_eq!((by(0), by(1)), (2, 6), "{plan:?}");
        // A known job first takes the slots the unknown one could have had.
        let plan = place(&one, &[warm(7), unknown]);
        let by = |d: usize| plan.placements.iter().filter(|p| p.demand == d).count();
        assert_eq!((by(0), by(1)), (7, 1), "{plan:?}");
    }

    proptest! {
        #[test]
        fn never_over_commits_never_uses_excluded_barred_or_cold_offers_and_fills_in_order(
            all in proptest::collection::vec(
                (0u32..8, any::<bool>(), any::<bool>(), 0u32..3).prop_map(|(free_cores, meters_fuel, usable, ahead)| Offer {
                    free_cores,
                    meters_fuel,
                    usable,
                    ahead,
                    ahead_unknown: ahead.min(1),
                }),
                0..6,
            ),
            demands in proptest::collection::vec(arb_demand(), 0..5),
        ) {
            let plan = place(&all, &demands);
            let allowed = |d: &Demand, e: usize, barred: &[usize]| {
                all[e].usable
                    && (all[e].meters_fuel || !d.needs_fuel)
                    && (d.is_warm(e) || cold_allowed(d, barred))
            };
            // Replays the placements: each takes an idle core if its offer has one, else
            // a queue slot, which only 1-core tasks may take, only when no idle core
            // anywhere was allowed to take the task, and never beside a multi-core task.
            let mut free: Vec<u32> = all.iter().map(|o| o.free_cores).collect();
            let mut ahead: Vec<u32> = all.iter().map(|o| o.ahead).collect();
            let mut multi = vec![false; all.len()];
            let mut queued = vec![false; all.len()];
            // Per demand, the offers' room once that demand had been served.
            let mut after: Vec<(Vec<u32>, Vec<u32>)> = Vec::new();
            let mut unconstrained = vec![0usize; demands.len()];
            let mut seen = std::collections::HashSet::new();
            let mut placements = plan.placements.iter().peekable();
            for (d_index, _) in demands.iter().enumerate() {
                while let Some(p) = placements.next_if(|p| p.demand == d_index) {
                    let d = &demands[p.demand];
                    let barred = p.constrained.map_or(&[][..], |c| &d.constrained[c][..]);
                    prop_assert!(allowed(d, p.offer, barred), "placed where not allowed: {p:?}");
                    if free[p.offer] >= d.cores {
                        free[p.offer] -= d.cores;
                        if d.cores > 1 {
                            prop_assert!(!queued[p.offer], "multi-core beside queued: {p:?}");
                            multi[p.offer] = true;
                        }
                    } else {
                        prop_assert!(d.cores == 1, "over-committed: {p:?}");
                        prop_assert!(d.is_warm(p.offer), "queued on a cold executor: {p:?}");
                        prop_assert!(ahead[p.offer] > 0, "over-committed queue: {p:?}");
                        prop_assert!(!multi[p.offer], "queued beside multi-core: {p:?}");
                        prop_assert!(
                            (0..all.len()).all(|e| free[e] == 0 || !allowed(d, e, barred) || barred.contains(&e)),
                            "queued while an idle core could take it: {p:?}"
                        );
                        ahead[p.offer] -= 1;
                        queued[p.offer] = true;
                    }
                    match p.constrained {
                        Some(c) => {
                            prop_assert!(!d.constrained[c].contains(&p.offer), "barred: {p:?}");
                            prop_assert!(seen.insert((p.demand, c)), "placed twice: {p:?}");
                        }
                        None => unconstrained[p.demand] += 1,
                    }
                }
                after.push((free.clone(), ahead.clone()));
            }
            prop_assert!(placements.next().is_none(), "placements out of job order");
            for (d, demand) in demands.iter().enumerate() {
                prop_assert!(unconstrained[d] <= demand.count);
                // A demand left short means no allowed executor had room for one more
                // of its tasks once it had been served: nothing was skipped that fit.
                if unconstrained[d] < demand.count {
                    let (free, ahead) = &after[d];
                    let full = (0..all.len()).all(|e| {
                        let queue = demand.cores == 1 && !multi[e] && demand.is_warm(e);
                        let room = free[e] + if queue { ahead[e] } else { 0 };
                        room < demand.cores || !allowed(demand, e, &[])
                    });
                    prop_assert!(full, "demand {d} left short with room: {plan:?}");
                }
                prop_assert!(!plan.waiting_for_locality[d] || !demand.cold_allowed);
            }
            // FIFO: placements of an earlier job come before those of a later one.
            prop_assert!(plan.placements.windows(2).all(|w| w[0].demand <= w[1].demand));
        }
    }
}
