//! End to end: `POST /v1/jobs` with an `Idempotency-Key` (and `flint submit
//! --idempotency-key`) makes a job once. Concurrent repeats wait for the first and get its
//! job; the same spec written in another key order is the same spec; another spec under
//! the key is refused naming the job; keys that break the rule are refused before
//! anything runs; and a key outlives a driver crash, as its job does.

use std::process::Stdio;
use std::sync::Barrier;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Api, DevCluster, Process, free_port, guests, process, wait_until};

/// POSTs `body` to `/v1/jobs{query}` with each of `keys` as an `Idempotency-Key` header.
fn post_with_keys(api: &Api, query: &str, keys: &[&[u8]], body: &str) -> (u16, Value) {
    let mut request = api
        .client
        .post(api.url(&format!("/v1/jobs{query}")))
        .header("content-type", "application/json");
    for key in keys {
        let value = reqwest::header::HeaderValue::from_bytes(key).unwrap();
        request = request.header("idempotency-key", value);
    }
    let response = request.body(body.to_owned()).send().unwrap();
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

fn post_keyed(api: &Api, key: &str, body: &str) -> (u16, Value) {
    post_with_keys(api, "", &[key.as_bytes()], body)
}

/// The ids of every job the driver has.
fn job_ids(api: &Api) -> Vec<String> {
    let (status, page) = api.get("/v1/jobs?limit=10000");
    assert_eq!(status, 200, "{page}");
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_owned())
        .collect()
}

fn echo_spec(module: &str, inputs: &[&str]) -> Value {
    json!({
        "name": "once",
        "module": module,
        "args": ["echo"],
        "inputs": inputs.iter().map(|t| json!({"text": t})).collect::<Vec<_>>(),
    })
}

