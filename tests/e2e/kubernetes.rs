//! End to end: the `kubernetes` cluster manager against a simulated Kubernetes API server
//! (tests/e2e/common/kube_sim.rs: a real one cannot run here). First the simulator's own
//! tests, over plain HTTP, with `/bin/sh` as what every container runs (its faults in
//! `kubernetes/sim_faults.rs`); then the driver (`flint driver --cluster-manager
//! kubernetes --kubeconfig ...`, a real process) creating executor pods that the
//! simulator runs as real `flint executor` processes: scaling with the work, evictions,
//! OOM kills, pods pending past the pending timeout, dropped watches and 410s, 429s, and
//! the driver's stop and death; its restart, which adopts the pods it left running, in
//! `kubernetes/restart.rs`; what a real cluster does to it (quotas, lost nodes, API
//! outages, hung connections, RBAC, names, two drivers) in `kubernetes/realism.rs`.
//! Every driver test runs under the RBAC the manifests in deploy/kubernetes give the
//! driver, and fails if the driver was refused anything by it.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::kube_sim::{self, KubeSim};
use crate::common::{DevCluster, FLINT, guests, process_exists, signal, spec, wait_until};

const NS: &str = "flint";

/// A simulator whose containers run `/bin/sh` with their pod's args, a client for it,
/// and the dir holding the pods' work dirs (kept as long as the simulator).
fn sh_sim() -> (KubeSim, reqwest::blocking::Client, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let sim = KubeSim::start("/bin/sh".as_ref(), root.path());
    (sim, client_as(kube_sim::TOKEN), root)
}

/// A client presenting `token` (the driver's ServiceAccount's, or the admin's).
fn client_as(token: &str) -> reqwest::blocking::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let bearer = format!("Bearer {token}");
    headers.insert(reqwest::header::AUTHORIZATION, bearer.parse().unwrap());
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .default_headers(headers)
        .build()
        .unwrap()
}

fn pods_url(sim: &KubeSim) -> String {
    format!("{}/api/v1/namespaces/{NS}/pods", sim.url())
}

/// A pod whose container runs `sh -c script`.
fn sh_pod(name: &str, script: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "selftest"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "sim/sh", "args": ["-c", script]}],
        },
    })
}

/// Status, headers and JSON body.
fn send(request: reqwest::blocking::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = request.send().unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.json().unwrap_or(Value::Null))
}

fn create(sim: &KubeSim, client: &reqwest::blocking::Client, pod: &Value) -> (u16, Value) {
    let (status, _, body) = send(client.post(pods_url(sim)).json(pod));
    (status, body)
}

/// A watch's events until `last` holds for one, or the stream ends (or breaks).
fn read_watch(response: reqwest::blocking::Response, last: impl Fn(&Value) -> bool) -> Vec<Value> {
    assert_eq!(response.status().as_u16(), 200);
    let mut events = Vec::new();
    for line in BufReader::new(response).lines() {
        let Ok(line) = line else { break };
        let event: Value = serde_json::from_str(&line).unwrap();
        let done = last(&event);
        events.push(event);
        if done {
            break;
        }
    }
    events
}

fn phase(sim: &KubeSim, name: &str) -> String {
    sim.pod(NS, name).map_or_else(String::new, |p| {
        p["status"]["phase"].as_str().unwrap_or_default().to_owned()
    })
}

fn container_state(sim: &KubeSim, name: &str) -> Value {
    sim.pod(NS, name).unwrap()["status"]["containerStatuses"][0]["state"].clone()
}

