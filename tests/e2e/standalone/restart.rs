//! The driver's restart under the `standalone` cluster manager: workers on two hosts
//! (network namespaces) keep their executors while the driver is SIGKILLed mid-job and
//! started again on its data dir and ports; they register again listing them, and the
//! new driver adopts them as its own: the same executor processes, none launched again,
//! every task run exactly once with its own result.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use super::{lan_driver_flags, start_worker_with, workers};
use crate::common::netns::Lan;
use crate::common::{DevCluster, Process, free_port, guests, process_exists, wait_until};
use crate::kubernetes::restart::warm_up;

const EXECUTORS: usize = 4;
const TASKS: usize = 8;

/// The live executors: id to (pid, worker).
fn alive(cluster: &DevCluster) -> BTreeMap<String, (u64, String)> {
    (cluster.executors().iter())
        .filter(|e| e["state"] == "alive")
        .map(|e| {
            let id = e["id"].as_str().unwrap().to_owned();
            let worker = e["worker"].as_str().unwrap_or_default().to_owned();
            (id, (e["pid"].as_u64().unwrap(), worker))
        })
        .collect()
}

#[test]
fn a_driver_killed_mid_job_adopts_its_workers_executors_and_runs_each_task_once() {
    let lan = Lan::create(2);
    let work = tempfile::tempdir().unwrap();
    let (http, executor_port) = (free_port(), free_port());
    let (listen, executor_listen) = (
        format!("{}:{http}", lan.gateway),
        format!("{}:{executor_port}", lan.gateway),
    );
    let mut args = lan_driver_flags(&listen, &executor_listen);
    args.extend(["--initial-executors", "4"]);
    let mut cluster = DevCluster::spawn("driver", &args, &[]);
    let workers_running: Vec<Process> = (lan.hosts.iter())
        .zip(["host-a", "host-b"])
        .map(|(host, name)| start_worker_with(host, name, &cluster, work.path(), 2))
        .collect();
    wait_until(Duration::from_secs(60), "four executors", || {
        cluster.alive_executors() == EXECUTORS
    });
    let before = alive(&cluster);
    let module = cluster.upload(&guests().testkit);
    warm_up(&cluster, &module, EXECUTORS);
    let inputs: Vec<String> = (0..TASKS).map(|i| format!("task-{i}")).collect();
    let job = cluster.submit(&json!({
        "module": module, "args": ["after", "3000", "echo"],
        "inputs": inputs.iter().map(|t| json!({"text": t})).collect::<Vec<_>>(),
    }));
    wait_until(
        Duration::from_secs(30),
        "the first four tasks running",
        || cluster.get(&format!("/v1/jobs/{job}")).1["counts"]["running"] == EXECUTORS,
    );

    cluster.child.sigkill();
    let DevCluster { data_dir, .. } = cluster;
    let cluster = DevCluster::driver_in(&args, &[], data_dir);
    let ended = cluster.wait_for_job(&job, Duration::from_secs(60));
    assert_eq!(ended["state"], "succeeded", "{ended}");
    for (index, task) in cluster.tasks(&ended).iter().enumerate() {
        assert_eq!(task["attempts"], 1, "{task}");
        let result = cluster.result(&ended, index as u64);
        assert_eq!(result, inputs[index].as_bytes(), "{task}");
    }
    // The same executors, processes and workers: adopted, none launched again.
    wait_until(
        Duration::from_secs(10),
        "the workers to report them",
        || alive(&cluster) == before,
    );
    assert_eq!(
        cluster.executors().len(),
        EXECUTORS,
        "{:?}",
        cluster.executors()
    );
    for (pid, _) in before.values() {
        assert!(process_exists(*pid as u32), "executor {pid} is gone");
    }
    for w in workers(&cluster) {
        assert_eq!(w["state"], "alive", "{w}");
        assert_eq!(w["free_cores"], 0, "its executors hold its room: {w}");
        assert_eq!(w["executors"].as_array().unwrap().len(), 2, "{w}");
    }
    for e in cluster.executors() {
        assert_eq!(e["cluster_manager"], "standalone", "{e}");
    }
    // The executors' own counts (in heartbeats, a second apart at most).
    let ran = || -> u64 {
        (cluster.executors().iter())
            .map(|e| e["tasks_completed"].as_u64().unwrap())
            .sum()
    };
    let expected = (TASKS + EXECUTORS) as u64;
    wait_until(Duration::from_secs(10), "the executors' counts", || {
        ran() >= expected
    });
    assert_eq!(ran(), expected, "no attempt ran twice");
    let allocation = cluster.get("/v1/executors").1["allocation"].clone();
    assert_eq!(allocation["target"], EXECUTORS, "{allocation}");
    assert_eq!(allocation["recent_failures"], 0, "{allocation}");
    drop(workers_running);
}