#[test]
fn twenty_concurrent_submissions_with_one_key_create_exactly_one_job() {
    let cluster = DevCluster::start(1, 2);
    let module = cluster.upload(&guests().testkit);
    // Inputs large enough that storing the job takes a while (a 1 MiB record), so that
    // repeats arrive while the first submission is still being admitted and stored.
    let (a, b) = ("a".repeat(512 << 10), "b".repeat(512 << 10));
    let spec = echo_spec(&module, &[&a, &b]).to_string();

    let start = Barrier::new(20);
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..20)
            .map(|_| {
                scope.spawn(|| {
                    // A connection each before the start, so all 20 submit at once.
                    assert!(cluster.answers());
                    start.wait();
                    post_keyed(&cluster, "retry-me", &spec)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let id = answers[0].1["id"].as_str().expect("a job view").to_owned();
    for (status, job) in &answers {
        assert!(*status == 200 || *status == 202, "{status} {job}");
        assert_eq!(job["id"], id.as_str(), "every answer names the one job");
    }
    let accepted = answers.iter().filter(|(s, _)| *s == 202).count();
    assert_eq!(
        accepted, 1,
        "one 202 (the job made), 19 200s (the job found)"
    );
    assert_eq!(job_ids(&cluster), [id.as_str()], "exactly one job");

    // A repeat honours ?wait= as a first submission does, and the job ran once.
    let (status, job) = post_with_keys(&cluster, "?wait=60", &[b"retry-me"], &spec);
    assert_eq!(
        (status, job["state"].as_str()),
        (200, Some("succeeded")),
        "{job}"
    );
    assert_eq!(job["counts"]["succeeded"], 2, "{job}");
    let tasks = cluster.tasks(&job);
    assert!(tasks.iter().all(|t| t["attempts"] == 1), "{tasks:?}");

    // The same spec with its keys in another order and other whitespace is the same.
    let reordered = format!(
        "{{\n  \"inputs\" : [ {{ \"text\" : \"{a}\" }},{{\"text\":\"{b}\"}} ],\n\t\"args\": \
         [\"echo\"],   \"module\": \"{module}\", \"name\":\"once\" }}"
    );
    let (status, job) = post_keyed(&cluster, "retry-me", &reordered);
    assert_eq!(
        (status, job["id"].as_str()),
        (200, Some(id.as_str())),
        "{job}"
    );

    // Another spec under the key is refused, naming the job the key belongs to.
    let other = echo_spec(&module, &[&a, "c"]).to_string();
    let (status, body) = post_keyed(&cluster, "retry-me", &other);
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["kind"], "idempotency_conflict", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&id) && message.contains("retry-me"),
        "{message}"
    );
    // A body that is not JSON is that, whatever the key.
    let (status, body) = post_keyed(&cluster, "retry-me", "{\"module\":");
    assert_eq!(
        (status, &body["error"]["kind"]),
        (400, &json!("invalid_json"))
    );

    // Another key is another job, even for the same spec.
    let (status, job) = post_keyed(&cluster, "retry-me-too", &spec);
    assert_eq!(status, 202, "{job}");
    assert_ne!(job["id"], id.as_str());
    assert_eq!(job_ids(&cluster).len(), 2);
}

#[test]
fn keys_outside_1_to_255_visible_ascii_bytes_are_refused_and_make_no_job() {
    let cluster = DevCluster::driver(&[
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--executor-listen".into(),
        "127.0.0.1:0".into(),
    ]);
    let module = cluster.upload(&guests().testkit);
    let spec = echo_spec(&module, &["a"]).to_string();
    let long = "k".repeat(256);
    let cases: [(&[u8], &str); 5] = [
        (b"", "is empty"),
        (long.as_bytes(), "is 256 bytes, over the limit of 255"),
        (b"two words", "byte 3 of the Idempotency-Key is 0x20"),
        (
            "caf\u{e9}".as_bytes(),
            "byte 3 of the Idempotency-Key is 0xc3",
        ),
        (b"tab\there", "byte 3 of the Idempotency-Key is 0x09"),
    ];
    for (key, why) in cases {
        let (status, body) = post_with_keys(&cluster, "", &[key], &spec);
        assert_eq!(status, 400, "{key:?}: {body}");
        assert_eq!(body["error"]["kind"], "bad_idempotency_key", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{message}");
        assert!(
            message.contains("1 to 255 bytes of visible ASCII (0x21-0x7e)"),
            "{message}"
        );
    }
    let (status, body) = post_with_keys(&cluster, "", &[b"one", b"two"], &spec);
    assert_eq!(
        (status, &body["error"]["kind"]),
        (400, &json!("bad_idempotency_key"))
    );
    assert!(
        job_ids(&cluster).is_empty(),
        "no refused submission made a job"
    );

    // The limits themselves are keys: 255 bytes, every visible byte.
    let longest = "~".repeat(255);
    let visible: Vec<u8> = (0x21..=0x7e).collect();
    for key in [longest.as_bytes(), &visible, b"a"] {
        let (status, body) = post_with_keys(&cluster, "", &[key], &spec);
        assert_eq!(status, 202, "{body}");
    }
    assert_eq!(job_ids(&cluster).len(), 3);

    // The OpenAPI document (which schemathesis fuzzes) says all of this.
    let (_, doc) = cluster.get("/v1/openapi.json");
    let submit = &doc["paths"]["/v1/jobs"]["post"];
    let header = submit["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "Idempotency-Key")
        .unwrap_or_else(|| panic!("no Idempotency-Key in {submit}"));
    assert_eq!(header["in"], "header", "{header}");
    assert_eq!(header["schema"]["maxLength"], 255, "{header}");
    for status in ["200", "202", "400", "422"] {
        assert!(
            submit["responses"][status].is_object(),
            "{status}: {submit}"
        );
    }
}

#[test]
fn a_key_still_names_its_job_after_the_driver_is_killed_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (http, executors) = (free_port(), free_port());
    let start = || {
        let listen = format!("127.0.0.1:{http}");
        let executor_listen = format!("127.0.0.1:{executors}");
        let driver = Process::spawn(
            process::driver(
                &["--listen", &listen, "--executor-listen", &executor_listen],
                &data,
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        );
        let api = Api::new(format!("http://{listen}"), None);
        wait_until(Duration::from_secs(30), "the driver to answer", || {
            api.answers()
        });
        (driver, api)
    };

    let (mut driver, api) = start();
    let module = api.upload(&guests().testkit);
    let spec = echo_spec(&module, &["a"]).to_string();
    let (status, job) = post_keyed(&api, "survives", &spec);
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    // Answered 202, so stored with its key: a SIGKILL loses neither.
    driver.sigkill();

    let (_driver, api) = start();
    let (status, job) = post_keyed(&api, "survives", &spec);
    assert_eq!(
        (status, job["id"].as_str()),
        (200, Some(id.as_str())),
        "{job}"
    );
    let other = echo_spec(&module, &["b"]).to_string();
    let (status, body) = post_keyed(&api, "survives", &other);
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(&id),
        "{body}"
    );
    assert_eq!(job_ids(&api), [id]);
}

#[test]
fn flint_submit_with_an_idempotency_key_twice_runs_one_job() {
    let cluster = DevCluster::start(1, 1);
    let testkit = guests().testkit.to_str().unwrap().to_owned();
    let submit = |extra: &[&str]| {
        let mut args = vec![
            "submit",
            testkit.as_str(),
            "--arg",
            "echo",
            "--input-text",
            "hi",
        ];
        args.extend(extra);
        cluster.cli(&args)
    };
    let first = submit(&["--idempotency-key", "cli-1"]);
    assert!(first.status.success(), "{first:?}");
    let id = String::from_utf8(first.stdout).unwrap().trim().to_owned();
    assert!(id.starts_with("job-"), "{id}");
    let again = submit(&["--idempotency-key", "cli-1"]);
    assert!(again.status.success(), "{again:?}");
    assert_eq!(String::from_utf8(again.stdout).unwrap().trim(), id);
    // Waiting on a repeat follows the one job to its results.
    let waited = submit(&["--idempotency-key", "cli-1", "--wait", "--progress", "off"]);
    assert!(waited.status.success(), "{waited:?}");
    assert_eq!(String::from_utf8(waited.stdout).unwrap().trim(), "hi");
    assert_eq!(
        job_ids(&cluster),
        [id.as_str()],
        "one job for three submits"
    );

    let other = cluster.cli(&[
        "submit",
        &testkit,
        "--arg",
        "echo",
        "--input-text",
        "bye",
        "--idempotency-key",
        "cli-1",
    ]);
    assert!(!other.status.success());
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(
        stderr.contains("idempotency_conflict") && stderr.contains(&id),
        "{stderr}"
    );

    let bad = submit(&["--idempotency-key", "two words"]);
    assert_eq!(bad.status.code(), Some(2), "a usage error: {bad:?}");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("0x21-0x7e"), "{stderr}");
    assert_eq!(job_ids(&cluster).len(), 1);
}
