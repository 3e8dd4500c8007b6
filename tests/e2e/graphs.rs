//! Pipelines on a real `flint dev`: a graph of jobs submitted in one request whose
//! tasks wait for the results they read (per task, not per job), failures that never run
//! what depends on them while independent branches finish, graphs refused whole, and a
//! driver SIGKILLed with a graph half done.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

/// Submits a graph; its answer.
fn submit_graph(cluster: &DevCluster, graph: &Value) -> Value {
    let (status, body) = cluster.post_raw("/v1/graphs", graph.to_string());
    assert_eq!(status, 202, "{body}");
    body
}

/// The graph once every job has ended.
fn wait_for_graph(cluster: &DevCluster, id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (status, view) = cluster.get(&format!("/v1/graphs/{id}?wait=10"));
        assert_eq!(status, 200, "{view}");
        let ended = view["jobs"]
            .as_object()
            .unwrap()
            .values()
            .all(|j| ["succeeded", "failed", "killed"].contains(&j["state"].as_str().unwrap()));
        if ended {
            return view;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "graph {id} never ended: {view}"
        );
    }
}

/// Every attempt of a job: (task, attempt, start_us, end_us).
fn attempts(cluster: &DevCluster, job: &str) -> Vec<(u64, u64, u64, Option<u64>)> {
    let (status, page) = cluster.get(&format!("/v1/jobs/{job}/timeline"));
    assert_eq!(status, 200, "{page}");
    page["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["task"].as_u64().unwrap(),
                a["attempt"].as_u64().unwrap(),
                a["start_us"].as_u64().unwrap(),
                a["end_us"].as_u64(),
            )
        })
        .collect()
}

/// Word counts as a map task writes them.
fn counts(words: &[(&str, u64)]) -> String {
    serde_json::to_string(
        &words
            .iter()
            .map(|(w, n)| (*w, *n))
            .collect::<std::collections::BTreeMap<_, _>>(),
    )
    .unwrap()
}

#[test]
fn a_three_stage_graph_in_one_request_starts_a_combine_before_the_other_half_of_the_maps_ends() {
    let cluster = DevCluster::start(3, 1);
    let testkit = cluster.upload(&guests().testkit);
    let reduce = cluster.upload(&guests().wordcount_reduce);
    // Eight maps, each writing word counts; the second half computes for 2 s first.
    let maps: Vec<Value> = (0..8u64)
        .map(|i| {
            let args = match i < 4 {
                true => json!(["echo"]),
                false => json!(["slow-first", "2000"]),
            };
            json!({"args": args, "input": {"text": counts(&[("flint", i + 1), ("w", 1)])}})
        })
        .collect();
    let graph = json!({"jobs": {
        "map": {"module": testkit, "tasks": maps},
        "combine": {"module": reduce, "tasks": [
            {"input": {"results": {"job": "map", "tasks": [0, 1, 2, 3]}}},
            {"input": {"results": {"job": "map", "tasks": [4, 5, 6, 7]}}},
        ]},
        "reduce": {"module": reduce, "inputs": [{"results": {"job": "combine"}}]},
    }});
    let created = submit_graph(&cluster, &graph);
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("graph-"), "{created}");
    let job = |name: &str| created["jobs"][name].as_str().unwrap().to_owned();
    // Before anything could have ended, the readers wait.
    let (_, early) = cluster.get(&format!("/v1/jobs/{}", job("reduce")));
    assert_eq!(early["counts"]["waiting"], 1, "{early}");

    let view = wait_for_graph(&cluster, id);
    assert_eq!(view["state"], "succeeded", "{view}");
    let mut edges: Vec<(String, String)> = view["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["from"].as_str().unwrap().into(),
                e["to"].as_str().unwrap().into(),
            )
        })
        .collect();
    edges.sort();
    assert_eq!(
        edges,
        [
            ("combine".into(), "reduce".into()),
            ("map".into(), "combine".into())
        ]
    );
    // 1+2+...+8 of `flint`, 8 of `w`.
    let result = cluster.result(&json!({"id": job("reduce")}), 0);
    assert_eq!(
        String::from_utf8(result).unwrap(),
        counts(&[("flint", 36), ("w", 8)])
    );
    // The first combine started before the last slow map ended: per-task readiness.
    let last_map_end = (attempts(&cluster, &job("map")).iter())
        .filter(|a| a.0 >= 4)
        .map(|a| a.3.unwrap())
        .max()
        .unwrap();
    let first_combine_start = (attempts(&cluster, &job("combine")).iter())
        .find(|a| a.0 == 0)
        .unwrap()
        .2;
    assert!(
        first_combine_start < last_map_end,
        "combine 0 started at {first_combine_start}, the last map ended at {last_map_end}"
    );
}

