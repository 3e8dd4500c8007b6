//! The end buffer's bookkeeping, without I/O or waiting (the buffer does both): which
//! ends are held where, what each budget holds; [`sending`]: how far the connection has
//! been sent, and what stops it.

mod sending;

use std::collections::VecDeque;

use flint_protocol::{
    ExecutorMessage, FailureKind, HeldAttempt, TaskEnd, TaskFailure, TaskId, TaskResult,
    TaskStatus, Usage,
};
use tokio::sync::mpsc::UnboundedSender;

use super::Budgets;

/// An upper bound of the encoded size of an end's fixed fields (frame length, message
/// tag, `seq`, ids, times, usage, the lengths of its variable parts), all varints at
/// their longest.
const FIXED: u64 = 160;

/// What an end is counted as, in memory and on disk alike: an upper bound of its encoded
/// size, computed from its parts rather than by encoding it (encoding every end to weigh
/// it would cost as much as sending it): its variable parts' bytes plus [`FIXED`].
pub(super) fn weight(status: &TaskStatus) -> u64 {
    let end = &status.end;
    let outcome = match &end.outcome {
        Ok(TaskResult::Inline(bytes)) => bytes.len() as u64,
        Ok(TaskResult::Block(block)) => block.id.len() as u64 + 32 + 10,
        Err(failure) => failure.message.len() as u64 + 6,
    };
    let pins = end.pins.as_ref().map_or(0, |p| {
        // Egress pins and refusals are the guest's to multiply: counted from their parts.
        let egress: u64 = (p.egress.iter())
            .map(|pin| {
                let numbers = varint(pin.status.into()) + varint(pin.offset) + varint(pin.len);
                string(&pin.method) + string(&pin.url) + 64 + numbers
            })
            .sum();
        let tape = (p.egress_tape.as_ref()).map_or(0, |tape| string(&tape.id) + 32 + 10);
        32 * (2 + p.files.len() as u64) + 5 + egress + 5 + tape + 1
    });
    let denied: u64 = end
        .egress_denied
        .iter()
        .map(|message| string(message))
        .sum();
    FIXED + status.task.job.0.len() as u64 + end.log.len() as u64 + outcome + pins + denied
}

/// A string's encoded size: its bytes and their count.
fn string(s: &str) -> u64 {
    s.len() as u64 + varint(s.len() as u64)
}

/// The bytes of `n` as a varint (postcard's unsigned integers).
fn varint(n: u64) -> u64 {
    u64::from((64 - n.leading_zeros()).max(1).div_ceil(7))
}

/// Where an admitted end goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    Memory,
    Disk,
}

/// What the connection's backlog work should do for the end at the head of the unsent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Read spilled end `seq` back ([`super::EndBuffer::load`]); memory is reserved.
    Load(u64),
    /// Upload the held blocks of end `seq` (those of `ids` that are held), then report
    /// how it went.
    Upload { seq: u64, ids: Vec<String> },
    /// Nothing to do until the buffer changes (not connected, all sent, or waiting for
    /// an ack to make room, or for a spill to be written).
    Idle,
}

/// The buffer's figures, for heartbeats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub held: u64,
    pub memory_bytes: u64,
    pub disk_bytes: u64,
    pub peak_memory_bytes: u64,
    pub peak_disk_bytes: u64,
    pub waited: u64,
}

/// What an end on disk is known by, without reading it.
struct Key {
    task: TaskId,
    attempt: u32,
    generation: u64,
    started_at_us: u64,
}

impl Key {
    fn of(status: &TaskStatus) -> Key {
        Key {
            task: status.task.clone(),
            attempt: status.attempt,
            generation: status.generation,
            started_at_us: status.end.started_at_us,
        }
    }
}

#[expect(
    clippy::large_enum_variant,
    reason = "almost every held end is in memory: boxing it would cost an allocation per \
              task to save bytes on the few that spill"
)]
enum Place {
    Memory(TaskStatus),
    Disk(Key, Stage),
}

/// How far an end on disk is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Being written (its bytes are counted on disk already).
    Spilling,
    Written,
    /// Being read back (its bytes are counted in memory already, and still on disk).
    Loading,
}

pub(super) struct Held {
    seq: u64,
    bytes: u64,
    place: Place,
    /// Bytes of its blocks (its result's, its tape), on this executor's disk until the
    /// driver has them.
    block: Option<u64>,
}

/// The connection ends are sent on, and how far.
struct Link {
    outbox: UnboundedSender<ExecutorMessage>,
    /// Every end up to this number went out on this connection (or was acknowledged).
    sent_up_to: u64,
}

