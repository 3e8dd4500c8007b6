//! End to end: the `standalone` cluster manager on three hosts. Each host is a network
//! namespace on a bridge (addresses only on this machine) running `flint worker`; the
//! driver listens on the bridge with a token and a cluster secret and has its workers
//! launch its executors. A SIGKILLed executor is reported by its worker with its signal
//! and replaced; a SIGKILLed worker takes its executors with it and the replacements
//! come from the other workers; every result is there, once. A driver SIGKILLed and
//! started again adopts its workers' executors (`standalone/restart.rs`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::netns::{Host, Lan};
use crate::common::{
    DevCluster, FLINT, Process, guests, process_exists, sha256_hex, signal, spec, wait_until,
};

const TOKEN: &str = "standalone-token";
const SECRET: &str = "standalone-secret";

/// A standalone driver's flags for the LAN's tests: its addresses, token, secret, app
/// id, and 1-core executors of 256 MiB.
fn lan_driver_flags<'a>(listen: &'a str, executor_listen: &'a str) -> Vec<&'a str> {
    vec![
        "--listen",
        listen,
        "--executor-listen",
        executor_listen,
        "--token",
        TOKEN,
        "--cluster-secret",
        SECRET,
        "--cluster-manager",
        "standalone",
        "--executor-cores",
        "1",
        "--executor-memory-mb",
        "256",
        "--app-id",
        "lan-test",
    ]
}

fn start_driver(lan: &Lan, executors: u32) -> DevCluster {
    let executors = executors.to_string();
    start_driver_with(lan, &["--initial-executors", &executors])
}

fn start_driver_with(lan: &Lan, allocation: &[&str]) -> DevCluster {
    let at = format!("{}:0", lan.gateway);
    let mut args = lan_driver_flags(&at, &at);
    args.extend_from_slice(allocation);
    DevCluster::spawn("driver", &args, &[])
}

fn start_worker(host: &Host, name: &str, cluster: &DevCluster, work: &std::path::Path) -> Process {
    start_worker_with(host, name, cluster, work, 4)
}

fn start_worker_with(
    host: &Host,
    name: &str,
    cluster: &DevCluster,
    work: &std::path::Path,
    cores: u32,
) -> Process {
    let log = std::fs::File::create(work.join(format!("{name}.log"))).unwrap();
    let cores = cores.to_string();
    Process::spawn(
        host.command(FLINT)
            .args(["worker", "--driver-url", &cluster.executor_url()])
            .args(["--cores", &cores, "--memory-mb", "2048", "--host", name])
            .args(["--worker-id", name, "--cluster-secret", SECRET])
            .arg("--work-dir")
            .arg(work.join(name))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log),
    )
}

fn workers(cluster: &DevCluster) -> Vec<Value> {
    let (status, body) = cluster.get("/v1/workers");
    assert_eq!(status, 200, "{body}");
    body["items"].as_array().unwrap().clone()
}

fn alive_on(cluster: &DevCluster, worker: &str) -> Vec<Value> {
    cluster
        .executors()
        .into_iter()
        .filter(|e| e["state"] == "alive" && e["worker"] == worker)
        .collect()
}

