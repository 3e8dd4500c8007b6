//! End to end: outbound HTTP from tasks (issue 42), on real `flint dev` processes and
//! real servers that log what reaches them. Here: egress is off until the operator
//! allows origins, and with an allow-list a preview-1 guest's GET and POST reach the
//! server exactly as sent, counted in bytes in every view of `usage`. The three layers
//! at submit and per request in `egress/layers.rs`, the per-task limits, deadline and
//! kill in `egress/limits.rs`, hostile URLs and internal names in `egress/hostile.rs`,
//! recorded responses and `flint replay` in `egress/replay.rs`, a component's requests
//! through wasi-http in `egress/components.rs`.
//!
//! Guests are testkit's `http-*` commands (guest-examples/testkit/src/egress.rs): a
//! response is a line `status=<code> bytes=<n> sha256=<hex>` and then its body when
//! short text; a failed request is a line `error: <kind>: <message>`.

mod components;
mod hostile;
mod layers;
mod limits;
mod replay;

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{
    Api, DevCluster, EventStream, Logged, Origin, Reply, guests, sha256_hex, spec,
};

/// A `flint dev` with one executor of one core whose operator allows `origins`
/// (`--egress-allow`); none, egress is off.
fn cluster(origins: &[&str]) -> DevCluster {
    let allow = origins.join(",");
    let args: &[&str] = match origins.is_empty() {
        true => &[],
        false => &["--egress-allow", &allow],
    };
    DevCluster::start_with(1, 1, args)
}

/// A one-task job of `module` running `args` with `stdin`, allowed `allow` (no
/// `"network"` when empty). Never retried: a retry would send its requests again.
fn job(module: &str, args: &[&str], stdin: &str, allow: &[&str]) -> Value {
    let mut job = spec(module, args, &[stdin]);
    if !allow.is_empty() {
        job["network"] = json!({ "allow": allow });
    }
    job["max_failures"] = json!(1);
    job
}

/// A job of one task per URL, each `http-get` of it with empty stdin, allowed `allow`,
/// never retried.
fn gets_job(module: &str, urls: &[String], allow: &[&str]) -> Value {
    let tasks: Vec<Value> = urls
        .iter()
        .map(|url| json!({"input": {"text": ""}, "args": ["http-get", url]}))
        .collect();
    json!({
        "module": module,
        "tasks": tasks,
        "network": {"allow": allow},
        "max_failures": 1,
    })
}

/// The one task of an ended job.
fn only_task(api: &Api, job: &Value) -> Value {
    api.tasks(job).remove(0)
}

/// The result of a job's task `index` as text; none when the task kept none (a task
/// that failed keeps no result).
fn result_text(api: &Api, job: &Value, index: u64) -> Option<String> {
    let id = job["id"].as_str().unwrap();
    let (status, bytes) = api.get_bytes(&format!("/v1/jobs/{id}/tasks/{index}/result"));
    (status == 200).then(|| String::from_utf8(bytes).unwrap())
}

/// The result of a job that must have succeeded, with its one task.
fn succeeded(api: &Api, job: &Value) -> (String, Value) {
    assert_eq!(job["state"], "succeeded", "{job}");
    let text = result_text(api, job, 0).expect("a succeeded task has a result");
    (text, only_task(api, job))
}

/// One of a view's `usage` counters.
fn used(view: &Value, name: &str) -> u64 {
    view["usage"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage.{name} in {view}"))
}

/// What testkit prints for a response with `status` and `body`.
fn response_line(status: u16, body: &[u8]) -> String {
    format!(
        "status={status} bytes={} sha256={}\n",
        body.len(),
        sha256_hex(body)
    )
}

/// The bytes the executor counts for one exchange the server logged, by the rule the
/// README gives: sent = method + URL + the guest's header names and values + body;
/// received = the answer's header names and values + body.
fn counted(server: &Origin, request: &Logged, guest_headers: &[(&str, &str)]) -> (u64, u64) {
    let headers: usize = guest_headers.iter().map(|(n, v)| n.len() + v.len()).sum();
    let sent =
        request.method.len() + server.url(&request.path).len() + headers + request.body.len();
    let answer: usize = request
        .answer_headers
        .iter()
        .map(|(n, v)| n.len() + v.len())
        .sum();
    (sent as u64, (answer + request.answer_body.len()) as u64)
}

/// Asserts that `message` holds every one of `words`.
fn names(message: &str, words: &[&str]) {
    for word in words {
        assert!(message.contains(word), "{word:?} not in {message:?}");
    }
}

#[test]
fn without_egress_allow_a_network_job_is_refused_and_a_guests_request_is_denied_with_an_event() {
    let server = Origin::start(&[("/x", Reply::Body(b"secret".to_vec()))]);
    let url = server.url("/x");
    let cluster = cluster(&[]);
    let module = cluster.upload(&guests().testkit);

    // Asking for the network where the operator allows none: refused at submit.
    let asking = job(&module, &["http-get", &url], "", &[&server.origin]);
    let (status, body) = cluster.post_raw("/v1/jobs", asking.to_string());
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["kind"], "invalid_spec", "{body}");
    names(
        body["error"]["message"].as_str().unwrap(),
        &["egress is off", "--egress-allow"],
    );

    // A job without `network` whose guest calls anyway: told, and the task goes on. The
    // guest waits a second first so that the stream is open before its attempt ends.
    let id = cluster.submit(&job(&module, &["after", "1000", "http-get", &url], "", &[]));
    let events = EventStream::open(&cluster, &id, None).rest();
    let job = cluster.wait_for_job(&id, Duration::from_secs(60));
    let (text, task) = succeeded(&cluster, &job);
    let line = text.strip_prefix("error: Denied: ").unwrap_or_else(|| {
        panic!("expected a denial, got {text:?}");
    });
    names(line, &[&format!("GET {url}"), "network.allow"]);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert_eq!(
        used(&task, "egress_requests"),
        0,
        "a refusal is not a request"
    );

    let denials: Vec<&Value> = events
        .iter()
        .filter(|(name, _)| name == "egress_denied")
        .map(|(_, data)| data)
        .collect();
    assert_eq!(denials.len(), 1, "{events:?}");
    let denial = denials[0];
    assert_eq!(denial["index"], 0, "{denial}");
    assert_eq!(denial["attempt"], task["history"][0]["attempt"], "{denial}");
    assert_eq!(denial["executor"], task["executor"], "{denial}");
    let denied = denial["denied"].as_array().unwrap();
    assert_eq!(denied.len(), 1, "{denial}");
    names(
        denied[0].as_str().unwrap(),
        &[&format!("GET {url}"), "network.allow"],
    );
    assert_eq!(server.connections(), 0, "a denied request never connects");
}

