//! End to end: `flint replay` runs an attempt of a real `flint dev` job again with no
//! cluster (the driver only hands out the bundle and the bytes) and says whether it did
//! the same thing: a failed deterministic task fails again with the same error and the
//! same log, byte for byte; a plain one reads other clocks and says so.

use serde_json::{Value, json};

use crate::common::{DevCluster, guests, spec};

/// A p1 command that writes its clocks and 16 random bytes to stderr, then exits 3.
const FAILING_PROBE: &str = r#"(module
  (import "wasi_snapshot_preview1" "clock_time_get"
    (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (drop (call $clock (i32.const 0) (i64.const 1) (i32.const 1024)))
    (drop (call $clock (i32.const 1) (i64.const 1) (i32.const 1032)))
    (drop (call $random (i32.const 1040) (i32.const 16)))
    (i32.store (i32.const 200) (i32.const 1024))
    (i32.store (i32.const 204) (i32.const 32))
    (drop (call $write (i32.const 2) (i32.const 200) (i32.const 1) (i32.const 208)))
    (call $exit (i32.const 3))))"#;

/// `flint replay` with `args` against the cluster: (exit code, stdout, stderr).
fn replay(cluster: &DevCluster, args: &[&str]) -> (i32, Vec<u8>, String) {
    let (code, stdout, stderr) = replay_bytes(cluster, args);
    (code, stdout, String::from_utf8_lossy(&stderr).into_owned())
}

fn replay_bytes(cluster: &DevCluster, args: &[&str]) -> (i32, Vec<u8>, Vec<u8>) {
    let out = cluster.cli(&[&["replay"], args].concat());
    (out.status.code().unwrap_or(-1), out.stdout, out.stderr)
}

fn id(job: &Value) -> &str {
    job["id"].as_str().unwrap()
}

#[test]
fn a_failed_deterministic_task_fails_again_locally_with_the_same_error_and_log() {
    let cluster = DevCluster::start(1, 1);
    let probe = cluster.upload_wat(FAILING_PROBE);
    let mut job = spec(&probe, &[], &["in"]);
    job["deterministic"] = json!(true);
    let failed = cluster.run_job(job);
    assert_eq!(failed["state"], "failed", "{failed}");
    let log = cluster
        .get_bytes(&format!("/v1/jobs/{}/tasks/0/log", id(&failed)))
        .1;
    assert_eq!(log.len(), 32);

    let (code, stdout, raw) = replay_bytes(&cluster, &[id(&failed), "0"]);
    let stderr = String::from_utf8_lossy(&raw);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.is_empty());
    // The guest's own stderr first, byte for byte, then the verdict.
    assert_eq!(raw[..log.len()], log[..], "{stderr}");
    assert!(
        stderr.contains("failed: exit: exited with code 3"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the same failure and log as the recorded attempt"),
        "{stderr}"
    );

    // Without determinism the replay reads today's clock: a different log, said so.
    let plain = cluster.run_job(spec(&probe, &[], &["in"]));
    let (code, _, stderr) = replay(&cluster, &[id(&plain), "0"]);
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("not what the attempt did: its log was sha256:"),
        "{stderr}"
    );
}

#[test]
fn a_succeeded_task_with_files_replays_to_the_same_result_and_each_attempt_to_its_own_end() {
    let cluster = DevCluster::start(1, 1);
    let testkit = cluster.upload(&guests().testkit);
    let file = cluster.upload_file(b"0123456789".to_vec());
    let mut job = spec(&testkit, &["read", "/files/ten.txt"], &[""]);
    job["deterministic"] = json!(true);
    job["files"] = json!({"ten.txt": file});
    let done = cluster.run_job(job);
    assert_eq!(done["state"], "succeeded", "{done}");
    let (code, stdout, stderr) = replay(&cluster, &[id(&done), "0"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, cluster.result(&done, 0));
    assert!(
        stderr.contains("the same result as the recorded attempt"),
        "{stderr}"
    );

    // The bundle itself: what the attempt ran with.
    let bundle = cluster
        .get(&format!("/v1/jobs/{}/tasks/0/replay", id(&done)))
        .1;
    assert_eq!(bundle["module"]["sha256"], testkit.as_str(), "{bundle}");
    assert_eq!(bundle["files"]["ten.txt"]["sha256"], file.as_str());
    assert_eq!(bundle["args"], json!(["read", "/files/ten.txt"]));
    assert!(bundle["seed"].is_u64() && bundle["deterministic"] == true);

    // An escalated task: each attempt replays with its own budget.
    let mut big = spec(&testkit, &["alloc", "300"], &[""]);
    big["resources"] = json!({"memory_mb": 128});
    big["retry"] = json!({"escalate": {"memory": 2.0}});
    let big = cluster.run_job(big);
    assert_eq!(big["state"], "succeeded", "{big}");
    let (code, _, stderr) = replay(&cluster, &[id(&big), "0", "--attempt", "1"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("attempt 1: failed: memory_limit"),
        "{stderr}"
    );
    let (code, stdout, stderr) = replay(&cluster, &[id(&big), "0"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, b"314572800");
    let (status, body) = cluster.get(&format!("/v1/jobs/{}/tasks/0/replay?attempt=9", id(&big)));
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["kind"], "attempt_not_found");
}

#[test]
fn a_deleted_job_cannot_be_replayed_and_a_changed_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let allow = format!("file://{}", dir.display());
    let cluster = DevCluster::start_with(1, 1, &["--fetch-allow", &allow]);
    let testkit = cluster.upload(&guests().testkit);
    let done = cluster.run_job(spec(&testkit, &["echo"], &["x"]));
    let out = cluster.cli(&["delete", id(&done)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, _, stderr) = replay(&cluster, &[id(&done), "0"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no job"), "{stderr}");

    // A URL input whose bytes changed after the attempt ran: the replay refuses to run
    // other bytes than the attempt's.
    let path = dir.join("input.txt");
    std::fs::write(&path, "before").unwrap();
    let mut job = spec(&testkit, &["echo"], &[]);
    job["inputs"] = json!([{"url": format!("file://{}", path.display())}]);
    job["deterministic"] = json!(true);
    let done = cluster.run_job(job);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(cluster.result(&done, 0), b"before");
    std::fs::write(&path, "after!").unwrap();
    let (code, _, stderr) = replay(&cluster, &[id(&done), "0"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("has changed since the attempt ran"),
        "{stderr}"
    );
}
