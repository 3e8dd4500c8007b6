//! End to end: large results through the block store, chained jobs reading earlier
//! results, and job files fetched by URL once per executor (counted at a real HTTP
//! server on loopback).

use serde_json::{Value, json};

use crate::common::{DevCluster, Origin, Reply, guests, peak_rss, sha256_hex, signal};

#[test]
fn large_results_come_back_byte_exact_and_outlive_their_executors() {
    const MIB: usize = 1024 * 1024;
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    let size = 64 * MIB;
    let job = cluster.run_job(json!({
        "module": module,
        "args": ["print", size.to_string()],
        "inputs": vec![json!({"text": ""}); 8],
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    let executor_pids: Vec<u32> = cluster
        .executors()
        .iter()
        .map(|e| e["pid"].as_u64().unwrap() as u32)
        .collect();
    let executors_peak: Vec<u64> = executor_pids.iter().map(|&p| peak_rss(p)).collect();
    // The results stay readable with every executor that produced them gone.
    for pid in executor_pids {
        signal(pid, libc::SIGKILL);
    }
    let tasks = cluster.tasks(&job);
    for (index, task) in tasks.iter().enumerate() {
        let bytes = cluster.result(&job, index as u64);
        assert_eq!(bytes.len(), size);
        assert_eq!(task["result"]["size"], size as u64);
        assert_eq!(task["result"]["sha256"], sha256_hex(&bytes), "task {index}");
        assert!(
            bytes.iter().all(|&b| b == bytes[0]),
            "print writes one byte value"
        );
    }
    // 512 MiB of results went through; no process held them.
    let driver_peak = peak_rss(cluster.pid());
    for peak in executors_peak.iter().chain([&driver_peak]) {
        assert!(*peak < 200 * MIB as u64, "peak RSS {peak} bytes");
    }
}

#[test]
fn a_chained_job_reads_earlier_results_inline_and_from_blocks() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    let first = cluster.run_job(json!({
        "module": module,
        "tasks": [
            {"args": ["print", (3 * 1024 * 1024).to_string()]},
            {"args": ["echo"], "input": {"text": "small"}},
        ],
    }));
    assert_eq!(first["state"], "succeeded", "{first}");
    let id = first["id"].as_str().unwrap();
    let second = cluster.run_job(json!({
        "module": module,
        "args": ["echo"],
        "inputs": [{"result": {"job": id, "task": 0}}, {"result": {"job": id, "task": 1}}],
    }));
    assert_eq!(second["state"], "succeeded", "{second}");
    assert_eq!(cluster.result(&second, 0), cluster.result(&first, 0));
    assert_eq!(cluster.result(&second, 1), b"small");

    // A result that does not exist yet is a clear 422.
    let (status, body) = cluster.post_raw(
        "/v1/jobs",
        json!({"module": module, "inputs": [{"result": {"job": id, "task": 9}}]}).to_string(),
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["kind"], "unknown_result", "{body}");
}

#[test]
fn a_job_over_its_result_cap_fails_as_result_limit() {
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    let job = cluster.run_job(json!({
        "module": module,
        "args": ["print", "2000000"],
        "inputs": vec![json!({"text": ""}); 3],
        "max_result_bytes": 5_000_000,
    }));
    assert_eq!(job["state"], "failed", "{job}");
    let failed: Vec<Value> = cluster
        .tasks(&job)
        .into_iter()
        .filter(|t| t["state"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["error"]["kind"], "result_limit", "{failed:?}");
    assert!(
        failed[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_result_bytes (5000000 bytes)"),
        "{failed:?}"
    );
}

#[test]
fn a_file_by_url_is_downloaded_once_per_executor_until_its_timestamp_changes() {
    let mut data = vec![b'.'; 50 * 1000 * 1000];
    data.extend_from_slice(b"\nthe needle\n");
    let server = Origin::start(&[("/big.txt", Reply::Body(data.clone()))]);
    let cluster = DevCluster::start_with(2, 1, &["--fetch-allow", &server.origin]);
    // No-op tasks: a job's files are fetched whether or not its tasks read them, and
    // one grep over the 50 MB shows the bytes are the right ones.
    let module = cluster.upload(&guests().testkit);
    let grep = cluster.upload(&guests().grep);
    let url = format!("{}/big.txt", server.origin);
    let job = |file: Value| {
        let job = cluster.run_job(json!({
            "module": module,
            "files": {"big.txt": file},
            "args": ["noop"],
            "inputs": vec![json!({"text": ""}); 100],
        }));
        assert_eq!(job["state"], "succeeded", "{job}");
        job
    };
    let sha = sha256_hex(&data);
    let first = job(json!({"url": url, "sha256": sha}));
    let ran_on: std::collections::BTreeSet<String> = cluster
        .tasks(&first)
        .iter()
        .map(|t| t["executor"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(server.all_hits(), ran_on.len(), "one download per executor");
    // Same URL, same timestamp: no download at all.
    job(json!({"url": url}));
    assert_eq!(server.all_hits(), ran_on.len());
    // A newer timestamp: fetched again, once per executor that runs the job.
    let newer = json!({"url": url, "timestamp_ms": 4_000_000_000_000u64});
    let third = job(newer);
    let ran_on_third: std::collections::BTreeSet<String> = cluster
        .tasks(&third)
        .iter()
        .map(|t| t["executor"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(server.all_hits(), ran_on.len() + ran_on_third.len());
    let hits = server.all_hits();
    let found = cluster.run_job(json!({
        "module": grep,
        "files": {"big.txt": {"url": url}},
        "args": ["needle"],
        "inputs": [{"text": ""}],
    }));
    assert_eq!(found["state"], "succeeded", "{found}");
    assert_eq!(cluster.result(&found, 0), b"big.txt:2:the needle\n");
    assert_eq!(server.all_hits(), hits, "served from the executors' caches");

    // A wrong digest is a fetch error naming both digests; nothing is cached under it.
    let wrong = "0".repeat(64);
    let bad = cluster.run_job(json!({
        "module": module,
        "files": {"big.txt": {"url": url, "sha256": wrong, "timestamp_ms": 4_000_000_000_001u64}},
        "args": ["needle"],
        "inputs": [{"text": ""}],
        "max_failures": 1,
    }));
    assert_eq!(bad["state"], "failed", "{bad}");
    let task = &cluster.tasks(&bad)[0];
    assert_eq!(task["error"]["kind"], "fetch_error", "{task}");
    let message = task["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&wrong) && message.contains(&sha),
        "{message}"
    );
}

#[test]
fn urls_the_policy_refuses_are_never_requested() {
    let server = Origin::start(&[("/x", Reply::Body(b"secret".to_vec()))]);
    // No --fetch-allow: loopback is refused, before any connection.
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    for url in [
        format!("{}/x", server.origin),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.0.0.1/x".to_owned(),
    ] {
        let job = cluster.run_job(json!({
            "module": module,
            "args": ["echo"],
            "inputs": [{"url": url}],
            "max_failures": 1,
        }));
        assert_eq!(job["state"], "failed", "{job}");
        let task = &cluster.tasks(&job)[0];
        assert_eq!(task["error"]["kind"], "fetch_error", "{task}");
        assert!(
            task["error"]["message"]
                .as_str()
                .unwrap()
                .contains("refused"),
            "{task}"
        );
    }
    assert_eq!(server.all_hits(), 0);
}
