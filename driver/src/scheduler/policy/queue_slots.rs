//! The queue slots a round of placement has left per offer, for any job and for a job
//! whose run time is not known yet.

use super::{Demand, Offer};

/// The queue slots left per offer: any job's, and a job's of unknown run time (a part
/// of them).
pub(super) struct QueueSlots {
    pub(super) any: Vec<u32>,
    unknown: Vec<u32>,
}

impl QueueSlots {
    pub(super) fn of(offers: &[Offer]) -> Self {
        let any: Vec<u32> = (offers.iter())
            .map(|o| if o.usable { o.ahead } else { 0 })
            .collect();
        let unknown = (offers.iter().zip(&any))
            .map(|(o, &a)| o.ahead_unknown.min(a))
            .collect();
        QueueSlots { any, unknown }
    }

    /// The slots `demand` may take.
    pub(super) fn of_demand(&self, demand: &Demand) -> &[u32] {
        match demand.run_time_unknown {
            true => &self.unknown,
            false => &self.any,
        }
    }

    /// A task of `demand` went to offer `e`, queued or onto a free core (a multi-core
    /// task leaves no queue behind it). What an unknown job may queue shrinks with its
    /// own queued task, and never exceeds the slots left.
    pub(super) fn placed(&mut self, e: usize, queued: bool, demand: &Demand) {
        if queued {
            self.any[e] -= 1;
        } else if demand.cores > 1 {
            self.any[e] = 0;
        }
        let took = u32::from(queued && demand.run_time_unknown);
        self.unknown[e] = self.unknown[e].saturating_sub(took).min(self.any[e]);
    }
}
