//! Retries that learn: the budget of a task's next attempt after it ran out of memory or
//! time, for a job that asked for it (`"retry": {"escalate": ...}`). A pure function of
//! the failure, the budget it ran with and what it was seen to use, so that the scheduler
//! only decides whether a retry is left.

use flint_protocol::records::Escalation;
use flint_protocol::{FailureKind, Resources};

/// The most memory any executor gives a task (`flint executor --max-memory-mb`'s upper
/// bound, and the module rules' largest memory): the cap when a job names none.
pub const MAX_MEMORY_MB: u32 = 4096;
/// The longest time limit an escalated attempt gets when the job names no cap: an hour,
/// or the job's own limit if that is longer.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// The next attempt's budget, or `None` when the failure is not one escalation cures,
/// the job does not escalate that budget, or it is already at its cap. Memory grows from
/// the larger of the budget and the peak the attempt reached; time from the budget.
pub fn next_budget(
    escalation: &Escalation,
    failure: FailureKind,
    ran_with: Resources,
    peak_memory_bytes: u64,
) -> Option<Resources> {
    let mut next = ran_with;
    match failure {
        FailureKind::MemoryLimit if escalation.memory > 1.0 => {
            let base = u64::from(ran_with.memory_mb).max(peak_memory_bytes.div_ceil(1 << 20));
            let wanted = (base as f64 * escalation.memory).ceil() as u64;
            let to = wanted.min(u64::from(escalation.max_memory_mb)) as u32;
            (to > ran_with.memory_mb).then_some(())?;
            next.memory_mb = to;
        }
        FailureKind::Timeout if escalation.timeout > 1.0 => {
            let wanted = (ran_with.timeout_ms as f64 * escalation.timeout).ceil() as u64;
            let to = wanted.min(escalation.max_timeout_ms);
            (to > ran_with.timeout_ms).then_some(())?;
            next.timeout_ms = to;
        }
        _ => return None,
    }
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escalation() -> Escalation {
        Escalation {
            memory: 2.0,
            timeout: 3.0,
            max_memory_mb: 1024,
            max_timeout_ms: 10_000,
        }
    }

    fn budget(memory_mb: u32, timeout_ms: u64) -> Resources {
        Resources {
            memory_mb,
            timeout_ms,
            ..Resources::default()
        }
    }

    #[test]
    fn memory_doubles_from_the_larger_of_budget_and_peak_up_to_the_cap() {
        let e = escalation();
        let next = |mb, peak| next_budget(&e, FailureKind::MemoryLimit, budget(mb, 100), peak);
        assert_eq!(next(128, 0).unwrap().memory_mb, 256);
        // A peak past the budget (several memories) is where growth starts.
        assert_eq!(next(128, 200 << 20).unwrap().memory_mb, 400);
        assert_eq!(next(128, 0).unwrap().timeout_ms, 100, "time is left alone");
        assert_eq!(next(768, 0).unwrap().memory_mb, 1024, "held to the cap");
        assert_eq!(next(1024, 0), None, "at the cap: no retry");
    }

    #[test]
    fn time_triples_up_to_the_cap() {
        let e = escalation();
        let next = |ms| next_budget(&e, FailureKind::Timeout, budget(128, ms), 0);
        assert_eq!(next(1_000).unwrap().timeout_ms, 3_000);
        assert_eq!(next(1_000).unwrap().memory_mb, 128);
        assert_eq!(next(5_000).unwrap().timeout_ms, 10_000);
        assert_eq!(next(10_000), None);
    }

    #[test]
    fn other_failures_and_budgets_not_escalated_get_no_retry() {
        let only_memory = Escalation {
            timeout: 1.0,
            ..escalation()
        };
        for kind in [
            FailureKind::Exit,
            FailureKind::Trap,
            FailureKind::OutputLimit,
            FailureKind::FuelLimit,
            FailureKind::StackOverflow,
        ] {
            assert_eq!(next_budget(&escalation(), kind, budget(128, 100), 0), None);
        }
        assert_eq!(
            next_budget(&only_memory, FailureKind::Timeout, budget(128, 100), 0),
            None
        );
    }
}