#[test]
fn kube_sim_runs_lists_watches_and_deletes_a_pod() {
    let (sim, client, _root) = sh_sim();
    let (status, _, list) = send(client.get(pods_url(&sim)));
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"], json!([]));
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    let url = format!(
        "{}?watch=true&resourceVersion={rv}&timeoutSeconds=60&labelSelector=app%3Dselftest",
        pods_url(&sim)
    );
    let watcher = std::thread::spawn({
        let client = client.clone();
        move || read_watch(client.get(url).send().unwrap(), |e| e["type"] == "DELETED")
    });
    // Not needed for correctness (the watch replays from the list's resourceVersion,
    // which is never "0", i.e. "any"), but it keeps the test reading a live watch.
    wait_until(Duration::from_secs(10), "the watch open", || {
        sim.requests().iter().any(|(verb, _, _)| verb == "watch")
    });

    let (status, created) = create(&sim, &client, &sh_pod("sleeper", "exec sleep 30"));
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["status"]["phase"], "Pending");
    assert_eq!(created["metadata"]["namespace"], NS);
    assert!(
        created["metadata"]["uid"].as_str().unwrap().len() == 36,
        "{created}"
    );
    wait_until(Duration::from_secs(10), "the pod running", || {
        phase(&sim, "sleeper") == "Running"
    });
    let pid = sim.pid(NS, "sleeper").unwrap();
    assert!(process_exists(pid));
    let pod = sim.pod(NS, "sleeper").unwrap();
    assert_eq!(pod["spec"]["nodeName"], "sim-node-1");
    assert_eq!(pod["status"]["podIP"], "127.0.0.1");
    assert_eq!(pod["status"]["containerStatuses"][0]["ready"], true);

    let selected = |selector: &str| {
        let url = format!("{}?labelSelector={selector}", pods_url(&sim));
        send(client.get(url)).2["items"].as_array().unwrap().len()
    };
    assert_eq!(selected("app%3Dselftest"), 1);
    assert_eq!(selected("app%3Dother"), 0);
    assert_eq!(selected("app%21%3Dother"), 1);
    let (status, _, got) = send(client.get(format!("{}/sleeper", pods_url(&sim))));
    assert_eq!((status, &got["metadata"]["name"]), (200, &json!("sleeper")));

    // Graceful: SIGTERM ends `sleep` at once, well inside the grace.
    let (status, _, deleted) = send(
        client
            .delete(format!("{}/sleeper", pods_url(&sim)))
            .json(&json!({"gracePeriodSeconds": 5, "propagationPolicy": "Background"})),
    );
    assert_eq!(status, 200, "{deleted}");
    assert!(
        deleted["metadata"]["deletionTimestamp"].is_string(),
        "{deleted}"
    );
    let events = watcher.join().unwrap();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"ADDED"), "{types:?}");
    assert_eq!(types.last(), Some(&"DELETED"), "{types:?}");
    assert!(
        types[1..types.len() - 1].iter().all(|t| *t == "MODIFIED"),
        "{types:?}"
    );
    assert_eq!(events[0]["object"]["status"]["phase"], "Pending");
    let rvs: Vec<u64> = events
        .iter()
        .map(|e| {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "{rvs:?}");
    assert!(
        events
            .iter()
            .any(|e| e["object"]["status"]["phase"] == "Running")
    );
    let waiting = |e: &&Value| {
        e["object"]["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
            == "ContainerCreating"
    };
    assert!(events.iter().any(|e| waiting(&e)), "{events:?}");
    let last = &events.last().unwrap()["object"];
    assert!(last["metadata"]["deletionTimestamp"].is_string());
    let ended = &last["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (&ended["exitCode"], &ended["signal"]),
        (&json!(143), &json!(15)),
        "{last}"
    );
    assert!(sim.pods(NS).is_empty(), "{:#?} {types:?}", sim.pods(NS));
    assert!(!process_exists(pid));

    let (status, _, gone) = send(client.get(format!("{}/sleeper", pods_url(&sim))));
    assert_eq!(
        (status, &gone["reason"]),
        (404, &json!("NotFound")),
        "{gone}"
    );
    let (status, _, gone) = send(client.delete(format!("{}/sleeper", pods_url(&sim))));
    assert_eq!((status, &gone["kind"]), (404, &json!("Status")), "{gone}");
    // The driver's ServiceAccount may not list nodes (deploy/kubernetes/base/rbac.yaml);
    // the admin may, and the simulator has none to serve.
    let (status, _, denied) = send(client.get(format!("{}/api/v1/nodes", sim.url())));
    assert_eq!(
        (status, &denied["reason"]),
        (403, &json!("Forbidden")),
        "{denied}"
    );
    assert_eq!(
        denied["message"],
        "nodes is forbidden: User \"system:serviceaccount:flint:flint-driver\" cannot list \
         resource \"nodes\" in API group \"\" at the cluster scope"
    );
    let admin = client_as(kube_sim::ADMIN_TOKEN);
    let (status, _, unknown) = send(admin.get(format!("{}/api/v1/nodes", sim.url())));
    assert_eq!((status, &unknown["code"]), (404, &json!(404)), "{unknown}");
    assert!(
        sim.requests()
            .iter()
            .any(|(verb, path, status)| verb == "watch"
                && path.contains("watch=true")
                && *status == 200)
    );
}

#[test]
fn kube_sim_expired_history_answers_410_and_drop_ends_watches() {
    let (sim, client, _root) = sh_sim();
    assert_eq!(
        create(&sim, &client, &sh_pod("one", "exec sleep 30")).0,
        201
    );
    let old_rv = send(client.get(pods_url(&sim))).2["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        create(&sim, &client, &sh_pod("two", "exec sleep 30")).0,
        201
    );
    sim.expire_history();

    let url = format!(
        "{}?watch=1&resourceVersion={old_rv}&timeoutSeconds=30",
        pods_url(&sim)
    );
    let events = read_watch(client.get(url).send().unwrap(), |_| false);
    assert_eq!(events.len(), 1, "{events:?}");
    let error = &events[0];
    assert_eq!(error["type"], "ERROR");
    assert_eq!(error["object"]["code"], 410);
    assert_eq!(error["object"]["reason"], "Expired");
    let message = error["object"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("too old resource version: {old_rv} (")),
        "{message}"
    );

    let url = format!(
        "{}?resourceVersion={old_rv}&resourceVersionMatch=Exact",
        pods_url(&sim)
    );
    let (status, _, body) = send(client.get(url));
    assert_eq!(
        (status, &body["reason"]),
        (410, &json!("Expired")),
        "{body}"
    );

    // From now: nothing changes, so the timeout ends it with a bookmark.
    let now_rv = send(client.get(pods_url(&sim))).2["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = format!(
        "{}?watch=true&resourceVersion={now_rv}&timeoutSeconds=1&allowWatchBookmarks=true",
        pods_url(&sim)
    );
    let started = Instant::now();
    let events = read_watch(client.get(url).send().unwrap(), |_| false);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert!(
        types.iter().all(|t| *t == "MODIFIED" || *t == "BOOKMARK")
            && types.last() == Some(&"BOOKMARK"),
        "{types:?}"
    );
    assert!(started.elapsed() >= Duration::from_secs(1));

    // An open watch ends when the connections drop.
    let url = format!(
        "{}?watch=true&resourceVersion={now_rv}&timeoutSeconds=60",
        pods_url(&sim)
    );
    let response = client.get(url).send().unwrap();
    let reader = std::thread::spawn(move || read_watch(response, |_| false));
    std::thread::sleep(Duration::from_millis(200));
    let dropped = Instant::now();
    sim.drop_watches();
    reader.join().unwrap();
    assert!(dropped.elapsed() < Duration::from_secs(10));
}

