//! What a real cluster does to the `kubernetes` cluster manager, against the simulated
//! API (`common/kube_sim.rs`: no real API server can run here): a namespace quota that
//! refuses pods for a while, pods pending longer than the launch timeout, a node lost
//! with its executor, a pod deleted while the watch is down, an API outage of over a
//! minute, a create that is never answered, RBAC refusing a permission until it is
//! granted, executors started before the driver is reachable, app ids long enough to
//! cut pod names, and two drivers of the same app id in one namespace.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{K8s, NS, driver_args};
use crate::common::kube_sim::{KubeSim, NODE};
use crate::common::{DevCluster, free_port, process_exists, wait_until};

impl K8s {
    fn allocation(&self) -> Value {
        self.driver.get("/v1/executors").1["allocation"].clone()
    }

    fn recent_failures(&self) -> u64 {
        self.allocation()["recent_failures"].as_u64().unwrap()
    }

    /// The statuses the API answered `verb` with, in order (0: never answered).
    fn answers(&self, verb: &str) -> Vec<u16> {
        (self.sim.requests().into_iter())
            .filter(|(v, _, _)| v == verb)
            .map(|(_, _, status)| status)
            .collect()
    }

    /// Waits for `executor` to have ended with `reason`; its description.
    fn ended_with(&self, executor: &str, reason: &str) -> String {
        wait_until(
            Duration::from_secs(60),
            &format!("{executor} {reason}"),
            || {
                (self.driver.executors().iter())
                    .any(|e| e["id"] == executor && e["exit_reason"] == reason)
            },
        );
        let e = self.executor(executor);
        e["exit_description"].as_str().unwrap().to_owned()
    }
}

/// A full ResourceQuota is back-pressure: the pods stay queued and are asked for again
/// (capped backoff), none counted as a failure, and they come once the quota has room;
/// one refused past `--executor-pending-timeout-ms` is given up on, not as a failure,
/// and says why.
#[test]
fn quota_refusals_for_a_while_are_back_pressure_not_failures() {
    let k = K8s::start_with(
        &[
            "--initial-executors",
            "2",
            "--executor-launch-timeout-ms",
            "2000",
            "--executor-pending-timeout-ms",
            "4000",
        ],
        // The driver's own pod fills it.
        |sim| sim.set_quota(Some(1)),
    );
    let why = k.ended_with("exec-1", "pending_timeout");
    assert!(
        why.contains("refused it for now") && why.contains("exceeded quota: pod-count"),
        "{why}"
    );
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    assert!(k.answers("create").iter().filter(|s| **s == 403).count() >= 4);
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
    assert!(k.allocation()["gave_up"].is_null(), "{}", k.allocation());

    k.sim.set_quota(None);
    wait_until(
        Duration::from_secs(60),
        "two executors once the quota has room",
        || k.driver.alive_executors() == 2,
    );
    eprintln!(
        "executors came {:?} after the quota was lifted",
        started.elapsed() - Duration::from_secs(3)
    );
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
    assert_eq!(k.created(), 2);
}

/// A pod the scheduler cannot place for longer than the launch timeout (stand-in for the
/// 3 minutes a real cluster's autoscaler may take to bring a node: 2 s of launch
/// timeout, 6 s pending) is not a failure: the same pod runs once it is placed.
#[test]
fn a_pod_pending_for_longer_than_the_launch_timeout_is_no_failure() {
    let k = K8s::start_with(
        &[
            "--initial-executors",
            "1",
            "--executor-launch-timeout-ms",
            "2000",
        ],
        |sim| sim.set_unschedulable(Some("0/1 nodes are available: 1 Insufficient cpu.")),
    );
    wait_until(Duration::from_secs(30), "the pod created", || {
        k.created() == 1
    });
    std::thread::sleep(Duration::from_secs(6));
    let e = k.executor("exec-1");
    assert!(e["exit_reason"].is_null(), "{e}");
    k.sim.set_unschedulable(None);
    wait_until(Duration::from_secs(60), "the executor once placed", || {
        k.driver.alive_executors() == 1
    });
    assert_eq!(k.executor("exec-1")["state"], "alive");
    assert_eq!(k.created(), 1, "the same pod");
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
}

