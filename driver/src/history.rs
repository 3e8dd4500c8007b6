//! The cluster over the last minutes, for the web UI's utilisation chart: one sample a
//! second of the running tasks, busy and total cores, live executors and pending
//! tasks, kept in memory (a ring; a restarted driver starts it afresh). Beside it, each
//! tenant's own running and pending tasks, sampled at the same moments: what a tenant is
//! shown instead, since the cluster's figures are every tenant's load.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use flint_protocol::api::{ClusterHistory, ClusterSample, ExecutorState};

use crate::scheduler::ClusterState;

/// How often a sample is taken.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept: 15 minutes of them, about 40 bytes each for the cluster and 24 for
/// each tenant (about 22 KB a tenant).
pub const SAMPLES: usize = 900;

/// One tenant's own figures at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Own {
    pub running_tasks: u32,
    pub busy_cores: u32,
    pub pending_tasks: u64,
}

/// The cluster at one moment, and each tenant's part of it (tenants with live jobs
/// only; the others' is zero).
#[derive(Debug)]
pub struct Sample {
    pub cluster: ClusterSample,
    pub tenants: HashMap<String, Own>,
}

#[derive(Default)]
pub struct History {
    rings: Mutex<Rings>,
}

#[derive(Default)]
struct Rings {
    cluster: VecDeque<ClusterSample>,
    /// A ring per tenant in force: one added starts its own, one removed loses it, so
    /// the memory follows the tenants file, not what anyone submits.
    tenants: HashMap<Arc<str>, VecDeque<(u64, Own)>>,
}

fn push<T>(ring: &mut VecDeque<T>, item: T) {
    if ring.len() == SAMPLES {
        ring.pop_front();
    }
    ring.push_back(item);
}

impl History {
    /// Keeps a sample: the cluster's, and one for each tenant of `known` (the tenants in
    /// force), zero for those without live jobs.
    pub fn record<'a>(&self, sample: Sample, known: impl IntoIterator<Item = &'a Arc<str>>) {
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let t_ms = sample.cluster.t_ms;
        push(&mut rings.cluster, sample.cluster);
        let mut kept = HashMap::new();
        for name in known {
            let mut ring = rings.tenants.remove(name).unwrap_or_default();
            let own = sample.tenants.get(&**name).copied().unwrap_or_default();
            push(&mut ring, (t_ms, own));
            kept.insert(name.clone(), ring);
        }
        rings.tenants = kept;
    }

    /// The whole cluster's history: the admin's view.
    pub fn view(&self) -> ClusterHistory {
        let rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        ClusterHistory {
            interval_ms: INTERVAL.as_millis() as u64,
            tenant: None,
            samples: rings.cluster.iter().copied().collect(),
        }
    }

    /// A tenant's own tasks over the same moments, and nothing of the cluster's (its
    /// cores and executors are left out).
    pub fn tenant_view(&self, tenant: &str) -> ClusterHistory {
        let rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let samples = rings.tenants.get(tenant).map_or_else(Vec::new, |ring| {
            ring.iter()
                .map(|(t_ms, own)| ClusterSample {
                    t_ms: *t_ms,
                    running_tasks: own.running_tasks,
                    busy_cores: own.busy_cores,
                    cores: None,
                    executors: None,
                    pending_tasks: own.pending_tasks,
                })
                .collect()
        });
        ClusterHistory {
            interval_ms: INTERVAL.as_millis() as u64,
            tenant: Some(tenant.to_owned()),
            samples,
        }
    }
}

/// The cluster as it is now, and each tenant's live jobs' running and pending tasks (as
/// `GET /v1/tenants/{name}/usage` counts them).
pub fn sample(state: &ClusterState, now: SystemTime) -> Sample {
    let (mut cores, mut executors, mut busy_cores, mut running_tasks) = (0, 0, 0, 0);
    for e in state
        .executors
        .values()
        .filter(|e| e.state == ExecutorState::Alive)
    {
        executors += 1;
        cores += e.cores;
        busy_cores += e.cores.saturating_sub(e.free_cores);
        running_tasks += e.running.len() as u32;
    }
    let mut s = ClusterSample {
        t_ms: now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        running_tasks,
        busy_cores,
        cores: Some(cores),
        executors: Some(executors),
        pending_tasks: 0,
    };
    let mut tenants: HashMap<String, Own> = HashMap::new();
    for job in state.jobs.values().filter(|j| !j.state.is_final()) {
        // The field, not `counts()`: that one checks itself against every task in debug
        // builds, and this runs every second.
        let counts = job.counts;
        s.pending_tasks += u64::from(counts.pending);
        if let Some(tenant) = &job.def.owner.tenant {
            let own = tenants.entry(tenant.clone()).or_default();
            let cores = counts.running.saturating_mul(job.def.resources.cores);
            own.running_tasks = own.running_tasks.saturating_add(counts.running);
            own.busy_cores = own.busy_cores.saturating_add(cores);
            own.pending_tasks += u64::from(counts.pending);
        }
    }
    Sample {
        cluster: s,
        tenants,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t_ms: u64, tenants: &[(&str, u32)]) -> Sample {
        Sample {
            cluster: ClusterSample {
                t_ms,
                running_tasks: 7,
                busy_cores: 7,
                cores: Some(8),
                executors: Some(2),
                pending_tasks: 100,
            },
            tenants: tenants
                .iter()
                .map(|(name, running)| {
                    let own = Own {
                        running_tasks: *running,
                        busy_cores: *running,
                        pending_tasks: 1,
                    };
                    (name.to_string(), own)
                })
                .collect(),
        }
    }

    #[test]
    fn the_ring_keeps_the_latest_samples_oldest_first() {
        let history = History::default();
        let a: Arc<str> = "a".into();
        for t in 0..(SAMPLES as u64 + 5) {
            history.record(at(t, &[]), [&a]);
        }
        let view = history.view();
        assert_eq!(view.samples.len(), SAMPLES);
        assert_eq!(view.samples.first().unwrap().t_ms, 5);
        assert_eq!(view.samples.last().unwrap().t_ms, SAMPLES as u64 + 4);
        let own = history.tenant_view("a");
        assert_eq!(own.samples.len(), SAMPLES);
        assert_eq!(own.samples.first().unwrap().t_ms, 5);
    }

    #[test]
    fn a_tenant_sees_its_own_tasks_and_nothing_of_the_clusters() {
        let history = History::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        history.record(at(1, &[("a", 3)]), [&a, &b]);
        history.record(at(2, &[("a", 3), ("b", 5)]), [&a, &b]);
        let view = history.tenant_view("b");
        assert_eq!(view.tenant.as_deref(), Some("b"));
        let running: Vec<u32> = view.samples.iter().map(|s| s.running_tasks).collect();
        assert_eq!(running, [0, 5]);
        assert!(view.samples.iter().all(|s| s.cores.is_none()));
        assert!(view.samples.iter().all(|s| s.executors.is_none()));
        assert_eq!(view.samples[0].pending_tasks, 0);
        // A tenant taken out of the file loses its ring; one never known has none.
        history.record(at(3, &[("b", 5)]), [&a]);
        assert!(history.tenant_view("b").samples.is_empty());
        assert_eq!(history.tenant_view("a").samples.len(), 3);
        assert_eq!(history.view().samples.len(), 3);
        assert_eq!(history.view().tenant, None);
    }
}