pub(super) struct State {
    next_seq: u64,
    /// Every end numbered up to this is durable with the driver.
    acked: u64,
    /// The highest number sent on any connection: an ack past it is a driver's mistake.
    sent_ever: u64,
    /// The held ends, `acked + 1` onwards, without gaps.
    ends: VecDeque<Held>,
    link: Option<Link>,
    holding_back: bool,
    memory_bytes: u64,
    disk_bytes: u64,
    peak_memory_bytes: u64,
    peak_disk_bytes: u64,
    waited: u64,
    /// Ends spilling, spilled or being read back.
    on_disk: usize,
    /// Reporters waiting for room.
    pub(super) waiting: usize,
    /// This episode of waiting has been logged.
    warned: bool,
}

impl Default for State {
    fn default() -> Self {
        State {
            next_seq: 1,
            acked: 0,
            sent_ever: 0,
            ends: VecDeque::new(),
            link: None,
            holding_back: false,
            memory_bytes: 0,
            disk_bytes: 0,
            peak_memory_bytes: 0,
            peak_disk_bytes: 0,
            waited: 0,
            on_disk: 0,
            waiting: 0,
            warned: false,
        }
    }
}

impl State {
    /// Where an end of `bytes` may go now, if anywhere. Memory only while nothing is on
    /// disk (the order invariant); an end that no budget holds goes to disk once the
    /// buffer is empty, alone, rather than wait for ever. Nothing goes to disk while
    /// memory is past its budget: a spill that failed (a full or broken disk) keeps its
    /// end in memory, and the next ones wait for room rather than fail the same way and
    /// pile up in memory too.
    pub(super) fn admit(&self, bytes: u64, budgets: Budgets) -> Option<Admission> {
        if self.on_disk == 0 && self.memory_bytes + bytes <= budgets.memory_bytes {
            Some(Admission::Memory)
        } else if (self.disk_bytes + bytes <= budgets.disk_bytes
            && self.memory_bytes <= budgets.memory_bytes)
            || (self.memory_bytes == 0 && self.disk_bytes == 0)
        {
            Some(Admission::Disk)
        } else {
            None
        }
    }

    pub(super) fn push_memory(&mut self, status: TaskStatus, bytes: u64, block: Option<u64>) {
        self.add_memory(bytes);
        self.push(Place::Memory(status), bytes, block);
    }

    pub(super) fn push_spilling(
        &mut self,
        status: &TaskStatus,
        bytes: u64,
        block: Option<u64>,
    ) -> u64 {
        self.add_disk(bytes);
        self.on_disk += 1;
        self.push(Place::Disk(Key::of(status), Stage::Spilling), bytes, block)
    }

    fn push(&mut self, place: Place, bytes: u64, block: Option<u64>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(block) = block {
            self.add_disk(block);
        }
        self.ends.push_back(Held {
            seq,
            bytes,
            place,
            block,
        });
        seq
    }

    fn add_memory(&mut self, bytes: u64) {
        self.memory_bytes += bytes;
        self.peak_memory_bytes = self.peak_memory_bytes.max(self.memory_bytes);
    }

    fn add_disk(&mut self, bytes: u64) {
        self.disk_bytes += bytes;
        self.peak_disk_bytes = self.peak_disk_bytes.max(self.disk_bytes);
    }

    fn get_mut(&mut self, seq: u64) -> Option<&mut Held> {
        let index = seq.checked_sub(self.acked + 1)?;
        let end = self.ends.get_mut(usize::try_from(index).ok()?)?;
        debug_assert_eq!(end.seq, seq, "held ends are numbered without gaps");
        Some(end)
    }

    /// The spill of `seq` is on disk.
    pub(super) fn spilled(&mut self, seq: u64) {
        if let Some(Held {
            place: Place::Disk(_, stage),
            ..
        }) = self.get_mut(seq)
        {
            *stage = Stage::Written;
        }
    }

    /// The spill of `seq` could not be written: it stays in memory.
    pub(super) fn spill_failed(&mut self, seq: u64, status: TaskStatus) {
        let end = self.get_mut(seq).expect("a spilling end is held");
        end.place = Place::Memory(status);
        let bytes = end.bytes;
        self.disk_bytes -= bytes;
        self.on_disk -= 1;
        self.add_memory(bytes);
    }

    /// End `seq` was read back (its memory was reserved by [`State::next_step`]).
    pub(super) fn loaded(&mut self, seq: u64, status: TaskStatus) {
        let end = self.get_mut(seq).expect("a loading end is held");
        end.place = Place::Memory(status);
        let bytes = end.bytes;
        self.disk_bytes -= bytes;
        self.on_disk -= 1;
    }

