//! A task's outbound limits (`resources.egress`): `max_requests`, `max_bytes` and
//! `max_concurrent` each stop at their number, naming it; and a request that is never
//! answered holds its task neither past its deadline nor past a kill.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{cluster, job, names, only_task, response_line, succeeded, used};
use crate::common::{DevCluster, Origin, Reply, guests, run_time, wait_until};

/// How far past its deadline, or past its kill, a task blocked in a request may let go
/// of it (issue 42: 0.1 s).
const STOP_WITHIN: Duration = Duration::from_millis(100);

/// `job` with `resources.egress` set to `limits`.
fn limited(module: &str, args: &[&str], allow: &str, limits: Value) -> Value {
    let mut spec = job(module, args, "", &[allow]);
    spec["resources"] = json!({ "egress": limits });
    spec
}

/// The single `error: Limit: ...` line a task printed, without its prefix.
fn limit_line(text: &str) -> &str {
    text.lines()
        .find_map(|l| l.strip_prefix("error: Limit: "))
        .unwrap_or_else(|| panic!("no limit error in {text:?}"))
}

/// A task that stopped itself (exit 3) at an error of `http-n` or `http-par`.
fn stopped_at_an_error(cluster: &DevCluster, job: &Value) -> Value {
    assert_eq!(job["state"], "failed", "{job}");
    let task = only_task(cluster, job);
    assert_eq!(task["error"]["kind"], "exit", "{task}");
    assert_eq!(task["exit_code"], 3, "{task}");
    task
}

#[test]
fn max_requests_max_bytes_and_max_concurrent_each_stop_at_their_number() {
    let big = vec![b'x'; 64 * 1024];
    let server = Origin::start(&[
        ("/n", Reply::Body(b"n".to_vec())),
        ("/r1", Reply::Redirect("/r2".into())),
        ("/r2", Reply::Redirect("/r3".into())),
        ("/r3", Reply::Body(b"end".to_vec())),
        ("/big", Reply::Body(big.clone())),
        ("/unsized", Reply::Unsized(big)),
    ]);
    let cluster = cluster(&[&server.origin]);
    let module = cluster.upload(&guests().testkit);
    let run = |args: &[&str], limits: Value| {
        cluster.run_job(limited(&module, args, &server.origin, limits))
    };

    // max_requests: the third of three GETs is never sent.
    let three = run(
        &["http-n", &server.url("/n"), "3"],
        json!({"max_requests": 2}),
    );
    let task = stopped_at_an_error(&cluster, &three);
    assert_eq!(server.hits("/n"), 2);
    assert_eq!(used(&task, "egress_requests"), 2, "{task}");
    // Each redirect hop is a request: the second redirect is the one too many, and the
    // guest is told which limit it hit.
    let (text, task) = succeeded(
        &cluster,
        &run(
            &["http-get", &server.url("/r1")],
            json!({"max_requests": 2}),
        ),
    );
    names(
        limit_line(&text),
        &[&format!("GET {}", server.url("/r3")), "max_requests 2"],
    );
    assert_eq!((server.hits("/r2"), server.hits("/r3")), (1, 0));
    assert_eq!(used(&task, "egress_requests"), 2);

    // max_bytes: a response declared past what is left is refused from its head; one
    // whose length is not declared is cut once past it. Either way the guest is told,
    // and not a byte past the budget is counted.
    for path in ["/big", "/unsized"] {
        let (text, task) = succeeded(
            &cluster,
            &run(
                &["http-get", &server.url(path)],
                json!({"max_bytes": 10_000}),
            ),
        );
        let line = limit_line(&text);
        names(
            line,
            &[&format!("GET {}", server.url(path)), "max_bytes 10000"],
        );
        if path == "/unsized" {
            names(line, &["cut"]);
        }
        assert_eq!(server.hits(path), 1);
        let counted = used(&task, "egress_bytes_sent") + used(&task, "egress_bytes_received");
        assert!(counted <= 10_000, "{counted} bytes counted: {task}");
    }

    // max_concurrent: with one response held untaken, the second request is never sent.
    let before = server.hits("/n");
    let two = run(
        &["http-par", &server.url("/n"), "2"],
        json!({"max_concurrent": 1}),
    );
    let task = stopped_at_an_error(&cluster, &two);
    assert_eq!(server.hits("/n"), before + 1);
    assert_eq!(used(&task, "egress_requests"), 1, "{task}");
    // Its `error: Limit: ... max_concurrent 1 ...` line went to stdout, and a task that
    // failed keeps no result: the message is checked in
    // executor/src/sandbox/egress/tests/requests.rs.
    // Two at once where two are allowed.
    let (text, _) = succeeded(
        &cluster,
        &run(
            &["http-par", &server.url("/n"), "2"],
            json!({"max_concurrent": 2}),
        ),
    );
    assert_eq!(text, response_line(200, b"n").repeat(2));
    assert_eq!(server.hits("/n"), before + 3);
}

