//! The end buffer's promises, without a network: order, budgets, spills read back,
//! acks, waiting reporters, resends, and the registration's listing under a race.

use std::sync::mpsc as std_mpsc;

use bytes::BytesMut;
use flint_protocol::codec::FrameCodec;
use flint_protocol::{
    BlockRef, Digest, ExecutorMessage, FailureKind, JobId, Pins, TaskEnd, TaskFailure, TaskId,
    TaskResult, TaskStatus, Usage,
};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::state::weight;
use super::*;

mod held;

fn status(index: u32, result_bytes: usize) -> TaskStatus {
    TaskStatus {
        task: TaskId {
            job: JobId("job".into()),
            index,
        },
        attempt: 1,
        generation: 1,
        end: TaskEnd {
            started_at_us: 1,
            finished_at_us: 2,
            outcome: Ok(TaskResult::Inline(vec![7; result_bytes])),
            log: Vec::new(),
            log_truncated: false,
            usage: Usage::default(),
            pins: None,
            memory_mb: None,
            egress_denied: Vec::new(),
        },
    }
}

/// The weight of every `status(_, 100)`.
fn unit() -> u64 {
    weight(&status(0, 100))
}

fn buffer(memory_bytes: u64, disk_bytes: u64) -> (Arc<EndBuffer>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let budgets = Budgets {
        memory_bytes,
        disk_bytes,
    };
    (
        EndBuffer::open(dir.path().join("ends"), budgets).unwrap(),
        dir,
    )
}

fn take(buffer: &EndBuffer, index: u32) {
    buffer.take(status(index, 100), None, false, |_| {});
}

fn connect(buffer: &EndBuffer) -> UnboundedReceiver<ExecutorMessage> {
    let (outbox, rx) = unbounded_channel();
    buffer.attach(outbox);
    rx
}

/// The (seq, task index) of every end sent so far.
fn sent(rx: &mut UnboundedReceiver<ExecutorMessage>) -> Vec<(u64, u32)> {
    std::iter::from_fn(|| rx.try_recv().ok())
        .map(|message| match message {
            ExecutorMessage::StatusUpdate { seq, status } => (seq, status.task.index),
            other => panic!("not an end: {other:?}"),
        })
        .collect()
}

/// Runs the backlog work until it has nothing to do, as a connection's would.
fn work_backlog(buffer: &EndBuffer) {
    loop {
        match buffer.next_step() {
            Step::Load(seq) => buffer.load(seq),
            Step::Upload { .. } => panic!("no blocks here"),
            Step::Idle => return,
        }
    }
}

fn files(buffer: &EndBuffer) -> usize {
    buffer.spill.files()
}

#[test]
fn ends_go_out_numbered_in_order_and_an_ack_forgets_them() {
    let (buffer, _dir) = buffer(1 << 20, 1 << 20);
    let mut rx = connect(&buffer);
    for index in 0..3 {
        take(&buffer, index);
    }
    assert_eq!(sent(&mut rx), [(1, 0), (2, 1), (3, 2)]);
    assert_eq!(buffer.figures().held, 3);
    assert_eq!(buffer.figures().memory_bytes, 3 * unit());
    buffer.acknowledge(2);
    assert_eq!(buffer.figures().held, 1);
    buffer.acknowledge(3);
    let figures = buffer.figures();
    assert_eq!((figures.held, figures.memory_bytes), (0, 0));
    assert_eq!(
        figures.peak_memory_bytes,
        3 * unit(),
        "the high-water mark stays"
    );
}

#[test]
fn an_ack_past_what_was_sent_forgets_only_what_was_sent() {
    let (buffer, _dir) = buffer(1 << 20, 1 << 20);
    take(&buffer, 0);
    let mut rx = connect(&buffer);
    take(&buffer, 1);
    buffer.detach();
    take(&buffer, 2);
    buffer.acknowledge(99);
    assert_eq!(sent(&mut rx), [(1, 0), (2, 1)]);
    assert_eq!(buffer.figures().held, 1, "end 3 was never sent");
}

#[test]
fn ends_held_back_for_a_batch_go_out_with_the_next_one_or_within_the_hold() {
    let (buffer, _dir) = buffer(1 << 20, 1 << 20);
    let mut rx = connect(&buffer);
    buffer.take(status(0, 100), None, true, |_| {});
    let first = rx.blocking_recv().expect("the flusher sends it");
    assert!(matches!(
        first,
        ExecutorMessage::StatusUpdate { seq: 1, .. }
    ));
    buffer.take(status(1, 100), None, true, |_| {});
    buffer.take(status(2, 100), None, true, |_| {});
    take(&buffer, 3);
    // Sent by the last take, whatever the flusher did.
    assert_eq!(sent(&mut rx), [(2, 1), (3, 2), (4, 3)]);
}

