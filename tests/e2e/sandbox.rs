//! End to end: every row of RELIABILITY.md's "Untrusted guests" table against running
//! executors. Each hostile task ends in its named outcome, the executor processes survive
//! it (same pid, same registration), and a well-behaved job running beside it finishes
//! with the right results.

use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::common;
use crate::common::{DevCluster, guests, peak_rss, spec};

/// Runs `hostile` next to a wordcount job on a 2 x 1-core cluster; returns the hostile
/// job's only task after checking that the cluster came through unharmed.
fn run_beside_a_good_job(cluster: &DevCluster, hostile: Value) -> Value {
    let before = cluster.executors();
    let wordcount = cluster.upload(&guests().wordcount);
    let inputs = ["the quick brown fox", "jumps over the lazy dog", "the end"];
    let (status, good) = cluster.post_raw("/v1/jobs", spec(&wordcount, &[], &inputs).to_string());
    assert_eq!(status, 202, "{good}");
    let bad = cluster.run_job(hostile);
    let good = cluster
        .get(&format!(
            "/v1/jobs/{}?wait=60",
            good["id"].as_str().unwrap()
        ))
        .1;
    assert_eq!(good["state"], "succeeded", "{good}");
    let counts: Value = serde_json::from_slice(&cluster.result(&good, 1)).unwrap();
    assert_eq!(counts, json!({"dog":1,"jumps":1,"lazy":1,"over":1,"the":1}));
    let after = cluster.executors();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a["state"], "alive", "{a}");
        assert_eq!(
            (&a["pid"], &a["generation"]),
            (&b["pid"], &b["generation"]),
            "{a}"
        );
    }
    let tasks = cluster.tasks(&bad);
    assert_eq!(tasks.len(), 1);
    tasks[0].clone()
}

fn assert_failed_with(task: &Value, kind: &str, mentions: &str) {
    assert_eq!(task["state"], "failed", "{task}");
    assert_eq!(task["error"]["kind"], kind, "{task}");
    let message = task["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(mentions),
        "`{message}` should mention `{mentions}`"
    );
    assert_eq!(
        task["attempts"], 1,
        "a guest's own failure is not retried: {task}"
    );
}

fn with_resources(mut job: Value, resources: Value) -> Value {
    job["resources"] = resources;
    job
}

#[test]
fn an_infinite_loop_times_out() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload_wat(
        r#"(module (memory (export "memory") 1)
                   (func (export "_start") (loop $l (br $l))))"#,
    );
    let job = with_resources(spec(&module, &[], &[""]), json!({"timeout_ms": 500}));
    let task = run_beside_a_good_job(&cluster, job);
    assert_failed_with(&task, "timeout", "500 ms time limit");
}

#[test]
fn a_memory_growing_loop_hits_the_memory_limit() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    let job = with_resources(
        spec(&module, &["alloc", "512"], &[""]),
        json!({"memory_mb": 64}),
    );
    let task = run_beside_a_good_job(&cluster, job);
    assert_failed_with(&task, "memory_limit", "64 MiB memory limit");
}

#[test]
fn a_huge_initial_memory_hits_the_memory_limit() {
    let cluster = DevCluster::start(2, 1);
    // 30,000 pages of 64 KiB: 1.8 GiB before the first instruction.
    let module =
        cluster.upload_wat(r#"(module (memory (export "memory") 30000) (func (export "_start")))"#);
    let job = with_resources(spec(&module, &[], &[""]), json!({"memory_mb": 64}));
    let task = run_beside_a_good_job(&cluster, job);
    assert_failed_with(&task, "memory_limit", "64 MiB memory limit");
}

#[test]
fn unbounded_recursion_is_a_clean_stack_overflow() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload_wat(
        r#"(module (memory (export "memory") 1)
                   (func $f (call $f))
                   (func (export "_start") (call $f)))"#,
    );
    let task = run_beside_a_good_job(&cluster, spec(&module, &[], &[""]));
    assert_failed_with(&task, "stack_overflow", "stack overflow");
}

#[test]
fn a_stdout_flood_hits_the_output_limit() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    let job = with_resources(
        spec(&module, &["print", "1000000000"], &[""]),
        json!({"max_output_bytes": 1048576}),
    );
    let task = run_beside_a_good_job(&cluster, job);
    assert_failed_with(&task, "output_limit", "1048576 bytes output limit");
}

#[test]
fn a_result_over_its_cap_hits_the_output_limit_past_the_inline_size() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    // Past the 1 MiB inline size, so the cap is enforced while the result streams to
    // the block store; the attempt's partial block must not become a result.
    let cap = 3 * 1024 * 1024;
    let over = (cap + 1).to_string();
    let mut job = spec(&module, &["print", &over], &[""]);
    job["resources"] = serde_json::json!({ "max_output_bytes": cap });
    let task = run_beside_a_good_job(&cluster, job);
    assert_failed_with(&task, "output_limit", "3145728 bytes output limit");
    assert!(task["result"].is_null(), "{task}");
}