#[test]
fn a_server_that_never_answers_does_not_hold_a_task_past_its_deadline() {
    let server = Origin::start(&[("/hang", Reply::Hang)]);
    let cluster = cluster(&[&server.origin]);
    let module = cluster.upload(&guests().testkit);
    let mut spec = job(
        &module,
        &["http-get", &server.url("/hang")],
        "",
        &[&server.origin],
    );
    spec["resources"] = json!({"timeout_ms": 1000});
    let job = cluster.run_job(spec);
    assert_eq!(job["state"], "failed", "{job}");
    let task = only_task(&cluster, &job);
    assert_eq!(task["error"]["kind"], "timeout", "{task}");
    assert_eq!(
        server.hits("/hang"),
        1,
        "the request was made and left hanging"
    );
    let ran = run_time(&task).expect("start and end times");
    eprintln!("a 1000 ms task blocked in a request ended after {ran:?}");
    assert!(
        ran <= Duration::from_millis(1000) + STOP_WITHIN,
        "ended {ran:?} after its start: {task}"
    );
    // The connection went with the task.
    wait_until(
        Duration::from_secs(5),
        "the hanging request's close",
        || server.hangups().len() == 1,
    );
}

#[test]
fn killing_a_job_closes_the_request_its_task_is_blocked_in_within_100ms() {
    let server = Origin::start(&[("/hang", Reply::Hang)]);
    let cluster = cluster(&[&server.origin]);
    let module = cluster.upload(&guests().testkit);
    let mut spec = job(
        &module,
        &["http-get", &server.url("/hang")],
        "",
        &[&server.origin],
    );
    spec["resources"] = json!({"timeout_ms": 60_000});
    let id = cluster.submit(&spec);
    wait_until(Duration::from_secs(30), "the task's request", || {
        server.hits("/hang") == 1
    });

    // DELETE is for jobs that ended: it refuses a running one, and leaves it running.
    let response = cluster
        .client
        .delete(cluster.url(&format!("/v1/jobs/{id}")))
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 409);
    let body: Value = response.json().unwrap();
    assert_eq!(body["error"]["kind"], "job_running", "{body}");
    assert!(server.hangups().is_empty(), "DELETE let the request go");

    let (status, view) = cluster.post_raw(&format!("/v1/jobs/{id}/kill"), "");
    let answered = Instant::now();
    assert_eq!(status, 202, "{view}");
    wait_until(Duration::from_secs(5), "the killed request's close", || {
        !server.hangups().is_empty()
    });
    let closed = server.hangups()[0].saturating_duration_since(answered);
    eprintln!("the kill's answer -> the request's connection closed: {closed:?}");
    assert!(
        closed <= STOP_WITHIN,
        "closed {closed:?} after the kill's answer"
    );
    let job = cluster.wait_for_job(&id, Duration::from_secs(30));
    assert_eq!(job["state"], "killed", "{job}");
    let task = only_task(&cluster, &job);
    assert_eq!(task["error"]["kind"], "killed", "{task}");
    assert_eq!(task["attempts"], 1, "{task}");
}