/// A GET and a POST by `guest` (testkit as a module or a component) against a server
/// that logs them, each a job on a cluster allowing its origin: both answered right, and
/// the server saw exactly those two requests, for the origin it is.
struct GetAndPost {
    server: Origin,
    cluster: DevCluster,
    get: Value,
    post: Value,
    get_task: Value,
    post_task: Value,
    log: Vec<Logged>,
    sent: &'static str,
}

fn get_and_post(guest: &std::path::Path) -> GetAndPost {
    let page = b"hello from the origin".to_vec();
    let server = Origin::start(&[("/get", Reply::Body(page.clone())), ("/echo", Reply::Echo)]);
    let cluster = cluster(&[&server.origin]);
    let module = cluster.upload(guest);
    let allow = [server.origin.as_str()];

    let get = cluster.run_job(job(&module, &["http-get", &server.url("/get")], "", &allow));
    let (text, get_task) = succeeded(&cluster, &get);
    let page_text = String::from_utf8(page.clone()).unwrap();
    assert_eq!(text, response_line(200, &page) + &page_text);

    let sent = "a body for the server to echo back";
    let post = cluster.run_job(job(
        &module,
        &["http-post", &server.url("/echo")],
        sent,
        &allow,
    ));
    let (text, post_task) = succeeded(&cluster, &post);
    assert_eq!(text, response_line(200, sent.as_bytes()) + sent);

    let log = server.log();
    let seen: Vec<(&str, &str, &[u8])> = log
        .iter()
        .map(|r| (r.method.as_str(), r.path.as_str(), r.body.as_slice()))
        .collect();
    assert_eq!(
        seen,
        [
            ("GET", "/get", &b""[..]),
            ("POST", "/echo", sent.as_bytes())
        ]
    );
    let authority = server.origin.trim_start_matches("http://");
    for request in &log {
        assert_eq!(request.host.as_deref(), Some(authority), "{request:?}");
    }
    assert_eq!(server.connections(), 2);
    GetAndPost {
        server,
        cluster,
        get,
        post,
        get_task,
        post_task,
        log,
        sent,
    }
}

#[test]
fn with_an_allow_list_a_p1_guest_gets_and_posts_and_usage_counts_exactly_the_bytes() {
    let GetAndPost {
        server,
        cluster,
        get,
        post,
        get_task,
        post_task,
        log,
        ..
    } = get_and_post(&guests().testkit);

    // Each attempt counts its request's bytes, and the job and the totals sum them.
    let mut totals = (0, 0);
    for (job, task, request) in [(&get, &get_task, &log[0]), (&post, &post_task, &log[1])] {
        let (bytes_sent, bytes_received) = counted(&server, request, &[]);
        for view in [task, &task["history"][0], job] {
            assert_eq!(used(view, "egress_requests"), 1, "{view}");
            assert_eq!(used(view, "egress_bytes_sent"), bytes_sent, "{view}");
            assert_eq!(
                used(view, "egress_bytes_received"),
                bytes_received,
                "{view}"
            );
        }
        totals = (totals.0 + bytes_sent, totals.1 + bytes_received);
    }
    let (status, usage) = cluster.get("/v1/tenants/admin/usage");
    assert_eq!(status, 200, "{usage}");
    assert_eq!(usage["egress_requests"], 2, "{usage}");
    assert_eq!(usage["egress_bytes_sent"], totals.0, "{usage}");
    assert_eq!(usage["egress_bytes_received"], totals.1, "{usage}");
    for (series, value) in [
        ("flint_task_egress_requests_total", 2),
        ("flint_task_egress_bytes_sent_total", totals.0),
        ("flint_task_egress_bytes_received_total", totals.1),
        (
            "flint_tenant_task_egress_requests_total{tenant=\"admin\"}",
            2,
        ),
        (
            "flint_tenant_task_egress_bytes_sent_total{tenant=\"admin\"}",
            totals.0,
        ),
        (
            "flint_tenant_task_egress_bytes_received_total{tenant=\"admin\"}",
            totals.1,
        ),
    ] {
        assert_eq!(cluster.metric(series), value as f64, "{series}");
    }
}
