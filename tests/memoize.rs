//! End to end on a real `flint dev`: `"memoize": true` takes a deterministic task's
//! result from an earlier task that ran the same, without running it; deleting that
//! earlier job takes its entries with it.

mod common;

use common::{DevCluster, guests, spec};
use serde_json::{Value, json};

/// A p1 command that writes its clocks and 16 random bytes: the same bytes for the same
/// task of a deterministic job, whoever runs it.
const PROBE: &str = r#"(module
  (import "wasi_snapshot_preview1" "clock_time_get"
    (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (drop (call $clock (i32.const 0) (i64.const 1) (i32.const 1024)))
    (drop (call $random (i32.const 1032) (i32.const 16)))
    (i32.store (i32.const 200) (i32.const 1024))
    (i32.store (i32.const 204) (i32.const 24))
    (drop (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 208)))))"#;

/// Attempts the executors have finished, as the driver counts them.
fn finished(cluster: &DevCluster) -> u64 {
    cluster
        .executors()
        .iter()
        .map(|e| e["tasks_finished"].as_u64().unwrap())
        .sum()
}

fn results(cluster: &DevCluster, job: &Value) -> Vec<Vec<u8>> {
    assert_eq!(job["state"], "succeeded", "{job}");
    (0..3).map(|i| cluster.result(job, i)).collect()
}

#[test]
fn the_second_of_two_identical_memoized_jobs_runs_nothing_and_returns_the_same_results() {
    let cluster = DevCluster::start(2, 1);
    let probe = cluster.upload_wat(PROBE);
    let mut job = spec(&probe, &[], &["a", "b", "c"]);
    job["deterministic"] = json!(true);
    job["seed"] = json!(9);
    job["memoize"] = json!(true);

    let first = cluster.run_job(job.clone());
    let computed = results(&cluster, &first);
    assert_eq!(finished(&cluster), 3);
    let second = cluster.run_job(job.clone());
    assert_eq!(results(&cluster, &second), computed);
    assert_eq!(
        finished(&cluster),
        3,
        "no executor ran a task of the second job"
    );
    for (index, task) in cluster.tasks(&second).iter().enumerate() {
        assert_eq!(task["memoized_from"]["job"], first["id"], "{task}");
        assert_eq!(task["memoized_from"]["task"], index);
        assert_eq!(task["attempts"], 0);
        assert_eq!(task["state"], "succeeded");
    }
    assert!(cluster.tasks(&first)[0].get("memoized_from").is_none());

    // Another seed is another computation.
    job["seed"] = json!(10);
    let reseeded = cluster.run_job(job.clone());
    assert_ne!(results(&cluster, &reseeded), computed);
    assert_eq!(finished(&cluster), 6);

    // Deleting the first job drops its entries: the same job runs again, to the same
    // bytes (it is deterministic), and becomes the one later jobs take from.
    job["seed"] = json!(9);
    let out = cluster.cli(&["delete", first["id"].as_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let third = cluster.run_job(job.clone());
    assert_eq!(results(&cluster, &third), computed);
    assert_eq!(finished(&cluster), 9);
    let fourth = cluster.run_job(job);
    assert_eq!(finished(&cluster), 9);
    assert_eq!(
        cluster.tasks(&fourth)[2]["memoized_from"]["job"],
        third["id"]
    );
    // The second job took copies: it keeps its results with the first one gone.
    assert_eq!(results(&cluster, &second), computed);
}

#[test]
fn memoize_is_refused_where_a_result_could_differ_or_an_input_has_no_digest() {
    let cluster = DevCluster::start(1, 1);
    let testkit = cluster.upload(&guests().testkit);
    let mut job = spec(&testkit, &["echo"], &["x"]);
    job["memoize"] = json!(true);
    let (status, body) = cluster.post_raw("/v1/jobs", job.to_string());
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("deterministic"),
        "{body}"
    );

    job["deterministic"] = json!(true);
    job["module"] = json!("http://127.0.0.1:9/testkit.wasm");
    let (status, body) = cluster.post_raw("/v1/jobs", job.to_string());
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("module_sha256"),
        "{body}"
    );

    job["module"] = json!(testkit);
    job["inputs"] = json!([{"text": "x"}, {"url": "http://127.0.0.1:9/in"}]);
    let (status, body) = cluster.post_raw("/v1/jobs", job.to_string());
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("task 1's input"),
        "{body}"
    );
}
