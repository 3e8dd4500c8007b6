//! Between tenants: the cluster's cores are shared by weight, a tenant's jobs go by
//! priority then submission, and no tenant holds more than its `max_cores`.
//!
//! Each round, every tenant with work is given its fair share of the cores (weighted
//! max-min, water-filling: a tenant that wants less than its weight's part gives the
//! rest to the others, by weight). Placement then runs three times: first each tenant
//! may take the whole cores that bring it up to its share, tenants furthest below their
//! share first (ties: the least virtual time); then what is left is split by weight;
//! then whatever is still left goes to whoever has work (work-conserving: an idle cluster
//! is never held back for a tenant that may come), within `max_cores`. A tenant with a big
//! backlog thus takes the cores others do not want, and gives them back as their tasks
//! end. With a single tenant (or none) and no core limits this is the plain placement.

use super::policy::{self, Demand, Offer, Placement, Plan};
use super::*;
use flint_protocol::records::Escalation;

/// A tenant's weight, core limit and per-task limits, as the tenants file says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Share {
    pub weight: f64,
    pub max_cores: Option<u32>,
    /// What one task may be given: an escalated retry stops here, even when the file
    /// lowered the limit after the job was accepted.
    pub max_task_memory_mb: Option<u32>,
    pub max_task_timeout_ms: Option<u64>,
}

impl Share {
    /// `escalation` with its caps held to this tenant's per-task limits.
    pub(super) fn hold(&self, escalation: Escalation) -> Escalation {
        Escalation {
            max_memory_mb: (self.max_task_memory_mb).map_or(escalation.max_memory_mb, |m| {
                m.min(escalation.max_memory_mb)
            }),
            max_timeout_ms: (self.max_task_timeout_ms).map_or(escalation.max_timeout_ms, |t| {
                t.min(escalation.max_timeout_ms)
            }),
            ..escalation
        }
    }
}

/// Every tenant's [`Share`]; a tenant not listed (the admin's jobs, or a tenant just
/// removed from the file) has weight 1 and no core limit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shares(pub FastMap<String, Share>);

impl Shares {
    pub(super) fn of(&self, tenant: Option<&str>) -> Share {
        tenant
            .and_then(|t| self.0.get(t))
            .copied()
            .unwrap_or(Share {
                weight: 1.0,
                max_cores: None,
                max_task_memory_mb: None,
                max_task_timeout_ms: None,
            })
    }
}

/// Weighted max-min shares of `total` cores for tenants wanting `want` each: no tenant
/// gets more than it wants, and what one does not want goes to the others by weight.
pub fn fair_shares(total: f64, tenants: &[(f64, f64)]) -> Vec<f64> {
    let mut share = vec![0.0; tenants.len()];
    let mut open: Vec<usize> = (0..tenants.len()).filter(|&t| tenants[t].1 > 0.0).collect();
    let mut left = total;
    while !open.is_empty() && left > 1e-9 {
        let weights: f64 = open.iter().map(|&t| tenants[t].0).sum();
        let per_weight = left / weights;
        // Tenants that want less than their weight's part are filled and leave.
        let filled: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&t| tenants[t].1 - share[t] <= per_weight * tenants[t].0)
            .collect();
        if filled.is_empty() {
            for &t in &open {
                share[t] += per_weight * tenants[t].0;
            }
            break;
        }
        for &t in &filled {
            left -= tenants[t].1 - share[t];
            share[t] = tenants[t].1;
        }
        open.retain(|t| !filled.contains(t));
    }
    share
}

impl ClusterState {
    /// Sets the tenants' weights and core limits (the tenants file changed).
    pub fn set_shares(&mut self, shares: Shares) {
        self.shares = shares;
    }

    /// Whether any of the queued jobs belongs to a tenant, has a priority or is bound
    /// by a core limit: only then is there more to placement than the plain order.
    pub(super) fn shared(&self) -> bool {
        let mut first: Option<Option<&str>> = None;
        for job in self.queue.iter().filter_map(|id| self.jobs.get(id)) {
            let tenant = job.def.owner.tenant.as_deref();
            if job.def.owner.priority != 0 || self.shares.of(tenant).max_cores.is_some() {
                return true;
            }
            match first {
                None => first = Some(tenant),
                Some(t) if t != tenant => return true,
                Some(_) => {}
            }
        }
        // Another tenant's running tasks count against the queued one's share too.
        first.is_some_and(|queued| {
            self.jobs
                .values()
                .any(|j| j.counts.running > 0 && j.def.owner.tenant.as_deref() != queued)
        })
    }

