//! End to end: a real `flint dev` (driver + executor processes) driven over HTTP.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common;
use crate::common::{DevCluster, guests, spec};

/// An independent word count to check the guest against: lowercase, split on anything
/// that is not alphanumeric.
fn expected_counts(text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for word in text
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        *counts.entry(word.to_owned()).or_insert(0) += 1;
    }
    counts
}

#[test]
fn wordcount_over_eight_inputs_returns_exact_counts() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().wordcount);
    let sample = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sample.txt"),
    )
    .unwrap();
    let mut inputs: Vec<String> = sample
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .take(5)
        .map(str::to_owned)
        .collect();
    inputs.push("Déjà vu: DÉJÀ VU, déjà-vu!".into());
    inputs.push(String::new());
    inputs.push("it's   the\tend\nof  the line, isn't it".into());
    assert_eq!(inputs.len(), 8);
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();

    let job = cluster.run_job(spec(&module, &[], &refs));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["counts"]["succeeded"], 8);
    for (index, input) in inputs.iter().enumerate() {
        let result = cluster.result(&job, index as u64);
        let counts: BTreeMap<String, u64> = serde_json::from_slice(&result).unwrap();
        assert_eq!(counts, expected_counts(input), "task {index}");
    }
    let tasks = cluster.tasks(&job);
    assert!(
        tasks
            .iter()
            .all(|t| t["attempts"] == 1 && t["result"]["size"].as_u64().unwrap() > 0)
    );
}

#[test]
fn failing_guests_fail_their_jobs_and_the_executors_survive() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    let before: Vec<Value> = cluster.executors();

    let job = cluster.run_job(spec(&module, &["exit", "3"], &[""]));
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["error"]["kind"], "task_failed");
    assert!(
        job["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exited with code 3"),
        "{job}"
    );
    let task = &cluster.tasks(&job)[0];
    assert_eq!(task["state"], "failed");
    assert_eq!(task["exit_code"], 3);
    assert_eq!(task["error"]["kind"], "exit");
    assert_eq!(task["attempts"], 1, "a guest's own exit is not retried");
    let id = job["id"].as_str().unwrap();
    let (_, log) = cluster.get_bytes(&format!("/v1/jobs/{id}/tasks/0/log"));
    assert_eq!(String::from_utf8_lossy(&log).trim(), "exiting with 3");

    let job = cluster.run_job(spec(&module, &["panic"], &[""]));
    assert_eq!(job["state"], "failed", "{job}");
    let task = &cluster.tasks(&job)[0];
    assert_eq!(task["error"]["kind"], "trap", "{task}");
    assert!(
        task["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unreachable"),
        "{task}"
    );
    assert_eq!(task["exit_code"], Value::Null);

    // Both executors are the same processes as before and still run work.
    let job = cluster.run_job(spec(&module, &["echo"], &["a", "b", "c", "d"]));
    assert_eq!(job["state"], "succeeded", "{job}");
    for (i, want) in ["a", "b", "c", "d"].iter().enumerate() {
        assert_eq!(cluster.result(&job, i as u64), want.as_bytes());
    }
    let after = cluster.executors();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a["state"], "alive");
        assert_eq!((&a["pid"], &a["generation"]), (&b["pid"], &b["generation"]));
    }
    // Their heartbeats report the compiled-module cache at work: compiled once per
    // executor, then served from memory.
    common::wait_until(
        Duration::from_secs(10),
        "cache figures in heartbeats",
        || {
            let executors = cluster.executors();
            let sum = |key: &str| {
                executors
                    .iter()
                    .map(|e| e[key].as_u64().unwrap())
                    .sum::<u64>()
            };
            sum("modules_compiled") >= 1 && sum("module_cache_hits") >= 1
        },
    );
    let compiled: Vec<u64> = cluster
        .executors()
        .iter()
        .map(|e| e["modules_compiled"].as_u64().unwrap())
        .collect();
    assert!(
        compiled.iter().all(|&n| n <= 1),
        "one module, compiled at most once each: {compiled:?}"
    );
}

