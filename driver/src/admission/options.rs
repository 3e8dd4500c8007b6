//! A job's options beyond its resources, checked: exact accounting, determinism and its
//! seed, and `"retry"` (how a task that ran out of memory or time is given more on its
//! next attempt).

use flint_protocol::api::{Accounting, EscalateSpec, Factor, RetrySpec};
use flint_protocol::records::{Escalation, JobOptions};
use flint_protocol::{Determinism, Resources};

use super::Rejection;
use crate::scheduler::escalation;

/// What a spec asks for beyond its resources (already checked: `resources`): its
/// `deterministic`, `seed` and `memoize`, `accounting` and `retry`.
pub(super) fn of(
    (deterministic, seed, memoize): (bool, Option<u64>, bool),
    accounting: Option<Accounting>,
    retry: Option<&RetrySpec>,
    resources: &Resources,
) -> Result<JobOptions, Rejection> {
    let determinism = match (deterministic, seed) {
        (true, seed) => Some(Determinism {
            seed: seed.unwrap_or_else(draw_seed),
        }),
        (false, None) => None,
        (false, Some(_)) => {
            return Err(Rejection::new(
                "invalid_spec",
                "seed is for a deterministic job: give \"deterministic\": true too",
            ));
        }
    };
    if memoize && determinism.is_none() {
        return Err(Rejection::new(
            "invalid_spec",
            "memoize is for deterministic jobs: give \"deterministic\": true too (a result is \
             reused only where the same inputs are sure to make the same bytes)",
        ));
    }
    Ok(JobOptions {
        exact_accounting: accounting == Some(Accounting::Exact),
        determinism,
        memoize,
        memoized: Vec::new(),
        escalate: retry
            .and_then(|r| r.escalate.as_ref())
            .map(|e| escalation(e, resources))
            .transpose()?,
    })
}

/// Factors an escalation may have: more than 1 (1 or less would never grow) and at most
/// 16 (a typo of 100 would jump straight to the cap).
const MAX_FACTOR: f64 = 16.0;

/// `"retry": {"escalate": ...}` checked against the job's own budget: factors in
/// (1, 16], caps no lower than what the job starts with and within the cluster's.
pub(super) fn escalation(
    spec: &EscalateSpec,
    resources: &Resources,
) -> Result<Escalation, Rejection> {
    let invalid = |m: String| Rejection::new("invalid_spec", m);
    if spec.memory.is_none() && spec.timeout.is_none() {
        return Err(invalid(
            "retry.escalate needs a factor for `memory`, `timeout` or both".into(),
        ));
    }
    let factor = |name: &str, f: Option<Factor>| match f {
        None => Ok(1.0),
        Some(Factor(f)) if f.is_finite() && f > 1.0 && f <= MAX_FACTOR => Ok(f),
        Some(Factor(f)) => Err(invalid(format!(
            "retry.escalate.{name} is {f}: a factor is more than 1 and at most {MAX_FACTOR}"
        ))),
    };
    let memory = factor("memory", spec.memory)?;
    let timeout = factor("timeout", spec.timeout)?;
    let max_memory_mb = spec.max_memory_mb.unwrap_or(escalation::MAX_MEMORY_MB);
    if max_memory_mb > escalation::MAX_MEMORY_MB || max_memory_mb < resources.memory_mb {
        return Err(invalid(format!(
            "retry.escalate.max_memory_mb is {max_memory_mb}: it is at least the job's resources.memory_mb ({}) and at most {} (the most any executor gives a task)",
            resources.memory_mb,
            escalation::MAX_MEMORY_MB
        )));
    }
    let max_timeout_ms = spec
        .max_timeout_ms
        .unwrap_or(escalation::MAX_TIMEOUT_MS.max(resources.timeout_ms));
    if max_timeout_ms < resources.timeout_ms {
        return Err(invalid(format!(
            "retry.escalate.max_timeout_ms is {max_timeout_ms}: it is at least the job's resources.timeout_ms ({})",
            resources.timeout_ms
        )));
    }
    Ok(Escalation {
        memory,
        timeout,
        max_memory_mb,
        max_timeout_ms,
    })
}

/// A seed for a deterministic job that gave none: 53 random bits (a JSON number any
/// client reads exactly), from the random part of a v7 UUID.
fn draw_seed() -> u64 {
    (uuid::Uuid::now_v7().as_u128() as u64) & ((1 << 53) - 1)
}