/// A node lost with its executor (its process silent, nothing more reported of its pod):
/// the driver declares the executor lost, releases it (its pod force-deleted: a graceful
/// deletion would leave it Terminating for good), and launches another on a node that
/// is left; no failure counted, and no event about the old pod counted again.
#[test]
fn an_executor_on_a_lost_node_is_released_its_pod_deleted_and_replaced() {
    let k = K8s::start(&["--initial-executors", "1", "--executor-timeout-ms", "2000"]);
    wait_until(Duration::from_secs(30), "an executor", || {
        k.driver.alive_executors() == 1
    });
    let pod = k.pod_of("exec-1");
    let pid = k.sim.pid(NS, &pod).unwrap();
    k.sim.add_node("sim-node-2");
    k.sim.lose_node(NODE);
    wait_until(Duration::from_secs(30), "its pod gone from the API", || {
        k.sim.pod(NS, &pod).is_none()
    });
    wait_until(Duration::from_secs(60), "another executor", || {
        k.driver.alive_executors() == 1 && k.executor("exec-2")["state"] == "alive"
    });
    assert_eq!(k.executor("exec-2")["worker"], "sim-node-2");
    wait_until(Duration::from_secs(10), "the old process gone", || {
        !process_exists(pid)
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(k.created(), 2, "one replacement");
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
    assert_eq!(k.driver.alive_executors(), 1);
}

/// The API away (its port refusing connections) while someone deletes a pod, and its
/// history compacted meanwhile: the watch, back, lists again, finds the pod gone, and
/// exactly one executor replaces it.
#[test]
fn a_pod_deleted_while_the_watch_is_down_is_replaced_exactly_once() {
    let k = K8s::start(&["--initial-executors", "2"]);
    wait_until(Duration::from_secs(30), "two executors", || {
        k.driver.alive_executors() == 2
    });
    let pod = k.pod_of("exec-1");
    k.sim.go_down();
    k.sim.delete(NS, &pod);
    wait_until(Duration::from_secs(30), "the pod deleted", || {
        k.sim.pod(NS, &pod).is_none()
    });
    k.sim.expire_history();
    std::thread::sleep(Duration::from_secs(2));
    k.sim.come_back();
    wait_until(Duration::from_secs(90), "a replacement", || {
        k.created() == 3 && k.driver.alive_executors() == 2
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(k.created(), 3, "exactly one replacement");
    assert_eq!(k.executor_pods().len(), 2);
    assert_eq!(k.driver.alive_executors(), 2);
    let lost = k.executor("exec-1");
    assert_eq!(lost["exit_reason"], "lost", "{lost}");
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
}

/// An API outage longer than the old deleter's patience (8 tries, about 62 s: so this
/// test has to last a real minute and more; no flag shortens a backoff): the pod of an
/// executor killed during it is deleted once the API is back, not left running.
#[test]
fn an_api_outage_of_over_a_minute_leaks_no_pod() {
    let k = K8s::start(&["--initial-executors", "2"]);
    wait_until(Duration::from_secs(30), "two executors", || {
        k.driver.alive_executors() == 2
    });
    let pod = k.pod_of("exec-1");
    k.sim.go_down();
    let killed = k
        .driver
        .client
        .delete(k.driver.url("/v1/executors/exec-1"))
        .send()
        .unwrap();
    assert!(killed.status().is_success(), "{killed:?}");
    std::thread::sleep(Duration::from_secs(70));
    assert!(k.sim.pod(NS, &pod).is_some(), "deleted during the outage?");
    k.sim.come_back();
    let back = Instant::now();
    wait_until(
        Duration::from_secs(30),
        "the killed executor's pod deleted",
        || k.sim.pod(NS, &pod).is_none(),
    );
    eprintln!("deleted {:?} after the API came back", back.elapsed());
    wait_until(Duration::from_secs(60), "a replacement", || {
        k.driver.alive_executors() == 2 && k.created() == 3
    });
    assert_eq!(k.executor_pods().len(), 2, "no pod left over");
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
}

/// A creation the API server reads and never answers (a half-open connection), and one
/// it does whose answer is lost: neither holds up the rest of its batch nor its executor
/// for good. The client gives up on both after its read timeout (30 s) and the pods are
/// asked for again: one is created then, the other's 409 finds this executor's own pod
/// there (its labels: app, driver instance, executor id) and takes it. No failure.
#[test]
fn creates_never_answered_or_whose_answer_is_lost_are_retried_and_taken_as_done() {
    let k = K8s::start_with(&["--initial-executors", "3"], |sim| {
        sim.hang_next("create", 1);
        sim.lose_next_answer("create", 1);
    });
    wait_until(Duration::from_secs(30), "the third executor", || {
        k.driver.alive_executors() >= 1
    });
    let hung = Instant::now();
    wait_until(
        Duration::from_secs(60),
        "the other two, asked for again",
        || k.driver.alive_executors() == 3,
    );
    eprintln!("the two asked for again ran {:?} later", hung.elapsed());
    let creates = k.answers("create");
    let count = |status: u16| creates.iter().filter(|s| **s == status).count();
    assert_eq!((count(0), count(409), count(201)), (1, 1, 3), "{creates:?}");
    assert_eq!(k.created(), 3, "{creates:?}");
    assert_eq!(k.executor_pods().len(), 3);
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
}

/// RBAC without `create pods` (an admin's mistake in the Role): no failure, the driver
/// keeps asking (capped backoff), the executor's end names the permission, and once it
/// is granted again the executors come, the driver not restarted.
#[test]
fn an_rbac_refusal_is_retried_until_the_permission_is_granted() {
    let mut k = K8s::start_with(
        &[
            "--initial-executors",
            "1",
            "--executor-launch-timeout-ms",
            "1000",
            "--executor-pending-timeout-ms",
            "3000",
        ],
        |sim| sim.revoke("create", "pods"),
    );
    k.denials_expected = true;
    let why = k.ended_with("exec-1", "pending_timeout");
    assert!(
        why.contains("cannot create resource \"pods\"") && why.contains("needs `create pods`"),
        "{why}"
    );
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
    k.sim.restore_rbac();
    wait_until(Duration::from_secs(60), "an executor once granted", || {
        k.driver.alive_executors() == 1
    });
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
    assert!(!k.sim.denials().is_empty());
}

/// A pod can start before the driver is reachable (its Service's name not resolving
/// yet, the driver restarting): the executor keeps dialling for 60 s instead of its
/// own 10 s default, and registers once the driver answers, no failure counted. Here
/// the address the pods dial is a forwarder to the driver that starts 15 s late.
#[test]
fn an_executor_started_before_the_driver_is_reachable_waits_for_it() {
    let port = free_port();
    let url = format!("flint://127.0.0.1:{port}");
    let k = K8s::start(&["--initial-executors", "1", "--k8s-driver-url", &url]);
    std::thread::sleep(Duration::from_secs(15));
    let target = k.driver.executor_addr.clone();
    forward(TcpListener::bind(("127.0.0.1", port)).unwrap(), target);
    wait_until(Duration::from_secs(60), "the executor registered", || {
        k.driver.alive_executors() == 1
    });
    assert_eq!(k.executor("exec-1")["state"], "alive");
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
    assert_eq!(k.created(), 1);
}

/// Copies each connection to `listener` both ways to `target`, in threads, for good.
fn forward(listener: TcpListener, target: String) {
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&target) else {
                continue;
            };
            let (mut c1, mut s1) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut c2, mut s2) = (client, server);
            std::thread::spawn(move || drop(std::io::copy(&mut c1, &mut s1)));
            std::thread::spawn(move || drop(std::io::copy(&mut s2, &mut c2)));
        }
    });
}

