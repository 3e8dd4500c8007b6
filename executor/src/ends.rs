//! The end buffer: every task end this executor reports, numbered (`seq`, from 1) and
//! held until the driver says it is durable (`EndsDurable`), so that an end sent just
//! before a driver crashed, or one that ended while the driver was away, reaches the
//! driver that comes back.
//!
//! - [`EndBuffer::take`]: a task thread hands over an end. It is held in memory, or on
//!   disk when memory is full, or the thread waits until an acknowledgement makes room.
//! - While a connection is attached ([`EndBuffer::attach`]) ends go to its outbox in
//!   `seq` order, each once per connection; a burst is batched (see [`HOLD_FOR`]).
//! - [`EndBuffer::acknowledge`]: a cumulative ack frees what it covers.
//! - The connection's backlog work ([`EndBuffer::next_step`]) reads spilled ends back
//!   and has held blocks uploaded, for the ends at the head of the unsent ones.
//!
//! Invariants: ends go out in `seq` order, never twice on one connection; memory holds
//! a prefix of the held ends and disk the rest (an end goes to memory only while none
//! is on disk), so reading the first spilled end back only ever waits for acks of ends
//! already sent; ends in memory stay within the memory budget, but for one end larger
//! than it, read back alone. Files are written without fsync: the buffer outlives a
//! driver, not this process (a new process is a new executor to the driver).

mod spill;
mod state;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use flint_protocol::{ExecutorMessage, HeldAttempt, TaskResult, TaskStatus};
use tokio::sync::mpsc::UnboundedSender;

use self::spill::Spill;
use self::state::{Admission, State};
pub use self::state::{Figures, Step};

/// The blocks of an end that may wait on this executor's disk for the driver: its
/// result's, and a deterministic attempt's tape of recorded responses.
pub fn held_blocks(status: &TaskStatus) -> impl Iterator<Item = &str> {
    let result = match &status.end.outcome {
        Ok(TaskResult::Block(block)) => Some(block.id.as_str()),
        _ => None,
    };
    let tape = (status.end.pins.as_ref())
        .and_then(|pins| pins.egress_tape.as_ref())
        .map(|tape| tape.id.as_str());
    result.into_iter().chain(tape)
}

/// Ends held back while task threads have more work queued, so that a burst of short
/// tasks wakes the connection's writer once per batch instead of once per task (that
/// wake-up, a futex call, cost as much as running a no-op task). An end is held at most
/// `HOLD_FOR` (the flusher thread sends it then) and never when its thread's queue is
/// empty, so a lone task's end goes out at once.
const HOLD_FOR: Duration = Duration::from_millis(1);
/// The most ends held back before they are sent anyway.
const HOLD_MAX: u64 = 64;

/// How much the buffer may hold: ends in memory, and ends and held result blocks on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    pub memory_bytes: u64,
    pub disk_bytes: u64,
}

/// `flint executor --end-buffer-bytes` and `--end-spill-bytes`: 64 MiB holds about
/// 400,000 small ends (a driver's restart's worth at full speed on a large executor);
/// past it, 1 GiB of disk holds the large ones.
impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            memory_bytes: 64 << 20,
            disk_bytes: 1 << 30,
        }
    }
}

pub struct EndBuffer {
    state: Mutex<State>,
    budgets: Budgets,
    spill: Spill,
    /// Reporters waiting for room (both budgets full).
    room: Condvar,
    /// Wakes the flusher: an end was held back to batch.
    held_back: Condvar,
    /// Wakes the connection's backlog work: an end to read back or a block to upload
    /// heads the unsent ends, or an ack made room to read one back. A wake-up given while
    /// nobody waits is kept, so none is lost between a look and the wait.
    backlog: tokio::sync::Notify,
}

impl EndBuffer {
    /// A buffer spilling to `dir`, emptied first: ends held by an earlier process are
    /// not this executor's (the driver saw that one go).
    pub fn open(dir: PathBuf, budgets: Budgets) -> std::io::Result<Arc<EndBuffer>> {
        let buffer = Arc::new(EndBuffer {
            state: Mutex::new(State::default()),
            budgets,
            spill: Spill::clear(dir)?,
            room: Condvar::new(),
            held_back: Condvar::new(),
            backlog: tokio::sync::Notify::new(),
        });
        let weak = Arc::downgrade(&buffer);
        std::thread::Builder::new()
            .name("flint-end-flush".into())
            .spawn(move || flush_held_back(weak))?;
        Ok(buffer)
    }

    /// Holds an attempt's end, numbered after every end taken before it, and sends it
    /// (now, or with its batch when `more_queued`). `held_block` is the size of its
    /// result's block when that block waits on this executor's disk for the driver
    /// ([`crate::blocks`]): the end is not sent before the block is uploaded. Blocks while
    /// neither budget has room. `taken` is called with the end once it is held, under
    /// the buffer's lock: the runner forgets the attempt there, so that a registration's
    /// listing ([`EndBuffer::held_attempts`]) sees it running or ended, never neither.
    pub fn take(
        &self,
        status: TaskStatus,
        held_block: Option<u64>,
        more_queued: bool,
        taken: impl FnOnce(&TaskStatus),
    ) {
        let bytes = state::weight(&status);
        let mut state = self.lock();
        let admission = loop {
            match state.admit(bytes, self.budgets) {
                Some(admission) => break admission,
                None => state = self.wait_for_room(state),
            }
        };
        state.end_wait();
        // Under the same lock as the end's arrival: nobody can see it between the two.
        taken(&status);
        if admission == Admission::Disk {
            let seq = state.push_spilling(&status, bytes, held_block);
            drop(state);
            return self.spill(seq, status);
        }
        state.push_memory(status, bytes, held_block);
        if more_queued && state.unsent() < HOLD_MAX {
            if state.hold_back() {
                self.held_back.notify_one();
            }
            return;
        }
        self.pump(&mut state);
    }

