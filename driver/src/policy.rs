//! Placement: which pending tasks go to which executor's free cores. Pure, so its
//! invariants are property-tested rather than hoped for.
//!
//! Spark's makeOffers in one function: every live executor offers its free cores; jobs are
//! served first-in first-out; a task needing `c` cores goes only to an executor with at
//! least `c` free, which then has `c` fewer; consecutive placements rotate across
//! executors so that load spreads instead of piling onto the first one.

/// An executor's free cores at this moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub free_cores: u32,
    /// The executor meters fuel, so it may run tasks with fuel budgets.
    pub meters_fuel: bool,
}

/// A job's pending tasks: `count` tasks needing `cores` cores each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    pub cores: u32,
    pub count: usize,
    /// The tasks have fuel budgets: only executors that meter fuel may take them.
    pub needs_fuel: bool,
}

/// One task of demand `demand` goes to offer `offer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub demand: usize,
    pub offer: usize,
}

/// Fills `offers` from `demands` in order. Returns placements in launch order.
pub fn place(offers: &[Offer], demands: &[Demand]) -> Vec<Placement> {
    let mut free: Vec<u32> = offers.iter().map(|o| o.free_cores).collect();
    let mut placements = Vec::new();
    if free.is_empty() {
        return placements;
    }
    let mut cursor = 0;
    for (d, demand) in demands.iter().enumerate() {
        if demand.cores == 0 {
            continue;
        }
        for _ in 0..demand.count {
            let fits = (0..free.len())
                .map(|k| (cursor + k) % free.len())
                .find(|&e| {
                    free[e] >= demand.cores && (offers[e].meters_fuel || !demand.needs_fuel)
                });
            let Some(e) = fits else { break };
            free[e] -= demand.cores;
            placements.push(Placement {
                demand: d,
                offer: e,
            });
            cursor = (e + 1) % free.len();
        }
        if free.iter().all(|&f| f == 0) {
            break;
        }
    }
    placements
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
            })
            .collect()
    }

    fn demand(cores: u32, count: usize) -> Demand {
        Demand {
            cores,
            count,
            needs_fuel: false,
        }
    }

    #[test]
    fn budgeted_tasks_go_only_to_executors_that_meter_fuel() {
        let mut metered = offers(&[2, 2]);
        metered[1].meters_fuel = true;
        let placed = place(
            &metered,
            &[Demand {
                cores: 1,
                count: 3,
                needs_fuel: true,
            }],
        );
        let targets: Vec<usize> = placed.iter().map(|p| p.offer).collect();
        assert_eq!(targets, vec![1, 1]);
    }

    #[test]
    fn two_core_tasks_take_a_whole_two_core_executor_each() {
        let placed = place(&offers(&[2, 2]), &[demand(2, 5)]);
        let targets: Vec<usize> = placed.iter().map(|p| p.offer).collect();
        assert_eq!(targets, vec![0, 1]);
    }

    #[test]
    fn placements_rotate_across_executors() {
        let placed = place(&offers(&[2, 2, 2]), &[demand(1, 4)]);
        let targets: Vec<usize> = placed.iter().map(|p| p.offer).collect();
        assert_eq!(targets, vec![0, 1, 2, 0]);
    }

    #[test]
    fn a_later_smaller_job_fills_what_a_larger_one_cannot_use() {
        let placed = place(&offers(&[1, 1]), &[demand(2, 3), demand(1, 3)]);
        assert_eq!(placed.len(), 2);
        assert!(placed.iter().all(|p| p.demand == 1));
    }

    proptest! {
        #[test]
        fn never_over_commits_and_fills_in_job_order(
            free in proptest::collection::vec((0u32..8, any::<bool>()), 0..6),
            demands in proptest::collection::vec((1u32..5, 0usize..10, any::<bool>()), 0..5),
        ) {
            let demands: Vec<Demand> = demands
                .into_iter()
                .map(|(cores, count, needs_fuel)| Demand { cores, count, needs_fuel })
                .collect();
            let all: Vec<Offer> = free
                .iter()
                .map(|&(free_cores, meters_fuel)| Offer { free_cores, meters_fuel })
                .collect();
            let free: Vec<u32> = all.iter().map(|o| o.free_cores).collect();
            let placed = place(&all, &demands);
            let mut used = vec![0u32; free.len()];
            let mut per_demand = vec![0usize; demands.len()];
            for p in &placed {
                used[p.offer] += demands[p.demand].cores;
                per_demand[p.demand] += 1;
                prop_assert!(all[p.offer].meters_fuel || !demands[p.demand].needs_fuel);
            }
            for (u, f) in used.iter().zip(&free) {
                prop_assert!(u <= f, "over-committed: used {u} of {f}");
            }
            for (d, demand) in demands.iter().enumerate() {
                prop_assert!(per_demand[d] <= demand.count);
                // A demand left short means no executor had room for one more of its
                // tasks once it had been served: nothing was skipped that fit.
                if per_demand[d] < demand.count {
                    let mut left = free.clone();
                    for p in placed.iter().filter(|p| p.demand <= d) {
                        left[p.offer] -= demands[p.demand].cores;
                    }
                    prop_assert!(left
                        .iter()
                        .zip(&all)
                        .all(|(&l, o)| l < demand.cores || (demand.needs_fuel && !o.meters_fuel)));
                }
            }
            // FIFO: placements of an earlier job come before those of a later one.
            prop_assert!(placed.windows(2).all(|w| w[0].demand <= w[1].demand));
        }
    }
}