#[test]
fn a_task_reading_task_0_starts_as_soon_as_task_0_ends_whatever_task_7_does() {
    let cluster = DevCluster::start(3, 1);
    let testkit = cluster.upload(&guests().testkit);
    let tasks: Vec<Value> = (0..8)
        .map(|i| match i {
            0 => json!({"args": ["slow-first", "500"], "input": {"text": "zero"}}),
            7 => json!({"args": ["sleep", "10000"]}),
            _ => json!({"args": ["noop"]}),
        })
        .collect();
    let upstream = cluster.submit(&json!({"module": testkit, "tasks": tasks}));
    let reader = cluster.submit_view(
        &json!({"module": testkit, "args": ["echo"],
                "inputs": [{"result": {"job": upstream, "task": 0}}]}),
        "",
    );
    assert_eq!(reader["counts"]["waiting"], 1, "{reader}");
    let reader_id = reader["id"].as_str().unwrap();
    let done = cluster.wait_for_job(reader_id, Duration::from_secs(60));
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(cluster.result(&done, 0), b"zero");
    let (_, up) = cluster.get(&format!("/v1/jobs/{upstream}"));
    assert_ne!(up["state"], "succeeded", "task 7 still sleeps: {up}");
    let task0_end = (attempts(&cluster, &upstream).iter())
        .find(|a| a.0 == 0)
        .and_then(|a| a.3)
        .unwrap();
    let reader_start = attempts(&cluster, reader_id)[0].2;
    let gap_ms = reader_start.saturating_sub(task0_end) as f64 / 1000.0;
    eprintln!("the reader started {gap_ms} ms after task 0 ended");
    assert!(
        gap_ms < 100.0,
        "the reader started {gap_ms} ms after task 0 ended"
    );
}

#[test]
fn a_failed_map_fails_what_reads_it_unrun_and_an_independent_branch_finishes() {
    let cluster = DevCluster::start(2, 1);
    let testkit = cluster.upload(&guests().testkit);
    let graph = json!({"jobs": {
        "good": {"module": testkit, "args": ["echo"],
                 "inputs": [{"text": "a"}, {"text": "b"}]},
        "bad": {"module": testkit, "args": ["exit", "3"], "max_failures": 1,
                "inputs": [{"text": ""}]},
        "left": {"module": testkit, "args": ["echo"], "inputs": [{"results": {"job": "good"}}]},
        "right": {"module": testkit, "args": ["echo"], "tasks": [
            {"input": {"result": {"job": "bad", "task": 0}}},
            {"input": {"result": {"job": "good", "task": 0}}},
        ]},
        "last": {"module": testkit, "args": ["echo"], "inputs": [{"results": {"job": "right"}}]},
    }});
    let created = submit_graph(&cluster, &graph);
    let view = wait_for_graph(&cluster, created["id"].as_str().unwrap());
    assert_eq!(view["state"], "failed", "{view}");
    let jobs = &view["jobs"];
    assert_eq!(jobs["good"]["state"], "succeeded", "{view}");
    assert_eq!(jobs["left"]["state"], "succeeded", "{view}");
    assert_eq!(jobs["bad"]["state"], "failed", "{view}");
    let bad_id = jobs["bad"]["id"].as_str().unwrap();
    for name in ["right", "last"] {
        let job = &jobs[name];
        assert_eq!(job["state"], "failed", "{name}: {view}");
        assert_eq!(job["error"]["kind"], "upstream_failed", "{name}: {view}");
    }
    let right = jobs["right"]["id"].as_str().unwrap();
    let tasks = cluster.tasks(&json!({"id": right}));
    assert_eq!(tasks[0]["error"]["kind"], "upstream_failed", "{tasks:?}");
    let message = tasks[0]["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(bad_id) && message.contains("task 0"),
        "{message}"
    );
    // Never ran: no attempt.
    assert!(
        attempts(&cluster, right).iter().all(|a| a.0 != 0),
        "{tasks:?}"
    );
    let left = cluster.result(&jobs["left"], 0);
    assert_eq!(left, b"ab");
}