/// The headless Service executors dial publishes the driver's address before its pod
/// is ready (a restarting driver replays its job store first): else the name does not
/// resolve, and executors started meanwhile give up (Spark's SPARK-32975).
#[test]
fn the_driver_service_publishes_its_address_before_the_driver_is_ready() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/kubernetes/base/service.yaml"
    );
    let service: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert_eq!(
        service["spec"]["publishNotReadyAddresses"], true,
        "{service}"
    );
}

/// Pod names are DNS labels of at most 63 bytes: an app id of 63 characters and
/// executors `exec-99`, `exec-100` and `exec-101` (the driver's next id seeded) get
/// three pods, not one name three times.
#[test]
fn pod_names_are_unique_for_a_63_character_app_id_and_three_digit_executor_ids() {
    let app = format!("a{}", "b".repeat(62));
    let data_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(data_dir.path().join("work")).unwrap();
    std::fs::write(data_dir.path().join("work/next-executor-id"), "99\n").unwrap();
    let k = K8s::start_full(
        ["127.0.0.1:0", "127.0.0.1:0"],
        Some(&app),
        data_dir,
        &["--initial-executors", "3"],
        |_| {},
    );
    wait_until(Duration::from_secs(60), "three executors", || {
        k.driver.alive_executors() == 3
    });
    let names: Vec<String> = ["exec-99", "exec-100", "exec-101"]
        .iter()
        .map(|e| k.pod_of(e))
        .collect();
    let unique: std::collections::BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| n.len() <= 63), "{names:?}");
    assert_eq!(k.executor_pods().len(), 3);
    assert_eq!(k.recent_failures(), 0, "{}", k.allocation());
}