#[test]
fn workers_launch_executors_replace_a_killed_one_and_lose_theirs_with_them() {
    let lan = Lan::create(3);
    let work = tempfile::tempdir().unwrap();
    let cluster = start_driver(&lan, 6);
    let names = ["host-a", "host-b", "host-c"];
    let mut running: Vec<Process> = lan
        .hosts
        .iter()
        .zip(names)
        .map(|(host, name)| start_worker(host, name, &cluster, work.path()))
        .collect();
    wait_until(
        Duration::from_secs(60),
        "six executors on three workers",
        || cluster.alive_executors() == 6,
    );
    // Each on a worker that had room, none past its worker's cores (workers register
    // one after another, and each takes what is pending when it comes).
    let mut per_worker = std::collections::BTreeMap::<String, usize>::new();
    for e in cluster.executors() {
        assert_eq!(e["cluster_manager"], "standalone", "{e}");
        assert_eq!(e["host"], e["worker"], "{e}");
        *per_worker
            .entry(e["worker"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert!(per_worker.values().all(|&n| n <= 4), "{per_worker:?}");
    let views = workers(&cluster);
    assert_eq!(views.len(), 3);
    for w in &views {
        let on = per_worker
            .get(w["id"].as_str().unwrap())
            .copied()
            .unwrap_or(0) as u64;
        assert_eq!(w["state"], "alive", "{w}");
        assert_eq!(w["free_cores"], 4 - on, "{w}");
        assert_eq!(w["free_memory_mb"], 2048 - 256 * on, "{w}");
        assert_eq!(w["executors"].as_array().unwrap().len() as u64, on, "{w}");
    }
    // The busiest worker and another one.
    let (busiest, _) = per_worker.iter().max_by_key(|(_, n)| **n).unwrap();
    let busiest = busiest.clone();
    let other = names
        .iter()
        .find(|n| **n != busiest && per_worker.contains_key(**n))
        .expect("executors on two workers at least")
        .to_string();
    // Work dirs by app and executor, with the executor's own output.
    let first = &alive_on(&cluster, &busiest)[0];
    let dir = work
        .path()
        .join(&busiest)
        .join("lan-test")
        .join(first["id"].as_str().unwrap());
    assert!(dir.join("stderr").is_file(), "{}", dir.display());

    let module = cluster.upload(&guests().testkit);
    let busy = cluster.submit(&serde_json::json!({
        "module": module, "args": ["sleep", "40"],
        "inputs": vec![serde_json::json!({"text": ""}); 600],
    }));
    let inputs: Vec<String> = (0..2000).map(|i| format!("result-{i}")).collect();
    let input_refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let echoed = cluster.submit(&spec(&module, &["echo"], &input_refs));

    // An executor SIGKILLed: its worker reports the signal, and it is replaced.
    wait_until(Duration::from_secs(30), "the busy job to start", || {
        cluster.get(&format!("/v1/jobs/{busy}")).1["counts"]["succeeded"]
            .as_u64()
            .unwrap()
            >= 30
    });
    let victim = alive_on(&cluster, &other)[0].clone();
    let victim_id = victim["id"].as_str().unwrap().to_owned();
    signal(victim["pid"].as_u64().unwrap() as u32, libc::SIGKILL);
    wait_until(
        Duration::from_secs(20),
        "the kill reported and replaced",
        || {
            let gone = cluster
                .executors()
                .into_iter()
                .find(|e| e["id"] == victim_id.as_str())
                .unwrap();
            gone["state"] == "exited" && cluster.alive_executors() == 6
        },
    );
    let gone = cluster
        .executors()
        .into_iter()
        .find(|e| e["id"] == victim_id.as_str())
        .unwrap();
    assert_eq!(gone["exit_signal"], 9, "{gone}");
    assert_eq!(gone["exit_reason"], "killed", "{gone}");
    assert_eq!(gone["worker"], other.as_str(), "{gone}");

    // A worker SIGKILLed: its executors die with it and come back on the others.
    let doomed: Vec<u32> = alive_on(&cluster, &busiest)
        .iter()
        .map(|e| e["pid"].as_u64().unwrap() as u32)
        .collect();
    let at = names.iter().position(|n| **n == busiest).unwrap();
    running[at].sigkill();
    wait_until(Duration::from_secs(20), "the worker lost", || {
        workers(&cluster)
            .iter()
            .any(|w| w["id"] == busiest.as_str() && w["state"] == "lost")
    });
    wait_until(
        Duration::from_secs(30),
        "replacements on the other workers",
        || {
            let elsewhere: usize = names
                .iter()
                .filter(|n| **n != busiest)
                .map(|n| alive_on(&cluster, n).len())
                .sum();
            elsewhere == 6
        },
    );
    for pid in doomed {
        wait_until(Duration::from_secs(10), "host-a's executors to die", || {
            !process_exists(pid)
        });
    }
    let a = cluster.get("/v1/executors").1["allocation"].clone();
    assert_eq!(a["cluster_manager"], "standalone", "{a}");
    assert_eq!(a["recent_failures"], 1, "only the SIGKILL counts: {a}");

    let busy = cluster.wait_for_job(&busy, Duration::from_secs(180));
    assert_eq!(busy["state"], "succeeded", "{busy}");
    let echoed = cluster.wait_for_job(&echoed, Duration::from_secs(180));
    assert_eq!(echoed["state"], "succeeded", "{echoed}");
    assert_eq!(echoed["counts"]["succeeded"], 2000, "{echoed}");
    // Every task has one result, its own input.
    let tasks = cluster.tasks(&echoed);
    assert_eq!(tasks.len(), 2000);
    for (task, input) in tasks.iter().zip(&inputs) {
        assert_eq!(task["state"], "succeeded", "{task}");
        assert_eq!(
            task["result"]["sha256"],
            sha256_hex(input.as_bytes()),
            "{task}"
        );
    }
    for (index, input) in inputs.iter().enumerate().step_by(97) {
        assert_eq!(cluster.result(&echoed, index as u64), input.as_bytes());
    }
    drop(running);
}

#[test]
fn a_worker_is_refused_by_a_driver_without_the_standalone_cluster_manager() {
    let cluster = DevCluster::start(1, 1);
    let work = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(FLINT)
        .args(["worker", "--driver-url", &cluster.executor_url()])
        .args(["--cores", "2", "--memory-mb", "512"])
        .arg("--work-dir")
        .arg(work.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--cluster-manager standalone"), "{stderr}");
}

/// Spark runs several workers on a host; with no `--worker-id` each must get an id of its
/// own (the default was `worker-<host>`, and the second was refused as "already
/// registered").
#[test]
fn two_workers_on_one_host_with_default_ids_both_register_and_get_executors() {
    let cluster = DevCluster::spawn(
        "driver",
        &[
            "--cluster-manager",
            "standalone",
            "--executor-cores",
            "1",
            "--executor-memory-mb",
            "256",
            "--initial-executors",
            "2",
        ],
        &[],
    );
    let work = tempfile::tempdir().unwrap();
    let _workers: Vec<Process> = ["one", "two"]
        .into_iter()
        .map(|name| {
            let log = std::fs::File::create(work.path().join(format!("{name}.log"))).unwrap();
            Process::spawn(
                std::process::Command::new(FLINT)
                    .args(["worker", "--driver-url", &cluster.executor_url()])
                    .args(["--cores", "1", "--memory-mb", "512"])
                    .arg("--work-dir")
                    .arg(work.path().join(name))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log),
            )
        })
        .collect();
    wait_until(
        Duration::from_secs(60),
        "two workers with an executor each",
        || {
            let views = workers(&cluster);
            views.len() == 2
                && views.iter().all(|w| w["state"] == "alive")
                && cluster.alive_executors() == 2
        },
    );
    let views = workers(&cluster);
    let ids: Vec<&str> = views.iter().map(|w| w["id"].as_str().unwrap()).collect();
    assert_ne!(ids[0], ids[1], "{views:?}");
    assert_eq!(views[0]["host"], views[1]["host"], "one host: {views:?}");
    for id in &ids {
        assert!(id.starts_with("worker-"), "{id}");
        assert_eq!(
            alive_on(&cluster, id).len(),
            1,
            "{id} has no executor: {views:?}"
        );
    }
    for name in ["one", "two"] {
        let log = std::fs::read_to_string(work.path().join(format!("{name}.log"))).unwrap();
        assert!(!log.contains("refused"), "worker {name}: {log}");
    }
}

#[test]
fn dynamic_allocation_scales_from_zero_to_six_with_the_work_and_back_to_zero() {
    let lan = Lan::create(3);
    let work = tempfile::tempdir().unwrap();
    let idle_timeout = Duration::from_secs(2);
    let idle_ms = idle_timeout.as_millis().to_string();
    let cluster = start_driver_with(
        &lan,
        &[
            "--min-executors",
            "0",
            "--max-executors",
            "6",
            "--executor-idle-timeout-ms",
            &idle_ms,
        ],
    );
    let _workers: Vec<Process> = lan
        .hosts
        .iter()
        .zip(["host-a", "host-b", "host-c"])
        .map(|(host, name)| start_worker_with(host, name, &cluster, work.path(), 2))
        .collect();
    wait_until(Duration::from_secs(30), "three workers", || {
        workers(&cluster)
            .iter()
            .filter(|w| w["state"] == "alive")
            .count()
            == 3
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        cluster.executors().len(),
        0,
        "nothing launched without work"
    );
    assert_eq!(cluster.get("/v1/executors").1["allocation"]["target"], 0);

    let module = cluster.upload(&guests().testkit);
    let submitted = Instant::now();
    let busy = cluster.submit(&serde_json::json!({
        "module": module, "args": ["sleep", "15"],
        "inputs": vec![serde_json::json!({"text": ""}); 2000],
    }));
    let inputs: Vec<String> = (0..2000).map(|i| format!("r{i}")).collect();
    let input_refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let echoed = cluster.submit(&spec(&module, &["echo"], &input_refs));
    let mut first = None;
    wait_until(Duration::from_secs(30), "six executors", || {
        let alive = cluster.alive_executors();
        if alive > 0 && first.is_none() {
            first = Some(submitted.elapsed());
        }
        alive == 6
    });
    let full = submitted.elapsed();
    eprintln!("standalone scale-up: first executor {first:?}, six after {full:?}");
    assert!(
        full < Duration::from_secs(5),
        "six executors after {full:?}"
    );

    let busy = cluster.wait_for_job(&busy, Duration::from_secs(120));
    assert_eq!(busy["state"], "succeeded", "{busy}");
    let echoed = cluster.wait_for_job(&echoed, Duration::from_secs(120));
    assert_eq!(echoed["state"], "succeeded", "{echoed}");
    let ended = Instant::now();
    wait_until(
        idle_timeout + Duration::from_secs(10),
        "back to zero",
        || cluster.alive_executors() == 0,
    );
    let down = ended.elapsed();
    eprintln!("standalone scale-down to 0 after the work ended: {down:?}");
    assert!(down < idle_timeout + Duration::from_secs(5), "{down:?}");
    // They were decommissioned: clean exits, none counted, none replaced. (A worker's
    // report of an exit can come after the executor's connection closed: `lost` until
    // then.)
    wait_until(Duration::from_secs(10), "every exit reported", || {
        cluster.executors().iter().all(|e| e["state"] == "exited")
    });
    let executors = cluster.executors();
    assert!(executors.len() >= 6, "{executors:?}");
    for e in &executors {
        assert_eq!(e["state"], "exited", "{e}");
        assert_eq!(e["exit_code"], 0, "{e}");
    }
    let a = cluster.get("/v1/executors").1["allocation"].clone();
    assert_eq!(a["target"], 0, "{a}");
    assert_eq!(a["recent_failures"], 0, "{a}");
    // Every result there once: each task's own input.
    let tasks = cluster.tasks(&echoed);
    assert_eq!(tasks.len(), 2000);
    for (task, input) in tasks.iter().zip(&inputs) {
        assert_eq!(task["attempts"], 1, "{task}");
        assert_eq!(
            task["result"]["sha256"],
            sha256_hex(input.as_bytes()),
            "{task}"
        );
    }
    for t in cluster.tasks(&busy) {
        assert_eq!(t["state"], "succeeded", "{t}");
    }
}

mod restart;