#[test]
fn kube_sim_injects_failures_and_validates_creations() {
    let (sim, client, _root) = sh_sim();
    sim.fail_next("create", 2, 429);
    let pod = sh_pod("retried", "exec sleep 30");
    for _ in 0..2 {
        let (status, headers, body) = send(client.post(pods_url(&sim)).json(&pod));
        assert_eq!(status, 429, "{body}");
        assert_eq!(headers["retry-after"], "1");
        assert_eq!(
            (&body["kind"], &body["reason"]),
            (&json!("Status"), &json!("TooManyRequests"))
        );
        assert_eq!(body["code"], 429);
    }
    assert_eq!(create(&sim, &client, &pod).0, 201);
    let creates: Vec<u16> = sim
        .requests()
        .iter()
        .filter(|(verb, _, _)| verb == "create")
        .map(|(_, _, status)| *status)
        .collect();
    assert_eq!(creates, [429, 429, 201]);
    assert_eq!(sim.created(), std::slice::from_ref(&pod));

    let (status, taken) = create(&sim, &client, &pod);
    assert_eq!(
        (status, &taken["reason"]),
        (409, &json!("AlreadyExists")),
        "{taken}"
    );
    let mut empty = sh_pod("empty", "true");
    empty["spec"]["containers"] = json!([]);
    let (status, invalid) = create(&sim, &client, &empty);
    assert_eq!(
        (status, &invalid["reason"]),
        (422, &json!("Invalid")),
        "{invalid}"
    );
    let (status, invalid) = create(&sim, &client, &sh_pod("Not_A_Name", "true"));
    assert_eq!(status, 422, "{invalid}");

    sim.fail_next("any", 1, 503);
    let (status, _, body) = send(client.get(pods_url(&sim)));
    assert_eq!(
        (status, &body["reason"]),
        (503, &json!("ServiceUnavailable"))
    );
    assert_eq!(send(client.get(pods_url(&sim))).0, 200);
}

#[test]
fn kube_sim_deletes_what_a_deleted_pod_owns() {
    let (sim, client, _root) = sh_sim();
    let owner = sim.add_pod(NS, "driver", &[("app", "driver")]);
    for name in ["owned-1", "owned-2", "bystander"] {
        let mut pod = sh_pod(name, "exec sleep 30");
        if name.starts_with("owned") {
            pod["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "v1", "kind": "Pod", "name": "driver", "uid": owner,
                "controller": true,
            }]);
        }
        assert_eq!(create(&sim, &client, &pod).0, 201);
    }
    wait_until(Duration::from_secs(10), "three pods running", || {
        ["owned-1", "owned-2", "bystander"]
            .iter()
            .all(|name| phase(&sim, name) == "Running")
    });
    let pids: Vec<u32> = ["owned-1", "owned-2", "bystander"]
        .iter()
        .map(|name| sim.pid(NS, name).unwrap())
        .collect();

    sim.delete(NS, "driver");
    wait_until(Duration::from_secs(10), "the owned pods deleted", || {
        let names: Vec<Value> = sim
            .pods(NS)
            .iter()
            .map(|p| p["metadata"]["name"].clone())
            .collect();
        names == [json!("bystander")]
    });
    assert!(!process_exists(pids[0]) && !process_exists(pids[1]));
    assert!(process_exists(pids[2]));
}

