//! End to end on a real `flint dev`: `"memoize": true` takes a deterministic task's
//! result from an earlier task that ran the same, without running it; deleting that
//! earlier job takes its entries with it.

use serde_json::{Value, json};

use crate::common::{DevCluster, guests, spec};

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

/// A deterministic, memoized job whose one task allocates 300 MiB under a 128 MiB start.
fn needs_300_mib(module: &str, escalate: Option<Value>) -> Value {
    let mut job = spec(module, &["alloc", "300"], &[""]);
    job["resources"] = json!({"memory_mb": 128});
    job["deterministic"] = json!(true);
    job["memoize"] = json!(true);
    if let Some(escalate) = escalate {
        job["retry"] = json!({"escalate": escalate});
    }
    job
}

#[test]
fn a_result_that_needed_escalation_answers_only_a_job_that_escalates_the_same_way() {
    let cluster = DevCluster::start(1, 1);
    let testkit = cluster.upload(&guests().testkit);
    let escalating = cluster.run_job(needs_300_mib(&testkit, Some(json!({"memory": 2.0}))));
    assert_eq!(escalating["state"], "succeeded", "{escalating}");
    assert_eq!(finished(&cluster), 3, "128, 256, then 512 MiB");

    // Without escalation the task fails at 128 MiB: it must run, not take the result.
    let plain = cluster.run_job(needs_300_mib(&testkit, None));
    assert_eq!(plain["state"], "failed", "{plain}");
    let task = &cluster.tasks(&plain)[0];
    assert_eq!(task["error"]["kind"], "memory_limit", "{task}");
    assert!(task.get("memoized_from").is_none(), "{task}");
    assert_eq!(finished(&cluster), 4);

    // Escalating the same way, it is the same computation: taken, not run.
    let again = cluster.run_job(needs_300_mib(&testkit, Some(json!({"memory": 2.0}))));
    assert_eq!(again["state"], "succeeded", "{again}");
    assert_eq!(
        cluster.tasks(&again)[0]["memoized_from"]["job"],
        escalating["id"]
    );
    assert_eq!(finished(&cluster), 4);
    // Another factor would try other budgets: another computation.
    let other = cluster.run_job(needs_300_mib(&testkit, Some(json!({"memory": 4.0}))));
    assert!(cluster.tasks(&other)[0].get("memoized_from").is_none());
    assert_eq!(finished(&cluster), 6, "128, then 512 MiB");
}

#[test]
fn two_identical_memoized_jobs_without_a_seed_are_one_computation() {
    let cluster = DevCluster::start(1, 1);
    let probe = cluster.upload_wat(PROBE);
    let mut job = spec(&probe, &[], &["a", "b", "c"]);
    job["deterministic"] = json!(true);
    job["memoize"] = json!(true);
    let first = cluster.run_job(job.clone());
    let computed = results(&cluster, &first);
    let second = cluster.run_job(job.clone());
    assert_eq!(second["seed"], first["seed"], "{second}");
    assert_eq!(results(&cluster, &second), computed);
    assert_eq!(
        finished(&cluster),
        3,
        "no executor ran a task of the second job"
    );
    for task in cluster.tasks(&second) {
        assert_eq!(task["memoized_from"]["job"], first["id"], "{task}");
    }
    // Another spec is another seed.
    job["inputs"] = json!([{"text": "a"}, {"text": "b"}, {"text": "d"}]);
    let other = cluster.run_job(job);
    assert_ne!(other["seed"], first["seed"]);
}

#[test]
fn two_identical_memoized_jobs_at_the_same_moment_both_end_with_the_same_bytes() {
    let cluster = DevCluster::start(2, 1);
    let probe = cluster.upload_wat(PROBE);
    let mut job = spec(&probe, &[], &["a", "b", "c"]);
    job["deterministic"] = json!(true);
    job["memoize"] = json!(true);
    let (one, two) = std::thread::scope(|scope| {
        let one = scope.spawn(|| cluster.run_job(job.clone()));
        let two = scope.spawn(|| cluster.run_job(job.clone()));
        (one.join().unwrap(), two.join().unwrap())
    });
    let bytes = results(&cluster, &one);
    assert_eq!(results(&cluster, &two), bytes);
    // Each task was computed, or taken from the other job's (never from itself).
    for (job, other) in [(&one, &two), (&two, &one)] {
        for task in cluster.tasks(job) {
            if let Some(from) = task.get("memoized_from") {
                assert_eq!(from["job"], other["id"], "{task}");
            }
        }
    }
    // Whichever computed first, a third job takes every result and runs nothing.
    let ran = finished(&cluster);
    let third = cluster.run_job(job);
    assert_eq!(results(&cluster, &third), bytes);
    assert_eq!(finished(&cluster), ran);
}

#[test]
fn an_attempt_held_to_less_memory_than_it_asked_records_what_it_ran_with() {
    let cluster = DevCluster::start_with(1, 1, &["--executor-arg=--max-memory-mb=200"]);
    let testkit = cluster.upload(&guests().testkit);
    let mut job = spec(&testkit, &["alloc", "100"], &[""]);
    job["resources"] = json!({"memory_mb": 512});
    job["deterministic"] = json!(true);
    let job = cluster.run_job(job);
    assert_eq!(job["state"], "succeeded", "{job}");
    let task = &cluster.tasks(&job)[0];
    assert_eq!(task["history"][0]["memory_mb"], 200, "{task}");
    let id = job["id"].as_str().unwrap();
    let (status, bundle) = cluster.get(&format!("/v1/jobs/{id}/tasks/0/replay"));
    assert_eq!(status, 200, "{bundle}");
    assert_eq!(bundle["memory_mb"], 200, "{bundle}");
}

/// A fully memoized job accepted just before a driver crash: its record was synced to
/// the journal, nothing else of it committed (commits 10 s apart). After the restart
/// its tasks are still the memoized copies: succeeded, `memoized_from`, no attempt,
/// and no executor runs them.
#[test]
fn a_memoized_task_is_still_the_memoized_copy_after_a_driver_crash() {
    // The most the flag allows: the second job's record stays in the journal alone.
    let slow_commits = ["--commit-interval-ms", "10000"];
    let cluster = DevCluster::start_with(2, 1, &slow_commits);
    let probe = cluster.upload_wat(PROBE);
    let mut job = spec(&probe, &[], &["a", "b", "c"]);
    job["deterministic"] = json!(true);
    job["seed"] = json!(11);
    job["memoize"] = json!(true);
    let first = cluster.run_job(job.clone());
    let computed = results(&cluster, &first);
    assert_eq!(finished(&cluster), 3);
    // Accepted (synced) and answered; the crash comes before any commit interval.
    let second = cluster.submit_view(&job, "");
    let id = second["id"].as_str().unwrap().to_owned();

    let cluster = cluster.crash_and_restart_with(2, 1, &slow_commits);
    let second = cluster.wait_for_job(&id, std::time::Duration::from_secs(60));
    assert_eq!(results(&cluster, &second), computed);
    for (index, task) in cluster.tasks(&second).iter().enumerate() {
        assert_eq!(task["memoized_from"]["job"], first["id"], "{task}");
        assert_eq!(task["memoized_from"]["task"], index);
        assert_eq!(task["attempts"], 0, "{task}");
        assert_eq!(task["state"], "succeeded");
    }
    assert_eq!(finished(&cluster), 0, "no executor ran a task of it");
}