#[test]
fn a_flood_spills_past_memory_and_is_read_back_in_order_as_acks_make_room() {
    let (buffer, _dir) = buffer(2 * unit(), 100 * unit());
    for index in 0..6 {
        take(&buffer, index);
    }
    let figures = buffer.figures();
    assert_eq!(
        (figures.memory_bytes, figures.disk_bytes),
        (2 * unit(), 4 * unit())
    );
    assert_eq!(files(&buffer), 4);

    let mut rx = connect(&buffer);
    work_backlog(&buffer);
    assert_eq!(
        sent(&mut rx),
        [(1, 0), (2, 1)],
        "memory is full of ends not yet acked"
    );
    buffer.acknowledge(2);
    work_backlog(&buffer);
    assert_eq!(sent(&mut rx), [(3, 2), (4, 3)]);
    buffer.acknowledge(4);
    work_backlog(&buffer);
    assert_eq!(sent(&mut rx), [(5, 4), (6, 5)]);
    assert_eq!(files(&buffer), 0, "read back, deleted");
    buffer.acknowledge(6);
    let figures = buffer.figures();
    assert_eq!((figures.memory_bytes, figures.disk_bytes), (0, 0));
    assert_eq!(
        figures.peak_memory_bytes,
        2 * unit(),
        "never past the memory budget"
    );
    assert_eq!(figures.peak_disk_bytes, 4 * unit());

    // Nothing on disk any more: ends go to memory again.
    take(&buffer, 6);
    assert_eq!(sent(&mut rx), [(7, 6)]);
    assert_eq!(files(&buffer), 0);
}

#[test]
fn while_anything_is_on_disk_new_ends_go_there_too_so_they_stay_behind_it() {
    let (buffer, _dir) = buffer(2 * unit(), 100 * unit());
    let mut rx = connect(&buffer);
    for index in 0..3 {
        take(&buffer, index);
    }
    buffer.acknowledge(2);
    // Memory has room again, but end 3 is on disk: end 4 must not overtake it.
    take(&buffer, 3);
    assert_eq!(files(&buffer), 2);
    work_backlog(&buffer);
    assert_eq!(sent(&mut rx), [(1, 0), (2, 1), (3, 2), (4, 3)]);
}

#[test]
fn an_end_larger_than_the_memory_budget_goes_to_disk_and_is_read_back_alone() {
    let (buffer, _dir) = buffer(unit(), 1 << 20);
    let mut rx = connect(&buffer);
    buffer.take(status(0, 5_000), None, false, |_| {});
    take(&buffer, 1);
    assert_eq!(
        files(&buffer),
        2,
        "the small one stays behind the large one"
    );
    work_backlog(&buffer);
    assert_eq!(sent(&mut rx), [(1, 0)]);
    assert_eq!(buffer.figures().memory_bytes, weight(&status(0, 5_000)));
    buffer.acknowledge(1);
    work_backlog(&buffer);
    assert_eq!(sent(&mut rx), [(2, 1)]);
    assert_eq!(
        buffer.figures().peak_memory_bytes,
        weight(&status(0, 5_000))
    );
}

#[test]
fn a_full_buffer_makes_its_reporter_wait_until_an_ack_makes_room() {
    let (buffer, _dir) = buffer(2 * unit(), unit());
    let mut rx = connect(&buffer);
    for index in 0..3 {
        take(&buffer, index);
    }
    let (done_tx, done) = std_mpsc::channel();
    let reporter = {
        let buffer = buffer.clone();
        std::thread::spawn(move || {
            take(&buffer, 3);
            done_tx.send(()).unwrap();
        })
    };
    let waiting = done.recv_timeout(Duration::from_millis(200));
    assert!(waiting.is_err(), "the fourth end found no room and waits");
    assert_eq!(buffer.figures().waited, 1);
    assert_eq!(buffer.figures().held, 3);
    // The ack makes room in memory for end 3, and reading it back frees the disk.
    buffer.acknowledge(1);
    work_backlog(&buffer);
    done.recv_timeout(Duration::from_secs(5))
        .expect("the ack made room");
    reporter.join().unwrap();
    buffer.acknowledge(2);
    work_backlog(&buffer);
    assert_eq!(sent(&mut rx), [(1, 0), (2, 1), (3, 2), (4, 3)]);
    let figures = buffer.figures();
    assert!(figures.peak_memory_bytes <= 2 * unit());
    assert!(figures.peak_disk_bytes <= unit());
}

