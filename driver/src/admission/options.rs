//! A job's options beyond its resources, checked: exact accounting, determinism and its
//! seed, and `"retry"` (how a task that ran out of memory or time is given more on its
//! next attempt).

use flint_protocol::api::{Accounting, ErrorCode, EscalateSpec, Factor, JobSpec, RetrySpec};
use flint_protocol::records::{Escalation, JobOptions};
use flint_protocol::{Determinism, Resources};

use super::{Ceiling, Rejection};
use crate::scheduler::escalation;

/// What a spec asks for beyond its resources (already checked: `resources`): its
/// `deterministic`, `seed` and `memoize`, `accounting` and `retry`.
pub(super) fn of(
    (deterministic, seed, memoize): (bool, Option<u64>, bool),
    accounting: Option<Accounting>,
    retry: Option<&RetrySpec>,
    (resources, ceiling): (&Resources, &Ceiling),
) -> Result<JobOptions, Rejection> {
    let determinism = match (deterministic, seed) {
        (true, Some(seed)) => Some(Determinism { seed }),
        (true, None) => {
            return Err(Rejection::new(
                ErrorCode::InvalidSpec,
                "a deterministic job's seed is given or derived before its options",
            ));
        }
        (false, None) => None,
        (false, Some(_)) => {
            return Err(Rejection::new(
                ErrorCode::InvalidSpec,
                "seed is for a deterministic job: give \"deterministic\": true too",
            ));
        }
    };
    if memoize && determinism.is_none() {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
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
            .map(|e| escalation(e, resources, ceiling))
            .transpose()?,
    })
}

/// Factors an escalation may have: more than 1 (1 or less would never grow) and at most
/// 16 (a typo of 100 would jump straight to the cap).
const MAX_FACTOR: f64 = 16.0;

/// `"retry": {"escalate": ...}` checked against the job's own budget: factors in
/// (1, 16], caps no lower than what the job starts with and within the cluster's (422)
/// and the caller's tenant's limits (429: a tenant's task never grows past them). A cap
/// left out is the cluster's default, held to the tenant's limit.
pub(super) fn escalation(
    spec: &EscalateSpec,
    resources: &Resources,
    ceiling: &Ceiling,
) -> Result<Escalation, Rejection> {
    let invalid = |m: String| Rejection::new(ErrorCode::InvalidSpec, m);
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
    let max_memory_mb = match spec.max_memory_mb {
        Some(cap) => cap,
        // The job's own budget is the tenant's to refuse (`check_quotas`), not this.
        None => (ceiling.memory_mb)
            .map_or(escalation::MAX_MEMORY_MB, |m| {
                m.min(escalation::MAX_MEMORY_MB)
            })
            .max(resources.memory_mb),
    };
    if max_memory_mb > escalation::MAX_MEMORY_MB || max_memory_mb < resources.memory_mb {
        return Err(invalid(format!(
            "retry.escalate.max_memory_mb is {max_memory_mb}: it is at least the job's resources.memory_mb ({}) and at most {} (the most any executor gives a task)",
            resources.memory_mb,
            escalation::MAX_MEMORY_MB
        )));
    }
    let max_timeout_ms = match spec.max_timeout_ms {
        Some(cap) => cap,
        None => (ceiling.timeout_ms)
            .map_or(escalation::MAX_TIMEOUT_MS, |t| {
                t.min(escalation::MAX_TIMEOUT_MS)
            })
            .max(resources.timeout_ms),
    };
    if max_timeout_ms < resources.timeout_ms {
        return Err(invalid(format!(
            "retry.escalate.max_timeout_ms is {max_timeout_ms}: it is at least the job's resources.timeout_ms ({})",
            resources.timeout_ms
        )));
    }
    let over_tenant = |field: &str, limit: &str, max: u64, cap: u64| {
        Rejection::new(
            ErrorCode::QuotaExceeded,
            format!(
                "tenant {:?}: {limit} is {max}; retry.escalate.{field} asks for up to {cap}",
                ceiling.tenant.as_deref().unwrap_or_default()
            ),
        )
    };
    if let Some(max) = ceiling.memory_mb
        && max_memory_mb > max.max(resources.memory_mb)
    {
        let (max, cap) = (u64::from(max), u64::from(max_memory_mb));
        return Err(over_tenant("max_memory_mb", "max_task_memory_mb", max, cap));
    }
    if let Some(max) = ceiling.timeout_ms
        && max_timeout_ms > max.max(resources.timeout_ms)
    {
        return Err(over_tenant(
            "max_timeout_ms",
            "max_task_timeout_ms",
            max,
            max_timeout_ms,
        ));
    }
    Ok(Escalation {
        memory,
        timeout,
        max_memory_mb,
        max_timeout_ms,
    })
}

/// The seed of a deterministic job that gave none: 53 bits (a JSON number any client
/// reads exactly) of SHA-256 over the spec's JSON as accepted (keys in one order, maps
/// sorted), with `memoize` and `priority` left out (they change whether and when a task
/// runs, not what it computes). The same spec has the same seed, so the same key for
/// its memoized tasks: a seed drawn at random made two identical `"memoize": true` jobs
/// never meet.
pub(super) fn seed_of(spec: &mut JobSpec) -> u64 {
    use sha2::Digest as _;
    struct Hashing(sha2::Sha256);
    impl std::io::Write for Hashing {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.update(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut hash = Hashing(sha2::Sha256::new());
    std::io::Write::write_all(&mut hash, b"flint seed of a spec v1\0").expect("hashing");
    // Taken out and put back rather than the spec copied: it may hold a million inputs.
    let left_out = (std::mem::take(&mut spec.memoize), spec.priority.take());
    serde_json::to_writer(&mut hash, &*spec).expect("a parsed spec serialises");
    (spec.memoize, spec.priority) = left_out;
    let digest: [u8; 32] = hash.0.finalize().into();
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")) & ((1 << 53) - 1)
}
