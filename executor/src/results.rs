//! A task's stdout as its result: kept in memory up to the inline limit, and past it
//! streamed to the block store while the guest is still writing (Spark's
//! IndirectTaskResult, without holding the whole result anywhere). The digest is taken
//! once, where the bytes are stored (the driver, or the upload to an object store), and
//! is the block's; here only the size is checked against what the guest wrote, since a
//! second SHA-256 pass on this side cost a third of the CPU a large result takes on 2
//! cores (BENCHMARKS.md). Whoever reads a block back (a chained task's fetch) checks its
//! digest. The cap on the whole result traps the guest, as for inline ones.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use flint_protocol::{BlockRef, Digest, FailureKind, TaskFailure, TaskId, TaskResult};

/// Bytes handed to the block store at once: big enough that a 64 MiB result is a few
/// dozen hand-offs, small enough that a task holds little of it in memory.
const CHUNK: usize = 1 << 20;

/// Receives one result's bytes, in order, on the task thread. `write` may block: that is
/// the back-pressure that keeps a fast guest from outrunning the upload; it gives up
/// once `stopped` says the attempt is over (its deadline passed, it was killed), since a
/// guest blocked in this write is in a host call that no epoch reaches.
pub trait BlockSink: Send {
    fn write(&mut self, chunk: Bytes, stopped: &dyn Fn() -> bool) -> Result<(), String>;
    /// Every byte was written: returns the size and digest the store received.
    fn finish(self: Box<Self>) -> Result<(u64, Digest), String>;
    /// The attempt failed: nothing may become visible.
    fn abort(self: Box<Self>);
}

/// Opens a sink for a block id.
pub trait BlockWriter: Send + Sync {
    fn open(&self, id: &str) -> Box<dyn BlockSink>;

    /// The size of block `id` when it was finished but kept on this executor's disk,
    /// its store (the driver) being away: its end must wait for it to be uploaded.
    fn held(&self, _id: &str) -> Option<u64> {
        None
    }
}

/// Where this attempt's result goes if it outgrows the inline limit.
#[derive(Clone)]
pub struct ResultTarget {
    pub writer: Arc<dyn BlockWriter>,
    /// The attempt, for the block's id: formatted only when a result needs a block.
    pub task: TaskId,
    pub attempt: u32,
    pub generation: u64,
    pub inline_max: usize,
}

impl ResultTarget {
    fn id(&self) -> String {
        BlockRef::id_for(&self.task, self.attempt, self.generation)
    }
}

/// Whether the attempt is over (past its deadline or killed).
pub type Stopped = Arc<dyn Fn() -> bool + Send + Sync>;

#[derive(Clone)]
pub struct ResultPipe {
    inner: Arc<Mutex<State>>,
}

struct State {
    cap: u64,
    target: Option<ResultTarget>,
    head: Vec<u8>,
    /// Bytes past the head not yet handed to the sink.
    pending: Vec<u8>,
    total: u64,
    sink: Option<Box<dyn BlockSink>>,
    overflowed: bool,
    /// Why the block store refused bytes: a host failure, not the guest's.
    failed: Option<String>,
    stopped: Stopped,
    /// A write was refused because the attempt was over.
    was_stopped: bool,
}