    /// Cores each tenant's tasks hold now.
    fn running_cores(&self) -> FastMap<Option<String>, u32> {
        let mut running: FastMap<Option<String>, u32> = FastMap::default();
        for job in self.jobs.values().filter(|j| j.counts.running > 0) {
            *running.entry(job.def.owner.tenant.clone()).or_default() +=
                job.counts.running.saturating_mul(job.def.resources.cores);
        }
        running
    }

    /// Orders the queue by tenant (furthest below its weighted share first), then by
    /// priority (highest first), then as the scheduling mode says; then places the
    /// demands (in the queue's order) in the passes described above. For rounds where
    /// [`Self::shared`] holds; others take the plain placement.
    pub(super) fn place_shared(
        &mut self,
        offers: &[Offer],
        build: impl Fn(&Self) -> Vec<Demand>,
    ) -> Plan {
        let running = self.running_cores();
        let tenants = self.tenants_with_work();
        let fair = fair_shares(f64::from(self.total_cores()), &tenants.wants());
        let held: Vec<u32> = (tenants.0.iter())
            .map(|t| running.get(&t.name).copied().unwrap_or(0))
            .collect();
        self.start_virtual_times(&tenants);
        self.order_by_share(&tenants, &fair, &running);
        let demands = build(self);
        let tenant_of: Vec<usize> = (self.queue.iter())
            .map(|id| tenants.position(self.jobs[id].def.owner.tenant.as_deref()))
            .collect();
        let passes = Passes {
            offers,
            demands: &demands,
            tenant_of: &tenant_of,
            tenants: &tenants,
            held: &held,
        };
        let mut plan = passes.up_to_shares(&fair);
        passes.split_what_is_left(&mut plan);
        self.charge_virtual_times(&plan, &demands, &tenant_of, &tenants);
        plan
    }

    /// Cores of the executors that take tasks.
    fn total_cores(&self) -> u32 {
        (self.executors.values())
            .filter(|e| e.takes_tasks())
            .map(|e| e.cores)
            .sum()
    }

    /// Every tenant with tasks pending or running, and the cores those want.
    fn tenants_with_work(&self) -> Tenants {
        let mut tenants = Tenants(Vec::new());
        for job in self.jobs.values() {
            let tenant = job.def.owner.tenant.as_deref();
            let wants = f64::from(job.counts.pending + job.counts.running)
                * f64::from(job.def.resources.cores);
            if wants == 0.0 {
                continue;
            }
            match tenants.0.iter_mut().find(|t| t.name.as_deref() == tenant) {
                Some(t) => t.wants += wants,
                None => {
                    let share = self.shares.of(tenant);
                    tenants.0.push(Tenant {
                        name: tenant.map(str::to_owned),
                        weight: share.weight,
                        wants,
                        cap: share.max_cores.unwrap_or(u32::MAX),
                    });
                }
            }
        }
        tenants
    }

    /// Virtual time: what each tenant with work was given (cores launched over its
    /// weight). Held cores alone cannot tell tenants apart when tasks end faster than
    /// rounds come (all hold none): the one given least goes first then. A tenant that
    /// had no work starts from the least of the others', so that an idle spell is neither
    /// credit nor debt.
    fn start_virtual_times(&mut self, tenants: &Tenants) {
        self.vtime
            .retain(|t, _| tenants.0.iter().any(|tn| tn.name == *t));
        let floor = self.vtime.values().copied().fold(f64::INFINITY, f64::min);
        for tenant in &tenants.0 {
            if !self.vtime.contains_key(&tenant.name) {
                let start = if floor.is_finite() { floor } else { 0.0 };
                self.vtime.insert(tenant.name.clone(), start);
            }
        }
    }

