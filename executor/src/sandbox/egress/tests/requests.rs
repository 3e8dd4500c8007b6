//! Requests that end: answered, refused, limited, malformed.

use super::super::{Errno, NoNetwork};
use super::*;

#[test]
fn a_get_is_answered_with_its_status_headers_and_body_and_counted() {
    for path in PATHS {
        let origin = Origin::answering(b"hello");
        let url = origin.url("/greeting?x=1");
        let report = run_ops(&[get(&url), take(0)], path, granted(&origin, ROOMY));
        let mut replies = Replies::of(&report);
        let sent = replies.send();
        assert_eq!(
            (sent.errno, sent.handle, sent.status),
            (0, 1, 200),
            "{path:?}"
        );
        assert_eq!(sent.body_len, 5);
        let (errno, headers, body) = replies.take(4096, 4096);
        assert_eq!(errno, 0);
        assert_eq!(&body[..5], b"hello");
        let headers: Vec<(String, String)> =
            serde_json::from_slice(&headers[..sent.headers_len as usize]).unwrap();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("x-test"), Some("yes"));
        assert_eq!(header("content-length"), Some("5"));
        let seen = origin.requests();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(
            (seen[0].method.as_str(), seen[0].target.as_str()),
            ("GET", "/greeting?x=1")
        );
        // Sent: method and URL (no headers, no body); received: the server's three
        // headers' names and values, and the body.
        let usage = &report.usage;
        assert_eq!(usage.egress_requests, 1);
        assert_eq!(usage.egress_bytes_sent, ("GET".len() + url.len()) as u64);
        let received = "content-length5connectionclosex-testyeshello".len() as u64;
        assert_eq!(usage.egress_bytes_received, received);
        assert_eq!(report.egress_denied.count, 0);
    }
}

#[test]
fn a_posts_body_and_headers_reach_the_server() {
    let origin = Origin::answering(b"");
    let head = format!(
        r#"{{"method":"POST","url":"{}","headers":[["content-type","text/plain"]]}}"#,
        origin.url("/in")
    );
    let post = Op::Send {
        head,
        body: b"the payload".to_vec(),
    };
    let report = run_ops(&[post], Path::Sync, granted(&origin, ROOMY));
    assert_eq!(Replies::of(&report).send().errno, 0);
    let seen = origin.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].body, b"the payload");
    let sent = "POST".len() + origin.url("/in").len() + "content-typetext/plain".len() + 11;
    assert_eq!(report.usage.egress_bytes_sent, sent as u64);
}

#[test]
fn without_a_grant_every_request_is_denied_naming_network_allow() {
    let origin = Origin::answering(b"no");
    for (why, names) in [
        (NoNetwork::Job, &["network.allow"][..]),
        (
            NoNetwork::JobAndExecutor,
            &["network.allow", "--egress-allow"],
        ),
    ] {
        let ops = [get(&origin.url("/")), error(), get(&origin.url("/"))];
        let report = run_ops(&ops, Path::Sync, Egress::Off(why));
        let mut replies = Replies::of(&report);
        let message = replies.failed(Errno::Denied);
        for name in names {
            assert!(message.contains(name), "{message:?} should name {name}");
        }
        assert!(message.contains(&origin.url("/")), "{message}");
        assert_eq!(replies.send().errno, Errno::Denied as u32);
        assert_eq!(report.usage.egress_requests, 0);
        assert_eq!(report.egress_denied.count, 2);
        assert_eq!(report.egress_denied.first, [message.clone(), message]);
    }
    assert!(origin.requests().is_empty());
}

#[test]
fn an_origin_the_operator_does_not_list_is_denied_naming_egress_allow() {
    let origin = Origin::answering(b"no");
    let egress = live(&["http://127.0.0.1:1".into()], &[origin.origin()], ROOMY);
    let report = run_ops(&[get(&origin.url("/")), error()], Path::Sync, egress);
    let message = Replies::of(&report).failed(Errno::Denied);
    assert!(message.contains("--egress-allow"), "{message}");
    assert_eq!(report.egress_denied.first, [message]);
    assert!(origin.requests().is_empty());
}

#[test]
fn a_name_for_a_loopback_address_not_listed_exactly_is_denied_at_connect() {
    let origin = Origin::answering(b"no");
    let by_name = format!("http://localhost:{}", origin.port);
    let listed = std::slice::from_ref(&by_name);
    let egress = live(listed, listed, ROOMY);
    let ops = [get(&format!("{by_name}/")), error()];
    let report = run_ops(&ops, Path::Sync, egress);
    let message = Replies::of(&report).failed(Errno::Denied);
    assert!(message.contains("loopback"), "{message}");
    assert!(message.contains("--egress-allow"), "{message}");
    // Refused before a connection: not a request.
    assert_eq!(report.usage.egress_requests, 0);
    assert_eq!(report.egress_denied.count, 1);
    assert!(origin.requests().is_empty());
}