#[test]
fn a_disk_that_refuses_spills_makes_reporters_wait_instead_of_filling_memory() {
    let (buffer, dir) = buffer(2 * unit(), 10 * unit());
    let mut rx = connect(&buffer);
    take(&buffer, 0);
    take(&buffer, 1);
    // The spill directory is gone, a file in its place: every spill fails.
    let ends = dir.path().join("ends");
    std::fs::remove_dir_all(&ends).unwrap();
    std::fs::write(&ends, b"not a directory").unwrap();
    take(&buffer, 2);
    assert_eq!(
        buffer.figures().memory_bytes,
        3 * unit(),
        "kept, over its budget"
    );
    let (done_tx, done) = std_mpsc::channel();
    let reporter = {
        let buffer = buffer.clone();
        std::thread::spawn(move || {
            take(&buffer, 3);
            done_tx.send(()).unwrap();
        })
    };
    assert!(
        done.recv_timeout(Duration::from_millis(200)).is_err(),
        "the next end waits rather than pile up in memory"
    );
    assert_eq!(buffer.figures().memory_bytes, 3 * unit());
    buffer.acknowledge(3);
    done.recv_timeout(Duration::from_secs(5))
        .expect("the ack made room");
    reporter.join().unwrap();
    assert_eq!(sent(&mut rx), [(1, 0), (2, 1), (3, 2), (4, 3)]);
}

#[test]
fn a_new_connection_gets_every_unacknowledged_end_again_in_order_then_the_new_ones() {
    let (buffer, _dir) = buffer(3 * unit(), 100 * unit());
    let mut first = connect(&buffer);
    for index in 0..4 {
        take(&buffer, index);
    }
    buffer.acknowledge(1);
    buffer.detach();
    for index in 4..7 {
        take(&buffer, index);
    }
    // End 4 was spilled, and this connection's backlog work never read it back.
    assert_eq!(sent(&mut first), [(1, 0), (2, 1), (3, 2)]);

    let mut second = connect(&buffer);
    work_backlog(&buffer);
    take(&buffer, 7);
    buffer.acknowledge(4);
    work_backlog(&buffer);
    buffer.acknowledge(7);
    work_backlog(&buffer);
    let resent = sent(&mut second);
    assert_eq!(
        resent,
        [(2, 1), (3, 2), (4, 3), (5, 4), (6, 5), (7, 6), (8, 7)],
        "each unacknowledged end once, in order, none lost"
    );
}

#[test]
fn the_registration_lists_what_is_held_and_what_runs() {
    let (buffer, _dir) = buffer(unit(), 100 * unit());
    take(&buffer, 0);
    take(&buffer, 1);
    let running = flint_protocol::HeldAttempt {
        task: TaskId {
            job: JobId("job".into()),
            index: 9,
        },
        attempt: 1,
        generation: 1,
        started_at_us: 5,
        ended: false,
    };
    let listed = buffer.held_attempts(|| vec![running.clone()]);
    let ended: Vec<(u32, bool)> = listed.iter().map(|a| (a.task.index, a.ended)).collect();
    assert_eq!(
        ended,
        [(9, false), (0, true), (1, true)],
        "one in memory, one on disk"
    );
}

#[test]
fn an_attempt_whose_end_is_being_taken_is_listed_exactly_once() {
    let (buffer, _dir) = buffer(1 << 20, 1 << 20);
    const ATTEMPTS: u32 = 2_000;
    let running = Arc::new(Mutex::new((0..ATTEMPTS).collect::<Vec<u32>>()));
    let reporter = {
        let (buffer, running) = (buffer.clone(), running.clone());
        std::thread::spawn(move || {
            for index in 0..ATTEMPTS {
                buffer.take(status(index, 0), None, false, |s| {
                    running.lock().unwrap().retain(|i| *i != s.task.index);
                });
            }
        })
    };
    while !reporter.is_finished() {
        let listed = buffer.held_attempts(|| {
            let running = running.lock().unwrap();
            (running.iter())
                .map(|&index| flint_protocol::HeldAttempt {
                    task: TaskId {
                        job: JobId("job".into()),
                        index,
                    },
                    attempt: 1,
                    generation: 1,
                    started_at_us: 0,
                    ended: false,
                })
                .collect()
        });
        let mut indices: Vec<u32> = listed.iter().map(|a| a.task.index).collect();
        indices.sort_unstable();
        assert_eq!(
            indices,
            (0..ATTEMPTS).collect::<Vec<_>>(),
            "each attempt once"
        );
    }
    reporter.join().unwrap();
}

