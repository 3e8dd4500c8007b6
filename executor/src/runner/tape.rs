//! A deterministic attempt's recorded requests, kept with its end: each request becomes
//! a pin (`Pins.egress`), and the tape of answers one block in the block store,
//! `<job>/<index>-<attempt>-<generation>.egress` (`Pins.egress_tape`), written through
//! the same [`BlockWriter`] as large results: to the driver (kept on this disk while it
//! is away, the end waiting for it), or to the object store. The driver caps what one
//! job records (`--egress-record-max-bytes`) and refuses a tape past it; the attempt then
//! fails as `host_error` naming the cap. An object store takes what it is given: there
//! the cap is each attempt's own (its `max_bytes` and framing, see the sandbox's
//! `record`). Without a block store the pins still list the requests, and a replay says
//! it has no tape.

use bytes::Bytes;
use flint_protocol::{BlockRef, Digest, FailureKind, Pins, TaskDescription, TaskFailure};

use super::TaskRunner;
use crate::results::BlockWriter;
use crate::sandbox::{RunReport, Tape};

/// Bytes handed to the block store at once, as for results.
const CHUNK: usize = 1 << 20;

impl TaskRunner {
    /// Pins the attempt's recorded requests and stores their tape; a tape that cannot be
    /// stored fails the attempt (a replay of it would have nothing to serve).
    pub(super) fn keep_tape(
        &self,
        desc: &TaskDescription,
        report: &mut RunReport,
        stopped: &dyn Fn() -> bool,
    ) {
        let (Some(tape), Some(pins)) = (report.egress_tape.take(), report.pins.as_mut()) else {
            return;
        };
        let Tape {
            bytes,
            pins: egress,
        } = tape;
        pins.egress = egress;
        let Some(writer) = &self.blocks else {
            return;
        };
        let id = format!(
            "{}.egress",
            BlockRef::id_for(&desc.task, desc.attempt, desc.generation)
        );
        if let Err(why) = store(&**writer, &id, bytes, stopped, pins) {
            report.outcome = Err(TaskFailure::new(
                FailureKind::HostError,
                format!("storing the attempt's recorded responses: {why}"),
            ));
        }
    }
}

fn store(
    writer: &dyn BlockWriter,
    id: &str,
    bytes: Vec<u8>,
    stopped: &dyn Fn() -> bool,
    pins: &mut Pins,
) -> Result<(), String> {
    let digest = Digest::of(&bytes);
    let bytes = Bytes::from(bytes);
    let mut sink = writer.open(id);
    let mut at = 0;
    while at < bytes.len() {
        let end = (at + CHUNK).min(bytes.len());
        if let Err(why) = sink.write(bytes.slice(at..end), stopped) {
            sink.abort();
            return Err(why);
        }
        at = end;
    }
    let (size, stored) = sink.finish()?;
    if (size, stored) != (bytes.len() as u64, digest) {
        return Err(format!(
            "the block store kept {size} bytes hashing to {stored}, not the {} bytes hashing \
             to {digest} recorded",
            bytes.len()
        ));
    }
    pins.egress_tape = Some(BlockRef {
        id: id.to_owned(),
        size,
        digest,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::results::BlockSink;

    /// Keeps finished blocks, or refuses every one with `refusal`.
    #[derive(Default)]
    struct Store {
        kept: Mutex<Vec<(String, Vec<u8>)>>,
        refusal: Option<String>,
    }

    struct Sink {
        store: Arc<Store>,
        id: String,
        bytes: Vec<u8>,
    }

    impl BlockWriter for Arc<Store> {
        fn open(&self, id: &str) -> Box<dyn BlockSink> {
            Box::new(Sink {
                store: self.clone(),
                id: id.to_owned(),
                bytes: Vec::new(),
            })
        }
    }

    impl BlockSink for Sink {
        fn write(&mut self, chunk: Bytes, _stopped: &dyn Fn() -> bool) -> Result<(), String> {
            self.bytes.extend_from_slice(&chunk);
            Ok(())
        }
        fn finish(self: Box<Self>) -> Result<(u64, Digest), String> {
            if let Some(refusal) = &self.store.refusal {
                return Err(refusal.clone());
            }
            let stored = (self.bytes.len() as u64, Digest::of(&self.bytes));
            self.store.kept.lock().unwrap().push((self.id, self.bytes));
            Ok(stored)
        }
        fn abort(self: Box<Self>) {}
    }

    fn pins() -> Pins {
        Pins {
            module: Digest::of(b"m"),
            files: Vec::new(),
            input: Digest::of(b""),
            egress: Vec::new(),
            egress_tape: None,
        }
    }

    #[test]
    fn a_tape_of_several_chunks_is_one_block_pinned_by_size_and_digest() {
        let blocks = Arc::new(Store::default());
        let bytes: Vec<u8> = (0..CHUNK * 2 + 7).map(|i| i as u8).collect();
        let mut pins = pins();
        store(
            &blocks,
            "job/0-1-1.egress",
            bytes.clone(),
            &|| false,
            &mut pins,
        )
        .unwrap();
        let kept = blocks.kept.lock().unwrap();
        assert_eq!(kept[..], [("job/0-1-1.egress".to_owned(), bytes.clone())]);
        let tape = pins.egress_tape.unwrap();
        assert_eq!(
            (tape.size, tape.digest),
            (bytes.len() as u64, Digest::of(&bytes))
        );
    }

    #[test]
    fn a_refused_tape_is_not_pinned_and_says_why() {
        let blocks = Arc::new(Store {
            refusal: Some("past --egress-record-max-bytes".into()),
            ..Store::default()
        });
        let mut pins = pins();
        let why = store(
            &blocks,
            "job/0-1-1.egress",
            vec![1; 10],
            &|| false,
            &mut pins,
        );
        assert_eq!(why, Err("past --egress-record-max-bytes".to_owned()));
        assert!(pins.egress_tape.is_none());
    }
}
