//! End to end: a cluster at rest gives back what it does not use (issue 44). An idle
//! executor's epoch ticker sleeps instead of waking 500 times a second, a quiet
//! executor and driver unmap the binary's pages that start-up touched, and the work that
//! comes after still runs: its code faults back in, and a task's deadline still stops it.

use std::time::{Duration, Instant};

use crate::common::{DevCluster, guests, spec, wait_until};

/// A `/proc/PID/status` (or a thread's) field in its unit (kB, or a count).
fn status_field(path: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(path).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {path}"))
}

fn executor_pids(cluster: &DevCluster) -> Vec<u32> {
    cluster
        .executors()
        .iter()
        .map(|e| e["pid"].as_u64().unwrap() as u32)
        .collect()
}

/// The status file of `pid`'s thread named `name`.
fn thread_status(pid: u32, name: &str) -> String {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() == name {
            return dir.join("status").to_str().unwrap().to_owned();
        }
    }
    panic!("process {pid} has no thread {name}");
}

#[test]
fn an_idle_executors_epoch_ticker_sleeps_and_wakes_for_the_next_attempt() {
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    // An attempt first: the ticker has run, and stops again once it ended.
    let job = cluster.submit(&spec(&module, &["noop"], &[""]));
    assert_eq!(
        cluster.wait_for_job(&job, Duration::from_secs(30))["state"],
        "succeeded"
    );
    let pid = executor_pids(&cluster)[0];
    let ticker = thread_status(pid, "flint-epoch");
    std::thread::sleep(Duration::from_millis(200));
    let before = status_field(&ticker, "voluntary_ctxt_switches:");
    std::thread::sleep(Duration::from_secs(1));
    let woke = status_field(&ticker, "voluntary_ctxt_switches:") - before;
    // Ticking every 2 ms it woke about 500 times; waiting, once (its stop check).
    assert!(woke <= 5, "the idle ticker woke {woke} times in a second");

    // It ticks again for the next attempt: a task past its deadline is stopped at one.
    let mut spinning = spec(&module, &["spin"], &[""]);
    spinning["resources"] = serde_json::json!({"timeout_ms": 300});
    let t0 = Instant::now();
    let job = cluster.submit(&spinning);
    let view = cluster.wait_for_job(&job, Duration::from_secs(30));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let task = &cluster.tasks(&view)[0];
    assert_eq!(task["state"], "failed", "{task}");
    assert_eq!(task["error"]["kind"], "timeout", "{task}");
}

#[test]
fn a_quiet_cluster_unmaps_the_binarys_pages_and_runs_the_next_job() {
    let cluster = DevCluster::start(2, 1);
    let mut pids = executor_pids(&cluster);
    pids.push(cluster.child.id());
    // Start-up maps some 20 MB of the binary into each process; after three quiet
    // seconds each gives back most of it.
    let at_start: Vec<u64> = pids
        .iter()
        .map(|pid| status_field(&format!("/proc/{pid}/status"), "RssFile:"))
        .collect();
    for (pid, start) in pids.iter().zip(&at_start) {
        wait_until(
            Duration::from_secs(20),
            "the binary's pages unmapped",
            || status_field(&format!("/proc/{pid}/status"), "RssFile:") < start / 2,
        );
    }
    let module = cluster.upload(&guests().testkit);
    let inputs: Vec<&str> = vec!["x"; 200];
    let job = cluster.submit(&spec(&module, &["echo"], &inputs));
    let view = cluster.wait_for_job(&job, Duration::from_secs(60));
    assert_eq!(view["state"], "succeeded", "{view}");
    assert_eq!(cluster.tasks(&view).len(), 200);
}