#[test]
fn kube_sim_runs_containers_as_the_kubelet_would() {
    let (sim, client, root) = sh_sim();
    let script = "touch \"$DATA/x\" && echo \"$(GREETING) $POD_NAME $TOKEN $NODE \
                  ${CARGO_MANIFEST_DIR:-isolated}\" >&2; exec sleep 30";
    let mut pod = sh_pod("configured", script);
    let container = &mut pod["spec"]["containers"][0];
    container["env"] = json!([
        {"name": "GREETING", "value": "hello"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "DATA", "value": "/data"},
    ]);
    container["volumeMounts"] = json!([{"name": "scratch", "mountPath": "/data"}]);
    pod["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
    assert_eq!(create(&sim, &client, &pod).0, 201);
    wait_until(
        Duration::from_secs(10),
        "the missing secret reported",
        || container_state(&sim, "configured")["waiting"]["reason"] == "CreateContainerConfigError",
    );
    let message = &container_state(&sim, "configured")["waiting"]["message"];
    assert_eq!(message, "secret \"creds\" not found");
    assert_eq!(phase(&sim, "configured"), "Pending");

    sim.add_secret(NS, "creds", "token", "s3cret");
    wait_until(Duration::from_secs(10), "the pod's log", || {
        sim.pod_log(NS, "configured").contains('\n')
    });
    assert_eq!(
        sim.pod_log(NS, "configured"),
        "hello configured s3cret sim-node-1 isolated\n"
    );
    assert!(
        root.path()
            .join(NS)
            .join("configured/volumes/scratch/x")
            .exists()
    );

    sim.oom_kill(NS, "configured");
    wait_until(Duration::from_secs(10), "the OOM kill", || {
        phase(&sim, "configured") == "Failed"
    });
    let ended = &container_state(&sim, "configured")["terminated"];
    assert_eq!(
        (&ended["exitCode"], &ended["reason"]),
        (&json!(137), &json!("OOMKilled"))
    );
    assert_eq!(ended["signal"], 9);

    for (name, script) in [
        ("evicted", "exec sleep 30"),
        ("fails", "exit 3"),
        ("completes", "exit 0"),
    ] {
        assert_eq!(create(&sim, &client, &sh_pod(name, script)).0, 201);
    }
    wait_until(Duration::from_secs(10), "the evictee running", || {
        phase(&sim, "evicted") == "Running"
    });
    sim.evict(NS, "evicted");
    wait_until(Duration::from_secs(10), "every pod ended", || {
        phase(&sim, "evicted") == "Failed"
            && phase(&sim, "fails") == "Failed"
            && phase(&sim, "completes") == "Succeeded"
    });
    let evicted = sim.pod(NS, "evicted").unwrap();
    assert_eq!(evicted["status"]["reason"], "Evicted");
    let message = evicted["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("The node was low on resource: memory."),
        "{message}"
    );
    let fails = &container_state(&sim, "fails")["terminated"];
    assert_eq!(
        (&fails["exitCode"], &fails["reason"]),
        (&json!(3), &json!("Error"))
    );
    let completes = &container_state(&sim, "completes")["terminated"];
    assert_eq!(
        (&completes["exitCode"], &completes["reason"]),
        (&json!(0), &json!("Completed"))
    );

    let full = "0/1 nodes are available: 1 Insufficient memory.";
    sim.set_unschedulable(Some(full));
    assert_eq!(
        create(&sim, &client, &sh_pod("waits", "exec sleep 30")).0,
        201
    );
    let scheduled = |sim: &KubeSim| {
        let pod = sim.pod(NS, "waits").unwrap();
        let conditions = pod["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions.into_iter().find(|c| c["type"] == "PodScheduled")
    };
    wait_until(Duration::from_secs(10), "the pod unschedulable", || {
        scheduled(&sim).is_some_and(|c| c["reason"] == "Unschedulable")
    });
    assert_eq!(scheduled(&sim).unwrap()["message"], full);
    assert_eq!(phase(&sim, "waits"), "Pending");
    assert!(sim.pid(NS, "waits").is_none());
    sim.set_unschedulable(None);
    wait_until(Duration::from_secs(10), "the pod scheduled at last", || {
        phase(&sim, "waits") == "Running"
    });
}
// ---- The driver's kubernetes cluster manager against the simulator ----

const SECRET: &str = "k8s-cluster-secret";
const APP: &str = "k8s-test";

/// The uid of the StatefulSet that owns the driver's pod (it exists only as this uid:
/// the simulator has no StatefulSets).
const STATEFULSET_UID: &str = "5e7f0c1a-0d1e-4c2b-9a3f-57a7e0f5e7a1";

/// The driver's own pod, as its StatefulSet makes it (again, in a rollout); its uid.
fn add_driver_pod(sim: &KubeSim) -> String {
    let owner = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "flint-driver",
        "uid": STATEFULSET_UID, "controller": true, "blockOwnerDeletion": true,
    });
    let labels = [("app.kubernetes.io/component", "driver")];
    sim.add_owned_pod(NS, "flint-driver-0", &labels, Some(owner))
}