#[test]
fn bad_graphs_are_refused_whole_naming_the_problem_and_nothing_is_stored() {
    let cluster = DevCluster::start(1, 1);
    let testkit = cluster.upload(&guests().testkit);
    let job = |input: Value| json!({"module": testkit, "args": ["echo"], "inputs": [input]});
    let text = json!({"text": "x"});
    let refused = |graph: Value, kind: &str, says: &str| {
        let (status, body) = cluster.post_raw("/v1/graphs", graph.to_string());
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["kind"], kind, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{says:?} not in {message:?}");
    };
    refused(
        json!({"jobs": {
            "a": job(json!({"results": {"job": "b"}})),
            "b": job(json!({"results": {"job": "c"}})),
            "c": job(json!({"results": {"job": "a"}})),
            "d": job(text.clone()),
        }}),
        "invalid_spec",
        "cycle: ",
    );
    let (_, body) = cluster.post_raw(
        "/v1/graphs",
        json!({"jobs": {"a": job(json!({"results": {"job": "b"}})),
                        "b": job(json!({"results": {"job": "a"}}))}})
        .to_string(),
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.ends_with("a -> b -> a") || message.ends_with("b -> a -> b"),
        "{message}"
    );
    refused(
        json!({"jobs": {"a": job(json!({"results": {"job": "mapp"}})), "map": job(text.clone())}}),
        "unknown_result",
        "`mapp` is neither a job of this graph",
    );
    refused(
        json!({"jobs": {"a": job(json!({"result": {"job": "map", "task": 1}})),
                        "map": job(text.clone())}}),
        "unknown_result",
        "has no task 1 (it has 1)",
    );
    refused(
        json!({"jobs": {"a": job(json!({"results": {"job": "a"}}))}}),
        "invalid_spec",
        "self-reference",
    );
    for bad in ["a b", "job-1", "", &"x".repeat(65)] {
        refused(
            json!({"jobs": {bad: job(text.clone())}}),
            "invalid_spec",
            "is not a job name",
        );
    }
    let many: serde_json::Map<String, Value> = (0..10_001)
        .map(|i| (format!("j{i}"), job(text.clone())))
        .collect();
    refused(json!({"jobs": many}), "invalid_spec", "MAX_GRAPH_JOBS");
    // A job refused as POST /v1/jobs would refuse it, named.
    refused(
        json!({"jobs": {"a": job(text.clone()), "b": {"module": testkit}}}),
        "no_tasks",
        "jobs.b: ",
    );
    let (_, list) = cluster.get("/v1/jobs");
    assert_eq!(list["items"].as_array().unwrap().len(), 0, "{list}");
}

#[test]
fn a_graph_half_done_survives_a_driver_sigkill_with_every_edge_and_no_ended_task_run_again() {
    let cluster = DevCluster::start(2, 1);
    let testkit = cluster.upload(&guests().testkit);
    let graph = json!({"jobs": {
        "first": {"module": testkit, "args": ["echo"],
                  "inputs": [{"text": "one,"}, {"text": "two"}]},
        "second": {"module": testkit, "args": ["slow-first", "3000"],
                   "inputs": [{"results": {"job": "first"}}]},
        "third": {"module": testkit, "args": ["echo"],
                  "inputs": [{"results": {"job": "second"}}, {"result": {"job": "first", "task": 1}}]},
    }});
    let created = submit_graph(&cluster, &graph);
    let id = created["id"].as_str().unwrap().to_owned();
    let first = created["jobs"]["first"].as_str().unwrap().to_owned();
    let second = created["jobs"]["second"].as_str().unwrap().to_owned();
    let third = created["jobs"]["third"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(60), "second to be running", || {
        let (_, job) = cluster.get(&format!("/v1/jobs/{second}"));
        job["counts"]["running"] == 1
    });
    // `first` has ended and its ends are committed (the commit interval is a few ms).
    std::thread::sleep(Duration::from_millis(500));
    let cluster = cluster.crash_and_restart_with(2, 1, &[]);
    // Read back with its edge: task 0 still waits for `second`.
    let (_, third_view) = cluster.get(&format!("/v1/jobs/{third}"));
    assert_eq!(third_view["counts"]["waiting"], 1, "{third_view}");
    let view = wait_for_graph(&cluster, &id);
    assert_eq!(view["state"], "succeeded", "{view}");
    let third = json!({"id": third});
    assert_eq!(cluster.result(&third, 0), b"one,two");
    assert_eq!(cluster.result(&third, 1), b"two");
    // `first` and third's task 1 (which read first's task 1) ended before the crash:
    // none of them ran again.
    let tasks = cluster.tasks(&json!({"id": first}));
    assert!(tasks.iter().all(|t| t["attempts"] == 1), "{tasks:?}");
    let tasks = cluster.tasks(&third);
    assert_eq!(tasks[1]["attempts"], 1, "{tasks:?}");
}

