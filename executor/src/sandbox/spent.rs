//! What an attempt's store says of its guest once the guest has ended: whether the
//! memory limit stopped it, the most memory it held, the fuel left, and what its
//! outbound requests used.

use wasmtime::Store;

use flint_protocol::{TaskFailure, Usage};

use super::egress::EgressSpent;
use super::{Limited, RunReport};

/// What a store says of its guest once the guest has ended.
pub(super) struct Spent {
    pub(super) memory_limit_hit: bool,
    pub(super) memory_peak: usize,
    pub(super) fuel: Option<u64>,
    pub(super) egress: EgressSpent,
}

impl Spent {
    pub(super) fn of<T: Limited>(store: &mut Store<T>, metered: bool) -> Self {
        // Fuel left is what `set_fuel` gave minus what the guest burnt; `store` set it
        // to u64::MAX where the task had no budget.
        let fuel = match metered {
            true => store.get_fuel().ok(),
            false => None,
        };
        let egress = store.data_mut().egress_spent();
        let limits = store.data_mut().limits();
        Spent {
            memory_limit_hit: limits.memory_limit_hit,
            memory_peak: limits.memory_peak,
            fuel,
            egress,
        }
    }
}

impl RunReport {
    /// An attempt that ended before its guest ran.
    pub(super) fn refused(failure: TaskFailure) -> Self {
        RunReport {
            outcome: Err(failure),
            log: Vec::new(),
            log_truncated: false,
            usage: Usage::default(),
            pins: None,
            egress_denied: Default::default(),
            egress_tape: None,
        }
    }
}
