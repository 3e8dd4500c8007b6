//! The tenants part of `/metrics`: what each tenant holds now and what its attempts used
//! since the driver started, labelled `tenant` (`admin` for the admin's jobs). Only
//! tenants with a live job or an attempt ended since the start are listed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{escape, family};
use crate::scheduler::{ClusterState, Spent};

/// What one tenant holds now.
#[derive(Default)]
struct Holding {
    live_jobs: u64,
    pending: u64,
    running_cores: u64,
}

pub(super) fn render(out: &mut String, state: &ClusterState) {
    let mut rows: BTreeMap<String, (Holding, Spent)> = BTreeMap::new();
    let name = |t: &Option<String>| t.clone().unwrap_or_else(|| "admin".into());
    for job in state.jobs.values().filter(|j| !j.state.is_final()) {
        let row = &mut rows.entry(name(&job.def.owner.tenant)).or_default().0;
        // The kept counts, not `counts()`: that re-counts every task in debug builds.
        let c = job.counts;
        row.live_jobs += 1;
        row.pending += u64::from(c.pending);
        row.running_cores += u64::from(c.running) * u64::from(job.def.resources.cores);
    }
    for (tenant, spent) in &state.tenant_spent {
        rows.entry(name(tenant)).or_default().1 = *spent;
    }
    if rows.is_empty() {
        return;
    }
    let seconds = |us: u64| (us as f64 / 1e6).to_string();
    type Column = fn(&Holding, &Spent, &dyn Fn(u64) -> String) -> String;
    let families: [(&str, &str, &str, Column); 11] = [
        (
            "flint_tenant_live_jobs",
            "gauge",
            "Queued and running jobs of the tenant.",
            |h, _, _| h.live_jobs.to_string(),
        ),
        (
            "flint_tenant_pending_tasks",
            "gauge",
            "Tasks of the tenant waiting for a core.",
            |h, _, _| h.pending.to_string(),
        ),
        (
            "flint_tenant_running_cores",
            "gauge",
            "Cores the tenant's running tasks hold.",
            |h, _, _| h.running_cores.to_string(),
        ),
        (
            "flint_tenant_attempts_total",
            "counter",
            "Attempts of the tenant's tasks that reported their end.",
            |_, s, _| s.attempts.to_string(),
        ),
        (
            "flint_tenant_attempts_preempted_total",
            "counter",
            "Attempts of the tenant's killed to give their cores to a tenant below its share.",
            |_, s, _| s.preempted.to_string(),
        ),
        (
            "flint_tenant_task_cpu_seconds_total",
            "counter",
            "CPU time of the tenant's attempts.",
            |_, s, f| f(s.cpu_us),
        ),
        (
            "flint_tenant_task_wall_seconds_total",
            "counter",
            "Time the tenant's guests ran.",
            |_, s, f| f(s.wall_us),
        ),
        (
            "flint_tenant_task_output_bytes_total",
            "counter",
            "Bytes the tenant's guests wrote as results.",
            |_, s, _| s.output_bytes.to_string(),
        ),
        (
            "flint_tenant_task_egress_requests_total",
            "counter",
            "Outbound HTTP requests the tenant's guests made.",
            |_, s, _| s.egress_requests.to_string(),
        ),
        (
            "flint_tenant_task_egress_bytes_sent_total",
            "counter",
            "Bytes the tenant's guests sent in outbound requests.",
            |_, s, _| s.egress_bytes_sent.to_string(),
        ),
        (
            "flint_tenant_task_egress_bytes_received_total",
            "counter",
            "Bytes the tenant's guests received in answer to outbound requests.",
            |_, s, _| s.egress_bytes_received.to_string(),
        ),
    ];
    for (metric, kind, help, column) in families {
        family(out, metric, kind, help);
        for (tenant, (holding, spent)) in &rows {
            let value = column(holding, spent, &seconds);
            let _ = writeln!(out, "{metric}{{tenant=\"{}\"}} {value}", escape(tenant));
        }
    }
}