#[test]
fn tasks_needing_two_cores_never_share_a_two_core_executor() {
    let cluster = DevCluster::start(2, 2);
    let module = cluster.upload(&guests().testkit);
    let job = cluster.run_job(json!({
        "module": module,
        "args": ["sleep", "150"],
        "inputs": vec![json!({"text": ""}); 8],
        "resources": {"cores": 2},
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    let tasks = cluster.tasks(&job);
    assert_eq!(tasks.len(), 8);

    let mut by_executor: BTreeMap<String, Vec<(std::time::SystemTime, std::time::SystemTime)>> =
        BTreeMap::new();
    for task in &tasks {
        assert_eq!(task["state"], "succeeded", "{task}");
        let time = |key: &str| humantime::parse_rfc3339(task[key].as_str().unwrap()).unwrap();
        by_executor
            .entry(task["executor"].as_str().unwrap().to_owned())
            .or_default()
            .push((time("started_at"), time("finished_at")));
    }
    assert_eq!(
        by_executor.len(),
        2,
        "both executors took tasks: {by_executor:?}"
    );
    for (executor, mut spans) in by_executor {
        spans.sort();
        for pair in spans.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "two 2-core tasks overlapped on {executor}: {pair:?}"
            );
        }
        for (start, end) in spans {
            assert!(end.duration_since(start).unwrap() >= Duration::from_millis(150));
        }
    }
    // All cores are free again once the job is over.
    for executor in cluster.executors() {
        assert_eq!(executor["free_cores"], executor["cores"], "{executor}");
    }
}

#[test]
fn task_env_and_args_follow_the_guest_abi() {
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    // The FLINT_* variables are the executor's to set: a job naming one is refused, not
    // silently overruled.
    let (status, body) = cluster.post_raw(
        "/v1/jobs",
        json!({
            "module": module,
            "env": {"FLINT_TASK_INDEX": "forged"},
            "tasks": [{}],
        })
        .to_string(),
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["kind"], "invalid_spec", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("FLINT_"),
        "{body}"
    );
    let job = cluster.run_job(json!({
        "name": "abi",
        "module": module,
        "args": ["env", "job-arg"],
        "tasks": [{"args": ["task-arg"]}, {"args": []}],
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap();
    let out = String::from_utf8(cluster.result(&job, 0)).unwrap();
    assert_eq!(
        out,
        format!(
            "FLINT_ATTEMPT=1\nFLINT_JOB_ID={id}\nFLINT_TASK_COUNT=2\nFLINT_TASK_INDEX=0\nARGS=env job-arg task-arg\n"
        )
    );
    let out = String::from_utf8(cluster.result(&job, 1)).unwrap();
    assert!(
        out.contains("FLINT_TASK_INDEX=1\n") && out.ends_with("ARGS=env job-arg\n"),
        "{out}"
    );
    // A task's variable is given instead of the job's of the same name, not after it
    // (a guest's getenv takes the first): the environ holds one `A`, the task's.
    let job = cluster.run_job(json!({
        "module": module,
        "args": ["facts"],
        "env": {"A": "job", "B": "job"},
        "tasks": [{"env": {"A": "task"}}],
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    let facts = String::from_utf8(cluster.result(&job, 0)).unwrap();
    let env: Vec<&str> = facts.lines().filter(|l| l.starts_with("env ")).collect();
    assert!(env.contains(&"env \"A=task\""), "{facts}");
    assert!(env.contains(&"env \"B=job\""), "{facts}");
    assert!(!env.contains(&"env \"A=job\""), "{facts}");
}

#[test]
fn a_spinning_guest_neither_stalls_heartbeats_nor_outlives_its_deadline() {
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    let mut spin = spec(&module, &["spin"], &[""]);
    spin["resources"] = json!({"timeout_ms": 3000});
    let (status, job) = cluster.post_raw("/v1/jobs", spin.to_string());
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    // While the only task thread spins, the executor's connection keeps beating.
    let mut checked = 0;
    while cluster.get(&format!("/v1/jobs/{id}")).1["state"] != "failed" {
        let executor = &cluster.executors()[0];
        if executor["running"] == 1 {
            let age = executor["last_heartbeat_ms"].as_u64().unwrap();
            assert!(age < 2500, "heartbeat is {age} ms old while a guest spins");
            checked += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        checked >= 10,
        "observed the spinning task only {checked} times"
    );
    let job = cluster.get(&format!("/v1/jobs/{id}")).1;
    let task = &cluster.tasks(&job)[0];
    assert_eq!(task["error"]["kind"], "timeout", "{task}");
    assert!(
        task["error"]["message"]
            .as_str()
            .unwrap()
            .contains("3000 ms"),
        "{task}"
    );
}

#[test]
fn in_fair_mode_a_small_job_is_not_stuck_behind_a_big_one() {
    // How many of the big job's tasks started after the small job had ended. Counting the
    // big job's successes when the small one ends raced with the big job's last end (on a
    // loaded machine its report came a moment after the small job's); a start time on the
    // executor's clock does not move.
    let run = |mode: &str| {
        let cluster = DevCluster::start_with(2, 1, &["--scheduling-mode", mode]);
        let module = cluster.upload(&guests().testkit);
        let big_inputs: Vec<String> = (0..60).map(|i| format!("b{i}")).collect();
        let big_refs: Vec<&str> = big_inputs.iter().map(String::as_str).collect();
        let (status, big) = cluster.post_raw(
            "/v1/jobs",
            spec(&module, &["sleep", "100"], &big_refs).to_string(),
        );
        assert_eq!(status, 202, "{big}");
        let small = cluster.run_job(spec(&module, &["sleep", "100"], &["s0", "s1"]));
        assert_eq!(small["state"], "succeeded", "{small}");
        let big = cluster.wait_for_job(big["id"].as_str().unwrap(), Duration::from_secs(60));
        assert_eq!(big["state"], "succeeded", "{big}");
        let small_end = cluster
            .spans(small["id"].as_str().unwrap())
            .iter()
            .filter_map(|s| s.1)
            .max()
            .unwrap();
        let big_spans = cluster.spans(big["id"].as_str().unwrap());
        assert_eq!(big_spans.len(), 60, "one attempt a task");
        big_spans.iter().filter(|s| s.0 > small_end).count()
    };
    // 60 tasks of 100 ms on two cores take 3 s; the small job's two take 0.1 s of them.
    let fair = run("fair");
    assert!(
        fair > 20,
        "only {fair} of the big job's 60 tasks started after the small job ended"
    );
    let fifo = run("fifo");
    assert_eq!(
        fifo, 0,
        "FIFO: the small job ran before the big one's tasks started"
    );
}

/// `GET /v1/jobs/{id}/results` read back into (index, result) frames.
fn frames(body: &[u8]) -> Vec<(u32, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        assert!(rest.len() >= 13, "a cut frame header: {} bytes", rest.len());
        let index = u32::from_be_bytes(rest[..4].try_into().unwrap());
        let present = rest[4];
        let len = u64::from_be_bytes(rest[5..13].try_into().unwrap()) as usize;
        rest = &rest[13..];
        match present {
            1 => {
                out.push((index, Some(rest[..len].to_vec())));
                rest = &rest[len..];
            }
            0 => {
                assert_eq!(len, 0);
                out.push((index, None));
            }
            other => panic!("frame of task {index}: presence byte {other}"),
        }
    }
    out
}

#[test]
fn every_result_comes_in_one_response_in_task_order_inline_and_block_alike() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    // Task 1's result is past the inline limit (1 MiB): it lives in the block store.
    let big = 3 * 1024 * 1024 / 2;
    let tasks = json!([
        {"input": {"text": "first"}, "args": ["echo"]},
        {"input": {"text": ""}, "args": ["print", big.to_string()]},
        {"input": {"text": ""}, "args": ["noop"]},
        {"input": {"text": "last"}, "args": ["echo"]},
    ]);
    let job = cluster.run_job(json!({"module": module, "tasks": tasks}));
    assert_eq!(job["state"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap();
    let response = cluster
        .client
        .get(cluster.url(&format!("/v1/jobs/{id}/results")))
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/vnd.flint.results"
    );
    assert_eq!(
        response.headers()["flint-tasks"],
        "4",
        "the frame count ahead"
    );
    let got = frames(&response.bytes().unwrap());
    assert_eq!(
        got,
        vec![
            (0, Some(b"first".to_vec())),
            (1, Some(vec![b'x'; big])),
            (2, Some(Vec::new())),
            (3, Some(b"last".to_vec())),
        ]
    );

    // Inline results past one chunk (64 KiB) of the response: frames split across
    // chunks, none lost or reordered.
    let many = cluster.run_job(json!({"module": module, "args": ["print", "3000"],
        "inputs": vec![json!({"text": ""}); 60]}));
    assert_eq!(many["state"], "succeeded", "{many}");
    let (status, body) = cluster.get_bytes(&format!(
        "/v1/jobs/{}/results",
        many["id"].as_str().unwrap()
    ));
    assert_eq!(status, 200);
    let got = frames(&body);
    assert_eq!(got.len(), 60);
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, (index, r))| *index == i as u32 && r.as_deref() == Some(&[b'x'; 3000][..]))
    );

    // A failed job: its failed and killed tasks have frames without a result.
    let failing = cluster.run_job(json!({"module": module, "tasks": [
        {"input": {"text": "ok"}, "args": ["echo"]},
        {"input": {"text": ""}, "args": ["exit", "3"]},
    ], "max_failures": 1}));
    assert_eq!(failing["state"], "failed", "{failing}");
    let (status, body) = cluster.get_bytes(&format!(
        "/v1/jobs/{}/results",
        failing["id"].as_str().unwrap()
    ));
    assert_eq!(status, 200);
    let got = frames(&body);
    assert_eq!(got[1], (1, None));
    assert_eq!(got.len(), 2);

    // Not before the job has ended, and not for a job that is not there.
    let sleeping = cluster.submit(&spec(&module, &["sleep", "30000"], &["z"]));
    let (status, body) = cluster.get(&format!("/v1/jobs/{sleeping}/results"));
    assert_eq!(
        (status, &body["error"]["kind"]),
        (409, &json!("job_running")),
        "{body}"
    );
    let (status, _) = cluster.post_raw(&format!("/v1/jobs/{sleeping}/kill"), "");
    assert_eq!(status, 202);
    let (status, body) = cluster.get("/v1/jobs/job-none/results");
    assert_eq!(
        (status, &body["error"]["kind"]),
        (404, &json!("job_not_found")),
        "{body}"
    );
}

/// A job's attempts, every page read (`limit` at a time): (task, attempt, outcome).
fn timeline(cluster: &DevCluster, id: &str, limit: usize) -> Vec<(u64, u64, String)> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let (status, page) = cluster.get(&format!("/v1/jobs/{id}/timeline?limit={limit}{after}"));
        assert_eq!(status, 200, "{page}");
        for a in page["attempts"].as_array().unwrap() {
            let outcome = a["outcome"].as_str().unwrap_or("running").to_owned();
            out.push((
                a["task"].as_u64().unwrap(),
                a["attempt"].as_u64().unwrap(),
                outcome,
            ));
        }
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => return out,
        }
    }
}

/// The spans of a live job are not stored: after a restart its tasks that had ended are
/// shown from their task records, ahead of the attempts launched since (so that a page's
/// cursor stays valid while the job adds attempts), and the job keeps that timeline once
/// stored.
#[test]
fn a_timeline_across_a_driver_restart_shows_every_task_those_ended_before_first() {
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    let echo = json!({"input": {"text": "a"}, "args": ["echo"]});
    let sleep = json!({"input": {"text": ""}, "args": ["sleep", "2000"]});
    let id = cluster.submit(&json!({"module": module, "tasks": [echo, echo, sleep, sleep]}));
    // One core: tasks 0 and 1 have ended, a sleep runs (2 s) and is killed by the stop.
    // Which sleep: the executor queues launched tasks as their module and inputs are
    // ready, not always in index order, so under load task 2 may run before task 1.
    common::wait_until(
        Duration::from_secs(60),
        "tasks 0, 1 ended, a sleep running",
        || {
            let (_, tasks) = cluster.get(&format!("/v1/jobs/{id}/tasks"));
            let states: Vec<&str> = (tasks["items"].as_array().unwrap().iter())
                .map(|t| t["state"].as_str().unwrap())
                .collect();
            states[..2] == ["succeeded", "succeeded"] && states[2..].contains(&"running")
        },
    );
    let cluster = cluster.restart(1, 1);
    let job = cluster.wait_for_job(&id, Duration::from_secs(60));
    assert_eq!(job["state"], "succeeded", "{job}");
    let expected: Vec<(u64, u64, String)> = (0..4)
        .map(|task| (task, 1, "succeeded".to_owned()))
        .collect();
    assert_eq!(timeline(&cluster, &id, 100), expected);
    assert_eq!(timeline(&cluster, &id, 1), expected, "one attempt a page");
    // Stored with the job: the same once it is read back from the store.
    let cluster = cluster.restart(1, 1);
    assert_eq!(timeline(&cluster, &id, 3), expected);
}

#[test]
fn a_jobs_timeline_pages_through_every_attempt_and_the_cluster_history_samples_each_second() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    let job = cluster.run_job(spec(&module, &["echo"], &["a", "b", "c", "d", "e"]));
    assert_eq!(job["state"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let query = match &after {
            Some(a) => format!("?limit=2&after={a}"),
            None => "?limit=2".to_owned(),
        };
        let (status, page) = cluster.get(&format!("/v1/jobs/{id}/timeline{query}"));
        assert_eq!(status, 200, "{page}");
        pages += 1;
        assert!(page["attempts"].as_array().unwrap().len() <= 2);
        assert!(page["finished_us"].as_u64().unwrap() >= page["created_us"].as_u64().unwrap());
        for a in page["attempts"].as_array().unwrap() {
            assert_eq!(a["outcome"], "succeeded", "{a}");
            assert_eq!(a["attempt"], 1, "{a}");
            assert!(
                a["end_us"].as_u64().unwrap() >= a["start_us"].as_u64().unwrap(),
                "{a}"
            );
            assert!(a["executor"].as_str().unwrap().starts_with("exec-"), "{a}");
            seen.push(a["task"].as_u64().unwrap());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    seen.sort_unstable();
    assert_eq!((seen, pages), (vec![0, 1, 2, 3, 4], 3));
    let (status, body) = cluster.get(&format!("/v1/jobs/{id}/timeline?limit=0"));
    assert_eq!(
        (status, &body["error"]["kind"]),
        (400, &json!("bad_query")),
        "{body}"
    );
    let (status, body) = cluster.get("/v1/jobs/job-none/timeline");
    assert_eq!(
        (status, &body["error"]["kind"]),
        (404, &json!("job_not_found")),
        "{body}"
    );

    common::wait_until(
        Duration::from_secs(10),
        "two samples of the cluster",
        || {
            cluster.get("/v1/cluster/history").1["samples"]
                .as_array()
                .is_some_and(|s| s.len() >= 2)
        },
    );
    let (status, history) = cluster.get("/v1/cluster/history");
    assert_eq!(status, 200);
    assert_eq!(history["interval_ms"], 1000);
    let samples = history["samples"].as_array().unwrap();
    let last = samples.last().unwrap();
    assert_eq!(
        (&last["cores"], &last["executors"]),
        (&json!(2), &json!(2)),
        "{history}"
    );
    assert!(
        samples
            .windows(2)
            .all(|w| w[0]["t_ms"].as_u64() < w[1]["t_ms"].as_u64())
    );
}