    /// End `seq` could not be read back: what is known of it goes to the driver as a
    /// host failure, so that the attempt is run again rather than forgotten.
    pub(super) fn load_failed(&mut self, seq: u64) {
        let end = self.get_mut(seq).expect("a loading end is held");
        let Place::Disk(key, _) = &end.place else {
            unreachable!("only an end on disk fails to load");
        };
        end.place = Place::Memory(lost_end(key));
        let bytes = end.bytes;
        self.disk_bytes -= bytes;
        self.on_disk -= 1;
    }

    /// The block of `seq` is uploaded, or was refused (`Some(why)`): the end may go.
    pub(super) fn block_done(&mut self, seq: u64, refused: Option<String>) {
        let Some(end) = self.get_mut(seq) else { return };
        let Some(block) = end.block.take() else {
            return;
        };
        if let (Some(why), Place::Memory(status)) = (refused, &mut end.place) {
            status.end.outcome = Err(TaskFailure::new(
                FailureKind::HostError,
                format!("the driver refused a block kept while it was away: {why}"),
            ));
        }
        self.disk_bytes -= block;
    }

    /// Forgets the ends up to `up_to`; the forgotten, to be dropped outside the lock.
    pub(super) fn acknowledge(&mut self, up_to: u64) -> Vec<Held> {
        let up_to = if up_to > self.sent_ever {
            tracing::warn!(
                up_to,
                sent = self.sent_ever,
                "the driver acknowledged ends it was never sent"
            );
            self.sent_ever
        } else {
            up_to
        };
        if up_to <= self.acked {
            return Vec::new();
        }
        let freed: Vec<Held> = self.ends.drain(..(up_to - self.acked) as usize).collect();
        for end in &freed {
            match end.place {
                Place::Memory(_) => self.memory_bytes -= end.bytes,
                // Never sent, so never acknowledged; counted right all the same.
                Place::Disk(_, stage) => {
                    self.disk_bytes -= end.bytes;
                    self.on_disk -= 1;
                    if stage == Stage::Loading {
                        self.memory_bytes -= end.bytes;
                    }
                }
            }
            self.disk_bytes -= end.block.unwrap_or(0);
        }
        self.acked = up_to;
        if let Some(link) = &mut self.link {
            link.sent_up_to = link.sent_up_to.max(up_to);
        }
        freed
    }

    /// Every held end, as a registration lists it.
    pub(super) fn ended_attempts(&self) -> impl Iterator<Item = HeldAttempt> + '_ {
        self.ends.iter().map(|end| {
            let (task, attempt, generation, started_at_us) = match &end.place {
                Place::Memory(s) => (&s.task, s.attempt, s.generation, s.end.started_at_us),
                Place::Disk(k, _) => (&k.task, k.attempt, k.generation, k.started_at_us),
            };
            HeldAttempt {
                task: task.clone(),
                attempt,
                generation,
                started_at_us,
                ended: true,
            }
        })
    }

    pub(super) fn on_disk(&self) -> usize {
        self.on_disk
    }

    /// A reporter starts waiting for room; whether this begins an episode to log.
    pub(super) fn begin_wait(&mut self) -> bool {
        self.waiting += 1;
        self.waited += 1;
        !std::mem::replace(&mut self.warned, true)
    }

    /// A reporter got room: once none waits, the episode is over.
    pub(super) fn end_wait(&mut self) {
        if self.waiting == 0 {
            self.warned = false;
        }
    }

    pub(super) fn figures(&self) -> Figures {
        Figures {
            held: self.ends.len() as u64,
            memory_bytes: self.memory_bytes,
            disk_bytes: self.disk_bytes,
            peak_memory_bytes: self.peak_memory_bytes,
            peak_disk_bytes: self.peak_disk_bytes,
            waited: self.waited,
        }
    }
}

/// An end that could not be read back, as the host failure it becomes.
fn lost_end(key: &Key) -> TaskStatus {
    TaskStatus {
        task: key.task.clone(),
        attempt: key.attempt,
        generation: key.generation,
        end: TaskEnd {
            started_at_us: key.started_at_us,
            finished_at_us: key.started_at_us,
            outcome: Err(TaskFailure::new(
                FailureKind::HostError,
                "the executor could not read this attempt's end back from its disk",
            )),
            log: Vec::new(),
            log_truncated: false,
            usage: Usage::default(),
            pins: None,
            memory_mb: None,
            egress_denied: Vec::new(),
        },
    }
}