#[test]
fn a_graph_is_read_killed_and_deleted_as_one_and_its_readers_hold_their_upstreams() {
    let cluster = DevCluster::start(1, 1);
    let testkit = cluster.upload(&guests().testkit);
    let graph = json!({"jobs": {
        "slow": {"module": testkit, "args": ["sleep", "60000"], "inputs": [{"text": ""}]},
        "after": {"module": testkit, "args": ["echo"], "inputs": [{"results": {"job": "slow"}}]},
    }});
    let created = submit_graph(&cluster, &graph);
    let id = created["id"].as_str().unwrap();
    let slow = created["jobs"]["slow"].as_str().unwrap();
    let after = created["jobs"]["after"].as_str().unwrap();
    // Neither the job a waiting task reads nor the waiting job can be deleted.
    for job in [slow, after] {
        let response = cluster
            .client
            .delete(cluster.url(&format!("/v1/jobs/{job}")))
            .send()
            .unwrap();
        assert_eq!(response.status().as_u16(), 409);
        let body: Value = response.json().unwrap();
        assert!(
            body["error"]["message"].as_str().unwrap().contains(job),
            "{body}"
        );
    }
    // Kill the graph: every job ends; the waiting reader never runs.
    let response = cluster
        .client
        .post(cluster.url(&format!("/v1/graphs/{id}/kill")))
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let view = wait_for_graph(&cluster, id);
    assert_eq!(view["state"], "killed", "{view}");
    let tasks = cluster.tasks(&json!({"id": after}));
    assert_eq!(tasks[0]["state"], "killed", "{tasks:?}");
    assert_eq!(tasks[0]["attempts"], 0, "{tasks:?}");
    let response = cluster
        .client
        .delete(cluster.url(&format!("/v1/graphs/{id}")))
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 204);
    for path in [
        format!("/v1/graphs/{id}"),
        format!("/v1/jobs/{slow}"),
        format!("/v1/jobs/{after}"),
    ] {
        let (status, body) = cluster.get(&path);
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (_, body) = cluster.get(&format!("/v1/graphs/{id}"));
    assert_eq!(body["error"]["kind"], "graph_not_found", "{body}");
}

