//! Ends whose blocks wait on this disk for the driver: a result's, a deterministic
//! attempt's tape of recorded responses, or both.

use super::*;

fn pins(tape: &str) -> Option<Box<Pins>> {
    Some(Box::new(Pins {
        module: Digest::of(b"m"),
        files: Vec::new(),
        input: Digest::of(b"i"),
        egress: Vec::new(),
        egress_tape: Some(BlockRef {
            id: tape.into(),
            size: 100,
            digest: Digest::of(b"t"),
        }),
    }))
}

#[test]
fn an_end_waits_for_its_held_tape_as_for_its_result_and_a_refused_tape_fails_it() {
    let (buffer, _dir) = buffer(1 << 20, 1 << 20);
    let mut rx = connect(&buffer);
    let mut both = status(0, 0);
    both.end.outcome = Ok(TaskResult::Block(BlockRef {
        id: "job/0-1-1".into(),
        size: 4096,
        digest: Digest::of(b"r"),
    }));
    both.end.pins = pins("job/0-1-1.egress");
    buffer.take(both, Some(4096 + 100), false, |_| {});
    let mut tape_only = status(1, 10);
    tape_only.end.pins = pins("job/1-1-1.egress");
    buffer.take(tape_only, Some(100), false, |_| {});
    assert_eq!(sent(&mut rx), [], "neither end's blocks are uploaded yet");
    assert_eq!(
        buffer.next_step(),
        Step::Upload {
            seq: 1,
            ids: vec!["job/0-1-1".into(), "job/0-1-1.egress".into()]
        }
    );
    buffer.block_uploaded(1);
    assert_eq!(sent(&mut rx), [(1, 0)]);
    assert_eq!(
        buffer.next_step(),
        Step::Upload {
            seq: 2,
            ids: vec!["job/1-1-1.egress".into()]
        }
    );
    buffer.block_refused(2, "job/1-1-1.egress: past --egress-record-max-bytes".into());
    let refused = rx.try_recv().unwrap();
    let ExecutorMessage::StatusUpdate { seq: 2, status } = refused else {
        panic!("{refused:?}")
    };
    let failure = status.end.outcome.unwrap_err();
    assert_eq!(failure.kind, FailureKind::HostError);
    assert!(
        failure.message.contains("--egress-record-max-bytes"),
        "{}",
        failure.message
    );
    assert_eq!(buffer.figures().disk_bytes, 0);
}