/// A simulated API with the driver's own pod and the Secret, and a driver using it.
/// Dropped, it checks that RBAC refused the driver nothing (unless the test revoked a
/// permission itself).
struct K8s {
    sim: KubeSim,
    driver: DevCluster,
    /// The driver's flags, for a restart.
    args: Vec<String>,
    /// Its app id.
    app: String,
    /// The test revoked a permission: RBAC's refusals are what it is about.
    denials_expected: bool,
    /// The kubeconfig and the pods' dirs.
    dir: tempfile::TempDir,
}

impl K8s {
    fn start(allocation: &[&str]) -> K8s {
        Self::start_with(allocation, |_| {})
    }

    /// `before` runs against the simulator before the driver starts (faults to inject).
    fn start_with(allocation: &[&str], before: impl FnOnce(&KubeSim)) -> K8s {
        Self::start_on(["127.0.0.1:0", "127.0.0.1:0"], allocation, before)
    }

    /// A driver listening on `listen` (its API, then its executor port).
    fn start_on(listen: [&str; 2], allocation: &[&str], before: impl FnOnce(&KubeSim)) -> K8s {
        let data_dir = tempfile::tempdir().unwrap();
        Self::start_full(listen, Some(APP), data_dir, allocation, before)
    }

    /// A driver of `app` (`None`: the default app id) on `data_dir`.
    fn start_full(
        listen: [&str; 2],
        app: Option<&str>,
        data_dir: tempfile::TempDir,
        allocation: &[&str],
        before: impl FnOnce(&KubeSim),
    ) -> K8s {
        let dir = tempfile::tempdir().unwrap();
        let sim = KubeSim::start(std::path::Path::new(FLINT), &dir.path().join("pods"));
        sim.add_secret(NS, "flint-secrets", "cluster-secret", SECRET);
        add_driver_pod(&sim);
        let kubeconfig = sim.write_kubeconfig(dir.path(), NS);
        before(&sim);
        let mut args = driver_args(&kubeconfig, listen, app);
        args.extend(allocation.iter().map(|a| a.to_string()));
        let flags: Vec<&str> = args.iter().map(String::as_str).collect();
        let driver = DevCluster::driver_in(&flags, &[], data_dir);
        K8s {
            sim,
            driver,
            args,
            app: app.unwrap_or("flint").to_owned(),
            denials_expected: false,
            dir,
        }
    }