#[test]
fn a_stderr_flood_is_truncated_and_marked_and_the_task_succeeds() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    let job = spec(&module, &["eprint", "200000000"], &[""]);
    let task = run_beside_a_good_job(&cluster, job.clone());
    assert_eq!(task["state"], "succeeded", "{task}");
    let id = cluster.get("/v1/jobs").1["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, log) = cluster.get_bytes(&format!("/v1/jobs/{id}/tasks/0/log"));
    let marker = b"\n[flint: log truncated at 1048576 bytes]\n";
    assert_eq!(log.len(), 1024 * 1024 + marker.len());
    assert!(log.ends_with(marker));
    assert!(log[..1024 * 1024].iter().all(|&b| b == b'e'));
}

#[test]
fn an_unknown_import_fails_as_unknown_import() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload_wat(
        r#"(module (import "env" "launch_missiles" (func))
                   (memory (export "memory") 1)
                   (func (export "_start") (call 0)))"#,
    );
    let task = run_beside_a_good_job(&cluster, spec(&module, &[], &[""]));
    assert_failed_with(&task, "unknown_import", "launch_missiles");
}

#[test]
fn a_module_that_is_not_a_command_is_refused_at_upload() {
    let cluster = DevCluster::start(1, 1);
    let wasm = wat::parse_str(r#"(module (memory (export "memory") 1))"#).unwrap();
    let (status, body) = cluster.put_module_bytes(wasm);
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["kind"], "invalid_module", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("_start"),
        "{body}"
    );
}

/// A valid module that takes cranelift seconds to compile: functions of hundreds of
/// thousands of loads, multiplies and stores over thousands of live locals (each body
/// under the 7.6 MB a function may have).
fn slow_to_compile_wat() -> String {
    const FUNCTIONS: usize = 2;
    const LOCALS: usize = 3000;
    const OPS: usize = 300_000;
    let mut wat = String::from(r#"(module (memory (export "memory") 1)"#);
    for f in 0..FUNCTIONS {
        wat.push_str(&format!("(func $f{f} (local"));
        wat.push_str(&" i32".repeat(LOCALS));
        wat.push(')');
        for i in 0..OPS {
            let (a, b) = (i % LOCALS, (i * 7919 + 3 + f) % LOCALS);
            let (load, store) = ((b * 4) % 60_000, (a * 4) % 60_000);
            wat.push_str(&format!(
                "(local.set {a} (i32.mul (local.get {a}) (i32.load offset={load} (local.get {b}))))"
            ));
            if i % 3 == 0 {
                wat.push_str(&format!(
                    "(i32.store offset={store} (local.get {b}) (local.get {a}))"
                ));
            }
        }
        wat.push(')');
    }
    wat.push_str(r#"(func (export "_start") (call $f0) (call $f1)))"#);
    wat
}

#[test]
fn a_module_too_slow_to_compile_is_stopped_at_the_compile_limit() {
    let cluster = DevCluster::start_with(2, 1, &["--executor-arg=--compile-timeout-ms=1000"]);
    let module = cluster.upload_wat(&slow_to_compile_wat());
    let started = Instant::now();
    let task = run_beside_a_good_job(&cluster, spec(&module, &[], &[""]));
    assert_failed_with(&task, "compile_limit", "1000 ms limit");
    assert!(started.elapsed() < Duration::from_secs(30));
    // The executors' compilers are gone with the bound: nothing is left compiling.
    for executor in cluster.executors() {
        let pid = executor["pid"].as_u64().unwrap();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        assert!(
            children.trim().is_empty(),
            "{} still has children: {children}",
            executor["id"]
        );
    }
}

#[test]
fn host_paths_are_out_of_reach() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    for (command, path) in [
        ("read", "/etc/passwd"),
        ("read", "../../etc/passwd"),
        ("read", "/proc/self/environ"),
        ("write", "/tmp/flint-escape"),
    ] {
        let task = run_beside_a_good_job(&cluster, spec(&module, &[command, path], &[""]));
        assert_eq!(task["state"], "failed", "{command} {path}: {task}");
        assert_eq!(task["exit_code"], 1, "{command} {path}: {task}");
    }
    assert!(!std::path::Path::new("/tmp/flint-escape").exists());
}

#[test]
fn a_killed_spinning_task_reports_killed_quickly_and_frees_its_core() {
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    let (status, job) = cluster.post_raw("/v1/jobs", spec(&module, &["spin"], &[""]).to_string());
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    common::wait_until(Duration::from_secs(30), "the spin task to run", || {
        cluster.executors()[0]["running"] == 1
    });
    std::thread::sleep(Duration::from_millis(200));
    let killed_at = SystemTime::now();
    let (status, job) = cluster.post_raw(&format!("/v1/jobs/{id}/kill"), "");
    assert_eq!(status, 202, "{job}");
    assert_eq!(job["state"], "killed");
    let t0 = Instant::now();
    common::wait_until(Duration::from_secs(10), "the core to come back", || {
        cluster.executors()[0]["free_cores"] == 1
    });
    let core_back = t0.elapsed();
    let task = &cluster.tasks(&job)[0];
    assert_eq!(task["state"], "killed", "{task}");
    assert_eq!(task["error"]["kind"], "killed", "{task}");
    // The executor's own clock says when the guest stopped.
    let stopped = humantime::parse_rfc3339(task["finished_at"].as_str().unwrap()).unwrap();
    let latency = stopped.duration_since(killed_at).unwrap_or_default();
    assert!(
        latency < Duration::from_millis(100),
        "guest stopped {latency:?} after the kill"
    );
    assert!(
        core_back < Duration::from_secs(2),
        "core offered again after {core_back:?}"
    );
    // And the core is used again.
    let job = cluster.run_job(spec(&module, &["echo"], &["after"]));
    assert_eq!(cluster.result(&job, 0), b"after");
}

/// What an executor holds besides its tasks' linear memories: the runtime, the engine,
/// the compiler's peak while compiling the module, and the pooling allocator's
/// keep-resident pages. Documented in README.md ("Limits and defaults").
const EXECUTOR_OVERHEAD_BYTES: u64 = 64 << 20;

/// Grows memory one page at a time and dirties every 4 KiB of each new page, until the
/// limit stops it: the bomb that really makes an executor's memory resident.
const GROW_LOOP: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "_start")
    (local $base i32) (local $off i32)
    (loop $grow
      (local.set $base (i32.mul (memory.grow (i32.const 1)) (i32.const 65536)))
      (local.set $off (i32.const 0))
      (loop $touch
        (i32.store (i32.add (local.get $base) (local.get $off)) (i32.const 1))
        (local.set $off (i32.add (local.get $off) (i32.const 4096)))
        (br_if $touch (i32.lt_u (local.get $off) (i32.const 65536))))
      (br $grow))))"#;

