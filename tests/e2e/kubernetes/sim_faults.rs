//! The simulator's own tests of what a real cluster does to its clients
//! (`common/kube_sim.rs`): RBAC from the manifests, a pod quota, an outage, hung
//! connections and a lost node, over plain HTTP with `/bin/sh` as every container.

use std::time::Duration;

use serde_json::json;

use super::{NS, client_as, create, phase, pods_url, send, sh_pod, sh_sim};
use crate::common::kube_sim::{self, NODE};
use crate::common::{process_exists, wait_until};

const DRIVER: &str = "system:serviceaccount:flint:flint-driver";

#[test]
fn kube_sim_enforces_the_manifests_rbac_and_a_pod_quota() {
    let (sim, client, _root) = sh_sim();
    assert_eq!(
        create(&sim, &client, &sh_pod("one", "exec sleep 30")).0,
        201
    );
    // What deploy/kubernetes/base/rbac.yaml does not grant the driver: another
    // resource, another namespace, a verb on the collection.
    let secret = format!("{}/api/v1/namespaces/{NS}/secrets/s", sim.url());
    let (status, _, body) = send(client.get(secret));
    assert_eq!(
        (status, &body["reason"]),
        (403, &json!("Forbidden")),
        "{body}"
    );
    assert_eq!(
        body["message"],
        format!(
            "secrets \"s\" is forbidden: User \"{DRIVER}\" cannot get resource \"secrets\" \
             in API group \"\" in the namespace \"{NS}\""
        )
    );
    let other = format!("{}/api/v1/namespaces/other/pods", sim.url());
    assert_eq!(send(client.get(other)).0, 403);
    let (status, _, body) = send(client.delete(pods_url(&sim)));
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("cannot deletecollection resource \"pods\""),
        "{body}"
    );
    // No token, no user.
    let anonymous = reqwest::blocking::Client::new();
    assert_eq!(send(anonymous.get(pods_url(&sim))).0, 401);
    // An admin editing the Role takes `delete` away, then gives it back.
    sim.revoke("delete", "pods");
    let one = format!("{}/one", pods_url(&sim));
    let (status, _, body) = send(client.delete(&one).json(&json!({"gracePeriodSeconds": 0})));
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["message"],
        format!(
            "pods \"one\" is forbidden: User \"{DRIVER}\" cannot delete resource \"pods\" in \
             API group \"\" in the namespace \"{NS}\""
        )
    );
    assert_eq!(sim.denials().len(), 4, "{:?}", sim.denials());
    assert_eq!(
        send(client_as(kube_sim::ADMIN_TOKEN).get(pods_url(&sim))).0,
        200
    );
    sim.restore_rbac();

    // A quota of 1 pod, which `one` holds: the next is refused, before its name is
    // found taken; one that ends frees its place.
    sim.set_quota(Some(1));
    let (status, body) = create(&sim, &client, &sh_pod("two", "exec sleep 30"));
    assert_eq!(
        (status, &body["reason"]),
        (403, &json!("Forbidden")),
        "{body}"
    );
    assert_eq!(
        body["message"],
        "pods \"two\" is forbidden: exceeded quota: pod-count, requested: pods=1, used: \
         pods=1, limited: pods=1"
    );
    assert_eq!(create(&sim, &client, &sh_pod("one", "true")).0, 403);
    let (status, _, _) = send(client.delete(&one).json(&json!({"gracePeriodSeconds": 0})));
    assert_eq!(status, 200);
    assert_eq!(
        create(&sim, &client, &sh_pod("two", "exec sleep 30")).0,
        201
    );
    sim.set_quota(None);
    assert_eq!(
        create(&sim, &client, &sh_pod("three", "exec sleep 30")).0,
        201
    );
}

