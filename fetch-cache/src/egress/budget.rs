//! A task's byte budget, shared by its requests in flight.

use std::sync::atomic::{AtomicU64, Ordering};

/// What is left of a task's `max_bytes` (sent plus received), shared by its requests:
/// each takes its bytes from it as they go out and come in, so that requests in flight
/// at once stay within the budget together, not each within what was left when it
/// started. A request that would pass it takes what was left: the part of a cut body
/// that came in is not known exactly, and no later request may download past the
/// budget by being cut in turn.
#[derive(Debug)]
pub struct ByteBudget {
    left: AtomicU64,
}

/// A request would have passed its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spent;

impl ByteBudget {
    pub fn new(max_bytes: u64) -> ByteBudget {
        ByteBudget {
            left: AtomicU64::new(max_bytes),
        }
    }

    pub fn left(&self) -> u64 {
        self.left.load(Ordering::Acquire)
    }

    /// Takes `n` bytes; when fewer are left, takes them all and refuses.
    pub(crate) fn take(&self, n: u64) -> Result<(), Spent> {
        let mut taken = Ok(());
        let _ = (self.left).fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
            taken = left.checked_sub(n).ok_or(Spent).map(drop);
            Some(left.saturating_sub(n))
        });
        taken
    }

    /// Gives back bytes taken for a request that never left the host.
    pub(crate) fn refund(&self, n: u64) {
        self.left.fetch_add(n, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_past_what_is_left_spends_it_all_and_is_refused() {
        let budget = ByteBudget::new(10);
        assert_eq!(budget.take(4), Ok(()));
        assert_eq!(budget.take(6), Ok(()));
        assert_eq!(budget.left(), 0);
        assert_eq!(budget.take(0), Ok(()));
        assert_eq!(budget.take(1), Err(Spent));
        let budget = ByteBudget::new(10);
        assert_eq!(budget.take(11), Err(Spent));
        assert_eq!(budget.left(), 0, "what was left is spent");
        budget.refund(3);
        assert_eq!(budget.left(), 3);
    }

    #[test]
    fn takes_from_many_threads_never_pass_the_budget_together() {
        let budget = std::sync::Arc::new(ByteBudget::new(1000));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let budget = budget.clone();
                std::thread::spawn(move || (0..100).filter(|_| budget.take(3).is_ok()).count())
            })
            .collect();
        let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(granted, 1000 / 3);
    }
}
