//! A job's `"network"`: the origins its tasks may call, checked against the two ceilings
//! above it (its tenant's `egress_allow`, the operator's `--egress-allow`), and the
//! outbound limits of each attempt (`resources.egress`), within its tenant's maxima.
//! What is accepted here is only what the executor enforces again on every request: it
//! holds the operator's list itself and gets the job's and the tenant's with the job.

use std::sync::Arc;

use flint_fetch_cache::egress::AllowList;
use flint_protocol::api::{EgressSpec, ErrorCode, NetworkSpec};
use flint_protocol::{NetworkGrant, defaults};

use super::Rejection;

/// A tenant's `egress_allow`: as written (what a job's grant carries to executors, which
/// judge it again) and parsed.
#[derive(Clone, Debug, Default)]
pub struct TenantEgress {
    pub entries: Vec<String>,
    pub list: Arc<AllowList>,
}

/// The most of the network a caller's jobs may have: the operator's list, and for a
/// tenant its list and maxima.
#[derive(Clone, Debug, Default)]
pub struct EgressCeiling {
    /// `--egress-allow`; empty, egress is off on the cluster.
    pub operator: Arc<AllowList>,
    /// The tenant's `egress_allow`; `None` for the admin, who has no tenant layer. A
    /// tenant that lists none may call nothing.
    pub tenant: Option<TenantEgress>,
    pub max_requests: Option<u32>,
    pub max_bytes: Option<u64>,
    pub max_concurrent: Option<u32>,
}

/// Most entries a job's `network.allow` may have.
const MAX_ALLOW_ENTRIES: usize = 64;

fn invalid(message: String) -> Rejection {
    Rejection::new(ErrorCode::InvalidSpec, message)
}

/// The grant of a job that asked for `network` with `limits`, or none; `tenant` names
/// the tenant in messages.
pub(super) fn grant(
    network: Option<NetworkSpec>,
    limits: Option<EgressSpec>,
    ceiling: &EgressCeiling,
    tenant: Option<&str>,
) -> Result<Option<NetworkGrant>, Rejection> {
    let Some(network) = network else {
        if limits.is_some() {
            return Err(invalid(
                "resources.egress limits outbound requests, and the job has no \"network\": \
                 give \"network\": {\"allow\": [...]} too"
                    .into(),
            ));
        }
        return Ok(None);
    };
    if network.allow.is_empty() || network.allow.len() > MAX_ALLOW_ENTRIES {
        return Err(invalid(format!(
            "network.allow has {} entries: 1 to {MAX_ALLOW_ENTRIES} origins",
            network.allow.len()
        )));
    }
    let asked =
        AllowList::parse(&network.allow).map_err(|e| invalid(format!("network.allow: {e}")))?;
    if ceiling.operator.is_empty() {
        return Err(invalid(
            "network: egress is off on this cluster (the operator allows no origin: \
             --egress-allow)"
                .into(),
        ));
    }
    let beyond = asked.outside(&ceiling.operator);
    if !beyond.is_empty() {
        return Err(invalid(format!(
            "network.allow: {} outside what the operator allows (--egress-allow)",
            listed(&beyond)
        )));
    }
    let tenant_allow = match &ceiling.tenant {
        None => None,
        Some(TenantEgress { entries, list }) => {
            let name = tenant.unwrap_or_default();
            if list.is_empty() {
                return Err(invalid(format!(
                    "network: tenant {name:?} may call no origin (no egress_allow in the \
                     tenants file)"
                )));
            }
            let beyond = asked.outside(list);
            if !beyond.is_empty() {
                return Err(invalid(format!(
                    "network.allow: {} outside what tenant {name:?} may call (its egress_allow)",
                    listed(&beyond)
                )));
            }
            Some(entries.clone())
        }
    };
    let (max_requests, max_bytes, max_concurrent) = limits_of(limits, ceiling, tenant)?;
    Ok(Some(NetworkGrant {
        allow: network.allow,
        tenant_allow,
        max_requests,
        max_bytes,
        max_concurrent,
    }))
}

fn listed(entries: &[String]) -> String {
    let quoted: Vec<String> = entries.iter().map(|e| format!("{e:?}")).collect();
    let verb = if entries.len() == 1 { "is" } else { "are" };
    format!("{} {verb}", quoted.join(", "))
}

/// Each limit as asked or its default, at least 1 and at most the tenant's maximum (a
/// default above a tenant's maximum is brought down to it: only what the job asks for is
/// refused).
fn limits_of(
    limits: Option<EgressSpec>,
    ceiling: &EgressCeiling,
    tenant: Option<&str>,
) -> Result<(u32, u64, u32), Rejection> {
    let limits = limits.unwrap_or_default();
    let one = |field: &str, asked: Option<u64>, default: u64, max: Option<u64>| match (asked, max) {
        (Some(0), _) => Err(invalid(format!(
            "resources.egress.{field} must be at least 1 (leave it out for the default, \
                 {default})"
        ))),
        (Some(asked), Some(max)) if asked > max => Err(Rejection::new(
            ErrorCode::QuotaExceeded,
            format!(
                "tenant {:?}: max_egress_{} is {max}; resources.egress.{field} asks for \
                     {asked}",
                tenant.unwrap_or_default(),
                field.trim_start_matches("max_")
            ),
        )),
        (Some(asked), _) => Ok(asked),
        (None, max) => Ok(max.map_or(default, |max| default.min(max))),
    };
    let requests = one(
        "max_requests",
        limits.max_requests.map(u64::from),
        u64::from(defaults::EGRESS_MAX_REQUESTS),
        ceiling.max_requests.map(u64::from),
    )?;
    let bytes = one(
        "max_bytes",
        limits.max_bytes,
        defaults::EGRESS_MAX_BYTES,
        ceiling.max_bytes,
    )?;
    let concurrent = one(
        "max_concurrent",
        limits.max_concurrent.map(u64::from),
        u64::from(defaults::EGRESS_MAX_CONCURRENT),
        ceiling.max_concurrent.map(u64::from),
    )?;
    // Both fit: they are u32 asked, u32 defaults or u32 maxima.
    Ok((requests as u32, bytes, concurrent as u32))
}

#[cfg(test)]
#[path = "network_tests.rs"]
mod tests;