#[test]
fn max_requests_stops_at_its_number_naming_it() {
    let origin = Origin::answering(b"ok");
    let limits = EgressLimits {
        max_requests: 2,
        ..ROOMY
    };
    let url = origin.url("/");
    let ops = [get(&url), take(0), get(&url), take(1), get(&url), error()];
    let report = run_ops(&ops, Path::Sync, granted(&origin, limits));
    let mut replies = Replies::of(&report);
    for _ in 0..2 {
        assert_eq!(replies.send().errno, 0);
        assert_eq!(replies.take(4096, 4096).0, 0);
    }
    let message = replies.failed(Errno::Limit);
    assert!(message.contains("max_requests 2"), "{message}");
    assert_eq!(origin.requests().len(), 2);
    assert_eq!(report.usage.egress_requests, 2);
}

#[test]
fn max_concurrent_counts_the_responses_not_yet_taken() {
    let origin = Origin::answering(b"ok");
    let limits = EgressLimits {
        max_concurrent: 2,
        ..ROOMY
    };
    let url = origin.url("/");
    let ops = [get(&url), get(&url), get(&url), error(), take(0), get(&url)];
    let report = run_ops(&ops, Path::Sync, granted(&origin, limits));
    let mut replies = Replies::of(&report);
    assert_eq!(replies.send().errno, 0);
    assert_eq!(replies.send().errno, 0);
    let message = replies.failed(Errno::Limit);
    assert!(message.contains("max_concurrent 2"), "{message}");
    assert_eq!(replies.take(4096, 4096).0, 0);
    let freed = replies.send();
    assert_eq!(
        (freed.errno, freed.handle),
        (0, 3),
        "taking one frees a place"
    );
    assert_eq!(origin.requests().len(), 3);
}

#[test]
fn max_bytes_stops_at_its_number_naming_it() {
    let origin = Origin::answering(&[b'x'; 1000]);
    let limits = EgressLimits {
        max_bytes: 1500,
        ..ROOMY
    };
    let url = origin.url("/big");
    let ops = [get(&url), take(0), get(&url), error(), get(&url), error()];
    let report = run_ops(&ops, Path::Sync, granted(&origin, limits));
    let mut replies = Replies::of(&report);
    assert_eq!(replies.send().errno, 0);
    assert_eq!(replies.take(4096, 4096).0, 0);
    // The second response's declared length is past what is left: refused before its
    // body; and from then on the budget is spent.
    for _ in 0..2 {
        let message = replies.failed(Errno::Limit);
        assert!(message.contains("max_bytes 1500"), "{message}");
    }
    assert!(report.usage.egress_bytes_sent + report.usage.egress_bytes_received <= 1500);
    assert_eq!(origin.requests().len(), 2, "the third never left");
}

#[test]
fn a_bad_head_or_url_is_invalid_naming_what_is_wrong() {
    let origin = Origin::answering(b"ok");
    let bad = |head: &str| Op::Send {
        head: head.into(),
        body: Vec::new(),
    };
    let ops = [
        bad("GET / HTTP/1.1"),
        error(),
        bad(r#"{"method":"GET","url":"not a url"}"#),
        error(),
        bad(r#"{"method":"GET","url":"http://127.0.0.1/","timeout":5}"#),
        error(),
    ];
    let report = run_ops(&ops, Path::Sync, granted(&origin, ROOMY));
    let mut replies = Replies::of(&report);
    for names in ["not JSON", "does not parse", "unknown field \"timeout\""] {
        let message = replies.failed(Errno::Invalid);
        assert!(message.contains(names), "{message:?} should name {names:?}");
    }
    assert_eq!(report.usage.egress_requests, 0);
    assert_eq!(report.egress_denied.count, 0);
}

#[test]
fn a_take_into_buffers_too_small_is_invalid_and_keeps_the_handle() {
    let origin = Origin::answering(b"0123456789");
    let small = Op::Take {
        send: 0,
        headers_cap: 4096,
        body_cap: 9,
    };
    let ops = [
        get(&origin.url("/")),
        small,
        error(),
        take(0),
        take(0),
        error(),
    ];
    let report = run_ops(&ops, Path::Sync, granted(&origin, ROOMY));
    let mut replies = Replies::of(&report);
    assert_eq!(replies.send().errno, 0);
    assert_eq!(replies.take(4096, 9).0, Errno::Invalid as u32);
    let message = replies.error(1024);
    assert!(message.contains("the handle is kept"), "{message}");
    let (errno, _, body) = replies.take(4096, 4096);
    assert_eq!((errno, &body[..10]), (0, &b"0123456789"[..]));
    assert_eq!(
        replies.take(4096, 4096).0,
        Errno::Invalid as u32,
        "taken once"
    );
    assert!(replies.error(1024).contains("no response has handle 1"));
}

#[test]
fn http_error_cuts_its_message_at_the_buffer_and_returns_its_whole_length() {
    let ops = [get("http://127.0.0.1:1/"), Op::Error { cap: 8 }, error()];
    let report = run_ops(&ops, Path::Sync, Egress::Off(NoNetwork::Job));
    let mut replies = Replies::of(&report);
    assert_eq!(replies.send().errno, Errno::Denied as u32);
    let cut = replies.error(8);
    let whole = replies.error(1024);
    assert_eq!(cut, whole[..8]);
    assert!(whole.len() > 8);
}
