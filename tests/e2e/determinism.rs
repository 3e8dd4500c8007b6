//! End to end on a real `flint dev`: a deterministic job's guests read a virtual clock
//! and seeded random bytes, so two runs of a task write the same bytes; the same job
//! without the flag does not. Each attempt records the digests of what it ran.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common;
use crate::common::{DevCluster, guests, spec};

/// The probe: clocks, random bytes and a 2 s sleep, written to stdout (see the file).
const PROBE: &str = include_str!("../wat/clocks_and_random.wat");

fn results(cluster: &DevCluster, job: &Value) -> Vec<Vec<u8>> {
    assert_eq!(job["state"], "succeeded", "{job}");
    (0..job["tasks"].as_u64().unwrap())
        .map(|i| cluster.result(job, i))
        .collect()
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

#[test]
fn two_deterministic_runs_read_the_same_clocks_and_random_bytes_and_plain_runs_do_not() {
    let cluster = DevCluster::start(2, 1);
    let probe = cluster.upload_wat(PROBE);
    let mut job = spec(&probe, &[], &["a", "b"]);
    let plain = [
        results(&cluster, &cluster.run_job(job.clone())),
        results(&cluster, &cluster.run_job(job.clone())),
    ];
    assert_ne!(
        plain[0][0], plain[1][0],
        "the host's clock and entropy differ per run"
    );

    job["deterministic"] = json!(true);
    job["seed"] = json!(42);
    let first = cluster.run_job(job.clone());
    assert_eq!(first["seed"], 42);
    let runs = [
        results(&cluster, &first),
        results(&cluster, &cluster.run_job(job.clone())),
    ];
    assert_eq!(
        runs[0], runs[1],
        "the same bytes, task by task, whichever executor"
    );
    let task0 = &runs[0][0];
    assert_eq!(
        u64_at(task0, 0),
        946_684_800_000_000_000,
        "2000-01-01T00:00:00Z"
    );
    assert_eq!(u64_at(task0, 8), 0);
    assert_eq!(
        u64_at(task0, 32),
        2_000_000_000,
        "moved by the guest's 2 s sleep"
    );
    assert_ne!(
        runs[0][0][16..32],
        runs[0][1][16..32],
        "each task its own stream"
    );

    // Another seed, other random bytes; no seed, one drawn and shown, which replays.
    job["seed"] = json!(43);
    assert_ne!(
        results(&cluster, &cluster.run_job(job.clone()))[0][16..32],
        task0[16..32]
    );
    job.as_object_mut().unwrap().remove("seed");
    let drawn = cluster.run_job(job.clone());
    let seed = drawn["seed"].as_u64().expect("a drawn seed is recorded");
    job["seed"] = json!(seed);
    assert_eq!(
        results(&cluster, &cluster.run_job(job)),
        results(&cluster, &drawn)
    );
}

#[test]
fn a_deterministic_guest_is_not_told_its_job_or_attempt_and_its_inputs_are_pinned() {
    let cluster = DevCluster::start(1, 1);
    let testkit = cluster.upload(&guests().testkit);
    let file = cluster.upload_file(b"stop words".to_vec());
    let mut job = spec(&testkit, &["env"], &["some input"]);
    job["deterministic"] = json!(true);
    job["files"] = json!({"words.txt": file});
    let done = cluster.run_job(job);
    let report = String::from_utf8(results(&cluster, &done).remove(0)).unwrap();
    assert!(!report.contains("FLINT_JOB_ID"), "{report}");
    assert!(!report.contains("FLINT_ATTEMPT"), "{report}");
    assert!(report.contains("FLINT_TASK_INDEX=0"), "{report}");

    let task = &cluster.tasks(&done)[0];
    let pins = &task["history"][0]["pins"];
    assert_eq!(pins["module"], testkit.as_str(), "{task}");
    assert_eq!(pins["files"]["words.txt"], file.as_str());
    let input = format!("sha256:{}", sha256_hex(b"some input"));
    assert_eq!(pins["input"], input.as_str());

    // A plain job records no pins; a seed without the flag is refused.
    let plain = cluster.run_job(spec(&testkit, &["echo"], &["x"]));
    assert!(cluster.tasks(&plain)[0]["history"][0].get("pins").is_none());
    let mut seeded = spec(&testkit, &["echo"], &["x"]);
    seeded["seed"] = json!(1);
    let (status, body) = cluster.post_raw("/v1/jobs", seeded.to_string());
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("deterministic")
    );
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// Runs the testkit's `facts` (what it can read of its host but file bytes) as a
/// deterministic job over three files: the result, and the executor it ran on.
fn facts(cluster: &DevCluster, module: &str, files: &Value) -> (Value, Vec<u8>, String) {
    let mut job = spec(module, &["facts"], &[]);
    job["deterministic"] = json!(true);
    job["seed"] = json!(7);
    job["files"] = files.clone();
    // Job and task variables with a name in common: the task's wins, once.
    job["env"] = json!({"Z": "job", "A": "job"});
    job.as_object_mut().unwrap().remove("inputs");
    job["tasks"] = json!([{"env": {"A": "task", "M": "task"}}]);
    let done = cluster.run_job(job);
    let result = results(cluster, &done).remove(0);
    let executor = cluster.tasks(&done)[0]["executor"]
        .as_str()
        .unwrap()
        .to_owned();
    (done, result, executor)
}

#[test]
fn a_deterministic_guest_reads_the_same_files_on_two_executors_and_in_replay_p1_and_p2() {
    let cluster = DevCluster::start(1, 1);
    let modules = [
        cluster.upload(&guests().testkit),
        cluster.upload(&guests().testkit_component),
    ];
    // Uploaded in an order that is not the names' order.
    let mut files = json!({});
    for (name, bytes) in [("b.txt", "bee"), ("c.txt", "sea!"), ("a.txt", "a")] {
        files[name] = json!(cluster.upload_file(bytes.as_bytes().to_vec()));
    }
    let first: Vec<_> = modules.iter().map(|m| facts(&cluster, m, &files)).collect();

    // Another executor, with its own copy of the files (other inodes, other times).
    let (status, body) =
        cluster.post_raw(&format!("/v1/executors/{}/decommission", first[0].2), "");
    assert_eq!(status, 202, "{body}");
    common::wait_until(Duration::from_secs(30), "a replacement", || {
        cluster
            .executors()
            .iter()
            .any(|e| e["state"] == "alive" && e["id"] != first[0].2.as_str())
    });
    common::wait_until(Duration::from_secs(30), "the old one gone", || {
        cluster.alive_executors() == 1
    });
    // Every run that differs from the first, named, so that a failure shows them all.
    let mut differs = Vec::new();
    for ((module, abi), (job, report, executor)) in modules.iter().zip(["p1", "p2"]).zip(&first) {
        let (_, again, elsewhere) = facts(&cluster, module, &files);
        assert_ne!(&elsewhere, executor);
        if &again != report {
            differs.push(format!(
                "{abi} on another executor:\n{}",
                diff(report, &again)
            ));
        }
        let out = cluster.cli(&["replay", job["id"].as_str().unwrap(), "0"]);
        if out.stdout != *report || out.status.code() != Some(0) {
            let stderr = String::from_utf8_lossy(&out.stderr);
            differs.push(format!(
                "{abi} in flint replay ({stderr}):\n{}",
                diff(report, &out.stdout)
            ));
        }
    }
    assert!(differs.is_empty(), "{}", differs.join("\n"));

    for (_, report, _) in &first {
        let text = String::from_utf8_lossy(report);
        // What it read: fixed times and links, inodes of the paths, names in order.
        assert!(text.contains("preopen fd=3 name=\"/files\""), "{text}");
        let stats = text.lines().filter(|l| l.contains(" dev=")).count();
        let fixed = "nlink=1 ";
        let times = "atim=946684800000000000 mtim=946684800000000000 ctim=946684800000000000";
        let fixed_lines = (text.lines())
            .filter(|l| l.contains(fixed) && l.ends_with(times))
            .count();
        assert_eq!((stats, fixed_lines), (8, 8), "{text}");
        let names: Vec<&str> = (text.lines())
            .filter_map(|l| l.strip_prefix("  entry "))
            .map(|l| l.rsplit_once(" name=").unwrap().1)
            .collect();
        assert_eq!(
            names,
            ["\".\"", "\"..\"", "\"a.txt\"", "\"b.txt\"", "\"c.txt\""],
            "{text}"
        );
        let env: Vec<&str> = text.lines().filter(|l| l.starts_with("env ")).collect();
        assert_eq!(
            env,
            [
                "env \"A=task\"",
                "env \"FLINT_TASK_COUNT=1\"",
                "env \"FLINT_TASK_INDEX=0\"",
                "env \"M=task\"",
                "env \"Z=job\""
            ],
            "{text}"
        );
    }
}

/// The lines of `b` that are not those of `a` at the same place.
fn diff(a: &[u8], b: &[u8]) -> String {
    let (a, b) = (String::from_utf8_lossy(a), String::from_utf8_lossy(b));
    (a.lines().zip(b.lines()))
        .filter(|(x, y)| x != y)
        .map(|(x, y)| format!("  - {x}\n  + {y}"))
        .collect::<Vec<_>>()
        .join("\n")
}
