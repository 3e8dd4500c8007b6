//! End to end: the API answers bad requests with a 4xx and a JSON error naming the
//! problem, and nothing breaks.

use serde_json::{Value, json};

use crate::common::{DevCluster, guests, spec};

fn assert_error(response: (u16, Value), status: u16, kind: &str, mentions: &str) {
    let (got, body) = response;
    assert_eq!(got, status, "{body}");
    assert_eq!(body["error"]["kind"], kind, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(mentions),
        "`{message}` should mention `{mentions}`"
    );
}

#[test]
fn bad_requests_get_a_named_4xx_and_the_driver_carries_on() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);

    assert_error(
        cluster.post_raw("/v1/jobs", "{\"module\": "),
        400,
        "invalid_json",
        "EOF",
    );
    assert_error(
        cluster.post_raw("/v1/jobs", "[1, 2]"),
        422,
        "invalid_spec",
        "invalid type",
    );
    assert_error(
        cluster.post_raw(
            "/v1/jobs",
            json!({"module": module, "inputz": []}).to_string(),
        ),
        422,
        "invalid_spec",
        "unknown field `inputz`",
    );
    let unknown = format!("sha256:{}", "ab".repeat(32));
    assert_error(
        cluster.post_raw("/v1/jobs", spec(&unknown, &[], &["x"]).to_string()),
        422,
        "unknown_module",
        &unknown,
    );
    assert_error(
        cluster.post_raw("/v1/jobs", spec("not-a-digest", &[], &["x"]).to_string()),
        422,
        "invalid_module_id",
        "not-a-digest",
    );
    assert_error(
        cluster.put_module_bytes(b"#!/bin/sh\necho not wasm\n".to_vec()),
        422,
        "invalid_module",
        "magic",
    );
    assert_error(
        cluster.put_module_bytes(b"\0asm\x01\0\0\0\x7f".to_vec()),
        422,
        "invalid_module",
        "",
    );
    assert_error(
        cluster.post_raw("/v1/jobs", spec(&module, &[], &[]).to_string()),
        422,
        "no_tasks",
        "at least one task",
    );
    assert_error(
        cluster.post_raw("/v1/jobs", json!({"module": module}).to_string()),
        422,
        "no_tasks",
        "at least one task",
    );
    let mut too_big = spec(&module, &["noop"], &["x"]);
    too_big["resources"] = json!({"cores": 4});
    assert_error(
        cluster.post_raw("/v1/jobs", too_big.to_string()),
        422,
        "unschedulable",
        "largest executor has 1",
    );
    let mut bad_b64 = spec(&module, &["noop"], &[]);
    bad_b64["inputs"] = json!([{"base64": "!!!"}]);
    assert_error(
        cluster.post_raw("/v1/jobs", bad_b64.to_string()),
        422,
        "invalid_spec",
        "inputs[0]: invalid base64",
    );
    assert_error(
        cluster.get("/v1/jobs/job-nope"),
        404,
        "job_not_found",
        "job-nope",
    );
    assert_error(
        cluster.get("/v1/nothing/here"),
        404,
        "not_found",
        "no such route",
    );

    // Nothing was created by the refused requests, and real work still runs.
    assert_eq!(cluster.get("/v1/jobs").1["items"], json!([]));
    let (status, body) = cluster.get_bytes("/healthz");
    assert_eq!((status, body.as_slice()), (200, &b"ok\n"[..]));
    let mut b64 = spec(&module, &["echo"], &[]);
    b64["inputs"] = json!([{"base64": "aGVsbG8="}]);
    let job = cluster.run_job(b64);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(cluster.result(&job, 0), b"hello");
    let id = job["id"].as_str().unwrap();
    assert_error(
        cluster.get(&format!("/v1/jobs/{id}/tasks/5/result")),
        404,
        "task_not_found",
        "no task 5",
    );
}
