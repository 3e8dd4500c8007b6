//! Deterministic attempts' requests recorded, and replayed with no network: the same
//! stdout byte for byte, a guest that asks for something else stopped naming both
//! requests, a recording past its cap stopped naming the cap.

use flint_protocol::{Digest, FailureKind, NetworkGrant};

use super::super::Replayer;
use super::*;

/// Three exchanges a replay must give back as they were: two GETs and a POST with a
/// body, each response taken whole, and a refused request between (no pin: the replay's
/// policy refuses it again, with the same message).
fn three_calls(origin: &Origin, second: &str) -> Vec<Op> {
    let post = Op::Send {
        head: format!(r#"{{"method":"POST","url":"{}"}}"#, origin.url("/3")),
        body: b"the payload".to_vec(),
    };
    vec![
        get(&origin.url("/1")),
        take(0),
        get("http://127.0.0.1:1/not-allowed"),
        error(),
        get(&origin.url(second)),
        take(2),
        post,
        take(3),
    ]
}

fn grant(origin: &Origin) -> NetworkGrant {
    NetworkGrant {
        allow: vec![origin.origin()],
        tenant_allow: None,
        max_requests: ROOMY.max_requests,
        max_bytes: ROOMY.max_bytes,
        max_concurrent: ROOMY.max_concurrent,
    }
}

fn stdout(report: &RunReport) -> Vec<u8> {
    match &report.outcome {
        Ok(TaskResult::Inline(bytes)) => bytes.clone(),
        other => panic!("{other:?}: {}", String::from_utf8_lossy(&report.log)),
    }
}

#[test]
fn a_recorded_attempt_replays_to_the_same_stdout_without_the_network() {
    let origin = Origin::answering(b"hello");
    let sandbox = sandbox();
    let ops = three_calls(&origin, "/2");
    let compiled = compile(&sandbox, &ops, Path::Deterministic);
    let egress = granted(&origin, ROOMY);
    let recorded = run(
        &sandbox,
        &compiled,
        Path::Deterministic,
        egress,
        Duration::from_secs(30),
        Kill::new(),
    );
    let recorded_stdout = stdout(&recorded);
    let tape = recorded
        .egress_tape
        .clone()
        .expect("a deterministic attempt records");
    let asked: Vec<(&str, &str, u16)> = (tape.pins.iter())
        .map(|pin| (pin.method.as_str(), pin.url.as_str(), pin.status))
        .collect();
    let url = |path: &str| origin.url(path);
    assert_eq!(
        asked,
        [
            ("GET", url("/1").as_str(), 200),
            ("GET", url("/2").as_str(), 200),
            ("POST", url("/3").as_str(), 200)
        ],
        "the refused request is no pin"
    );
    assert_eq!(tape.pins[2].request_sha256, Digest::of(b"the payload"));
    assert_eq!(origin.requests().len(), 3);

    let replayer = Replayer::new(&grant(&origin), tape.pins, Some(&tape.bytes)).unwrap();
    let replayed = run(
        &sandbox,
        &compiled,
        Path::Deterministic,
        Egress::Replay(replayer),
        Duration::from_secs(30),
        Kill::new(),
    );
    assert_eq!(
        stdout(&replayed),
        recorded_stdout,
        "the same bytes, refusal included"
    );
    assert!(origin.requests().is_empty(), "the replay reached no server");
    assert_eq!(
        replayed.usage.egress_requests,
        recorded.usage.egress_requests
    );
    assert_eq!(
        replayed.usage.egress_bytes_sent,
        recorded.usage.egress_bytes_sent
    );
    assert_eq!(
        replayed.usage.egress_bytes_received,
        recorded.usage.egress_bytes_received
    );
    assert_eq!(replayed.egress_denied, recorded.egress_denied);
    assert!(replayed.egress_tape.is_none(), "a replay records nothing");

    // A guest that asks for another URL second is stopped there, both requests named.
    let other = compile(
        &sandbox,
        &three_calls(&origin, "/other"),
        Path::Deterministic,
    );
    let replayer = Replayer::new(
        &grant(&origin),
        recorded.egress_tape.unwrap().pins,
        Some(&tape.bytes),
    )
    .unwrap();
    let stopped = run(
        &sandbox,
        &other,
        Path::Deterministic,
        Egress::Replay(replayer),
        Duration::from_secs(30),
        Kill::new(),
    );
    let failure = stopped.outcome.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Killed);
    assert_eq!(
        failure.message,
        format!(
            "replay: the guest asked for GET {} (body {}); the attempt's request 2 was GET {} (body {})",
            url("/other"),
            Digest::of(b""),
            url("/2"),
            Digest::of(b"")
        )
    );
    assert!(origin.requests().is_empty());
}

#[test]
fn an_attempt_that_is_not_deterministic_records_nothing() {
    let origin = Origin::answering(b"hello");
    let report = run_ops(
        &[get(&origin.url("/")), take(0)],
        Path::Sync,
        granted(&origin, ROOMY),
    );
    assert_eq!(Replies::of(&report).send().status, 200);
    assert!(report.egress_tape.is_none());
}

#[test]
fn refusals_at_connect_past_the_recordings_cap_stop_the_attempt_naming_it() {
    // A name that resolves to loopback is refused at connect (the operator lists no
    // address): such refusals are recorded, and are not requests, so only the tape's
    // cap bounds them.
    let listed = ["http://localhost:1".to_owned()];
    let limits = EgressLimits {
        max_requests: 1,
        max_bytes: 100,
        max_concurrent: 1,
    };
    let cap = 100 + crate::sandbox::FRAMING_PER_REQUEST;
    let mut ops = Vec::new();
    for _ in 0..100 {
        ops.push(get(
            "http://localhost:1/a-path-that-makes-the-message-longer",
        ));
    }
    ops.push(error());
    let report = run_ops(&ops, Path::Deterministic, live(&listed, &listed, limits));
    let failure = report.outcome.unwrap_err();
    assert_eq!(failure.kind, FailureKind::OutputLimit, "{failure:?}");
    assert!(
        failure.message.contains(&format!("{cap}-byte cap")),
        "{}",
        failure.message
    );
    assert!(
        report.egress_denied.count > 10,
        "{:?}",
        report.egress_denied
    );
    assert!(
        report.egress_denied.count < 100,
        "stopped at the cap: {:?}",
        report.egress_denied
    );
}
