//! The same requests from a preview-2 component: testkit built for wasm32-wasip2 calls
//! through `wasi:http/outgoing-handler`, which the executor serves only through its
//! guarded client, under the same policy, limits and counters as a module's `flint`
//! imports.

use std::time::Duration;

use serde_json::Value;

use super::{GetAndPost, cluster, counted, get_and_post, job, names, succeeded, used};
use crate::common::{EventStream, Origin, Reply, guests};

#[test]
fn a_component_gets_and_posts_through_wasi_http_and_usage_counts_exactly_the_bytes() {
    let GetAndPost {
        server,
        get_task,
        post_task,
        log,
        sent,
        ..
    } = get_and_post(&guests().testkit_component);
    // The SDK gives a body its length (wasmtime would send it chunked otherwise).
    let length = sent.len().to_string();
    let exchanges = [
        (&get_task, &log[0], vec![]),
        (
            &post_task,
            &log[1],
            vec![("content-length", length.as_str())],
        ),
    ];
    for (task, request, guest_headers) in exchanges {
        let (bytes_sent, bytes_received) = counted(&server, request, &guest_headers);
        assert_eq!(used(task, "egress_requests"), 1, "{task}");
        assert_eq!(used(task, "egress_bytes_sent"), bytes_sent, "{task}");
        assert_eq!(
            used(task, "egress_bytes_received"),
            bytes_received,
            "{task}"
        );
    }
}

#[test]
fn a_components_request_without_network_is_denied_and_the_event_names_the_rule() {
    let server = Origin::start(&[("/x", Reply::Body(b"secret".to_vec()))]);
    let url = server.url("/x");
    let cluster = cluster(&[&server.origin]);
    let module = cluster.upload(&guests().testkit_component);
    // The guest waits first, so that the stream is open before its attempt ends.
    let id = cluster.submit(&job(&module, &["after", "1000", "http-get", &url], "", &[]));
    let events = EventStream::open(&cluster, &id, None).rest();
    let ended = cluster.wait_for_job(&id, Duration::from_secs(60));
    let (text, task) = succeeded(&cluster, &ended);
    // wasi-http carries a code, not a message: the guest sees the denial's kind.
    assert!(text.starts_with("error: Denied: "), "{text}");
    assert_eq!(used(&task, "egress_requests"), 0, "{task}");
    let denials: Vec<&Value> = events
        .iter()
        .filter(|(name, _)| name == "egress_denied")
        .map(|(_, data)| data)
        .collect();
    assert_eq!(denials.len(), 1, "{events:?}");
    names(
        denials[0]["denied"][0].as_str().unwrap(),
        &[&format!("GET {url}"), "network.allow"],
    );
    assert_eq!(server.connections(), 0, "a denied request never connects");
}