    /// The kubeconfig the driver was given.
    fn kubeconfig(&self) -> std::path::PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The executor pods there are now (the driver's own pod aside).
    fn executor_pods(&self) -> Vec<Value> {
        self.sim
            .pods(NS)
            .into_iter()
            .filter(|p| p["metadata"]["labels"]["flint.dev/app"] == self.app.as_str())
            .collect()
    }

    fn created(&self) -> usize {
        self.sim.created().len()
    }

    fn executor(&self, id: &str) -> Value {
        self.driver
            .executors()
            .into_iter()
            .find(|e| e["id"] == id)
            .unwrap_or_else(|| panic!("no executor {id}"))
    }

    /// The name of the pod the driver created for `executor` (it may be gone since).
    fn pod_of(&self, executor: &str) -> String {
        pod_of(&self.sim, &self.app, executor)
    }
}

impl Drop for K8s {
    fn drop(&mut self) {
        let denials = self.sim.denials();
        if !self.denials_expected && !std::thread::panicking() {
            assert!(
                denials.is_empty(),
                "RBAC (deploy/kubernetes/base/rbac.yaml) refused the driver: {denials:#?}"
            );
        }
    }
}

/// The name of the last pod created for `executor` of `app`.
fn pod_of(sim: &KubeSim, app: &str, executor: &str) -> String {
    let created = sim.created();
    let pod = (created.iter().rev())
        .find(|p| {
            let labels = &p["metadata"]["labels"];
            labels["flint.dev/app"] == app && labels["flint.dev/executor-id"] == executor
        })
        .unwrap_or_else(|| panic!("no pod created for {executor} of {app}"));
    pod["metadata"]["name"].as_str().unwrap().to_owned()
}

/// A kubernetes driver's flags, against the simulator's kubeconfig; `app` `None`: the
/// default app id.
fn driver_args(kubeconfig: &std::path::Path, listen: [&str; 2], app: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = [
        "--listen",
        listen[0],
        "--executor-listen",
        listen[1],
        "--cluster-secret",
        SECRET,
        "--cluster-manager",
        "kubernetes",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--k8s-image",
        "localhost/flint:dev",
        "--k8s-driver-pod",
        "flint-driver-0",
        "--k8s-cluster-secret-ref",
        "flint-secrets:cluster-secret",
        "--k8s-allocation-batch-delay-ms",
        "200",
        "--executor-cores",
        "1",
        "--executor-memory-mb",
        "256",
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(app) = app {
        args.extend(["--app-id".to_owned(), app.to_owned()]);
    }
    args
}

fn sleeping_tasks(cluster: &DevCluster, n: usize, ms: u64) -> String {
    let module = cluster.upload(&guests().testkit);
    cluster.submit(&json!({
        "module": module, "args": ["sleep", ms.to_string()],
        "inputs": vec![json!({"text": ""}); n],
    }))
}

#[test]
fn pods_scale_from_zero_to_n_for_a_job_and_back_to_zero_after_idle() {
    let k = K8s::start(&[
        "--min-executors",
        "0",
        "--max-executors",
        "3",
        "--scheduler-backlog-timeout-ms",
        "100",
        "--executor-idle-timeout-ms",
        "1000",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(k.executor_pods().is_empty(), "no work, no pods");
    let id = sleeping_tasks(&k.driver, 30, 300);
    wait_until(
        Duration::from_secs(60),
        "three executor pods running",
        || k.driver.alive_executors() == 3,
    );
    assert_eq!(k.executor_pods().len(), 3);
    let job = k.driver.wait_for_job(&id, Duration::from_secs(60));
    assert_eq!(job["state"], "succeeded", "{job}");
    wait_until(Duration::from_secs(30), "no executor pods", || {
        k.executor_pods().is_empty()
    });
    assert_eq!(k.created(), 3, "never more pods than the maximum");
    for e in k.driver.executors() {
        assert_eq!(e["cluster_manager"], "kubernetes", "{e}");
        assert_eq!(e["worker"], "sim-node-1", "{e}");
        // Decommissioned when idle: a clean exit, not a failure.
        assert_eq!(e["exit_code"], 0, "{e}");
    }
    let allocation = k.driver.get("/v1/executors").1["allocation"].clone();
    assert_eq!(allocation["recent_failures"], 0, "{allocation}");

    // What the driver sent: each pod owned by what owns the driver's pod (not as its
    // controller), the secret by reference.
    for pod in k.sim.created() {
        let owner = &pod["metadata"]["ownerReferences"][0];
        assert_eq!(owner["uid"], STATEFULSET_UID, "{pod}");
        assert_eq!(
            (&owner["kind"], &owner["name"]),
            (&json!("StatefulSet"), &json!("flint-driver"))
        );
        assert!(owner.get("controller").is_none(), "{owner}");
        let env = pod["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .clone();
        let var = |name: &str| env.iter().find(|e| e["name"] == name).cloned();
        let secret = var("FLINT_CLUSTER_SECRET").expect("the secret's env");
        assert!(secret.get("value").is_none(), "inline secret: {secret}");
        assert_eq!(secret["valueFrom"]["secretKeyRef"]["name"], "flint-secrets");
        assert!(
            !pod.to_string().contains(SECRET),
            "the secret itself in the pod spec"
        );
        assert_eq!(var("FLINT_APP_ID").unwrap()["value"], APP);
        assert_eq!(var("FLINT_CORES").unwrap()["value"], "1");
        assert_eq!(var("FLINT_MEMORY_MB").unwrap()["value"], "256");
        let limits = &pod["spec"]["containers"][0]["resources"]["limits"];
        assert_eq!(
            limits["memory"], "640Mi",
            "256 MiB + the 384 MiB floor: {limits}"
        );
    }
}

/// Validates every pod the driver sent with the same validator CI runs on the
/// manifests (kubernetes-validate, strict, offline).
#[test]
fn the_pod_spec_the_driver_sends_validates_against_the_kubernetes_schema() {
    let validator = std::env::var("FLINT_K8S_VALIDATE")
        .expect("FLINT_K8S_VALIDATE: the kubernetes-validate scripts/test installs");
    let template = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        template.path(),
        "spec:\n  nodeSelector:\n    pool: wasm\n  containers:\n  - name: flint-executor\n    env:\n    - name: RUST_LOG\n      value: info\n",
    )
    .unwrap();
    let template_path = template.path().to_str().unwrap().to_owned();
    let k = K8s::start(&[
        "--initial-executors",
        "2",
        "--k8s-pod-template",
        &template_path,
    ]);
    wait_until(Duration::from_secs(30), "two executors", || {
        k.driver.alive_executors() == 2
    });
    let dir = tempfile::tempdir().unwrap();
    for (i, pod) in k.sim.created().iter().enumerate() {
        assert_eq!(
            pod["spec"]["nodeSelector"]["pool"], "wasm",
            "the template: {pod}"
        );
        let file = dir.path().join(format!("pod-{i}.json"));
        std::fs::write(&file, serde_json::to_vec_pretty(pod).unwrap()).unwrap();
        let out = std::process::Command::new(&validator)
            .args(validator_args())
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}\n{}\n{pod:#}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The validator does refuse what the schema does not allow.
    let mut bad = k.sim.created()[0].clone();
    bad["spec"]["containers"][0]["resources"]["limits"]["memory"] = json!({"not": "a quantity"});
    bad["spec"]["restartPolicy2"] = json!("Never");
    let file = dir.path().join("bad.json");
    std::fs::write(&file, serde_json::to_vec(&bad).unwrap()).unwrap();
    let out = std::process::Command::new(&validator)
        .args(validator_args())
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a bad pod passed the validator");
}

fn validator_args() -> Vec<String> {
    vec!["--strict".into(), "-k".into(), "1.37.0".into()]
}

#[test]
fn an_evicted_pods_tasks_run_elsewhere_and_a_replacement_pod_is_created() {
    let k = K8s::start(&["--initial-executors", "2"]);
    wait_until(Duration::from_secs(30), "two executors", || {
        k.driver.alive_executors() == 2
    });
    let id = sleeping_tasks(&k.driver, 6, 1500);
    wait_until(Duration::from_secs(10), "tasks running on exec-1", || {
        k.executor("exec-1")["running"] == 1
    });
    k.sim.evict(NS, &k.pod_of("exec-1"));
    let job = k.driver.wait_for_job(&id, Duration::from_secs(60));
    assert_eq!(job["state"], "succeeded", "{job}");
    let evicted = k.executor("exec-1");
    assert_ne!(evicted["state"], "alive", "{evicted}");
    wait_until(Duration::from_secs(30), "a replacement", || {
        k.driver.alive_executors() == 2 && k.created() == 3
    });
    let evicted = k.executor("exec-1");
    assert_eq!(evicted["exit_reason"], "lost", "{evicted}");
    let why = evicted["exit_description"].as_str().unwrap();
    assert!(
        why.contains("evicted") && why.contains("low on resource"),
        "{why}"
    );
    // The evicted pod was cleaned up; its replacement runs.
    let names: Vec<String> = k
        .executor_pods()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(!names.contains(&k.pod_of("exec-1")), "{names:?}");
    assert!(names.contains(&k.pod_of("exec-3")), "{names:?}");
    let allocation = k.driver.get("/v1/executors").1["allocation"].clone();
    assert_eq!(
        allocation["recent_failures"], 0,
        "an eviction is no failure: {allocation}"
    );
}

#[test]
fn a_container_oom_killed_is_reported_by_name_and_replaced() {
    let k = K8s::start(&["--initial-executors", "1"]);
    wait_until(Duration::from_secs(30), "an executor", || {
        k.driver.alive_executors() == 1
    });
    k.sim.oom_kill(NS, &k.pod_of("exec-1"));
    wait_until(Duration::from_secs(30), "its exit reported", || {
        k.executor("exec-1")["exit_reason"] == "oom_killed"
    });
    let e = k.executor("exec-1");
    assert_eq!(e["exit_code"], 137, "{e}");
    let why = e["exit_description"].as_str().unwrap();
    assert!(why.contains("OOMKilled"), "{why}");
    wait_until(Duration::from_secs(30), "a replacement", || {
        k.driver.alive_executors() == 1 && k.created() == 2
    });
    let allocation = k.driver.get("/v1/executors").1["allocation"].clone();
    assert_eq!(
        allocation["recent_failures"], 1,
        "an OOM kill is a failure: {allocation}"
    );
}

/// A pod the scheduler cannot place is back-pressure: it waits (the launch timeout does
/// not run), and past `--executor-pending-timeout-ms` it is deleted and launched again,
/// no failure counted, the scheduler's reason in the executor's end.
#[test]
fn a_pod_pending_past_the_pending_timeout_is_deleted_and_relaunched_without_a_failure() {
    let message = "0/1 nodes are available: 1 Insufficient cpu.";
    let k = K8s::start_with(
        &[
            "--initial-executors",
            "1",
            "--executor-launch-timeout-ms",
            "1000",
            "--executor-pending-timeout-ms",
            "3000",
        ],
        |sim| sim.set_unschedulable(Some(message)),
    );
    wait_until(
        Duration::from_secs(30),
        "the pending pod given up on",
        || {
            k.driver
                .executors()
                .iter()
                .any(|e| e["id"] == "exec-1" && e["exit_reason"] == "pending_timeout")
        },
    );
    let e = k.executor("exec-1");
    let why = e["exit_description"].as_str().unwrap();
    assert!(
        why.contains("Unschedulable") && why.contains(message),
        "{why}"
    );
    assert!(why.contains(&k.pod_of("exec-1")), "{why}");
    wait_until(Duration::from_secs(30), "the pending pod deleted", || {
        !k.executor_pods()
            .iter()
            .any(|p| p["metadata"]["name"] == k.pod_of("exec-1").as_str())
    });
    wait_until(Duration::from_secs(30), "a pod in its place", || {
        k.created() == 2
    });
    // Once the cluster has room, the one in its place runs.
    k.sim.set_unschedulable(None);
    wait_until(
        Duration::from_secs(60),
        "an executor once there is room",
        || k.driver.alive_executors() == 1,
    );
    let allocation = k.driver.get("/v1/executors").1["allocation"].clone();
    assert_eq!(allocation["recent_failures"], 0, "{allocation}");
}

#[test]
fn a_dropped_watch_and_a_410_are_followed_by_a_relist_without_duplicate_executors() {
    let k = K8s::start(&["--initial-executors", "2"]);
    wait_until(Duration::from_secs(30), "two executors", || {
        k.driver.alive_executors() == 2
    });
    let lists = |k: &K8s| {
        k.sim
            .requests()
            .iter()
            .filter(|(verb, _, _)| verb == "list")
            .count()
    };
    let lists_before = lists(&k);
    // A dropped watch resumes from its resourceVersion: nothing is listed again, and
    // a change made meanwhile still arrives.
    k.sim.drop_watches();
    k.sim.evict(NS, &k.pod_of("exec-2"));
    wait_until(
        Duration::from_secs(30),
        "the eviction seen after the resume",
        || k.executor("exec-2")["exit_reason"] == "lost",
    );
    wait_until(Duration::from_secs(30), "a replacement", || {
        k.driver.alive_executors() == 2
    });
    // A change the watch does not see (another app's pod), history compacted past
    // it, the watch dropped: the resume from the old resourceVersion gets 410 Gone and
    // the driver lists again.
    k.sim.add_pod(NS, "someone-else", &[("app", "other")]);
    k.sim.expire_history();
    k.sim.drop_watches();
    wait_until(Duration::from_secs(30), "a re-list", || {
        lists(&k) > lists_before
    });
    std::thread::sleep(Duration::from_secs(1));
    let executors = k.driver.executors();
    let ids: Vec<&str> = executors
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    let unique: std::collections::BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len(), "{ids:?}");
    assert_eq!(k.driver.alive_executors(), 2, "{executors:?}");
    assert_eq!(k.executor_pods().len(), 2, "no pod twice");
    assert_eq!(k.created(), 3, "one replacement, for the evicted pod");
    let job = k.driver.run_job(spec(
        &k.driver.upload(&guests().testkit),
        &["echo"],
        &["a", "b", "c"],
    ));
    assert_eq!(job["state"], "succeeded", "{job}");
}

#[test]
fn api_429s_on_pod_creation_are_backed_off_and_retried() {
    let k = K8s::start_with(&["--initial-executors", "2"], |sim| {
        sim.fail_next("create", 3, 429)
    });
    wait_until(Duration::from_secs(60), "two executors", || {
        k.driver.alive_executors() == 2
    });
    let creates: Vec<u16> = k
        .sim
        .requests()
        .iter()
        .filter(|(verb, _, _)| verb == "create")
        .map(|(_, _, status)| *status)
        .collect();
    assert_eq!(
        creates.iter().filter(|s| **s == 429).count(),
        3,
        "{creates:?}"
    );
    assert_eq!(
        creates.iter().filter(|s| **s == 201).count(),
        2,
        "{creates:?}"
    );
    assert_eq!(k.created(), 2, "{creates:?}");
    let allocation = k.driver.get("/v1/executors").1["allocation"].clone();
    assert_eq!(allocation["recent_failures"], 0, "{allocation}");
}

#[test]
fn stopping_the_driver_for_good_deletes_every_pod_of_its_app() {
    let mut k = K8s::start(&["--initial-executors", "3", "--stop-executors-on-exit"]);
    wait_until(Duration::from_secs(30), "three executors", || {
        k.driver.alive_executors() == 3
    });
    assert_eq!(k.executor_pods().len(), 3);
    let status = k.driver.stop();
    assert!(status.success(), "{status:?}");
    assert!(k.executor_pods().is_empty(), "{:?}", k.executor_pods());
    // The driver's own pod is no executor of its app: left alone.
    assert_eq!(k.sim.pods(NS).len(), 1);
}

mod realism;
mod sim_faults;

/// The driver's pod goes in every rollout: its executors' pods are not its own, so they
/// stay for the next driver; they go with the StatefulSet that owns them all.
#[test]
fn a_driver_pod_deleted_leaves_its_executor_pods_and_its_statefulset_deleted_takes_them() {
    let k = K8s::start(&["--initial-executors", "2"]);
    wait_until(Duration::from_secs(30), "two executors", || {
        k.driver.alive_executors() == 2
    });
    signal(k.driver.pid(), libc::SIGKILL);
    k.sim.delete(NS, "flint-driver-0");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(k.executor_pods().len(), 2, "{:?}", k.executor_pods());
    let pids: Vec<u32> = ["exec-1", "exec-2"]
        .iter()
        .map(|e| k.sim.pid(NS, &k.pod_of(e)).unwrap())
        .collect();
    assert!(pids.iter().all(|pid| process_exists(*pid)));
    // `kubectl delete statefulset flint-driver`: the garbage collector takes them.
    k.sim.delete_owner(NS, STATEFULSET_UID);
    wait_until(Duration::from_secs(30), "no executor pods", || {
        k.executor_pods().is_empty()
    });
}

pub(crate) mod restart;
