//! End to end: `results` inputs, a task reading several earlier results as one stdin.
//! The parts come three ways (inline results copied into the launch, inline results past
//! the launch's budget fetched from the driver with the cluster secret, block-store
//! results) and must arrive in order and intact; and a spec naming results that cannot
//! be read is refused with a kind that says why, before anything runs.

use serde_json::{Value, json};

use crate::common::{DevCluster, guests, sha256_hex};

const MIB: usize = 1 << 20;

fn refused(cluster: &DevCluster, spec: Value) -> Value {
    let (status, body) = cluster.post_raw("/v1/jobs", spec.to_string());
    assert_eq!(status, 422, "{body}");
    body["error"].clone()
}

#[test]
fn results_inputs_concatenate_inline_fetched_and_block_parts_in_order() {
    // With a token and a cluster secret, so the executors' reads of inline results from
    // the driver must pass its auth.
    let cluster = DevCluster::start_with(
        2,
        1,
        &[
            "--token",
            "chained-token",
            "--cluster-secret",
            "chained-secret",
        ],
    );
    let echo = cluster.upload(&guests().testkit);
    let hashgen = cluster.upload(&guests().hashgen);
    // A whole MiB is still an inline result (the inline limit is 1 MiB).
    let mib_of_x = "x".repeat(MIB);
    let small = cluster.run_job(json!({
        "module": echo, "args": ["echo"],
        "inputs": [{"text": "first\n"}, {"text": mib_of_x}],
    }));
    assert_eq!(small["state"], "succeeded", "{small}");
    let large = cluster.run_job(json!({
        "module": hashgen,
        "inputs": [{"text": r#"{"seed": 3, "mib": 2}"#}],
    }));
    assert_eq!(large["state"], "succeeded", "{large}");
    let block = cluster.result(&large, 0);
    assert_eq!(block.len(), 2 * MIB);
    let (small_id, large_id) = (small["id"].as_str().unwrap(), large["id"].as_str().unwrap());

    let reduce = cluster.run_job(json!({
        "module": echo, "args": ["echo"],
        "tasks": [
            {"input": {"results": {"job": small_id}}},
            // Five MiB of inline results: the job's 4 MiB budget of copied inline
            // results is used up by now (1 MiB by task 0, 3 here), so the fifth and the
            // last are fetched from the driver.
            {"input": {"results": {"job": small_id, "tasks": [1, 1, 1, 1, 1, 0]}}},
            {"input": {"results": {"job": large_id}}},
        ],
    }));
    assert_eq!(reduce["state"], "succeeded", "{reduce}");
    let expected = [
        [b"first\n".as_slice(), mib_of_x.as_bytes()].concat(),
        [mib_of_x.repeat(5).as_bytes(), b"first\n"].concat(),
        block,
    ];
    for (index, want) in expected.iter().enumerate() {
        let got = cluster.result(&reduce, index as u64);
        assert_eq!(got.len(), want.len(), "task {index}");
        assert_eq!(sha256_hex(&got), sha256_hex(want), "task {index}");
    }

    // Refused at submit, with the kind saying why.
    let spec = |input: Value| json!({"module": echo, "inputs": [input]});
    let error = refused(&cluster, spec(json!({"results": {"job": "job-nope"}})));
    assert_eq!(error["kind"], "unknown_result", "{error}");
    let error = refused(
        &cluster,
        spec(json!({"results": {"job": small_id, "tasks": [0, 2]}})),
    );
    assert_eq!(error["kind"], "unknown_result", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("has no task 2"),
        "{error}"
    );
    let error = refused(
        &cluster,
        spec(json!({"results": {"job": small_id, "tasks": []}})),
    );
    assert_eq!(error["kind"], "invalid_spec", "{error}");

    // 513 copies of a 2 MiB result pass the 1 GiB input limit; nothing is fetched.
    let error = refused(
        &cluster,
        spec(json!({"results": {"job": large_id, "tasks": vec![0; 513]}})),
    );
    assert_eq!(error["kind"], "input_too_large", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("MAX_TASK_INPUT_BYTES") && message.contains("1073741824"),
        "{error}"
    );

    // A job's `results` inputs together may name at most 1,000,000 results.
    let many = json!({"results": {"job": small_id, "tasks": vec![0; 600_000]}});
    let error = refused(
        &cluster,
        json!({"module": echo, "inputs": [many.clone(), many]}),
    );
    assert_eq!(error["kind"], "too_many_input_parts", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("MAX_INPUT_PARTS_PER_JOB"),
        "{error}"
    );

    // A task still running has no result yet: a job naming it waits for it; once it is
    // killed, the waiting task ends `upstream_failed` unrun, and a new job naming it is
    // refused, as it never will have a result.
    let (status, sleeper) = cluster.post_raw(
        "/v1/jobs",
        json!({"module": echo, "args": ["sleep", "60000"], "inputs": [{"text": ""}]}).to_string(),
    );
    assert_eq!(status, 202, "{sleeper}");
    let sleeper_id = sleeper["id"].as_str().unwrap();
    let (status, reader) = cluster.post_raw(
        "/v1/jobs",
        spec(json!({"results": {"job": sleeper_id}})).to_string(),
    );
    assert_eq!(status, 202, "{reader}");
    assert_eq!(reader["counts"]["waiting"], 1, "{reader}");
    let reader_id = reader["id"].as_str().unwrap();
    let response = cluster
        .client
        .post(cluster.url(&format!("/v1/jobs/{sleeper_id}/kill")))
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let (_, killed) = cluster.get(&format!("/v1/jobs/{sleeper_id}?wait=30"));
    assert_eq!(killed["state"], "killed", "{killed}");
    let (_, reader) = cluster.get(&format!("/v1/jobs/{reader_id}?wait=30"));
    assert_eq!(reader["state"], "failed", "{reader}");
    assert_eq!(reader["error"]["kind"], "upstream_failed", "{reader}");
    assert!(
        reader["error"]["message"]
            .as_str()
            .unwrap()
            .contains(sleeper_id),
        "{reader}"
    );
    let error = refused(&cluster, spec(json!({"results": {"job": sleeper_id}})));
    assert_eq!(error["kind"], "no_result", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("is killed"),
        "{error}"
    );
}
