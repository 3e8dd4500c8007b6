//! End to end: a cluster at rest gives back what it does not use (issue 44). An idle
//! executor's epoch ticker sleeps instead of waking 500 times a second, a quiet
//! executor and driver unmap the binary's pages that start-up touched, and the work that
//! comes after still runs: its code faults back in, and a task's deadline still stops it.

use std::time::{Duration, Instant};

use crate::common::{DevCluster, guests, spec};

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

/// KiB of `pid`'s resident set that is the flint binary's code (its `r-xp` mapping; not
/// its relocated data, which is the process's own, not libc, not the heap).
fn code_resident_kib(pid: u32) -> u64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let exe = exe.to_str().unwrap().to_owned();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut ours = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let first = line.split(' ').next().unwrap_or_default();
        if let Some(rss) = line.strip_prefix("Rss:") {
            if ours {
                kib += rss
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        } else if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: `start-end perms offset dev inode path`.
            ours = line.ends_with(&exe) && line.split(' ').nth(1) == Some("r-xp");
        }
    }
    kib
}

#[test]
fn a_quiet_cluster_unmaps_the_binarys_pages_and_runs_the_next_job() {
    let cluster = DevCluster::start(2, 1);
    let mut pids = executor_pids(&cluster);
    pids.push(cluster.child.id());
    // Start-up maps 13 MiB and more of the binary's code into each process. Once a
    // process has been quiet for three seconds it drops it all, and what runs next maps
    // back (a whole page-cache folio at a time: up to some 10 MiB for a heartbeat in a
    // debug build), so the drop is caught by reading often: at some read, less than a
    // third of the most seen. Without the trim the code stays mapped, every read alike.
    for pid in &pids {
        let (mut least, mut most) = (u64::MAX, 0);
        let dropped = (0..400).any(|_| {
            let kib = code_resident_kib(*pid);
            (least, most) = (least.min(kib), most.max(kib));
            std::thread::sleep(Duration::from_millis(50));
            least < most / 3
        });
        assert!(
            dropped,
            "process {pid} kept {least} - {most} KiB of code mapped for 20 s"
        );
    }
    let module = cluster.upload(&guests().testkit);
    let inputs: Vec<&str> = vec!["x"; 200];
    let job = cluster.submit(&spec(&module, &["echo"], &inputs));
    let view = cluster.wait_for_job(&job, Duration::from_secs(60));
    assert_eq!(view["state"], "succeeded", "{view}");
    assert_eq!(cluster.tasks(&view).len(), 200);
}
