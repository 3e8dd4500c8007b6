//! Sending: the ends go out on the attached connection in `seq` order, each once, for as
//! long as each is ready (in memory, its block uploaded); what stops them is the backlog
//! work's next step.

use flint_protocol::ExecutorMessage;
use tokio::sync::mpsc::UnboundedSender;

use super::{Link, Place, Stage, State, Step};
use crate::ends::Budgets;

impl State {
    pub(in crate::ends) fn attach(&mut self, outbox: UnboundedSender<ExecutorMessage>) {
        self.link = Some(Link {
            outbox,
            sent_up_to: self.acked,
        });
    }

    pub(in crate::ends) fn detach(&mut self) {
        self.link = None;
        self.holding_back = false;
    }

    /// Ends taken but not sent on the connection.
    pub(in crate::ends) fn unsent(&self) -> u64 {
        self.link
            .as_ref()
            .map_or(0, |link| self.next_seq - 1 - link.sent_up_to)
    }

    /// Marks an end held back for its batch: whether the flusher must be woken (the
    /// first of a batch, on a connection).
    pub(in crate::ends) fn hold_back(&mut self) -> bool {
        let first = self.link.is_some() && !self.holding_back;
        self.holding_back |= first;
        first
    }

    pub(in crate::ends) fn holding_back(&self) -> bool {
        self.holding_back
    }

    /// Sends the unsent ends in order for as long as each is ready; whether one that the
    /// backlog work must prepare (read back, upload its block) stopped it.
    pub(in crate::ends) fn pump(&mut self) -> bool {
        self.holding_back = false;
        let State {
            link,
            ends,
            acked,
            sent_ever,
            ..
        } = self;
        let Some(link) = link else { return false };
        loop {
            let seq = link.sent_up_to + 1;
            let Some(end) = ends.get((seq - *acked - 1) as usize) else {
                return false;
            };
            let status = match (&end.place, end.block) {
                (Place::Memory(status), None) => status.clone(),
                _ => return true,
            };
            // A closed outbox: the connection is gone, and the next one sends it.
            if link
                .outbox
                .send(ExecutorMessage::StatusUpdate { seq, status })
                .is_err()
            {
                return false;
            }
            link.sent_up_to = seq;
            *sent_ever = (*sent_ever).max(seq);
        }
    }

    /// What the backlog work should do for the first unsent end (sending those that are
    /// ready on the way). A spilled end is read back when memory has room for it, or
    /// when it is the oldest end held: every end in memory is then after it, so no ack
    /// can make room, and it goes alone.
    pub(in crate::ends) fn next_step(&mut self, budgets: Budgets) -> Step {
        loop {
            let Some(link) = &self.link else {
                return Step::Idle;
            };
            let seq = link.sent_up_to + 1;
            let (oldest, memory_bytes) = (seq == self.acked + 1, self.memory_bytes);
            let Some(end) = self.get_mut(seq) else {
                return Step::Idle;
            };
            match (&mut end.place, end.block) {
                (Place::Memory(status), Some(_)) => {
                    let ids: Vec<String> = crate::ends::held_blocks(status)
                        .map(str::to_owned)
                        .collect();
                    if !ids.is_empty() {
                        return Step::Upload { seq, ids };
                    }
                    // Only a result's block or a tape is ever held: with neither, nothing
                    // to wait for.
                    self.block_done(seq, None);
                }
                (Place::Memory(_), None) => {
                    // Stopped by nothing (all sent) or a closed outbox: nothing to do.
                    if !self.pump() {
                        return Step::Idle;
                    }
                }
                (Place::Disk(_, stage @ Stage::Written), _)
                    if oldest || memory_bytes + end.bytes <= budgets.memory_bytes =>
                {
                    *stage = Stage::Loading;
                    let bytes = end.bytes;
                    self.add_memory(bytes);
                    return Step::Load(seq);
                }
                _ => return Step::Idle,
            }
        }
    }
}