    /// The queue by tenant, furthest below its fair share first (running / fair share),
    /// then least virtual time; within a tenant by priority, then as the mode says.
    fn order_by_share(
        &mut self,
        tenants: &Tenants,
        fair: &[f64],
        running: &FastMap<Option<String>, u32>,
    ) {
        let deficit = |tenant: Option<&str>| {
            let at = tenants.0.iter().position(|t| t.name.as_deref() == tenant);
            let held = f64::from(
                running
                    .get(&tenant.map(str::to_owned))
                    .copied()
                    .unwrap_or(0),
            );
            at.map_or(f64::MAX, |at| held / fair[at].max(1e-9))
        };
        let fair_mode = self.config.mode == SchedulingMode::Fair;
        let jobs = &self.jobs;
        let vtime = &self.vtime;
        self.queue.make_contiguous().sort_by_cached_key(|id| {
            let job = &jobs[id];
            let tenant = job.def.owner.tenant.as_deref();
            let within = if fair_mode { job.counts.running } else { 0 };
            (
                // Finite and non-negative: their bits order as the numbers do.
                deficit(tenant).to_bits(),
                vtime
                    .get(&tenant.map(str::to_owned))
                    .copied()
                    .unwrap_or(0.0)
                    .to_bits(),
                tenant.map(str::to_owned),
                std::cmp::Reverse(job.def.owner.priority),
                within,
                job.key,
            )
        });
    }

    /// Each placement adds its cores over its tenant's weight to the tenant's virtual time.
    fn charge_virtual_times(
        &mut self,
        plan: &Plan,
        demands: &[Demand],
        tenant_of: &[usize],
        tenants: &Tenants,
    ) {
        for p in &plan.placements {
            if let Some(t) = tenants.0.get(tenant_of[p.demand]) {
                let given = f64::from(demands[p.demand].cores) / t.weight;
                *self.vtime.entry(t.name.clone()).or_default() += given;
            }
        }
    }
}

/// A tenant with work this round: its weight, the cores its tasks want, its core limit.
struct Tenant {
    name: Option<String>,
    weight: f64,
    wants: f64,
    cap: u32,
}

struct Tenants(Vec<Tenant>);

impl Tenants {
    /// (weight, cores wanted within the limit) of each, for [`fair_shares`].
    fn wants(&self) -> Vec<(f64, f64)> {
        (self.0.iter())
            .map(|t| (t.weight, t.wants.min(f64::from(t.cap))))
            .collect()
    }

    /// Where `tenant` is; `usize::MAX` (no room to cap it by) when it has no work.
    fn position(&self, tenant: Option<&str>) -> usize {
        (self.0.iter())
            .position(|t| t.name.as_deref() == tenant)
            .unwrap_or(usize::MAX)
    }
}

/// What the placement passes share: the round's offers and demands (in the queue's
/// order), each demand's tenant, and the cores each tenant held before the round.
struct Passes<'a> {
    offers: &'a [Offer],
    demands: &'a [Demand],
    tenant_of: &'a [usize],
    tenants: &'a Tenants,
    held: &'a [u32],
}

impl Passes<'_> {
    /// Pass 1: up to each tenant's fair share, in whole cores (the fractions go to pass
    /// 2, by who is furthest below its share, then who was given least).
    fn up_to_shares(&self, fair: &[f64]) -> Plan {
        let mut room: Vec<u32> = (self.tenants.0.iter().enumerate())
            .map(|(t, tenant)| {
                let to_share = (fair[t] - f64::from(self.held[t])).max(0.0).floor() as u32;
                to_share.min(tenant.cap.saturating_sub(self.held[t]))
            })
            .collect();
        let first: Vec<Demand> = (self.demands.iter().zip(self.tenant_of))
            .map(|(d, &t)| capped(d, room.get_mut(t)))
            .collect();
        policy::place(self.offers, &first)
    }

    /// Pass 2: what is left (queue slots above all, once every core is held), split by
    /// weight among the tenants with work, rounded up: given whole to the first in
    /// order, a round's slots would lift a small share far past its mark and a big one
    /// hardly. Pass 3: whatever is still left, within core limits.
    fn split_what_is_left(&self, plan: &mut Plan) {
        let tenants = &self.tenants.0;
        let weights: f64 = tenants.iter().map(|t| t.weight).sum();
        for split in [true, false] {
            let mut taken = vec![0u32; tenants.len()];
            for p in &plan.placements {
                if let Some(t) = taken.get_mut(self.tenant_of[p.demand]) {
                    *t += self.demands[p.demand].cores;
                }
            }
            let left = remaining(self.offers, self.demands, &plan.placements);
            let slots: u32 = (left.iter().filter(|o| o.usable))
                .map(|o| o.free_cores + o.ahead)
                .sum();
            if slots == 0 {
                break;
            }
            let mut room: Vec<u32> = (tenants.iter().enumerate())
                .map(|(t, tenant)| {
                    let cap = tenant.cap.saturating_sub(self.held[t] + taken[t]);
                    let part = (f64::from(slots) * tenant.weight / weights).ceil() as u32;
                    if split { cap.min(part) } else { cap }
                })
                .collect();
            let next: Vec<Demand> = rest(self.demands, &plan.placements, self.offers.len())
                .iter()
                .zip(self.tenant_of)
                .map(|(d, &t)| capped(d, room.get_mut(t)))
                .collect();
            let more = policy::place(&left, &next);
            plan.placements.extend(more.placements);
            plan.waiting_for_locality = more.waiting_for_locality;
        }
    }
}