#[test]
fn flint_graph_submit_runs_a_yaml_graph_with_local_modules_and_waits() {
    let cluster = DevCluster::start(2, 1);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&guests().wordcount, dir.path().join("map.wasm")).unwrap();
    std::fs::copy(&guests().wordcount_reduce, dir.path().join("reduce.wasm")).unwrap();
    let file = dir.path().join("wc.yaml");
    std::fs::write(
        &file,
        "jobs:\n  map:\n    module: map.wasm\n    inputs:\n      - text: the cat\n      - text: the dog\n\
         \x20 reduce:\n    module: reduce.wasm\n    inputs:\n      - results: {job: map}\n",
    )
    .unwrap();
    let out = cluster.cli(&[
        "graph",
        "submit",
        file.to_str().unwrap(),
        "--wait",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["state"], "succeeded", "{view}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("map (job-") && stderr.contains("reduce (job-"),
        "{stderr}"
    );
    let result = cluster.result(&view["jobs"]["reduce"], 0);
    assert_eq!(
        String::from_utf8(result).unwrap(),
        r#"{"cat":1,"dog":1,"the":2}"#
    );
    let out = cluster.cli(&["graph", "status", view["id"].as_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(succeeded)") && text.contains("map -> reduce"),
        "{text}"
    );
}

#[test]
fn recovering_a_failed_memoized_graph_runs_only_what_failed_and_what_reads_it() {
    let data = b"flaky but fine now".to_vec();
    let origin = Origin::start(&[("/flaky", Reply::Status(500))]);
    let cluster = DevCluster::start_with(2, 1, &["--fetch-allow", &origin.origin]);
    let testkit = cluster.upload(&guests().testkit);
    let job = |inputs: Value| {
        json!({"module": testkit, "args": ["echo"], "inputs": inputs,
               "deterministic": true, "memoize": true, "max_failures": 1})
    };
    let graph = json!({"jobs": {
        "good": job(json!([{"text": "a"}, {"text": "b"}])),
        "flaky": job(json!([{"url": origin.url("/flaky"), "sha256": sha256_hex(&data)}])),
        "left": job(json!([{"results": {"job": "good"}}])),
        "right": job(json!([{"results": {"job": "flaky"}}])),
        "last": job(json!([{"results": {"job": "right"}}])),
    }});
    let created = submit_graph(&cluster, &graph);
    let id = created["id"].as_str().unwrap();
    let view = wait_for_graph(&cluster, id);
    assert_eq!(view["state"], "failed", "{view}");
    assert_eq!(view["jobs"]["left"]["state"], "succeeded", "{view}");
    assert_eq!(
        view["jobs"]["right"]["error"]["kind"], "upstream_failed",
        "{view}"
    );
    let ran = |cluster: &DevCluster| -> u64 {
        cluster
            .executors()
            .iter()
            .map(|e| e["tasks_finished"].as_u64().unwrap())
            .sum()
    };
    let before = ran(&cluster);

    // The source is back: recover runs flaky, right and last, and nothing else.
    origin.set("/flaky", Reply::Body(data.clone()));
    let out = cluster.cli(&["graph", "recover", id, "--wait"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new_id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert_ne!(new_id, id);
    let view = wait_for_graph(&cluster, &new_id);
    assert_eq!(view["state"], "succeeded", "{view}");
    assert_eq!(view["recovered_from"], id, "{view}");
    assert_eq!(cluster.result(&view["jobs"]["last"], 0), data);
    assert_eq!(cluster.result(&view["jobs"]["left"], 0), b"ab");
    assert_eq!(
        ran(&cluster) - before,
        3,
        "flaky, right and last ran; the rest was memoized"
    );
    // A graph that succeeded has nothing to recover.
    let (status, body) = cluster.post_raw(&format!("/v1/graphs/{new_id}/recover"), "");
    assert_eq!(status, 422, "{body}");
    // The same graph submitted again finds every result memoized: nothing runs.
    let ran_before = ran(&cluster);
    let again = submit_graph(&cluster, &graph);
    let view = wait_for_graph(&cluster, again["id"].as_str().unwrap());
    assert_eq!(view["state"], "succeeded", "{view}");
    assert_eq!(cluster.result(&view["jobs"]["last"], 0), data);
    assert_eq!(
        ran(&cluster),
        ran_before,
        "the seeds come from the spec as written"
    );
}

#[test]
fn a_graph_under_an_idempotency_key_is_made_once_and_the_key_is_freed_with_it() {
    let cluster = DevCluster::start(1, 1);
    let testkit = cluster.upload(&guests().testkit);
    let graph = |text: &str| {
        json!({"jobs": {
            "a": {"module": testkit, "args": ["echo"], "inputs": [{"text": text}]},
            "b": {"module": testkit, "args": ["echo"], "inputs": [{"results": {"job": "a"}}]},
        }})
    };
    let post = |body: &Value| {
        let response = cluster
            .client
            .post(cluster.url("/v1/graphs"))
            .header("idempotency-key", "graph-key-1")
            .body(body.to_string())
            .send()
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().unwrap())
    };
    let (status, first) = post(&graph("x"));
    assert_eq!(status, 202, "{first}");
    let (status, again) = post(&graph("x"));
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["jobs"], first["jobs"]);
    let (status, other) = post(&graph("y"));
    assert_eq!(status, 422, "{other}");
    assert_eq!(other["error"]["kind"], "idempotency_conflict", "{other}");
    let (_, list) = cluster.get("/v1/jobs");
    assert_eq!(list["items"].as_array().unwrap().len(), 2, "{list}");
    let id = first["id"].as_str().unwrap();
    assert_eq!(wait_for_graph(&cluster, id)["state"], "succeeded");
    let response = cluster
        .client
        .delete(cluster.url(&format!("/v1/graphs/{id}")))
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 204);
    let (status, fresh) = post(&graph("y"));
    assert_eq!(
        status, 202,
        "the key is free once its graph is deleted: {fresh}"
    );
    assert_ne!(fresh["id"], first["id"]);
}

#[test]
fn a_task_that_waited_replays_bit_for_bit_from_the_results_it_read() {
    let cluster = DevCluster::start(2, 1);
    let map = cluster.upload(&guests().wordcount);
    let reduce = cluster.upload(&guests().wordcount_reduce);
    let graph = json!({"jobs": {
        "map": {"module": map, "deterministic": true,
                "inputs": [{"text": "to be or not"}, {"text": "to be"}]},
        "reduce": {"module": reduce, "deterministic": true,
                   "inputs": [{"results": {"job": "map"}}]},
    }});
    let created = submit_graph(&cluster, &graph);
    let view = wait_for_graph(&cluster, created["id"].as_str().unwrap());
    assert_eq!(view["state"], "succeeded", "{view}");
    let reduce = view["jobs"]["reduce"]["id"].as_str().unwrap();
    // The bundle's input is the results it read, made again, pinned by digest.
    let (status, bundle) = cluster.get(&format!("/v1/jobs/{reduce}/tasks/0/replay"));
    assert_eq!(status, 200, "{bundle}");
    assert_eq!(bundle["input"].as_array().unwrap().len(), 2, "{bundle}");
    let out = cluster.cli(&["replay", reduce, "0"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        r#"{"be":2,"not":1,"or":1,"to":2}"#
    );
}

#[test]
fn flint_submit_input_results_reads_a_job_still_running_without_waiting_for_it_first() {
    let cluster = DevCluster::start(2, 1);
    let testkit = cluster.upload(&guests().testkit);
    let map = cluster.submit(&json!({"module": testkit, "args": ["slow-first", "1000"],
                                     "inputs": [{"text": "one "}, {"text": "two"}]}));
    let path = guests().testkit.to_str().unwrap().to_owned();
    let out = cluster.cli(&[
        "submit",
        &path,
        "--arg",
        "echo",
        "--input-results",
        &map,
        "--wait",
        "--progress",
        "plain",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), "one two");
    assert!(
        stderr.contains("1 waiting"),
        "the progress showed the task waiting: {stderr}"
    );
}

#[test]
fn a_wait_ends_at_its_deadline_while_other_jobs_keep_ending() {
    // Two executors for the two sleepers, a third for the flood.
    let cluster = DevCluster::start(3, 1);
    let testkit = cluster.upload(&guests().testkit);
    let sleeper = cluster.submit(&json!({"module": testkit, "args": ["sleep", "60000"],
                                         "inputs": [{"text": ""}]}));
    let graph = submit_graph(
        &cluster,
        &json!({"jobs": {"slow": {"module": testkit, "args": ["sleep", "60000"],
                                  "inputs": [{"text": ""}]}}}),
    );
    // Jobs end one after another the whole time: every end wakes the waits.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood: Vec<_> = (0..4)
        .map(|_| {
            let api = Api::new(cluster.http.clone(), None);
            let (stop, testkit) = (stop.clone(), testkit.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let spec =
                        json!({"module": testkit, "args": ["noop"], "inputs": [{"text": ""}]});
                    api.post_raw("/v1/jobs?wait=10", spec.to_string());
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for path in [
        format!("/v1/jobs/{sleeper}?wait=1"),
        format!("/v1/graphs/{}?wait=1", graph["id"].as_str().unwrap()),
    ] {
        let asked = std::time::Instant::now();
        let (status, view) = cluster.get(&path);
        let took = asked.elapsed();
        assert_eq!(status, 200, "{view}");
        assert_eq!(view["state"], "running", "{view}");
        assert!(
            took < Duration::from_secs(5),
            "{path} answered after {took:?}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for thread in flood {
        thread.join().unwrap();
    }
}
