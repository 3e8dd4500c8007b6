//! End to end: the HTTP edge's limits over real sockets: bodies over the limit (413
//! before they are read), hostile JSON (deep nesting, wrong types, unknown fields) as
//! 4xx, slow-header and slow-body clients cut off by their timeouts, and requests past
//! the concurrency limit answered 503 with `Retry-After`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use flint_protocol::defaults;
use serde_json::{Value, json};

use crate::common::{DevCluster, guests, spec, wait_until};

/// Sends `head` (and `body`) on a fresh connection and returns the status line's code
/// and the whole answer.
fn raw(cluster: &DevCluster, head: &str, body: &[u8]) -> (u16, String) {
    let addr = cluster.http.strip_prefix("http://").unwrap();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Read the head and the (small, JSON) body; stop at the end of the body.
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(|v| v.trim().parse::<usize>().unwrap())
            });
            if length.is_some_and(|len| body.len() >= len) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    (status, text)
}

#[test]
fn bodies_over_the_limit_are_refused_before_they_are_read() {
    let cluster = DevCluster::start(1, 1);
    for (path, method, limit) in [
        ("/v1/jobs", "POST", defaults::MAX_JOB_SPEC_BYTES),
        ("/v1/modules", "PUT", defaults::MAX_MODULE_BYTES),
        ("/v1/files", "PUT", defaults::MAX_FILE_BYTES),
    ] {
        // Only the head is sent: the answer must come without the body.
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: flint\r\ncontent-length: {}\r\n\r\n",
            limit + 1
        );
        let (status, answer) = raw(&cluster, &head, b"");
        assert_eq!(status, 413, "{answer}");
        assert!(answer.contains("body_too_large"), "{answer}");
        assert!(
            answer.contains(&format!("limit of {limit} bytes")),
            "{answer}"
        );
    }
    assert_eq!(cluster.get("/healthz").0, 200);
}

#[test]
fn hostile_json_gets_a_4xx_never_a_5xx() {
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    let deep = |inner: &str| format!("{}{inner}{}", "[".repeat(10_000), "]".repeat(10_000));
    let deep_objects = format!("{}1{}", "{\"a\":".repeat(10_000), "}".repeat(10_000));
    let cases: Vec<(String, u16, &str)> = vec![
        (deep(""), 400, "invalid_json"),
        (
            format!("{{\"module\": \"{module}\", \"args\": {}}}", deep("\"x\"")),
            400,
            "invalid_json",
        ),
        (deep_objects, 400, "invalid_json"),
        (
            json!({"module": 5, "inputs": [{"text": "a"}]}).to_string(),
            422,
            "invalid_spec",
        ),
        (
            json!({"module": module, "inputs": "a"}).to_string(),
            422,
            "invalid_spec",
        ),
        (
            json!({"module": module, "inputs": [{"text": 1}]}).to_string(),
            422,
            "invalid_spec",
        ),
        (
            json!({"module": module, "inputs": [{"text": "a", "base64": "YQ=="}]}).to_string(),
            422,
            "invalid_spec",
        ),
        (
            json!({"module": module, "inputs": [{"text": "a"}], "resources": {"cores": "one"}})
                .to_string(),
            422,
            "invalid_spec",
        ),
        (
            json!({"module": module, "inputs": [{"text": "a"}], "resources": {"cores": -1}})
                .to_string(),
            422,
            "invalid_spec",
        ),
        (
            json!({"module": module, "inputs": [{"text": "a"}], "resources": {"gpus": 1}})
                .to_string(),
            422,
            "invalid_spec",
        ),
        (
            json!({"module": module, "inputs": [{"text": "a"}], "max_failures": 1e300}).to_string(),
            422,
            "invalid_spec",
        ),
        (
            json!({"module": module, "inputs": [{"text": "a"}], "env": {"A": null}}).to_string(),
            422,
            "invalid_spec",
        ),
        ("\u{feff}{}".to_owned(), 400, "invalid_json"),
        ("{\"module\": \"\\ud800\"}".to_owned(), 400, "invalid_json"),
    ];
    for (body, status, kind) in cases {
        let (got, error) = cluster.post_raw("/v1/jobs", body.clone());
        let shown: String = body.chars().take(120).collect();
        assert_eq!(got, status, "{shown}: {error}");
        assert_eq!(error["error"]["kind"], kind, "{shown}: {error}");
    }
    // Query and path parameters of the wrong type or range.
    for (path, kind) in [
        ("/v1/jobs?limit=0", "bad_query"),
        ("/v1/jobs?limit=10001", "bad_query"),
        ("/v1/jobs?limit=-1", "bad_query"),
        ("/v1/jobs/job-x?wait=soon", "bad_query"),
        ("/v1/jobs/job-x/tasks?after=x", "bad_query"),
        ("/v1/jobs/job-x/tasks/-1/result", "bad_path"),
        ("/v1/jobs/job-x/tasks/99999999999/log", "bad_path"),
    ] {
        let (status, error) = cluster.get(path);
        assert_eq!(status, 400, "{path}: {error}");
        assert_eq!(error["error"]["kind"], kind, "{path}: {error}");
    }
    assert_eq!(cluster.get("/healthz").0, 200);
}

