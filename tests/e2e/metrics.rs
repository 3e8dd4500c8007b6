//! End to end: `/metrics` in Prometheus text form moves with the work: queue depth and
//! running tasks while a job runs, then task states, the duration histogram, result
//! bytes and the executors' own heartbeat figures after it; and the executors' cache
//! figures (fetch cache hits and misses, compiled-module cache hits on disk) grow as
//! later jobs reuse a file and a module.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use crate::common::{DevCluster, Process, guests, process, spec, wait_until};

/// Every sample of a scrape: `name{labels}` -> value.
fn scrape(cluster: &DevCluster) -> HashMap<String, f64> {
    let response = cluster.client.get(cluster.url("/metrics")).send().unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = response.text().unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            (name.to_owned(), value.parse::<f64>().unwrap())
        })
        .collect()
}

fn sum_over_executors(samples: &HashMap<String, f64>, name: &str) -> f64 {
    samples
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{executor=")))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn metrics_move_with_a_job() {
    // No launches ahead of free cores, so that waiting tasks wait in the driver's queue.
    let cluster = DevCluster::start_with(2, 1, &["--launch-ahead", "0"]);
    let module = cluster.upload(&guests().testkit);
    let before = scrape(&cluster);
    assert_eq!(before["flint_executors{state=\"alive\"}"], 2.0);
    assert_eq!(before["flint_cores"], 2.0);
    assert_eq!(before["flint_cores_free"], 2.0);
    assert_eq!(before["flint_task_duration_seconds_count"], 0.0);
    assert_eq!(before["flint_result_bytes_total"], 0.0);
    assert_eq!(before["flint_executor_cores{executor=\"exec-1\"}"], 1.0);

    // Four sleeping tasks on two cores: two run, two wait.
    let (status, job) = cluster.post_raw(
        "/v1/jobs",
        spec(&module, &["sleep", "1500"], &["", "", "", ""]).to_string(),
    );
    assert_eq!(status, 202, "{job}");
    wait_until(
        Duration::from_secs(10),
        "two tasks running and two queued",
        || {
            let now = scrape(&cluster);
            now["flint_tasks{state=\"running\"}"] == 2.0
                && now["flint_queue_depth"] == 2.0
                && now["flint_cores_free"] == 0.0
                && sum_over_executors(&now, "flint_executor_running_tasks") == 2.0
        },
    );
    let id = job["id"].as_str().unwrap();
    let (_, job) = cluster.get(&format!("/v1/jobs/{id}?wait=60"));
    assert_eq!(job["state"], "succeeded", "{job}");

    let echoed = cluster.run_job(spec(&module, &["echo"], &["abc", "defgh"]));
    assert_eq!(echoed["state"], "succeeded", "{echoed}");

    // Heartbeats bring the executors' figures within a second or so.
    wait_until(Duration::from_secs(10), "heartbeats after the jobs", || {
        let now = scrape(&cluster);
        // Each executor compiles the module once; later tasks find it compiled.
        sum_over_executors(&now, "flint_executor_running_tasks") == 0.0
            && sum_over_executors(&now, "flint_executor_modules_compiled_total") >= 1.0
            && sum_over_executors(&now, "flint_executor_module_cache_hits_total") >= 1.0
            && sum_over_executors(&now, "flint_executor_tasks_completed_total") == 6.0
    });
    let after = scrape(&cluster);
    assert_eq!(after["flint_tasks{state=\"succeeded\"}"], 6.0);
    assert_eq!(after["flint_queue_depth"], 0.0);
    assert_eq!(after["flint_jobs{state=\"succeeded\"}"], 2.0);
    assert_eq!(after["flint_cores_free"], 2.0);
    assert_eq!(after["flint_task_duration_seconds_count"], 6.0);
    assert_eq!(
        after["flint_task_duration_seconds_bucket{le=\"+Inf\"}"],
        6.0
    );
    // The four sleepers took at least 1.5 s each; the echoes far less.
    assert!(after["flint_task_duration_seconds_sum"] >= 6.0, "{after:?}");
    assert_eq!(after["flint_task_duration_seconds_bucket{le=\"1\"}"], 2.0);
    assert_eq!(after["flint_results_total"], 6.0);
    assert_eq!(after["flint_result_bytes_total"], 8.0, "abc + defgh");
    assert!(
        after["flint_job_store_commits_total"] >= 1.0,
        "task ends were committed: {after:?}"
    );
    assert_eq!(
        sum_over_executors(&after, "flint_executor_tasks_finished_total"),
        6.0
    );
    // What the executors say of themselves (ExecutorSource): the echoes' 8 bytes of
    // results, the module downloaded once by each executor that compiled it, and task
    // threads that ran wasm for at least the sleepers' start-up.
    assert_eq!(
        sum_over_executors(&after, "flint_executor_result_bytes_total"),
        8.0
    );
    let compiled = sum_over_executors(&after, "flint_executor_modules_compiled_total");
    let module_bytes = std::fs::metadata(&guests().testkit).unwrap().len();
    assert!(
        sum_over_executors(&after, "flint_executor_fetched_bytes_total")
            >= compiled * module_bytes as f64,
        "{after:?}"
    );
    assert!(sum_over_executors(&after, "flint_executor_task_cpu_seconds_total") > 0.0);
    // Every attempt's launch-to-status time: the sleepers' over a second, the echoes'
    // well under.
    assert_eq!(after["flint_task_launch_to_status_seconds_count"], 6.0);
    assert_eq!(
        after["flint_task_launch_to_status_seconds_bucket{le=\"+Inf\"}"],
        6.0
    );
    assert_eq!(
        after["flint_task_launch_to_status_seconds_bucket{le=\"1\"}"], 2.0,
        "{after:?}"
    );
    assert!(after["flint_task_launch_to_status_seconds_sum"] >= 6.0);
    // The same figures per executor in /v1/executors.
    let executors = cluster.executors();
    let total = |field: &str| -> u64 {
        executors
            .iter()
            .map(|e| {
                e[field]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{field} in {e}"))
            })
            .sum()
    };
    assert_eq!(total("tasks_completed"), 6);
    assert_eq!(total("result_bytes"), 8);
    assert_eq!(total("tasks_active"), 0);
    assert!(total("task_cpu_us") > 0);
    assert!(total("bytes_fetched") >= module_bytes);
}

/// One `flint executor` process of the test's own, stopped on drop.
fn start_executor(cluster: &DevCluster, work_dir: &std::path::Path) -> Process {
    Process::spawn(
        process::executor(&cluster.executor_url(), "solo", work_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

#[test]
fn executor_cache_figures_grow_as_jobs_reuse_a_file_and_a_module() {
    let cluster = DevCluster::driver(&[
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--executor-listen".into(),
        "127.0.0.1:0".into(),
    ]);
    let work = tempfile::tempdir().unwrap();
    let executor = start_executor(&cluster, work.path());
    cluster.wait_for_alive_executors(1);
    // Started by the test, not by `flint dev`: the driver has no log of it.
    assert!(cluster.executors()[0]["log_url"].is_null());
    let (status, body) = cluster.get("/v1/executors/solo/log");
    assert_eq!(status, 404);
    assert_eq!(body["error"]["kind"], "no_log", "{body}");
    let module = cluster.upload(&guests().testkit);
    let file = cluster.upload_file("some data");
    let job = serde_json::json!({
        "module": module, "files": {"data.txt": file},
        "args": ["read", "/files/data.txt"], "inputs": [{"text": ""}],
    });
    let figure = |samples: &HashMap<String, f64>, name: &str| {
        samples
            .get(&format!("{name}{{executor=\"solo\"}}"))
            .copied()
            .unwrap_or(-1.0)
    };
    let (hits, misses, compiled, from_disk) = (
        "flint_executor_fetch_cache_hits_total",
        "flint_executor_fetch_cache_misses_total",
        "flint_executor_modules_compiled_total",
        "flint_executor_compile_cache_hits_total",
    );

    // The first job downloads the module and the file, and compiles the module.
    assert_eq!(cluster.run_job(job.clone())["state"], "succeeded");
    let mut first = HashMap::new();
    wait_until(Duration::from_secs(10), "the first job's heartbeat", || {
        first = scrape(&cluster);
        figure(&first, misses) == 2.0 && figure(&first, compiled) == 1.0
    });
    assert_eq!(figure(&first, hits), 0.0, "{first:?}");
    assert_eq!(figure(&first, from_disk), 0.0, "{first:?}");

    // The second finds the file in the fetch cache (and the module compiled in memory).
    assert_eq!(cluster.run_job(job.clone())["state"], "succeeded");
    wait_until(Duration::from_secs(10), "a fetch cache hit", || {
        let now = scrape(&cluster);
        figure(&now, hits) == 1.0 && figure(&now, misses) == 2.0
    });

    // A new process over the same work dir loads the module compiled by the last one.
    executor.stop();
    wait_until(Duration::from_secs(10), "the executor to be lost", || {
        cluster.executors()[0]["state"] != "alive"
    });
    let _executor = start_executor(&cluster, work.path());
    cluster.wait_for_alive_executors(1);
    assert_eq!(cluster.run_job(job)["state"], "succeeded");
    wait_until(
        Duration::from_secs(10),
        "a compiled-module cache hit",
        || {
            let now = scrape(&cluster);
            // Counters start again with the process (Prometheus reads that as a reset).
            figure(&now, from_disk) == 1.0
                && figure(&now, compiled) == 0.0
                && figure(&now, hits) == 2.0
                && figure(&now, misses) == 0.0
        },
    );
}
