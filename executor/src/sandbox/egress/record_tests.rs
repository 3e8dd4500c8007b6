use super::*;

fn response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Outcome {
    Outcome::Answered(EgressResponse {
        status,
        headers: (headers.iter())
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        body: body.to_vec(),
        bytes_sent: 40,
        bytes_received: 70,
    })
}

fn failure(errno: Errno, message: &str) -> Outcome {
    Outcome::Failed(Failure {
        errno,
        message: message.into(),
        bytes_sent: 12,
        bytes_received: 0,
    })
}

const LIMITS: EgressLimits = EgressLimits {
    max_requests: 10,
    max_bytes: 1 << 20,
    max_concurrent: 4,
};

#[test]
fn a_response_is_framed_as_documented_byte_for_byte() {
    let mut tape = Vec::new();
    encode(&mut tape, &response(201, &[("b", "xy"), ("a", "")], b"hey"));
    let mut expected = vec![0u8];
    expected.extend(201u16.to_le_bytes());
    expected.extend(40u64.to_le_bytes());
    expected.extend(70u64.to_le_bytes());
    expected.extend(2u32.to_le_bytes());
    expected.extend(1u32.to_le_bytes());
    expected.extend(b"b");
    expected.extend(2u32.to_le_bytes());
    expected.extend(b"xy");
    expected.extend(1u32.to_le_bytes());
    expected.extend(b"a");
    expected.extend(0u32.to_le_bytes());
    expected.extend(3u64.to_le_bytes());
    expected.extend(b"hey");
    assert_eq!(tape, expected);
    let outcome = response(201, &[("b", "xy"), ("a", "")], b"hey");
    assert_eq!(encoded_len(&outcome), expected.len() as u64);

    let mut tape = Vec::new();
    encode(&mut tape, &failure(Errno::Timeout, "late"));
    let mut expected = vec![1u8, 3];
    expected.extend(12u64.to_le_bytes());
    expected.extend(0u64.to_le_bytes());
    expected.extend(4u32.to_le_bytes());
    expected.extend(b"late");
    assert_eq!(tape, expected);
}

#[test]
fn records_read_back_as_written_headers_in_order() {
    for outcome in [
        response(200, &[("z", "1"), ("a", "2"), ("z", "3")], b"body"),
        response(404, &[], b""),
        failure(Errno::Denied, "GET http://x/: refused at connect"),
        failure(Errno::Limit, "max_bytes 10"),
        failure(Errno::Io, "reset"),
        failure(Errno::Invalid, "bad header"),
    ] {
        let mut tape = Vec::new();
        encode(&mut tape, &outcome);
        // The framing has one encoding per outcome: read back and written again, a
        // record is the same bytes only if every field came back.
        let mut again = Vec::new();
        encode(&mut again, &decode(&tape).unwrap());
        assert_eq!(again, tape);
    }
    let mut tape = Vec::new();
    encode(
        &mut tape,
        &response(200, &[("z", "1"), ("a", "2")], b"body"),
    );
    let Ok(Outcome::Answered(back)) = decode(&tape) else {
        panic!("a response")
    };
    assert_eq!(
        back.headers,
        [("z".into(), "1".into()), ("a".into(), "2".into())]
    );
    assert_eq!(
        (
            back.status,
            &back.body[..],
            back.bytes_sent,
            back.bytes_received
        ),
        (200, &b"body"[..], 40, 70)
    );
}

#[test]
fn a_damaged_record_is_refused_saying_how() {
    let mut tape = Vec::new();
    encode(&mut tape, &response(200, &[("a", "b")], b"body"));
    let short = decode(&tape[..tape.len() - 1]).unwrap_err();
    assert!(short.contains("1 bytes short"), "{short}");
    let mut long = tape.clone();
    long.push(0);
    assert!(decode(&long).unwrap_err().contains("follow"));
    assert!(decode(&[7]).unwrap_err().contains("kind 7"));
    assert!(decode(&[1, 9]).unwrap_err().contains("errno 9"));
}

#[test]
fn pins_are_in_request_order_wherever_their_records_lie() {
    let mut recorder = Recorder::new(LIMITS);
    let first = recorder.begin("GET", "http://a/1", b"");
    let second = recorder.begin("POST", "http://a/2", b"data");
    // Answered out of order, as concurrent requests may be.
    recorder
        .settle(second, &response(201, &[], b"two"))
        .unwrap();
    recorder
        .settle(first, &failure(Errno::Io, "reset"))
        .unwrap();
    let tape = recorder.finish().unwrap();
    let [one, two] = &tape.pins[..] else {
        panic!("{:?}", tape.pins)
    };
    assert_eq!(
        (one.method.as_str(), one.url.as_str(), one.status),
        ("GET", "http://a/1", 0)
    );
    assert_eq!((two.method.as_str(), two.status), ("POST", 201));
    assert_eq!(two.request_sha256, Digest::of(b"data"));
    assert_eq!(two.offset, 0);
    assert_eq!(one.offset, two.len);
    for pin in [one, two] {
        let record = &tape.bytes[pin.offset as usize..(pin.offset + pin.len) as usize];
        assert_eq!(Digest::of(record), pin.response);
    }
}

#[test]
fn requests_still_in_flight_at_the_end_are_no_pins_and_a_dropped_one_between_is_an_error() {
    let mut recorder = Recorder::new(LIMITS);
    assert!(
        Recorder::new(LIMITS).finish().is_none(),
        "no request, no tape"
    );
    let dropped = recorder.begin("GET", "http://a/1", b"");
    let answered = recorder.begin("GET", "http://a/2", b"");
    recorder.begin("GET", "http://a/3", b"");
    recorder
        .settle(answered, &response(200, &[], b"ok"))
        .unwrap();
    let tape = recorder.finish().unwrap();
    assert_eq!(tape.pins.len(), 2, "the third was in flight");
    let pin = &tape.pins[dropped];
    let record = &tape.bytes[pin.offset as usize..(pin.offset + pin.len) as usize];
    assert!(matches!(decode(record), Ok(Outcome::Failed(f)) if f.errno == Errno::Io));
}

#[test]
fn a_record_past_the_cap_is_refused_and_not_kept() {
    let limits = EgressLimits {
        max_requests: 1,
        max_bytes: 100,
        max_concurrent: 1,
    };
    let mut recorder = Recorder::new(limits);
    assert_eq!(recorder.cap(), 100 + FRAMING_PER_REQUEST);
    let slot = recorder.begin("GET", "http://a/", b"");
    let big = vec![0u8; (100 + FRAMING_PER_REQUEST) as usize];
    assert!(recorder.settle(slot, &response(200, &[], &big)).is_err());
    assert!(recorder.is_full());
    assert!(recorder.finish().is_none(), "nothing was kept");
}
