//! End to end: the cluster's processes: registration, duplicate ids, clean stops.

use std::process::Command;
use std::time::Duration;

use crate::common::{
    DevCluster, FLINT, free_port, guests, process, process_exists, signal, spec, wait_until,
};

#[test]
fn a_duplicate_executor_id_is_refused_and_the_first_keeps_working() {
    let cluster = DevCluster::start(1, 1);
    let before = cluster.executors();
    let work_dir = tempfile::tempdir().unwrap();
    let output = process::executor(&cluster.executor_url(), "exec-1", work_dir.path())
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(3),
        "documented code for a refused registration"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("executor id exec-1 is already registered"),
        "{stderr}"
    );

    let executors = cluster.executors();
    assert_eq!(executors.len(), 1);
    assert_eq!(executors[0]["state"], "alive");
    assert_eq!(
        executors[0]["generation"], before[0]["generation"],
        "not re-registered"
    );
    let module = cluster.upload(&guests().testkit);
    let job = cluster.run_job(spec(&module, &["echo"], &["still here"]));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(cluster.result(&job, 0), b"still here");
}

#[test]
fn an_executor_that_cannot_reach_the_driver_exits_with_its_code() {
    let addr = format!("127.0.0.1:{}", free_port());
    let work_dir = tempfile::tempdir().unwrap();
    let output = process::executor(&addr, "lonely", work_dir.path())
        .args(["--connect-timeout-ms", "300"])
        .env("FLINT_LOG", "error")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot connect to the driver"));
}

#[test]
fn executor_exit_codes_are_visible_and_sigterm_leaves_no_orphans() {
    let mut cluster = DevCluster::start(2, 1);
    let executors = cluster.executors();
    let pids: Vec<u32> = executors
        .iter()
        .map(|e| e["pid"].as_u64().unwrap() as u32)
        .collect();
    // Each executor's work dir holds its stdout and stderr.
    for id in ["exec-1", "exec-2"] {
        let dir = cluster.data_dir.path().join("work/flint").join(id);
        assert!(dir.join("stdout").is_file() && dir.join("stderr").is_file());
    }

    // An executor stopped from outside exits 0 and the driver shows it.
    signal(pids[0], libc::SIGTERM);
    wait_until(Duration::from_secs(20), "exec-1 to be seen exited", || {
        cluster
            .executors()
            .iter()
            .any(|e| e["id"] == "exec-1" && e["state"] == "exited" && e["exit_code"] == 0)
    });
    let stderr =
        std::fs::read_to_string(cluster.data_dir.path().join("work/flint/exec-1/stderr")).unwrap();
    assert!(stderr.contains("registered with driver"), "{stderr}");

    let status = cluster.stop();
    assert!(status.success(), "flint dev exits 0 on SIGTERM: {status:?}");
    for pid in pids {
        assert!(!process_exists(pid), "executor {pid} outlived flint dev");
    }
}

