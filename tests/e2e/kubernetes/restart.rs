//! The driver's restart under the `kubernetes` cluster manager, against the simulated API
//! (`common/kube_sim.rs`: no real API server can run here): a driver rolled out (SIGTERM,
//! its pod replaced) or crashed (SIGKILL) and started again on its data dir finds its
//! executor pods still running and adopts them: the same pods (names, uids, processes),
//! none created, the executors registered again, and every task run exactly once.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::{K8s, NS, add_driver_pod};
use crate::common::{Api, DevCluster, free_port, guests, wait_until};

#[derive(Clone, Copy, Debug)]
enum Stop {
    /// A rollout: SIGTERM, the driver's pod deleted and made again (another uid).
    Rollout,
    /// A crash: SIGKILL, the container restarted in the same pod.
    Crash,
}

const EXECUTORS: usize = 3;
const TASKS: usize = 6;

impl K8s {
    /// A driver on fixed ports (executors dial the same address after a restart).
    fn restartable(allocation: &[&str]) -> K8s {
        let (http, executors) = (free_port(), free_port());
        let listen = [
            format!("127.0.0.1:{http}"),
            format!("127.0.0.1:{executors}"),
        ];
        K8s::start_on([&listen[0], &listen[1]], allocation, |_| {})
    }

    /// Stops the driver as `stop` says and starts it again on its data dir and flags.
    fn restart(mut self, stop: Stop) -> K8s {
        match stop {
            Stop::Rollout => {
                let status = self.driver.stop();
                assert!(status.success(), "{status:?}");
                self.sim.delete(NS, "flint-driver-0");
                add_driver_pod(&self.sim);
            }
            Stop::Crash => self.driver.child.sigkill(),
        }
        let data_dir = std::mem::replace(&mut self.driver.data_dir, tempfile::tempdir().unwrap());
        let flags: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.driver = DevCluster::driver_in(&flags, &[], data_dir);
        self
    }

    /// The executor pods: name to (uid, pid of its process).
    fn pod_identities(&self) -> BTreeMap<String, (String, Option<u32>)> {
        (self.executor_pods().iter())
            .map(|p| {
                let name = p["metadata"]["name"].as_str().unwrap().to_owned();
                let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
                let pid = self.sim.pid(NS, &name);
                (name, (uid, pid))
            })
            .collect()
    }

    /// Attempts the live executors have ended since they started (their heartbeats).
    fn attempts_ended(&self) -> u64 {
        (self.driver.executors().iter())
            .filter(|e| e["state"] == "alive")
            .map(|e| e["tasks_completed"].as_u64().unwrap())
            .sum()
    }
}

fn a_restarted_driver_adopts_its_executor_pods(stop: Stop) {
    let k = K8s::restartable(&["--initial-executors", "3"]);
    wait_until(Duration::from_secs(60), "three executors", || {
        k.driver.alive_executors() == EXECUTORS
    });
    let module = k.driver.upload(&guests().testkit);
    warm_up(&k.driver, &module, EXECUTORS);
    let inputs: Vec<String> = (0..TASKS).map(|i| format!("task-{i}")).collect();
    let job = k.driver.submit(&json!({
        "module": module, "args": ["after", "2500", "echo"],
        "inputs": inputs.iter().map(|t| json!({"text": t})).collect::<Vec<_>>(),
    }));
    wait_until(
        Duration::from_secs(30),
        "the first three tasks running",
        || k.driver.get(&format!("/v1/jobs/{job}")).1["counts"]["running"] == EXECUTORS,
    );
    let pods = k.pod_identities();
    assert_eq!(pods.len(), EXECUTORS, "{pods:?}");
    assert!(pods.values().all(|(_, pid)| pid.is_some()), "{pods:?}");

    let k = k.restart(stop);
    wait_until(Duration::from_secs(30), "the executors back", || {
        k.driver.alive_executors() == EXECUTORS
    });
    let ended = k.driver.wait_for_job(&job, Duration::from_secs(60));
    assert_eq!(ended["state"], "succeeded", "{ended}");
    // The same pods and processes: none deleted, none created.
    assert_eq!(k.pod_identities(), pods, "{stop:?}");
    assert_eq!(k.created(), EXECUTORS, "no pod created after the restart");
    let ids: Vec<String> = (k.driver.executors().iter())
        .filter(|e| e["state"] == "alive")
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        ids,
        ["exec-1", "exec-2", "exec-3"],
        "{:?}",
        k.driver.executors()
    );
    for e in k.driver.executors() {
        assert_eq!(e["cluster_manager"], "kubernetes", "{e}");
    }
    // Every task ran once, where it was, and its result is its own input.
    assert_each_task_ran_once(&k, &ended, &inputs);
    // The executors' own counts (in heartbeats, a second apart at most).
    let expected = (TASKS + EXECUTORS) as u64;
    wait_until(Duration::from_secs(10), "the executors' counts", || {
        k.attempts_ended() >= expected
    });
    assert_eq!(k.attempts_ended(), expected, "no attempt ran twice");
    let allocation = k.driver.get("/v1/executors").1["allocation"].clone();
    assert_eq!(allocation["target"], EXECUTORS, "{allocation}");
    assert_eq!(allocation["recent_failures"], 0, "{allocation}");
}

/// One short task on each of the `executors` executors (one core each), so that each
/// has the module compiled before the job the driver dies under: an attempt whose
/// module fetch from the driver is cut by the driver's death fails as a host error on
/// the executor, which is not what these tests are about.
pub(crate) fn warm_up(api: &Api, module: &str, executors: usize) {
    let inputs = vec![json!({"text": ""}); executors];
    let job =
        api.submit(&json!({"module": module, "args": ["after", "500", "echo"], "inputs": inputs}));
    let ended = api.wait_for_job(&job, Duration::from_secs(60));
    assert_eq!(ended["state"], "succeeded", "{ended}");
    wait_until(
        Duration::from_secs(10),
        "each executor to have run one",
        || {
            (api.executors().iter())
                .filter(|e| e["state"] == "alive")
                .all(|e| e["tasks_completed"] == 1)
        },
    );
}

fn assert_each_task_ran_once(k: &K8s, job: &Value, inputs: &[String]) {
    for (index, task) in k.driver.tasks(job).iter().enumerate() {
        assert_eq!(task["attempts"], 1, "{task}");
        assert_eq!(
            k.driver.result(job, index as u64),
            inputs[index].as_bytes(),
            "{task}"
        );
    }
}

#[test]
fn a_driver_rolled_out_adopts_its_executor_pods_and_runs_each_task_once() {
    a_restarted_driver_adopts_its_executor_pods(Stop::Rollout);
}

#[test]
fn a_driver_killed_and_restarted_adopts_its_executor_pods_and_runs_each_task_once() {
    a_restarted_driver_adopts_its_executor_pods(Stop::Crash);
}