impl ResultPipe {
    pub fn new(cap: usize, target: Option<ResultTarget>, stopped: Stopped) -> Self {
        ResultPipe {
            inner: Arc::new(Mutex::new(State {
                cap: cap as u64,
                target,
                head: Vec::new(),
                pending: Vec::new(),
                total: 0,
                sink: None,
                overflowed: false,
                failed: None,
                stopped,
                was_stopped: false,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn overflowed(&self) -> bool {
        self.lock().overflowed
    }

    /// Whether a write was refused because the attempt was over: the guest was stopped
    /// in a host call, not failed by the store.
    pub fn was_stopped(&self) -> bool {
        self.lock().was_stopped
    }

    /// Bytes the guest wrote and the pipe took (what went past the cap was refused).
    pub fn written(&self) -> u64 {
        self.lock().total
    }

    /// Why storing the result failed, if it did.
    pub fn store_failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// Takes the guest's bytes: an error traps the guest.
    fn accept(&self, data: &[u8]) -> Result<(), &'static str> {
        let mut state = self.lock();
        let state = &mut *state;
        if state.failed.is_some() {
            return Err("result upload failed");
        }
        if state.total + data.len() as u64 > state.cap {
            state.overflowed = true;
            return Err("output limit exceeded");
        }
        state.total += data.len() as u64;
        let inline_max = state.target.as_ref().map_or(usize::MAX, |t| t.inline_max);
        if state.sink.is_none() && state.head.len() + data.len() <= inline_max {
            state.head.extend_from_slice(data);
            return Ok(());
        }
        if state.sink.is_none() {
            let target = state
                .target
                .as_ref()
                .expect("past the inline limit only with a target");
            state.sink = Some(target.writer.open(&target.id()));
            state.pending = std::mem::take(&mut state.head);
        }
        state.pending.extend_from_slice(data);
        while state.pending.len() >= CHUNK {
            // Room for a chunk and a guest write past it, so that the next chunk fills
            // without the Vec growing (and copying) its way up from a few bytes.
            let mut rest = Vec::with_capacity(CHUNK + CHUNK / 8);
            rest.extend_from_slice(&state.pending[CHUNK..]);
            state.pending.truncate(CHUNK);
            let chunk = std::mem::replace(&mut state.pending, rest);
            if (state.stopped)() {
                state.was_stopped = true;
                return Err("the attempt is over");
            }
            let sink = state.sink.as_mut().expect("opened above");
            if let Err(e) = sink.write(Bytes::from(chunk), &*state.stopped) {
                if (state.stopped)() {
                    state.was_stopped = true;
                    return Err("the attempt is over");
                }
                state.failed = Some(e);
                return Err("result upload failed");
            }
        }
        Ok(())
    }

    /// The attempt succeeded: its result, inline or as a stored block.
    pub fn into_result(self) -> Result<TaskResult, TaskFailure> {
        let mut state = self.lock();
        let Some(mut sink) = state.sink.take() else {
            return Ok(TaskResult::Inline(std::mem::take(&mut state.head)));
        };
        let host = |m: String| TaskFailure::new(FailureKind::HostError, m);
        let pending = std::mem::take(&mut state.pending);
        if !pending.is_empty() {
            sink.write(Bytes::from(pending), &|| false)
                .map_err(|e| host(format!("storing the result: {e}")))?;
        }
        let (size, digest) = sink
            .finish()
            .map_err(|e| host(format!("storing the result: {e}")))?;
        if size != state.total {
            return Err(host(format!(
                "the block store received {size} bytes, but the task wrote {}",
                state.total
            )));
        }
        let id = state.target.as_ref().expect("a sink has a target").id();
        Ok(TaskResult::Block(BlockRef { id, size, digest }))
    }

    /// The attempt failed: drop whatever was being stored.
    pub fn abort(self) {
        if let Some(sink) = self.lock().sink.take() {
            sink.abort();
        }
    }
}

crate::pipes::guest_output_pipe!(ResultPipe);

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use wasmtime_wasi::p2::OutputStream;

    use super::*;
    use flint_protocol::JobId;

    /// Keeps what it is given, as a store would.
    #[derive(Default)]
    struct Memory {
        blocks: Mutex<Vec<(String, Vec<u8>, bool)>>,
    }

    struct MemorySink {
        memory: Arc<Memory>,
        id: String,
        bytes: Vec<u8>,
        writes: usize,
    }

    impl BlockWriter for Arc<Memory> {
        fn open(&self, id: &str) -> Box<dyn BlockSink> {
            Box::new(MemorySink {
                memory: self.clone(),
                id: id.to_owned(),
                bytes: Vec::new(),
                writes: 0,
            })
        }
    }

    impl BlockSink for MemorySink {
        fn write(&mut self, chunk: Bytes, _stopped: &dyn Fn() -> bool) -> Result<(), String> {
            self.writes += 1;
            assert!(chunk.len() <= CHUNK);
            self.bytes.extend_from_slice(&chunk);
            Ok(())
        }
        fn finish(self: Box<Self>) -> Result<(u64, Digest), String> {
            let digest = Digest::of(&self.bytes);
            let size = self.bytes.len() as u64;
            self.memory
                .blocks
                .lock()
                .unwrap()
                .push((self.id, self.bytes, true));
            Ok((size, digest))
        }
        fn abort(self: Box<Self>) {
            self.memory
                .blocks
                .lock()
                .unwrap()
                .push((self.id, self.bytes, false));
        }
    }

    fn pipe(cap: usize, inline_max: usize) -> (ResultPipe, Arc<Memory>) {
        let memory = Arc::new(Memory::default());
        let target = ResultTarget {
            writer: Arc::new(memory.clone()),
            task: TaskId {
                job: JobId("job".into()),
                index: 0,
            },
            attempt: 1,
            generation: 1,
            inline_max,
        };
        (
            ResultPipe::new(cap, Some(target), Arc::new(|| false)),
            memory,
        )
    }

    /// A store that never takes a byte, as a stalled upload: it waits until the attempt
    /// is over, as the real one does.
    struct StalledSink;

    impl BlockSink for StalledSink {
        fn write(&mut self, _chunk: Bytes, stopped: &dyn Fn() -> bool) -> Result<(), String> {
            while !stopped() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err("the attempt is over".into())
        }
        fn finish(self: Box<Self>) -> Result<(u64, Digest), String> {
            unreachable!("never finished")
        }
        fn abort(self: Box<Self>) {}
    }

    struct Stalled;

    impl BlockWriter for Stalled {
        fn open(&self, _id: &str) -> Box<dyn BlockSink> {
            Box::new(StalledSink)
        }
    }

    #[test]
    fn a_write_waiting_on_a_stalled_store_gives_up_when_the_attempt_is_over() {
        let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let target = ResultTarget {
            writer: Arc::new(Stalled),
            task: TaskId {
                job: JobId("job".into()),
                index: 0,
            },
            attempt: 1,
            generation: 1,
            inline_max: 10,
        };
        let stopped: Stopped = {
            let over = over.clone();
            Arc::new(move || over.load(std::sync::atomic::Ordering::SeqCst))
        };
        let mut p = ResultPipe::new(10 << 20, Some(target), stopped);
        let ender = {
            let over = over.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                over.store(true, std::sync::atomic::Ordering::SeqCst);
            })
        };
        let piece = Bytes::from(vec![1u8; crate::pipes::WRITE_PERMIT]);
        let mut refused = false;
        for _ in 0..(2 * CHUNK / crate::pipes::WRITE_PERMIT + 1) {
            if p.write(piece.clone()).is_err() {
                refused = true;
                break;
            }
        }
        ender.join().unwrap();
        assert!(refused, "the write gave up");
        assert!(p.was_stopped());
        assert_eq!(p.store_failure(), None, "not the store's failure");
    }

    #[test]
    fn small_results_stay_inline() {
        let (mut p, memory) = pipe(100, 10);
        p.write(Bytes::from_static(b"0123456789")).unwrap();
        assert_eq!(
            p.into_result().unwrap(),
            TaskResult::Inline(b"0123456789".to_vec())
        );
        assert!(memory.blocks.lock().unwrap().is_empty());
    }

    #[test]
    fn large_results_become_one_block_with_every_byte_in_order() {
        let (mut p, memory) = pipe(10 << 20, 1000);
        let data: Vec<u8> = (0..(3 * CHUNK + 12345)).map(|i| (i % 251) as u8).collect();
        for piece in data.chunks(crate::pipes::WRITE_PERMIT - 7) {
            p.write(Bytes::copy_from_slice(piece)).unwrap();
        }
        let result = p.into_result().unwrap();
        assert_eq!(
            result,
            TaskResult::Block(BlockRef {
                id: "job/0-1-1".into(),
                size: data.len() as u64,
                digest: Digest::of(&data),
            })
        );
        let blocks = memory.blocks.lock().unwrap();
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].1, data);
        assert!(blocks[0].2, "finished, not aborted");
    }

    #[test]
    fn the_cap_traps_and_a_failed_attempt_stores_nothing() {
        let (mut p, memory) = pipe(3 * CHUNK, 10);
        p.write(Bytes::from(vec![1u8; 2 * CHUNK])).unwrap();
        assert!(p.write(Bytes::from(vec![1u8; 2 * CHUNK])).is_err());
        assert!(p.overflowed());
        p.abort();
        let blocks = memory.blocks.lock().unwrap();
        assert_eq!(blocks.len(), 1);
        assert!(!blocks[0].2, "aborted");
    }
}