#[test]
fn a_held_block_keeps_its_end_back_until_uploaded_or_refused() {
    let (buffer, _dir) = buffer(1 << 20, 1 << 20);
    let mut rx = connect(&buffer);
    let block = |index: u32| {
        let mut status = status(index, 0);
        status.end.outcome = Ok(TaskResult::Block(BlockRef {
            id: format!("job/{index}-1-1"),
            size: 4096,
            digest: Digest::of(b"x"),
        }));
        status
    };
    buffer.take(block(0), Some(4096), false, |_| {});
    buffer.take(block(1), Some(4096), false, |_| {});
    take(&buffer, 2);
    assert_eq!(
        sent(&mut rx),
        [],
        "the first end's block is not uploaded yet"
    );
    assert!(buffer.figures().disk_bytes >= 2 * 4096);
    let step = buffer.next_step();
    assert_eq!(
        step,
        Step::Upload {
            seq: 1,
            ids: vec!["job/0-1-1".into()]
        }
    );
    buffer.block_uploaded(1);
    assert_eq!(sent(&mut rx), [(1, 0)]);
    assert_eq!(
        buffer.next_step(),
        Step::Upload {
            seq: 2,
            ids: vec!["job/1-1-1".into()]
        }
    );
    buffer.block_refused(2, "404 job_not_found".into());
    let refused = rx.try_recv().unwrap();
    let ExecutorMessage::StatusUpdate { seq: 2, status } = refused else {
        panic!("{refused:?}")
    };
    let failure = status.end.outcome.unwrap_err();
    assert_eq!(failure.kind, FailureKind::HostError);
    assert!(
        failure.message.contains("404 job_not_found"),
        "{}",
        failure.message
    );
    assert_eq!(sent(&mut rx), [(3, 2)]);
    assert_eq!(buffer.figures().disk_bytes, 0);
}

#[test]
fn an_ends_weight_bounds_its_encoded_size_closely() {
    let codec = FrameCodec::<ExecutorMessage, ExecutorMessage>::default();
    let mut failed = status(u32::MAX, 0);
    failed.end.outcome = Err(TaskFailure {
        kind: FailureKind::Exit,
        message: "exit code 3".into(),
        exit_code: Some(-3),
    });
    failed.end.log = vec![1; 700];
    failed.end.pins = Some(Box::new(Pins {
        module: Digest::of(b"m"),
        files: vec![Digest::of(b"a"), Digest::of(b"b")],
        input: Digest::of(b"i"),
        egress: vec![flint_protocol::EgressPin {
            method: "POST".into(),
            url: "https://api.example.com/v1".into(),
            request_sha256: Digest::of(b"q"),
            status: 200,
            response: Digest::of(b"r"),
            offset: 0,
            len: 120,
        }],
        egress_tape: None,
    }));
    failed.end.egress_denied = vec!["GET http://10.0.0.1/: refused".into(); 8];
    let mut big = status(7, 10_000);
    big.attempt = u32::MAX;
    big.generation = u64::MAX;
    big.end.usage = Usage {
        fuel: Some(u64::MAX),
        cpu_us: u64::MAX,
        wall_us: u64::MAX,
        peak_memory_bytes: u64::MAX,
        input_bytes: u64::MAX,
        output_bytes: u64::MAX,
        fetched_bytes: u64::MAX,
        egress_requests: u64::MAX,
        egress_bytes_sent: u64::MAX,
        egress_bytes_received: u64::MAX,
    };
    big.end.memory_mb = Some(u32::MAX);
    for status in [status(0, 0), failed, big] {
        let bytes = weight(&status);
        let mut frame = BytesMut::new();
        let message = ExecutorMessage::StatusUpdate {
            seq: u64::MAX,
            status,
        };
        codec.encode_frame(&message, &mut frame).unwrap();
        let encoded = frame.len() as u64;
        assert!(encoded <= bytes, "{encoded} encoded, weighed {bytes}");
        assert!(bytes <= encoded + 160, "{encoded} encoded, weighed {bytes}");
    }
}