/// `demand` cut to the tasks that fit in `room` cores (taken from it); unbounded when
/// the tenant is not known (`None`).
fn capped(demand: &Demand, room: Option<&mut u32>) -> Demand {
    let mut d = demand.clone();
    let Some(room) = room else {
        return d;
    };
    let fits = (*room / d.cores.max(1)) as usize;
    let constrained = d.constrained.len().min(fits);
    d.constrained.truncate(constrained);
    d.count = d.count.min(fits - constrained);
    *room -= (constrained + d.count) as u32 * d.cores;
    d
}

/// The offers after `placements`: cores, or queue slots, taken as placement took them.
fn remaining(offers: &[Offer], demands: &[Demand], placements: &[Placement]) -> Vec<Offer> {
    let mut left = offers.to_vec();
    for p in placements {
        let cores = demands[p.demand].cores;
        let o = &mut left[p.offer];
        if o.free_cores >= cores {
            o.free_cores -= cores;
            if cores > 1 {
                o.ahead = 0;
            }
        } else {
            o.ahead = o.ahead.saturating_sub(1);
        }
    }
    left
}

/// The demands after `placements`: fewer unconstrained tasks, and each constrained
/// task placed barred from every offer (kept in its place, so that later placements'
/// indices still name the same tasks).
fn rest(demands: &[Demand], placements: &[Placement], offers: usize) -> Vec<Demand> {
    let mut rest = demands.to_vec();
    for p in placements {
        let d = &mut rest[p.demand];
        match p.constrained {
            None => d.count -= 1,
            Some(c) => d.constrained[c] = (0..offers).collect(),
        }
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_weights_and_what_a_tenant_does_not_want_goes_to_the_others() {
        let s = fair_shares(10.0, &[(1.0, 100.0), (1.0, 100.0)]);
        assert_eq!(s, [5.0, 5.0]);
        let s = fair_shares(12.0, &[(2.0, 100.0), (1.0, 100.0)]);
        assert_eq!(s, [8.0, 4.0]);
        // One wants 2: the other two split the remaining 8.
        let s = fair_shares(10.0, &[(1.0, 2.0), (1.0, 100.0), (1.0, 100.0)]);
        assert_eq!(s, [2.0, 4.0, 4.0]);
        // Nobody wants more than it asks for, even with cores to spare.
        let s = fair_shares(10.0, &[(1.0, 1.0), (5.0, 3.0)]);
        assert_eq!(s, [1.0, 3.0]);
        assert_eq!(fair_shares(4.0, &[(1.0, 0.0)]), [0.0]);
    }

    #[test]
    fn a_capped_demand_takes_only_its_room() {
        let d = Demand {
            cores: 2,
            count: 10,
            constrained: vec![vec![], vec![]],
            ..Demand::default()
        };
        let mut room = 7;
        let c = capped(&d, Some(&mut room));
        assert_eq!((c.constrained.len(), c.count, room), (2, 1, 1));
        assert_eq!(capped(&d, None).count, 10);
    }
}