    /// Writes a spilled end to disk, outside the lock: a large end takes a while.
    fn spill(&self, seq: u64, status: TaskStatus) {
        let written = self.spill.write(seq, &status);
        let mut state = self.lock();
        match written {
            Ok(()) => state.spilled(seq),
            Err(e) => {
                // Kept in memory over its budget rather than lost.
                tracing::error!(seq, error = %e, "cannot spill a task end to disk; keeping it in memory");
                state.spill_failed(seq, status);
            }
        }
        self.pump(&mut state);
        self.backlog.notify_one();
    }

    fn wait_for_room<'a>(&self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        if state.begin_wait() {
            tracing::warn!(
                memory_budget_bytes = self.budgets.memory_bytes,
                disk_budget_bytes = self.budgets.disk_bytes,
                "the end buffer is full (--end-buffer-bytes in memory, --end-spill-bytes on \
                 disk): tasks wait to report their ends until the driver acknowledges some"
            );
        }
        let mut state = self.room.wait(state).expect("end buffer lock poisoned");
        state.waiting -= 1;
        state
    }

    /// Every end numbered up to `up_to` is durable with the driver: forgets them.
    pub fn acknowledge(&self, up_to: u64) {
        let mut state = self.lock();
        let freed = state.acknowledge(up_to);
        let wake_reporters = state.waiting > 0;
        let wake_backlog = state.on_disk() > 0;
        drop(state);
        // Dropped outside the lock: an ack may free many ends.
        drop(freed);
        if wake_reporters {
            self.room.notify_all();
        }
        if wake_backlog {
            self.backlog.notify_one();
        }
    }

    /// A connection registered: every held end goes out on it again, in order, then
    /// each new one.
    pub fn attach(&self, outbox: UnboundedSender<ExecutorMessage>) {
        let mut state = self.lock();
        state.attach(outbox);
        self.pump(&mut state);
    }

    /// The connection is gone: ends are only held until the next.
    pub fn detach(&self) {
        self.lock().detach();
    }

    /// Sends what may go now; wakes the backlog work when an end it must prepare blocks
    /// the way.
    fn pump(&self, state: &mut State) {
        if state.pump() {
            self.backlog.notify_one();
        }
    }

    /// The attempts to list when registering: `running()` (read under this buffer's
    /// lock, so that no attempt is between the two lists) and every end held.
    pub fn held_attempts(&self, running: impl FnOnce() -> Vec<HeldAttempt>) -> Vec<HeldAttempt> {
        let state = self.lock();
        let mut attempts = running();
        attempts.extend(state.ended_attempts());
        attempts
    }

    pub fn figures(&self) -> Figures {
        self.lock().figures()
    }

    /// What the backlog work should do next for the attached connection.
    pub fn next_step(&self) -> Step {
        self.lock().next_step(self.budgets)
    }

    /// Reads a spilled end back into memory ([`Step::Load`]). Blocking: call it off the
    /// async runtime's threads.
    pub fn load(&self, seq: u64) {
        let read = self.spill.read(seq);
        let mut state = self.lock();
        match read {
            Ok(status) => state.loaded(seq, status),
            Err(e) => {
                // Nothing to send for it: the driver runs the attempt again (a lost end).
                tracing::error!(seq, error = %e, "cannot read a spilled task end back; dropping it");
                state.load_failed(seq);
            }
        }
        let wake_reporters = state.waiting > 0;
        self.pump(&mut state);
        drop(state);
        self.spill.remove(seq);
        if wake_reporters {
            self.room.notify_all();
        }
    }

    /// The block of end `seq` reached the driver: the end may go.
    pub fn block_uploaded(&self, seq: u64) {
        let mut state = self.lock();
        state.block_done(seq, None);
        self.after_block(state);
    }

    /// The driver refused the block of end `seq`: the end goes as the host failure it is.
    pub fn block_refused(&self, seq: u64, why: String) {
        let mut state = self.lock();
        state.block_done(seq, Some(why));
        self.after_block(state);
    }

    fn after_block(&self, mut state: MutexGuard<'_, State>) {
        let wake_reporters = state.waiting > 0;
        self.pump(&mut state);
        drop(state);
        if wake_reporters {
            self.room.notify_all();
        }
    }

    /// Waits until the backlog work may have something to do.
    pub async fn backlog_changed(&self) {
        self.backlog.notified().await;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("end buffer lock poisoned")
    }
}

/// Sends ends held back no later than [`HOLD_FOR`] after the first of them. Ends with the
/// buffer.
fn flush_held_back(buffer: Weak<EndBuffer>) {
    while let Some(buffer) = buffer.upgrade() {
        let state = buffer.lock();
        // Wakes now and then to notice that the buffer is gone.
        let (state, _) = buffer
            .held_back
            .wait_timeout_while(state, Duration::from_millis(200), |s| !s.holding_back())
            .expect("end buffer lock poisoned");
        if !state.holding_back() {
            continue;
        }
        drop(state);
        std::thread::sleep(HOLD_FOR);
        buffer.pump(&mut buffer.lock());
    }
}