#[test]
fn kube_sim_goes_down_comes_back_and_hangs_requests() {
    let (sim, client, _root) = sh_sim();
    let quick = || {
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let bearer = format!("Bearer {}", kube_sim::TOKEN);
    let get = |client: &reqwest::blocking::Client| {
        client
            .get(pods_url(&sim))
            .header("authorization", &bearer)
            .send()
    };
    // An open watch is cut by the outage, and the port refuses connections.
    let watch = format!("{}?watch=true&timeoutSeconds=60", pods_url(&sim));
    let response = client.get(watch).send().unwrap();
    let reader = std::thread::spawn(move || super::read_watch(response, |_| false));
    std::thread::sleep(Duration::from_millis(200));
    sim.go_down();
    reader.join().unwrap();
    let refused = get(&quick()).unwrap_err();
    assert!(refused.is_connect(), "{refused:?}");
    sim.come_back();
    wait_until(Duration::from_secs(10), "the port back", || {
        get(&quick()).is_ok_and(|r| r.status() == 200)
    });

    // A request read and never answered, once; then all of them, for a while.
    sim.hang_next("list", 1);
    assert!(get(&quick()).unwrap_err().is_timeout());
    assert_eq!(get(&quick()).unwrap().status(), 200);
    sim.set_hanging(true);
    assert!(get(&quick()).unwrap_err().is_timeout());
    sim.set_hanging(false);
    assert_eq!(get(&quick()).unwrap().status(), 200);
    let hung = (sim.requests().iter())
        .filter(|(verb, _, status)| verb == "list" && *status == 0)
        .count();
    assert_eq!(hung, 2);
}

#[test]
fn kube_sim_loses_a_node_leaving_its_pods_silent_and_their_graceful_deletions_terminating() {
    let (sim, client, _root) = sh_sim();
    for name in ["stays", "forced"] {
        assert_eq!(create(&sim, &client, &sh_pod(name, "exec sleep 60")).0, 201);
    }
    wait_until(Duration::from_secs(10), "both running", || {
        phase(&sim, "stays") == "Running" && phase(&sim, "forced") == "Running"
    });
    let pid = sim.pid(NS, "stays").unwrap();
    sim.add_node("sim-node-2");
    sim.lose_node(NODE);
    wait_until(Duration::from_secs(10), "its process stopped", || {
        process_state(pid) == Some('T')
    });
    let pod = sim.pod(NS, "stays").unwrap();
    let ready = pod["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready");
    assert_eq!(ready.unwrap()["status"], "False");
    assert_eq!(
        phase(&sim, "stays"),
        "Running",
        "no kubelet to say otherwise"
    );

    // Graceful: Terminating for good. Forced: gone at once.
    let (status, _, body) = send(
        client
            .delete(format!("{}/stays", pods_url(&sim)))
            .json(&json!({"gracePeriodSeconds": 1})),
    );
    assert_eq!(status, 200, "{body}");
    std::thread::sleep(Duration::from_secs(2));
    let stays = sim.pod(NS, "stays").expect("still there");
    assert!(
        stays["metadata"]["deletionTimestamp"].is_string(),
        "{stays}"
    );
    assert!(process_exists(pid));
    let (status, _, _) = send(
        client
            .delete(format!("{}/forced", pods_url(&sim)))
            .json(&json!({"gracePeriodSeconds": 0})),
    );
    assert_eq!(status, 200);
    assert!(sim.pod(NS, "forced").is_none());

    // New pods go to the node that is left.
    assert_eq!(
        create(&sim, &client, &sh_pod("new", "exec sleep 60")).0,
        201
    );
    wait_until(Duration::from_secs(10), "the new pod running", || {
        phase(&sim, "new") == "Running"
    });
    assert_eq!(
        sim.pod(NS, "new").unwrap()["spec"]["nodeName"],
        "sim-node-2"
    );
    let (status, _, _) = send(
        client
            .delete(format!("{}/stays", pods_url(&sim)))
            .json(&json!({"gracePeriodSeconds": 0})),
    );
    assert_eq!(status, 200);
    wait_until(Duration::from_secs(10), "its process killed", || {
        !process_exists(pid)
    });
}

/// The state letter in /proc/PID/stat (`T`: stopped).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}
