//! The service's periodic tick: what no single event decides, looked at on a timer.

use super::*;

impl ClusterState {
    /// Executors silent for longer than `executor_timeout` are lost (and returned, for
    /// the service to drop their connections), decommissioned ones that have drained or
    /// run out of time are stopped, a full round of offers picks up what rounds for one
    /// executor left (and ends locality waits, and the wait for executors to come back
    /// after a restart once it is due), and slow tasks get copies.
    pub fn tick(&mut self, executor_timeout: Duration) -> (Vec<(ExecutorId, u64)>, Vec<Action>) {
        let (expired, mut actions) = self.expire_executors(executor_timeout);
        actions.extend(self.stop_drained());
        self.end_adopting_if_due();
        actions.extend(self.make_offers());
        actions.extend(self.speculate());
        (expired, actions)
    }
}