/// Two drivers with the default app id in one namespace (each its own data dir): each
/// creates, watches and deletes only its own pods. A stop for good of the second
/// deletes its pods and none of the first's.
#[test]
fn two_drivers_with_the_default_app_id_in_one_namespace_leave_each_others_pods_alone() {
    let a = K8s::start_full(
        ["127.0.0.1:0", "127.0.0.1:0"],
        None,
        tempfile::tempdir().unwrap(),
        &["--initial-executors", "2"],
        |_| {},
    );
    wait_until(
        Duration::from_secs(30),
        "the first driver's executors",
        || a.driver.alive_executors() == 2,
    );
    let before = pod_uids(&a.sim);
    let mut args = driver_args(&a.kubeconfig(), ["127.0.0.1:0", "127.0.0.1:0"], None);
    args.extend(["--initial-executors", "2", "--stop-executors-on-exit"].map(str::to_owned));
    let mut b = DevCluster::driver(&args);
    wait_until(
        Duration::from_secs(30),
        "the second driver's executors",
        || b.alive_executors() == 2,
    );
    std::thread::sleep(Duration::from_secs(2));
    let both = pod_uids(&a.sim);
    assert_eq!(both.len(), 4, "{both:?}");
    for (name, uid) in &before {
        assert_eq!(
            both.get(name),
            Some(uid),
            "the first driver's pod {name} untouched"
        );
    }
    assert_eq!(a.driver.alive_executors(), 2);
    let status = b.stop();
    assert!(status.success(), "{status:?}");
    assert_eq!(
        pod_uids(&a.sim),
        before,
        "only the second driver's pods deleted"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(a.driver.alive_executors(), 2);
    assert_eq!(a.recent_failures(), 0, "{}", a.allocation());
}

/// The executor pods of the default app id, name to uid.
fn pod_uids(sim: &KubeSim) -> BTreeMap<String, String> {
    (sim.pods(NS).iter())
        .filter(|p| p["metadata"]["labels"]["flint.dev/app"] == "flint")
        .map(|p| {
            let name = p["metadata"]["name"].as_str().unwrap().to_owned();
            (name, p["metadata"]["uid"].as_str().unwrap().to_owned())
        })
        .collect()
}