#[test]
fn the_cli_submits_waits_and_prints_results_in_task_order() {
    let cluster = DevCluster::start(2, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("input.txt");
    std::fs::write(&file, "b a b").unwrap();
    let output = Command::new(FLINT)
        .args(["submit", "--driver", &cluster.http, "--wait"])
        .arg(&guests().wordcount)
        .args(["--input-text", "one"])
        .arg("--input")
        .arg(&file)
        .args(["--input-text", "two two"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout, "{\"one\":1}\n{\"a\":1,\"b\":2}\n{\"two\":2}\n");

    let output = Command::new(FLINT)
        .args(["submit", "--driver", &cluster.http, "--wait"])
        .arg(&guests().testkit)
        .args(["--arg", "exit", "--arg", "7"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("task 0: exit: exited with code 7"),
        "{stderr}"
    );
}

#[test]
fn the_cli_says_when_the_driver_is_unreachable() {
    let addr = format!("127.0.0.1:{}", free_port());
    let output = Command::new(FLINT)
        .args(["submit", "--driver", &format!("http://{addr}"), "--wait"])
        .arg(&guests().testkit)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot reach the Flint driver"), "{stderr}");
}

#[test]
fn a_hung_executor_is_declared_lost_released_and_replaced_and_its_task_runs_elsewhere() {
    let cluster = DevCluster::start_with(2, 1, &["--executor-timeout-ms", "2000"]);
    let module = cluster.upload(&guests().testkit);
    let (status, job) = cluster.post_raw(
        "/v1/jobs",
        spec(&module, &["sleep", "3000"], &["", ""]).to_string(),
    );
    assert_eq!(status, 202, "{job}");
    wait_until(Duration::from_secs(30), "both tasks to run", || {
        cluster.executors().iter().all(|e| e["running"] == 1)
    });
    let hung = cluster
        .executors()
        .into_iter()
        .find(|e| e["id"] == "exec-1")
        .unwrap();
    let pid = hung["pid"].as_u64().unwrap() as u32;
    signal(pid, libc::SIGSTOP);
    let stopped = std::time::Instant::now();
    wait_until(
        Duration::from_secs(10),
        "exec-1 to be declared lost",
        || cluster.executors()[0]["state"] != "alive",
    );
    let detected = stopped.elapsed();
    assert!(
        detected < Duration::from_secs(10),
        "lost after {detected:?}"
    );
    // Declared lost, it is released through its cluster manager (killed, as Spark's
    // HeartbeatReceiver kills and replaces it): a silent host holds nothing for good.
    wait_until(
        Duration::from_secs(10),
        "the lost exec-1 to be killed",
        || !process_exists(pid),
    );
    signal(pid, libc::SIGCONT);

    let id = job["id"].as_str().unwrap();
    let job = cluster.get(&format!("/v1/jobs/{id}?wait=60")).1;
    assert_eq!(job["state"], "succeeded", "{job}");
    let tasks = cluster.tasks(&job);
    let moved: Vec<_> = tasks.iter().filter(|t| t["attempts"] == 2).collect();
    assert_eq!(
        moved.len(),
        1,
        "the hung executor's task ran again: {tasks:?}"
    );
    assert_eq!(cluster.metric("flint_attempts_adopted_total"), 0.0);
    assert!(tasks.iter().all(|t| t["error"].is_null()), "{tasks:?}");
    // Replaced, and its release not counted as a failure.
    wait_until(Duration::from_secs(20), "a replacement to register", || {
        cluster
            .executors()
            .iter()
            .any(|e| e["id"] == "exec-3" && e["state"] == "alive")
    });
    let allocation = cluster.get("/v1/executors").1["allocation"].clone();
    assert_eq!(allocation["recent_failures"], 0, "{allocation}");
    assert_eq!(job["counts"]["succeeded"], 2);
    let job = cluster.run_job(spec(&module, &["echo"], &["a", "b", "c", "d"]));
    assert_eq!(job["state"], "succeeded", "{job}");
}

#[test]
fn the_cli_follows_a_job_through_status_results_logs_and_kill() {
    let cluster = DevCluster::start(2, 1);
    let flint = |args: &[&str]| {
        let output = cluster.cli(args);
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let testkit = guests().testkit.to_str().unwrap().to_owned();
    let (code, id, err) = flint(&[
        "submit",
        &testkit,
        "--arg",
        "echo",
        "--input-text",
        "a",
        "--input-text",
        "b",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let id = id.trim().to_owned();
    let mut last = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !last.contains("(succeeded)") {
        assert!(
            std::time::Instant::now() < deadline,
            "job did not succeed: {last}"
        );
        std::thread::sleep(Duration::from_millis(25));
        let (_, out, err) = flint(&["status", &id]);
        last = format!("{out}{err}");
    }
    let (_, status, _) = flint(&["status", &id]);
    assert!(status.contains("2 tasks: 2 succeeded"), "{status}");
    let (code, results, _) = flint(&["results", &id]);
    assert_eq!((code, results.as_str()), (Some(0), "a\nb\n"));
    let out = tempfile::tempdir().unwrap();
    let (code, _, err) = flint(&["results", &id, "--out", out.path().to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(std::fs::read(out.path().join("1")).unwrap(), b"b");

    let (code, id, _) = flint(&["submit", &testkit, "--arg", "exit", "--arg", "4"]);
    assert_eq!(code, Some(0));
    let id = id.trim().to_owned();
    wait_until(Duration::from_secs(30), "the failing job to end", || {
        flint(&["status", &id]).1.contains("(failed)")
    });
    assert_eq!(flint(&["logs", &id, "0"]).1.trim(), "exiting with 4");
    let (code, _, err) = flint(&["results", &id]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("1 of 1 tasks have no result"), "{err}");

    let (_, id, _) = flint(&["submit", &testkit, "--arg", "spin"]);
    let id = id.trim().to_owned();
    let (code, killed, _) = flint(&["kill", &id]);
    assert_eq!(code, Some(0));
    assert!(killed.contains("(killed)"), "{killed}");
    let (code, executors, _) = flint(&["executors"]);
    assert_eq!(code, Some(0));
    assert!(
        executors.contains("exec-1") && executors.contains("alive"),
        "{executors}"
    );
    let (code, _, err) = flint(&["status", "job-does-not-exist"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("job_not_found"), "{err}");
}

#[test]
fn a_killed_executor_mid_job_loses_no_result() {
    let cluster = DevCluster::start(3, 1);
    let module = cluster.upload(&guests().wordcount);
    let inputs: Vec<String> = (0..300).map(|i| format!("w{i} ").repeat(8000)).collect();
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let (status, job) = cluster.post_raw("/v1/jobs", spec(&module, &[], &refs).to_string());
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(30), "the job to get going", || {
        cluster.get(&format!("/v1/jobs/{id}")).1["counts"]["succeeded"]
            .as_u64()
            .unwrap()
            >= 20
    });
    let victim = cluster
        .executors()
        .into_iter()
        .find(|e| e["id"] == "exec-2")
        .unwrap();
    let before = cluster.get(&format!("/v1/jobs/{id}")).1;
    signal(victim["pid"].as_u64().unwrap() as u32, libc::SIGKILL);
    let killed = std::time::Instant::now();
    assert_ne!(
        before["state"], "succeeded",
        "the kill came too late to test anything"
    );
    wait_until(Duration::from_secs(2), "the loss to be seen", || {
        cluster.executors()[1]["state"] != "alive"
    });
    assert!(killed.elapsed() < Duration::from_secs(2));

    let job = cluster.get(&format!("/v1/jobs/{id}?wait=120")).1;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["counts"]["succeeded"], 300, "{job}");
    for (index, input) in inputs.iter().enumerate() {
        let counts: serde_json::Value =
            serde_json::from_slice(&cluster.result(&job, index as u64)).unwrap();
        let word = input.split_whitespace().next().unwrap();
        assert_eq!(counts, serde_json::json!({ word: 8000 }), "task {index}");
    }
    assert!(
        cluster
            .tasks(&job)
            .iter()
            .all(|t| t["attempts"].as_u64().unwrap() <= 2),
        "only the lost executor's tasks ran again"
    );
}

#[test]
fn an_executor_stopped_mid_job_with_sigterm_fails_no_task() {
    // Kubernetes stops a pod with SIGTERM: the executor kills what runs there and says
    // so, which must read as a lost host (the tasks run again), not as failed tasks.
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().testkit);
    let inputs: Vec<String> = (0..16).map(|i| format!("t{i}")).collect();
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let (status, job) = cluster.post_raw(
        "/v1/jobs",
        spec(&module, &["sleep", "400"], &refs).to_string(),
    );
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(30), "a task running on exec-1", || {
        cluster
            .executors()
            .iter()
            .any(|e| e["id"] == "exec-1" && e["running"].as_u64().unwrap_or(0) > 0)
    });
    let victim = cluster
        .executors()
        .into_iter()
        .find(|e| e["id"] == "exec-1")
        .unwrap();
    signal(victim["pid"].as_u64().unwrap() as u32, libc::SIGTERM);

    let job = cluster.get(&format!("/v1/jobs/{id}?wait=60")).1;
    assert_eq!(job["state"], "succeeded", "{job}");
    for index in 0..16 {
        assert!(
            cluster.result(&job, index).is_empty(),
            "sleep prints nothing"
        );
    }
    let tasks = cluster.tasks(&job);
    assert!(
        tasks.iter().any(|t| t["attempts"].as_u64().unwrap() >= 2),
        "the stopped executor's task ran again: {tasks:?}"
    );
    wait_until(Duration::from_secs(20), "exec-1 to be seen exited", || {
        cluster
            .executors()
            .iter()
            .any(|e| e["id"] == "exec-1" && e["state"] == "exited" && e["exit_code"] == 0)
    });
}

#[test]
fn a_poison_task_fails_its_job_by_name_while_a_healthy_job_succeeds() {
    let cluster = DevCluster::start(2, 1);
    let testkit = cluster.upload(&guests().testkit);
    let mut poison = serde_json::json!({
        "module": testkit,
        "tasks": [{"args": ["echo"]}, {"args": ["exit", "9"]}, {"args": ["echo"]}],
    });
    poison["max_failures"] = serde_json::json!(4);
    let (_, healthy) = cluster.post_raw(
        "/v1/jobs",
        spec(&testkit, &["echo"], &["x"; 20]).to_string(),
    );
    let started = std::time::Instant::now();
    let poisoned = cluster.run_job(poison);
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(poisoned["state"], "failed", "{poisoned}");
    let message = poisoned["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("task 1 failed after 1 attempt(s): exit: exited with code 9"),
        "{message}"
    );
    let healthy = cluster
        .get(&format!(
            "/v1/jobs/{}?wait=60",
            healthy["id"].as_str().unwrap()
        ))
        .1;
    assert_eq!(healthy["state"], "succeeded", "{healthy}");
    assert_eq!(healthy["counts"]["succeeded"], 20);
}