#[test]
fn memory_bombs_keep_executor_rss_under_cores_times_limit_plus_overhead() {
    // No locality wait and no launches ahead: the bombs must fill both executors' cores,
    // not queue on the first one to have compiled the module.
    let cluster = DevCluster::start_with(2, 2, &["--locality-wait-ms", "0", "--launch-ahead", "0"]);
    let module = cluster.upload_wat(GROW_LOOP);
    // Separate jobs, so that one bomb failing does not kill the others: all four cores
    // hold a full 64 MiB at once, twice over.
    let ids: Vec<String> = (0..8)
        .map(|_| {
            let job = with_resources(spec(&module, &[], &[""]), json!({"memory_mb": 64}));
            let (status, job) = cluster.post_raw("/v1/jobs", job.to_string());
            assert_eq!(status, 202, "{job}");
            job["id"].as_str().unwrap().to_owned()
        })
        .collect();
    for id in ids {
        let job = cluster.get(&format!("/v1/jobs/{id}?wait=60")).1;
        let task = &cluster.tasks(&job)[0];
        assert_failed_with(task, "memory_limit", "64 MiB memory limit");
    }
    let limit = 2 * (64 << 20) + EXECUTOR_OVERHEAD_BYTES;
    for executor in cluster.executors() {
        let rss = peak_rss(executor["pid"].as_u64().unwrap() as u32);
        eprintln!("{}: peak RSS {} MiB", executor["id"], rss >> 20);
        assert!(
            rss < limit,
            "{} peaked at {} MiB",
            executor["id"],
            rss >> 20
        );
        assert!(
            rss > 64 << 20,
            "the bombs did fill memory: {} MiB",
            rss >> 20
        );
    }
}

#[test]
fn a_fuel_budget_is_a_deterministic_limit_on_metering_executors() {
    let cluster = DevCluster::start_with(2, 1, &["--executor-arg=--fuel"]);
    let module = cluster.upload(&guests().testkit);
    let job = with_resources(spec(&module, &["spin"], &[""]), json!({"fuel": 1_000_000}));
    let task = run_beside_a_good_job(&cluster, job);
    assert_failed_with(&task, "fuel_limit", "fuel budget of 1000000");
    let job = cluster.run_job(with_resources(
        spec(&module, &["echo"], &["within budget"]),
        json!({"fuel": 10_000_000}),
    ));
    assert_eq!(cluster.result(&job, 0), b"within budget");

    // Without metering executors, a budget cannot be honoured: refused, not queued forever.
    let plain = DevCluster::start(1, 1);
    let module = plain.upload(&guests().testkit);
    let job = with_resources(spec(&module, &["noop"], &[""]), json!({"fuel": 1000}));
    let (status, body) = plain.post_raw("/v1/jobs", job.to_string());
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["kind"], "unschedulable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--fuel"),
        "{body}"
    );
}