/// Found by schemathesis: `Duration::from_secs_f64` panicked on `?wait=1.8e19` and the
/// connection dropped without an answer.
#[test]
fn a_wait_beyond_any_duration_is_capped_not_a_dropped_connection() {
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    let (status, job) = cluster.post_raw(
        "/v1/jobs?wait=1.8446744073709552e19",
        spec(&module, &["echo"], &["x"]).to_string(),
    );
    assert_eq!(status, 202, "{job}");
    assert_eq!(job["state"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap();
    let (status, _) = cluster.get(&format!("/v1/jobs/{id}?wait=1e300"));
    assert_eq!(status, 200);
}

#[test]
fn slow_header_connections_are_closed_while_requests_keep_answering() {
    const SLOW: usize = 1_000;
    let cluster = DevCluster::start_with(1, 1, &["--header-read-timeout-ms", "1000"]);
    let addr = cluster.http.strip_prefix("http://").unwrap().to_owned();
    let opened = Instant::now();
    let mut slow: Vec<TcpStream> = (0..SLOW)
        .map(|_| {
            let mut stream = TcpStream::connect(&addr).unwrap();
            // A request head that never ends.
            stream
                .write_all(b"GET /v1/jobs HTTP/1.1\r\nhost: flint\r\nx-slow: 1")
                .unwrap();
            stream
        })
        .collect();
    // Meanwhile the API answers, on fresh connections.
    let client = reqwest::blocking::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for _ in 0..20 {
        let response = client.get(cluster.url("/v1/executors")).send().unwrap();
        assert_eq!(response.status(), 200);
    }
    // Every slow connection is closed by the driver (end of stream, maybe after a 408).
    for stream in &mut slow {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut rest = Vec::new();
        match stream.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("slow connection not closed: {e}"),
        }
        assert!(
            rest.is_empty() || String::from_utf8_lossy(&rest).starts_with("HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&rest)
        );
    }
    println!(
        "{SLOW} slow-header connections closed {:?} after they opened (timeout 1 s)",
        opened.elapsed()
    );
    assert_eq!(cluster.get("/healthz").0, 200);
}

#[test]
fn a_stalled_body_gets_408() {
    let cluster = DevCluster::start_with(1, 1, &["--body-idle-timeout-ms", "300"]);
    let head = "POST /v1/jobs HTTP/1.1\r\nhost: flint\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n";
    let (status, answer) = raw(&cluster, head, b"{\"module\":");
    assert_eq!(status, 408, "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    assert!(answer.contains("300 ms"), "{answer}");
}

#[test]
fn requests_past_the_concurrency_limit_get_503_with_retry_after() {
    let cluster = DevCluster::start_with(1, 1, &["--max-concurrent-requests", "2"]);
    let module = cluster.upload(&guests().testkit);
    let (status, job) = cluster.post_raw(
        "/v1/jobs",
        spec(&module, &["sleep", "60000"], &[""]).to_string(),
    );
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    // Two long polls hold both permits for 8 s (the job runs longer).
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let url = cluster.url(&format!("/v1/jobs/{id}?wait=8"));
            // A waiter may itself be refused while the probe below holds the other
            // permit; it tries again until it holds one.
            std::thread::spawn(move || {
                loop {
                    let status = reqwest::blocking::get(&url).unwrap().status().as_u16();
                    if status != 503 {
                        return status;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        })
        .collect();
    let mut refused = None;
    wait_until(
        Duration::from_secs(15),
        "a request refused as overloaded",
        || {
            let response = cluster
                .client
                .get(cluster.url("/v1/executors"))
                .send()
                .unwrap();
            if response.status() == 503 {
                refused = Some(response);
            }
            refused.is_some()
        },
    );
    let response = refused.unwrap();
    assert_eq!(response.headers()["retry-after"], "1");
    let error: Value = response.json().unwrap();
    assert_eq!(error["error"]["kind"], "overloaded", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 2 requests")
    );
    for waiter in waiters {
        assert_eq!(waiter.join().unwrap(), 200);
    }
    assert_eq!(cluster.get("/v1/executors").0, 200, "permits come back");
    // The executor fetched its module meanwhile: downloads are not shed.
    let (_, job) = cluster.get(&format!("/v1/jobs/{id}"));
    assert_eq!(job["state"], "running", "{job}");
    let (status, _) = cluster.post_raw(&format!("/v1/jobs/{id}/kill"), "");
    assert_eq!(status, 202);
}

#[test]
fn the_openapi_document_lists_every_route_and_the_limits() {
    let cluster = DevCluster::start_with(1, 1, &["--token", "t", "--cluster-secret", "s"]);
    let doc: Value = reqwest::blocking::get(cluster.url("/v1/openapi.json"))
        .unwrap()
        .json()
        .unwrap();
    let mut paths: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "/healthz",
            "/metrics",
            "/v1/cluster/history",
            "/v1/executors",
            "/v1/executors/{id}",
            "/v1/executors/{id}/decommission",
            "/v1/executors/{id}/log",
            "/v1/files",
            "/v1/files/{id}",
            "/v1/graphs",
            "/v1/graphs/{id}",
            "/v1/graphs/{id}/kill",
            "/v1/graphs/{id}/recover",
            "/v1/jobs",
            "/v1/jobs/{id}",
            "/v1/jobs/{id}/events",
            "/v1/jobs/{id}/kill",
            "/v1/jobs/{id}/results",
            "/v1/jobs/{id}/tasks",
            "/v1/jobs/{id}/tasks/{index}/log",
            "/v1/jobs/{id}/tasks/{index}/replay",
            "/v1/jobs/{id}/tasks/{index}/result",
            "/v1/jobs/{id}/timeline",
            "/v1/modules",
            "/v1/modules/{id}",
            "/v1/tenants/{name}/usage",
            "/v1/workers",
            "/v1/workers/{id}/kill",
        ]
    );
    let submit = &doc["paths"]["/v1/jobs"]["post"];
    for status in ["202", "400", "401", "408", "413", "422", "503"] {
        assert!(
            submit["responses"][status].is_object(),
            "{status}: {submit}"
        );
    }
    assert_eq!(submit["security"][0]["bearer"], json!([]));
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let resources = &doc["components"]["schemas"]["ResourcesSpec"];
    assert_eq!(
        resources["properties"]["max_output_bytes"]["maximum"],
        defaults::TASK_MAX_OUTPUT_BYTES,
        "the schema's maximum follows the default"
    );
    assert_eq!(resources["additionalProperties"], false);
    let events = &doc["paths"]["/v1/jobs/{id}/events"]["get"]["responses"];
    assert!(
        events["200"]["content"]["text/event-stream"].is_object(),
        "{events}"
    );
    // Every shape the document refers to is in it (`result` inputs' ResultRef was not).
    let text = doc.to_string();
    for reference in text.split("\"#/components/schemas/").skip(1) {
        let name = reference.split('"').next().unwrap();
        assert!(doc["components"]["schemas"][name].is_object(), "{name}");
    }
    let results = &doc["paths"]["/v1/jobs/{id}/results"]["get"]["responses"];
    assert!(
        results["200"]["content"]["application/vnd.flint.results"].is_object(),
        "{results}"
    );
    for shape in [
        "TaskEvent",
        "LaggedEvent",
        "JobView",
        "TimelineView",
        "ClusterHistory",
    ] {
        assert!(doc["components"]["schemas"][shape].is_object(), "{shape}");
    }
}
