//! A **simulated** Kubernetes API server, for the end-to-end tests of the `kubernetes`
//! cluster manager. A real API server (with etcd, a scheduler and a kubelet) cannot run
//! on this machine, so this one stands in for all three: an HTTP server of our own that
//! speaks the REST subset of core/v1 pods that kube's client and watcher use, over plain
//! http on 127.0.0.1, and that runs each created pod's container as a local process.
//!
//! What it models, after the real wire formats:
//! - `GET /api/v1/namespaces/{ns}/pods` (list, or with `watch=true|1` a watch), `POST`
//!   there (create), `GET` and `DELETE /api/v1/namespaces/{ns}/pods/{name}`, and the
//!   all-namespaces `GET /api/v1/pods`; `GET /version`. Anything else: 404 (405 for a
//!   known path and another method) with a v1 `Status`, as every error is. Any bearer
//!   token is accepted.
//! - One global resourceVersion, bumped by every change and carried by every object and
//!   list; equality-based `labelSelector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`) and
//!   `fieldSelector` (`path=v`, `path!=v` on any field of the object) on lists and
//!   watches. Lists are never paginated (`limit` is ignored, no `continue` token).
//! - Watches: newline-delimited `{"type","object"}` events on a chunked response,
//!   replayed from `resourceVersion=R` then live; without one (or with `0`), synthetic
//!   `ADDED`s of what exists first. After [`KubeSim::expire_history`] (an etcd
//!   compaction) a watch from an older R gets the real server's single `ERROR` event
//!   (410, reason `Expired`) and ends, as does a list with `resourceVersionMatch=Exact`
//!   (as an HTTP 410). `timeoutSeconds` ends the stream (after a `BOOKMARK` with
//!   `allowWatchBookmarks`); `sendInitialEvents` (kube's streaming list) gets the
//!   `ADDED`s and the `k8s.io/initial-events-end` bookmark. [`KubeSim::drop_watches`]
//!   aborts every open watch connection, as an API server restart does.
//! - Create: validation of the name (DNS-1123 subdomain, or `generateName`), labels and
//!   `spec.containers` (422 `Invalid`), 409 `AlreadyExists`, `dryRun`; the stored object
//!   gets uid, resourceVersion, creationTimestamp, the defaults of `restartPolicy`
//!   (`Always`) and `terminationGracePeriodSeconds` (30), and `status.phase: Pending`.
//! - The scheduler: binds each pod to the node that is not lost with the fewest pods
//!   (`sim-node-1`, the only one unless [`KubeSim::add_node`] adds more; condition
//!   `PodScheduled`), or, while [`KubeSim::set_unschedulable`] says so or every node is
//!   lost, leaves it Pending and `Unschedulable` (and binds those waiting once it no
//!   longer does, as the real scheduler retries).
//! - The kubelet: `ContainerCreating`, then the first container as a process: `program`
//!   (what every image runs) with the container's `args` (`$(VAR)` expanded; `command`
//!   and the image name are ignored), and only the environment the spec gives (`value`,
//!   `secretKeyRef` and `envFrom.secretRef` from [`KubeSim::add_secret`], `fieldRef` of
//!   `metadata.name|namespace|uid|labels['k']|annotations['k']`, `spec.nodeName`,
//!   `spec.serviceAccountName`, `status.podIP|hostIP`), plus `PATH`, `HOSTNAME` (the pod
//!   name), `HOME` (the pod's dir) and the host's `RUST_LOG` for debugging. A missing
//!   secret or key leaves the container waiting with `CreateContainerConfigError`,
//!   retried until it appears, as the kubelet does. The process runs in `root/<ns>/<pod>`
//!   with `stdout` and `stderr` files there, stdin null, and PR_SET_PDEATHSIG SIGKILL.
//!   Running: `podIP` 127.0.0.1, `state.running`, ready at once (no probes). Its exit:
//!   `state.terminated` (exitCode, 128+N and `signal` N when killed, reason `Completed`,
//!   `Error` or `OOMKilled`), phase Succeeded or Failed. [`KubeSim::evict`] and
//!   [`KubeSim::oom_kill`] are the kubelet's node-pressure eviction and the kernel's
//!   OOM killer.
//! - emptyDir volumes, in place of a mount namespace: each `volumeMount` of an
//!   `emptyDir` volume gets a fresh dir `root/<ns>/<pod>/volumes/<volume>`, and every env
//!   value and arg (or the value of an `--flag=value` arg) that is the mount path or a
//!   path under it is rewritten to point into that dir.
//! - Delete (`DeleteOptions` in the body or the query: `gracePeriodSeconds`,
//!   `propagationPolicy`, `preconditions`, `dryRun`): deletionTimestamp (MODIFIED),
//!   SIGTERM, SIGKILL after the grace (the pod's `terminationGracePeriodSeconds` by
//!   default; a later delete with a shorter grace shortens it), then, once the process
//!   is gone, `DELETED` with the final state. A pod with no process (never started,
//!   ended, unscheduled) or a grace of 0 goes at once, as the real registry does. The
//!   garbage collector: once a pod is gone, the pods whose `ownerReferences` name its
//!   uid are deleted the same way (with their own grace), or with `Orphan` lose that
//!   reference; [`KubeSim::delete_owner`] does the same for an owner that is no pod (a
//!   StatefulSet, which exists here only as the uid its pods name).
//! - Injected API failures ([`KubeSim::fail_next`]: 429 with `Retry-After`, 5xx).
//! - Authentication and RBAC (`kube_sim/rbac.rs`), on from the start: [`TOKEN`] is the
//!   driver's ServiceAccount (`system:serviceaccount:flint:flint-driver`), whose rights
//!   are what `deploy/kubernetes/base` grants it, read from the manifests; a request no
//!   rule allows gets the real 403 (`pods "x" is forbidden: User "..." cannot delete
//!   resource "pods" in API group "" in the namespace "flint"`), recorded in
//!   [`KubeSim::denials`]; a missing or unknown token gets 401. [`ADMIN_TOKEN`] may do
//!   anything. [`KubeSim::revoke`] takes a verb on a resource from everyone until
//!   [`KubeSim::restore_rbac`].
//! - A ResourceQuota on the number of pods ([`KubeSim::set_quota`], in every namespace):
//!   a create past it gets the quota admission plugin's 403 (`pods "x" is forbidden:
//!   exceeded quota: pod-count, requested: pods=1, used: pods=N, limited: pods=N`),
//!   after validation (422) and before the name is checked (409), as the real order
//!   of admission and storage has it. Pods count until they end (Succeeded or Failed)
//!   or are being deleted.
//! - A lost node ([`KubeSim::lose_node`]: power cut, network partition): its pods'
//!   processes are SIGSTOPped (silent, not dead) and nothing about them changes any
//!   more but what the API server does itself: no status update, no exit, and a
//!   deletion with a grace leaves them Terminating for good (the kubelet that would
//!   stop them is gone); a deletion with grace 0 (a force delete) removes one at once.
//!   The node controller's part is shortened: the pods' `Ready` condition goes False
//!   at once (not after the node-monitor grace), and its taint-based eviction after
//!   5 minutes (a graceful delete, which would stay Terminating) is not modelled. The
//!   scheduler binds nothing to a lost node. A force-deleted pod's process is killed
//!   by the simulator (a real partitioned node would run it until it is back).
//! - An outage ([`KubeSim::go_down`] until [`KubeSim::come_back`], `kube_sim/serve.rs`):
//!   the port refuses connections and every open one (watches too) is cut; and hung
//!   connections ([`KubeSim::set_hanging`], [`KubeSim::hang_next`]): a request is read
//!   and never answered, for as long as the client keeps the connection (a half-open
//!   connection, a server that stopped answering); or done and its answer never sent
//!   ([`KubeSim::lose_next_answer`]: a create that landed, its client none the wiser).
//!
//! What it does not model: every other resource (no Secret, ConfigMap, Node, Role or
//! Event API; secrets exist only through [`KubeSim::add_secret`]), PATCH and PUT, the
//! `Foreground` propagation's wait (treated as `Background`), owner references to objects
//! that do not exist (the real garbage collector deletes such dependents), pagination,
//! set-based selectors (400), container restarts (`restartPolicy` is always treated as
//! `Never`), init and sidecar containers (only the first container runs), probes,
//! resource requests and limits (nothing is enforced: use `oom_kill`), security
//! contexts (the process runs as the test's user), images, `workingDir`, volumes other
//! than emptyDir (their mounts are ignored), networking (every pod is the host's
//! 127.0.0.1), authentication other than bearer tokens, quotas on anything but the pod
//! count, and API priority and fairness.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State as AxumState};
use axum::http::{Method, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

mod rbac;
mod serve;

use self::rbac::{Attributes, Rbac};

/// The first node, and the only one unless a test adds more.
pub const NODE: &str = "sim-node-1";
/// Every pod's (and the node's) address: the pods share the host's network.
pub const POD_IP: &str = "127.0.0.1";
/// The bearer token `write_kubeconfig` puts in the kubeconfig: the driver's
/// ServiceAccount's.
pub const TOKEN: &str = "flint-kube-sim-token";
/// Whose token it is.
pub const DRIVER_USER: &str = "system:serviceaccount:flint:flint-driver";
/// A token every rule allows (`system:masters`).
pub const ADMIN_TOKEN: &str = "flint-kube-sim-admin-token";
/// The manifests whose RBAC the simulator enforces.
const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes/base");

/// A pod by namespace and name.
type Key = (String, String);

/// The simulated API server, scheduler and kubelet. Dropping it stops the server and
/// SIGKILLs every pod's process.
pub struct KubeSim {
    shared: Arc<Shared>,
    port: u16,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the server's tasks and the test's thread share.
struct Shared {
    state: Mutex<State>,
    /// Wakes the watches: every change (also held by `State`, which notifies it).
    changed: Arc<Notify>,
    /// Wakes the scheduler and the kubelets waiting on the cluster: `set_unschedulable`,
    /// `add_secret`.
    kick: Notify,
    program: PathBuf,
    root: PathBuf,
    /// The server's runtime, for the grace timers a delete from the test's thread starts.
    runtime: tokio::runtime::Handle,
    /// Whether the API is out (`go_down`): the port refuses connections.
    down: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    /// The last resourceVersion given out.
    rv: u64,
    /// A watch (or exact list) from a resourceVersion older than this gets 410 Gone.
    oldest_rv: u64,
    /// Every change, in resourceVersion order: what watches replay and follow.
    events: Vec<Event>,
    pods: BTreeMap<Key, PodEntry>,
    secrets: HashMap<Key, BTreeMap<String, String>>,
    created: Vec<Value>,
    requests: Vec<(String, String, u16)>,
    failures: Vec<Failure>,
    unschedulable: Option<String>,
    /// Nodes by name, and whether each is lost.
    nodes: BTreeMap<String, bool>,
    /// Who may do what.
    rbac: Rbac,
    /// The 403 messages RBAC answered, in order.
    denials: Vec<String>,
    /// The most pods a namespace may hold (`set_quota`).
    quota: Option<u32>,
    /// Every request is read and never answered (`set_hanging`).
    hanging: bool,
    /// Bumped by `drop_watches`: a watch opened under another generation ends.
    watch_generation: u64,
    shutting_down: bool,
    /// Feeds uids and generated names.
    serial: u64,
    changed: Arc<Notify>,
}

struct Event {
    rv: u64,
    namespace: String,
    kind: &'static str,
    object: Value,
}

struct PodEntry {
    object: Value,
    uid: String,
    /// Its container's process, while it runs.
    process: Option<Running>,
    /// Why the kubelet killed it, for the status its exit gets.
    kill: Option<Kill>,
    /// Set by a delete: when its grace ends (a later delete may bring that forward).
    kill_at: Option<Instant>,
    /// Set by a delete with `propagationPolicy: Orphan`: what the garbage collector does
    /// with its dependents once it is gone.
    orphan_dependents: bool,
}

/// A running container. Signals go through its monitor, which alone waits on the
/// process, so that no signal reaches a pid that was reaped and reused.
struct Running {
    pid: u32,
    signals: mpsc::UnboundedSender<i32>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kill {
    Evicted,
    OomKilled,
}

struct Failure {
    verb: String,
    left: u32,
    fault: Fault,
}

/// What an injected failure does to a request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    /// Answered with this status and a Status body.
    Status(u16),
    /// Read and never answered (`hang_next`).
    Hang,
    /// Done, and its answer never sent (`lose_next_answer`).
    LoseAnswer,
}

impl KubeSim {
    /// Starts the server on a free loopback port. `program` is what every container
    /// image runs (the flint binary); `root` holds the pods' work dirs and logs.
    pub fn start(program: &Path, root: &Path) -> KubeSim {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        // One thread runs everything: the server, the kubelets and the processes'
        // monitors. It is also the parent PR_SET_PDEATHSIG watches (the kernel signals
        // when the *thread* that forked exits), and it lives until the drop.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let changed = Arc::new(Notify::new());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                // Never 0: a watch or list "from 0" means "from any state", so a real
                // server never gives 0 out (and a fresh etcd is past it too).
                rv: 1000,
                oldest_rv: 1000,
                changed: changed.clone(),
                nodes: BTreeMap::from([(NODE.to_owned(), false)]),
                rbac: Rbac::from_kustomization(Path::new(MANIFESTS)),
                ..State::default()
            }),
            changed,
            kick: Notify::new(),
            program: program.to_owned(),
            root: root.to_owned(),
            runtime: runtime.handle().clone(),
            down: watch::Sender::new(false),
        });
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("kube-sim".into())
            .spawn({
                let shared = shared.clone();
                move || run(runtime, listener, shared, stopped)
            })
            .unwrap();
        KubeSim {
            shared,
            port,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Writes `dir/kubeconfig`: one cluster (server `url()`), a user with a dummy bearer
    /// token, a current context with `namespace`. Returns its path.
    pub fn write_kubeconfig(&self, dir: &Path, namespace: &str) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: sim\n  cluster:\n    server: {url}\n\
             users:\n\
             - name: sim\n  user:\n    token: {TOKEN}\n\
             contexts:\n\
             - name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: \"{namespace}\"\n\
             current-context: sim\n",
            url = self.url(),
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Adds `key: value` to the Secret `namespace/name` (made if new). Containers
    /// waiting for it start.
    pub fn add_secret(&self, namespace: &str, name: &str, key: &str, value: &str) {
        self.shared
            .lock()
            .secrets
            .entry((namespace.into(), name.into()))
            .or_default()
            .insert(key.into(), value.into());
        self.shared.kick.notify_waiters();
    }

    /// A Running pod with no process (the driver's own pod, say, for owner references);
    /// returns its uid.
    pub fn add_pod(&self, namespace: &str, name: &str, labels: &[(&str, &str)]) -> String {
        self.add_owned_pod(namespace, name, labels, None)
    }

    /// [`Self::add_pod`] with an owner reference (`{apiVersion, kind, name, uid,
    /// controller}`): a StatefulSet's pod, say. The owner need not exist here: only
    /// [`Self::delete_owner`] acts on it.
    pub fn add_owned_pod(
        &self,
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
        owner: Option<Value>,
    ) -> String {
        let mut st = self.shared.lock();
        let key: Key = (namespace.into(), name.into());
        assert!(!st.pods.contains_key(&key), "pod {namespace}/{name} exists");
        let uid = st.new_uid();
        let now = now();
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let mut object = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name, "namespace": namespace, "uid": uid,
                "creationTimestamp": now, "labels": labels,
            },
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "main", "image": "sim/no-process"}],
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 30,
            },
            "status": {"phase": "Running", "podIP": POD_IP, "hostIP": POD_IP, "startTime": now},
        });
        if let Some(owner) = owner {
            object["metadata"]["ownerReferences"] = json!([owner]);
        }
        for kind in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
            set_condition(&mut object, kind, "True", None, None);
        }
        let running = json!({"running": {"startedAt": now}});
        set_container_state(&mut object, running, true, Some("sim://none".into()));
        st.pods
            .insert(key.clone(), PodEntry::new(object, uid.clone()));
        st.publish(&key, "ADDED");
        uid
    }

    /// Every pod of `namespace` as it is now, full JSON, by name.
    pub fn pods(&self, namespace: &str) -> Vec<Value> {
        let st = self.shared.lock();
        st.pods
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|(_, p)| p.object.clone())
            .collect()
    }

    /// One pod as it is now.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        let st = self.shared.lock();
        st.pods
            .get(&(namespace.into(), name.into()))
            .map(|p| p.object.clone())
    }

    /// The pid of a pod's running process.
    pub fn pid(&self, namespace: &str, name: &str) -> Option<u32> {
        let st = self.shared.lock();
        let pod = st.pods.get(&(namespace.into(), name.into()))?;
        pod.process.as_ref().map(|p| p.pid)
    }

    /// Every pod body whose POST created a pod, exactly as received (requests refused,
    /// by `fail_next` or validation, are in `requests()` only).
    pub fn created(&self) -> Vec<Value> {
        self.shared.lock().created.clone()
    }

    /// The pod's process's stderr so far (empty if it never started).
    pub fn pod_log(&self, namespace: &str, name: &str) -> String {
        let path = self.shared.root.join(namespace).join(name).join("stderr");
        std::fs::read(path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The kubelet's node-pressure eviction: SIGKILL; the pod stays, phase Failed,
    /// `status.reason: Evicted` and the kubelet's message, condition DisruptionTarget.
    pub fn evict(&self, namespace: &str, name: &str) {
        let mut st = self.shared.lock();
        let key: Key = (namespace.into(), name.into());
        let pod = st.pods.get_mut(&key).expect("no such pod to evict");
        pod.kill = Some(Kill::Evicted);
        match &pod.process {
            // The monitor writes the status once the process is gone.
            Some(process) => drop(process.signals.send(libc::SIGKILL)),
            None => {
                st.modify(&key, mark_evicted);
            }
        }
    }

    /// The kernel's OOM killer: SIGKILL; container terminated with exitCode 137, reason
    /// `OOMKilled`; phase Failed.
    pub fn oom_kill(&self, namespace: &str, name: &str) {
        let mut st = self.shared.lock();
        let pod = st
            .pods
            .get_mut(&(namespace.into(), name.into()))
            .expect("no such pod to OOM-kill");
        let process = pod
            .process
            .as_ref()
            .expect("the pod has no running process");
        let _ = process.signals.send(libc::SIGKILL);
        pod.kill = Some(Kill::OomKilled);
    }

    /// `kubectl delete pod` by someone else: graceful (the pod's own grace), background
    /// propagation to the pods it owns. Panics if there is no such pod.
    pub fn delete(&self, namespace: &str, name: &str) {
        let mut st = self.shared.lock();
        let key: Key = (namespace.into(), name.into());
        if let Err(status) = delete_pod(&self.shared, &mut st, &key, DeleteOptions::default()) {
            panic!("deleting {namespace}/{name}: {status}");
        }
    }

    /// The garbage collector once an owner that is not a pod here (a StatefulSet,
    /// deleted by `kubectl delete`) is gone: every pod naming its uid is deleted, with
    /// its own grace.
    pub fn delete_owner(&self, namespace: &str, uid: &str) {
        let mut st = self.shared.lock();
        for dependent in dependents(&st, namespace, uid) {
            let _ = delete_pod(&self.shared, &mut st, &dependent, DeleteOptions::default());
        }
    }

    /// `Some`: pods not bound yet stay Pending, condition PodScheduled False, reason
    /// Unschedulable, with this message. `None`: the scheduler binds again, those
    /// waiting included (the real one retries them when the cluster changes).
    pub fn set_unschedulable(&self, message: Option<&str>) {
        self.shared.lock().unschedulable = message.map(str::to_owned);
        self.shared.kick.notify_waiters();
    }

    /// The next `n` requests of `verb` ("create", "list", "watch", "delete", "get", or
    /// "any") are answered `status` with a v1 Status body (429 with `Retry-After: 1`).
    pub fn fail_next(&self, verb: &str, n: u32, status: u16) {
        self.shared.lock().failures.push(Failure {
            verb: verb.into(),
            left: n,
            fault: Fault::Status(status),
        });
    }

    /// The next `n` requests of `verb` are read and never answered, for as long as
    /// their client keeps the connection.
    pub fn hang_next(&self, verb: &str, n: u32) {
        self.shared.lock().failures.push(Failure {
            verb: verb.into(),
            left: n,
            fault: Fault::Hang,
        });
    }

    /// The next `n` requests of `verb` are done (a create creates) and their answers
    /// never sent: the connection dies after the request reached the server.
    pub fn lose_next_answer(&self, verb: &str, n: u32) {
        self.shared.lock().failures.push(Failure {
            verb: verb.into(),
            left: n,
            fault: Fault::LoseAnswer,
        });
    }

    /// `true`: every request from now on is read and never answered (those already
    /// hung stay so after `false`: their connections are dead to the client).
    pub fn set_hanging(&self, hanging: bool) {
        self.shared.lock().hanging = hanging;
    }

    /// An outage: the port refuses connections and every open one is cut, until
    /// [`Self::come_back`].
    pub fn go_down(&self) {
        self.shared.down.send_replace(true);
    }

    /// The outage is over: the same port accepts connections again.
    pub fn come_back(&self) {
        self.shared.down.send_replace(false);
    }

    /// A ResourceQuota of `max` pods in every namespace (`None`: none): a create past it
    /// is refused with the quota plugin's 403 until pods end or the quota is lifted.
    pub fn set_quota(&self, max: Option<u32>) {
        self.shared.lock().quota = max;
    }

    /// Takes `verb` on `resource` ("pods") from every user (as an admin editing the
    /// Role would), until [`Self::restore_rbac`].
    pub fn revoke(&self, verb: &str, resource: &str) {
        self.shared.lock().rbac.revoke(verb, resource);
    }

    /// The manifests' grants again, whole.
    pub fn restore_rbac(&self) {
        self.shared.lock().rbac.restore();
    }

    /// The 403 messages RBAC has answered so far.
    pub fn denials(&self) -> Vec<String> {
        self.shared.lock().denials.clone()
    }

    /// A node more for the scheduler to bind pods to.
    pub fn add_node(&self, name: &str) {
        self.shared.lock().nodes.insert(name.to_owned(), false);
        self.shared.kick.notify_waiters();
    }

    /// The node is lost (see the module's doc): its pods' processes are SIGSTOPped,
    /// their statuses frozen but for `Ready` going False, their graceful deletions left
    /// Terminating; the scheduler binds nothing more to it.
    pub fn lose_node(&self, name: &str) {
        let mut st = self.shared.lock();
        *st.nodes.get_mut(name).expect("no such node") = true;
        let on_node: Vec<Key> = (st.pods.iter())
            .filter(|(_, pod)| pod.object["spec"]["nodeName"] == json!(name))
            .map(|(key, _)| key.clone())
            .collect();
        for key in on_node {
            if let Some(process) = &st.pods[&key].process {
                let _ = process.signals.send(libc::SIGSTOP);
            }
            st.modify(&key, |o| {
                for kind in ["Ready", "ContainersReady"] {
                    set_condition(o, kind, "False", None, None);
                }
            });
        }
    }

    /// Aborts every open watch connection, as a dropped connection or an API server
    /// restart does.
    pub fn drop_watches(&self) {
        self.shared.lock().watch_generation += 1;
        self.shared.changed.notify_waiters();
    }

    /// An etcd compaction: a watch from any resourceVersion older than now (or a list
    /// with `resourceVersionMatch=Exact` at one) gets 410 Gone. Open watches go on.
    pub fn expire_history(&self) {
        let mut st = self.shared.lock();
        st.oldest_rv = st.rv;
    }

    /// Every request answered: (verb, path with query, status), in order. A watch is
    /// recorded when its response starts.
    pub fn requests(&self) -> Vec<(String, String, u16)> {
        self.shared.lock().requests.clone()
    }
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutting_down = true;
            for pod in st.pods.values() {
                if let Some(process) = &pod.process {
                    let _ = process.signals.send(libc::SIGKILL);
                }
            }
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The server's thread: serves until the drop, then waits (a little) for the monitors
/// to reap the processes the drop killed. Dropping the runtime drops what is left,
/// and each `Child` is `kill_on_drop`.
fn run(
    runtime: tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    stopped: oneshot::Receiver<()>,
) {
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let app = Router::new().fallback(handle).with_state(shared.clone());
        tokio::select! {
            () = serve::serve(listener, app, shared.down.subscribe()) => {}
            _ = stopped => {}
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && shared.lock().pods.values().any(|p| p.process.is_some())
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A test failing elsewhere must not turn every later call into a second panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl PodEntry {
    fn new(object: Value, uid: String) -> PodEntry {
        PodEntry {
            object,
            uid,
            process: None,
            kill: None,
            kill_at: None,
            orphan_dependents: false,
        }
    }
}

impl State {
    /// Gives the pod the next resourceVersion and records the change for the watches.
    fn publish(&mut self, key: &Key, kind: &'static str) -> Option<Value> {
        let pod = self.pods.get_mut(key)?;
        self.rv += 1;
        pod.object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let object = pod.object.clone();
        self.events.push(Event {
            rv: self.rv,
            namespace: key.0.clone(),
            kind,
            object: object.clone(),
        });
        self.changed.notify_waiters();
        Some(object)
    }

    /// Changes the pod's object: one MODIFIED event.
    fn modify(&mut self, key: &Key, change: impl FnOnce(&mut Value)) -> Option<Value> {
        change(&mut self.pods.get_mut(key)?.object);
        self.publish(key, "MODIFIED")
    }

    /// The pod, if it is still the one a kubelet task runs (same uid) and that kubelet
    /// still has work: not being deleted, not killed, its node not lost, the simulator
    /// not stopping.
    fn live(&self, key: &Key, uid: &str) -> Option<&PodEntry> {
        let pod = self.pods.get(key)?;
        let live = pod.uid == uid && pod.kill_at.is_none() && pod.kill.is_none();
        (live && !self.shutting_down && !self.on_lost_node(key)).then_some(pod)
    }

    fn new_uid(&mut self) -> String {
        let b = self.random_bytes();
        let hex: String = b.iter().map(|b| format!("{b:02x}")).collect();
        // The layout of a version-4 UUID, as the API server's uids are.
        format!(
            "{}-{}-4{}-{:x}{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[13..16],
            8 | (b[8] & 3),
            &hex[17..20],
            &hex[20..32]
        )
    }

    fn random_bytes(&mut self) -> [u8; 16] {
        self.serial += 1;
        let mut bytes = [0u8; 16];
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            // Each RandomState is freshly keyed: random enough for names in a test.
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(self.serial);
            hasher.write_usize(i);
            chunk.copy_from_slice(&hasher.finish().to_le_bytes());
        }
        bytes
    }

    /// The injected failure for this request, if one is due.
    fn take_failure(&mut self, verb: &str) -> Option<Fault> {
        let failure = self
            .failures
            .iter_mut()
            .find(|f| f.left > 0 && (f.verb == verb || f.verb == "any"))?;
        failure.left -= 1;
        let fault = failure.fault;
        self.failures.retain(|f| f.left > 0);
        Some(fault)
    }

    /// Whether the pod is on a lost node: nothing but the API server changes it.
    fn on_lost_node(&self, key: &Key) -> bool {
        let Some(pod) = self.pods.get(key) else {
            return false;
        };
        let node = pod.object["spec"]["nodeName"].as_str();
        node.is_some_and(|node| self.nodes.get(node) == Some(&true))
    }

    /// The node the scheduler binds the next pod to: one not lost with the fewest pods.
    fn pick_node(&self) -> Result<String, String> {
        let live = self.nodes.iter().filter(|(_, lost)| !**lost);
        let load = |node: &str| {
            (self.pods.values())
                .filter(|p| p.object["spec"]["nodeName"] == json!(node))
                .count()
        };
        live.map(|(name, _)| name.clone())
            .min_by_key(|name| load(name))
            .ok_or_else(|| {
                let n = self.nodes.len();
                format!(
                    "0/{n} nodes are available: {n} node(s) had untolerated taint \
                     {{node.kubernetes.io/unreachable: }}."
                )
            })
    }

    /// The pods a quota counts in `namespace`: not ended, not being deleted.
    fn quota_used(&self, namespace: &str) -> u32 {
        (self.pods.iter())
            .filter(|((ns, _), pod)| {
                let phase = pod.object["status"]["phase"].as_str();
                ns == namespace
                    && !matches!(phase, Some("Succeeded" | "Failed"))
                    && pod.object["metadata"]["deletionTimestamp"].is_null()
            })
            .count() as u32
    }
}

// ---------------------------------------------------------------------------------
// The API server: routing, list, watch, create, get, delete.

/// What a request asks for.
enum Route {
    List(Option<String>),
    Watch(Option<String>),
    Create(String),
    Get(String, String),
    Delete(String, String),
    Version,
    NotAllowed(String),
    NotFound(String),
}

impl Route {
    fn of(method: &Method, path: &str, watch: bool) -> Route {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let verb = method.as_str().to_ascii_lowercase();
        match (method.as_str(), segments.as_slice()) {
            ("GET", ["api", "v1", "pods"]) if watch => Route::Watch(None),
            ("GET", ["api", "v1", "pods"]) => Route::List(None),
            ("GET", ["api", "v1", "namespaces", ns, "pods"]) if watch => {
                Route::Watch(Some(ns.to_string()))
            }
            ("GET", ["api", "v1", "namespaces", ns, "pods"]) => Route::List(Some(ns.to_string())),
            ("POST", ["api", "v1", "namespaces", ns, "pods"]) => Route::Create(ns.to_string()),
            ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
                Route::Get(ns.to_string(), name.to_string())
            }
            ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => {
                Route::Delete(ns.to_string(), name.to_string())
            }
            ("GET", ["version"]) => Route::Version,
            (_, ["api", "v1", "pods"] | ["api", "v1", "namespaces", _, "pods", ..]) => {
                Route::NotAllowed(verb)
            }
            _ => Route::NotFound(verb),
        }
    }

    /// The verb as the API server's audit log would name it.
    fn verb(&self) -> String {
        match self {
            Route::List(_) => "list".into(),
            Route::Watch(_) => "watch".into(),
            Route::Create(_) => "create".into(),
            Route::Get(..) | Route::Version => "get".into(),
            Route::Delete(..) => "delete".into(),
            Route::NotAllowed(verb) | Route::NotFound(verb) => verb.clone(),
        }
    }
}

/// What becomes of a request before it is served.
enum Admission {
    Go,
    /// Done, the answer never sent.
    GoSilently,
    /// Refused: 401, 403, an injected failure.
    Answer(Response),
    /// Never answered.
    Hang,
}

impl State {
    /// A hung connection, authentication, an injected failure, RBAC, in this order;
    /// what is not served is recorded (a hung request with status 0).
    fn admit(
        &mut self,
        verb: &str,
        target: &str,
        token: Option<&str>,
        attributes: &Attributes,
    ) -> Admission {
        let failure = self.take_failure(verb);
        let (admission, code) = if self.hanging || failure == Some(Fault::Hang) {
            (Admission::Hang, 0)
        } else if let Some(user) = user_of(token) {
            match (failure, self.rbac.authorize(user, attributes)) {
                (Some(Fault::Status(code)), _) => (Admission::Answer(injected_failure(code)), code),
                (_, Err(status)) => {
                    self.denials
                        .push(status["message"].as_str().unwrap_or_default().to_owned());
                    (Admission::Answer(json_response(403, &status)), 403)
                }
                (Some(Fault::LoseAnswer), _) => return Admission::GoSilently,
                _ => return Admission::Go,
            }
        } else {
            let status = status_body(401, "Unauthorized", "Unauthorized");
            (Admission::Answer(json_response(401, &status)), 401)
        };
        self.requests
            .push((verb.to_owned(), target.to_owned(), code));
        admission
    }
}

/// The user a bearer token stands for.
fn user_of(token: Option<&str>) -> Option<&'static str> {
    match token? {
        TOKEN => Some(DRIVER_USER),
        ADMIN_TOKEN => Some(rbac::ADMIN),
        _ => None,
    }
}

/// The request's query parameters.
struct Params(Vec<(String, String)>);

impl Params {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("true" | "1"))
    }
}

async fn handle(AxumState(shared): AxumState<Arc<Shared>>, request: Request) -> Response {
    let uri = request.uri().clone();
    let method = request.method().clone();
    let target = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned());
    let params = Params(
        Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .map(|Query(q)| q)
            .unwrap_or_default(),
    );
    let route = Route::of(&method, uri.path(), params.flag("watch"));
    let verb = route.verb();
    let attributes = Attributes::of(&method, uri.path(), params.flag("watch"));
    let token = (request.headers().get(header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let admission = shared
        .lock()
        .admit(&verb, &target, token.as_deref(), &attributes);
    let silently = matches!(admission, Admission::GoSilently);
    match admission {
        Admission::Go | Admission::GoSilently => {}
        Admission::Answer(response) => return response,
        // Read, and never answered: the client's connection is dead to it.
        Admission::Hang => return std::future::pending().await,
    }
    let body = match axum::body::to_bytes(request.into_body(), 64 << 20).await {
        Ok(body) => body,
        Err(e) => return status_response(400, "BadRequest", &format!("reading the body: {e}")),
    };
    let response = match route {
        Route::List(ns) => list(&shared, ns.as_deref(), &params),
        Route::Watch(ns) => watch(&shared, ns, &params),
        Route::Create(ns) => create(&shared, &ns, &body, &params),
        Route::Get(ns, name) => match shared.lock().pods.get(&(ns, name.clone())) {
            Some(pod) => json_response(200, &pod.object),
            None => not_found(&name),
        },
        Route::Delete(ns, name) => delete(&shared, ns, name, &body, &params),
        Route::Version => json_response(
            200,
            &json!({
                "major": "1", "minor": "33", "gitVersion": "v1.33.0-flint-kube-sim",
                "platform": "linux/amd64",
            }),
        ),
        Route::NotAllowed(verb) => status_response(
            405,
            "MethodNotAllowed",
            &format!("the simulator does not serve {verb} here"),
        ),
        Route::NotFound(_) => status_response(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
    };
    shared
        .lock()
        .requests
        .push((verb, target, response.status().as_u16()));
    if silently {
        // Done and recorded as answered; the client never hears of it.
        return std::future::pending().await;
    }
    response
}

fn list(shared: &Shared, namespace: Option<&str>, params: &Params) -> Response {
    let filter = match Filter::new(namespace.map(str::to_owned), params) {
        Ok(filter) => filter,
        Err(response) => return response,
    };
    let st = shared.lock();
    if params.get("resourceVersionMatch") == Some("Exact")
        && let Some(rv) = params.get("resourceVersion").and_then(|r| r.parse().ok())
        && rv < st.oldest_rv
    {
        return status_response(410, "Expired", &too_old(rv, st.oldest_rv));
    }
    let items: Vec<Value> = st
        .pods
        .iter()
        .filter(|((ns, _), pod)| filter.matches(ns, &pod.object))
        .map(|(_, pod)| {
            // A list's items carry no kind and apiVersion, as the real server's do not.
            let mut item = pod.object.clone();
            let fields = item.as_object_mut().unwrap();
            fields.remove("kind");
            fields.remove("apiVersion");
            item
        })
        .collect();
    json_response(
        200,
        &json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": st.rv.to_string()},
            "items": items,
        }),
    )
}

/// Which pods a list or watch sees.
struct Filter {
    namespace: Option<String>,
    labels: Vec<Term>,
    fields: Vec<Term>,
}

enum Term {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
}

impl Filter {
    // The error is the request's whole answer (a 400), made once per bad request.
    #[allow(clippy::result_large_err)]
    fn new(namespace: Option<String>, params: &Params) -> Result<Filter, Response> {
        let parse = |name| parse_selector(params.get(name).unwrap_or_default());
        let bad = |e: String| status_response(400, "BadRequest", &e);
        Ok(Filter {
            namespace,
            labels: parse("labelSelector").map_err(bad)?,
            fields: parse("fieldSelector").map_err(bad)?,
        })
    }

    fn matches(&self, namespace: &str, object: &Value) -> bool {
        let label = |k: &str| object["metadata"]["labels"][k].as_str().map(str::to_owned);
        let field = |path: &str| {
            let value = path.split('.').fold(object, |v, part| &v[part]);
            match value {
                Value::String(s) => Some(s.clone()),
                Value::Null => None,
                other => Some(other.to_string()),
            }
        };
        self.namespace.as_deref().is_none_or(|ns| ns == namespace)
            && self.labels.iter().all(|t| t.holds(label))
            && self.fields.iter().all(|t| t.holds(field))
    }
}

impl Term {
    fn holds(&self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        match self {
            Term::Eq(k, v) => lookup(k).unwrap_or_default() == *v,
            Term::Ne(k, v) => lookup(k).unwrap_or_default() != *v,
            Term::Exists(k) => lookup(k).is_some(),
            Term::Absent(k) => lookup(k).is_none(),
        }
    }
}

/// An equality-based selector: `k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated.
fn parse_selector(selector: &str) -> Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if term.contains('(') || term.contains(' ') {
            return Err(format!(
                "set-based selectors are not modelled by the simulator: {term:?}"
            ));
        }
        terms.push(if let Some((k, v)) = term.split_once("!=") {
            Term::Ne(k.into(), v.into())
        } else if let Some((k, v)) = term.split_once("==") {
            Term::Eq(k.into(), v.into())
        } else if let Some((k, v)) = term.split_once('=') {
            Term::Eq(k.into(), v.into())
        } else if let Some(k) = term.strip_prefix('!') {
            Term::Absent(k.into())
        } else {
            Term::Exists(term.into())
        });
    }
    Ok(terms)
}

fn too_old(rv: u64, oldest: u64) -> String {
    format!("too old resource version: {rv} ({oldest})")
}

fn watch(shared: &Arc<Shared>, namespace: Option<String>, params: &Params) -> Response {
    let filter = match Filter::new(namespace, params) {
        Ok(filter) => filter,
        Err(response) => return response,
    };
    let bookmarks = params.flag("allowWatchBookmarks");
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|&t| t > 0)
        .map(|t| Instant::now() + Duration::from_secs(t));
    let mut first = Vec::new();
    let st = shared.lock();
    let since = match params.get("resourceVersion").filter(|r| !r.is_empty()) {
        None | Some("0") => None,
        Some(rv) => match rv.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                let message = format!("invalid resource version: {rv:?}");
                return status_response(400, "BadRequest", &message);
            }
        },
    };
    if let Some(rv) = since
        && rv < st.oldest_rv
    {
        // What the real server does: a 200 whose one event is the error.
        let status = status_body(410, "Expired", &too_old(rv, st.oldest_rv));
        return watch_response(Body::from(watch_line("ERROR", &status)));
    }
    // No resourceVersion (or 0), or a streaming list: first what exists, as ADDED.
    let initial_events = params.flag("sendInitialEvents");
    let cursor = if since.is_none() || initial_events {
        for ((ns, _), pod) in &st.pods {
            if filter.matches(ns, &pod.object) {
                first.push(watch_line("ADDED", &pod.object));
            }
        }
        if initial_events {
            first.push(bookmark(st.rv, true));
        }
        st.rv
    } else {
        since.unwrap_or_default()
    };
    let generation = st.watch_generation;
    drop(st);
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let follow = Follow {
        shared: shared.clone(),
        filter,
        cursor,
        generation,
        bookmarks,
        timeout,
    };
    shared.runtime.spawn(follow.run(first, tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    watch_response(Body::from_stream(stream))
}

/// An open watch, sending what changes after `cursor`.
struct Follow {
    shared: Arc<Shared>,
    filter: Filter,
    cursor: u64,
    generation: u64,
    bookmarks: bool,
    timeout: Option<Instant>,
}

impl Follow {
    async fn run(mut self, first: Vec<String>, tx: mpsc::Sender<Result<Bytes, std::io::Error>>) {
        let mut lines = first;
        loop {
            let mut changed = pin!(self.shared.changed.notified());
            changed.as_mut().enable();
            let dropped = {
                let st = self.shared.lock();
                let dropped = st.watch_generation != self.generation;
                let from = st.events.partition_point(|e| e.rv <= self.cursor);
                for event in &st.events[from..] {
                    if self.filter.matches(&event.namespace, &event.object) {
                        lines.push(watch_line(event.kind, &event.object));
                    }
                }
                self.cursor = self.cursor.max(st.rv);
                dropped
            };
            if dropped {
                // An error mid-body makes hyper drop the connection, unterminated, as a
                // server that went away would.
                let _ = tx.send(Err(std::io::Error::other("watch dropped"))).await;
                return;
            }
            for line in lines.drain(..) {
                if tx.send(Ok(line.into())).await.is_err() {
                    return;
                }
            }
            let timeout = async {
                match self.timeout {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = changed => {}
                _ = tx.closed() => return,
                _ = timeout => {
                    if self.bookmarks {
                        let _ = tx.send(Ok(bookmark(self.cursor, false).into())).await;
                    }
                    return;
                }
            }
        }
    }
}

fn watch_line(kind: &str, object: &Value) -> String {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    line
}

fn bookmark(rv: u64, initial_events_end: bool) -> String {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let object = json!({"kind": "Pod", "apiVersion": "v1", "metadata": metadata});
    watch_line("BOOKMARK", &object)
}

fn watch_response(body: Body) -> Response {
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap()
}

fn create(shared: &Arc<Shared>, namespace: &str, body: &[u8], params: &Params) -> Response {
    let raw: Value = match serde_json::from_slice(body) {
        Ok(raw @ Value::Object(_)) => raw,
        Ok(_) => return status_response(400, "BadRequest", "the body is not a JSON object"),
        Err(e) => {
            let message = format!("couldn't get version/kind; json parse error: {e}");
            return status_response(400, "BadRequest", &message);
        }
    };
    if raw.get("kind").is_some_and(|k| k != "Pod") {
        let message = format!("the body's kind {} is not Pod", raw["kind"]);
        return status_response(400, "BadRequest", &message);
    }
    if raw["metadata"]["namespace"]
        .as_str()
        .is_some_and(|ns| ns != namespace)
    {
        let message = "the namespace of the provided object does not match the namespace sent \
                       on the request";
        return status_response(400, "BadRequest", message);
    }
    let mut st = shared.lock();
    let name = match (
        raw["metadata"]["name"].as_str(),
        raw["metadata"]["generateName"].as_str(),
    ) {
        (Some(name), _) if !name.is_empty() => name.to_owned(),
        (_, Some(prefix)) if !prefix.is_empty() => {
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            let suffix: String = st.random_bytes()[..5]
                .iter()
                .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
                .collect();
            format!("{prefix}{suffix}")
        }
        _ => {
            return invalid(
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            );
        }
    };
    if let Err(e) = validate(&name, &raw) {
        return invalid(&name, e.0, &e.1);
    }
    // The quota admission plugin, before storage finds the name taken.
    if let Some(limit) = st.quota {
        let used = st.quota_used(namespace);
        if used >= limit {
            let message = format!(
                "pods \"{name}\" is forbidden: exceeded quota: pod-count, requested: pods=1, \
                 used: pods={used}, limited: pods={limit}"
            );
            let mut body = status_body(403, "Forbidden", &message);
            body["details"] = json!({"name": name, "kind": "pods"});
            return json_response(403, &body);
        }
    }
    let key: Key = (namespace.into(), name.clone());
    if st.pods.contains_key(&key) {
        let message = format!("pods \"{name}\" already exists");
        let mut body = status_body(409, "AlreadyExists", &message);
        body["details"] = json!({"name": name, "kind": "pods"});
        return json_response(409, &body);
    }
    let uid = st.new_uid();
    let mut object = raw.clone();
    object["apiVersion"] = json!("v1");
    object["kind"] = json!("Pod");
    let metadata = &mut object["metadata"];
    metadata["name"] = json!(name);
    metadata["namespace"] = json!(namespace);
    metadata["uid"] = json!(uid);
    metadata["creationTimestamp"] = json!(now());
    let spec = &mut object["spec"];
    for (field, default) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("schedulerName", json!("default-scheduler")),
    ] {
        if spec[field].is_null() {
            spec[field] = default;
        }
    }
    object["status"] = json!({"phase": "Pending"});
    if params.get("dryRun").is_some() {
        return json_response(201, &object);
    }
    st.pods
        .insert(key.clone(), PodEntry::new(object, uid.clone()));
    st.created.push(raw);
    let stored = st.publish(&key, "ADDED").unwrap();
    drop(st);
    shared.runtime.spawn(kubelet(shared.clone(), key, uid));
    json_response(201, &stored)
}

/// What the API server's validation of a new pod checks here: the field and why.
fn validate(name: &str, pod: &Value) -> Result<(), (&'static str, String)> {
    if !is_dns_subdomain(name) {
        return Err((
            "metadata.name",
            format!(
                "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower \
                 case alphanumeric characters, '-' or '.', and must start and end with an \
                 alphanumeric character"
            ),
        ));
    }
    if let Some(labels) = pod["metadata"]["labels"].as_object() {
        for (k, v) in labels {
            let value = v.as_str().unwrap_or("\u{0}");
            if !is_label_key(k) || !is_label_value(value) {
                return Err((
                    "metadata.labels",
                    format!("Invalid value: {k:?}: {v}: not a valid label"),
                ));
            }
        }
    }
    let containers = pod["spec"]["containers"].as_array();
    if containers.is_none_or(|c| c.is_empty()) {
        return Err(("spec.containers", "Required value".into()));
    }
    for container in containers.into_iter().flatten() {
        if container["name"].as_str().is_none_or(str::is_empty) {
            return Err(("spec.containers[].name", "Required value".into()));
        }
        if container["image"].as_str().is_none_or(str::is_empty) {
            return Err(("spec.containers[].image", "Required value".into()));
        }
    }
    Ok(())
}

fn is_dns_subdomain(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (1..=253).contains(&s.len())
        && s.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && s.bytes().next().is_some_and(alnum)
        && s.bytes().last().is_some_and(alnum)
}

fn is_label_key(key: &str) -> bool {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) if is_dns_subdomain(prefix) => name,
        Some(_) => return false,
        None => key,
    };
    !name.is_empty() && is_label_value(name)
}

fn is_label_value(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && s.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

/// What a delete asks for (DeleteOptions).
#[derive(Default)]
struct DeleteOptions {
    grace_seconds: Option<u64>,
    orphan: bool,
    uid: Option<String>,
    resource_version: Option<String>,
}

fn delete(
    shared: &Arc<Shared>,
    namespace: String,
    name: String,
    body: &[u8],
    params: &Params,
) -> Response {
    // DeleteOptions come in the body (kube sends them there) or the query.
    let body: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(body) => body,
            Err(e) => return status_response(400, "BadRequest", &format!("DeleteOptions: {e}")),
        }
    };
    let grace = body["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| params.get("gracePeriodSeconds")?.parse().ok());
    let policy = body["propagationPolicy"]
        .as_str()
        .or_else(|| params.get("propagationPolicy"));
    let options = DeleteOptions {
        grace_seconds: grace.map(|g| g.max(0) as u64),
        orphan: policy == Some("Orphan") || body["orphanDependents"] == json!(true),
        uid: body["preconditions"]["uid"].as_str().map(str::to_owned),
        resource_version: body["preconditions"]["resourceVersion"]
            .as_str()
            .map(str::to_owned),
    };
    let mut st = shared.lock();
    let key = (namespace, name);
    if body["dryRun"].is_array() || params.get("dryRun").is_some() {
        return match st.pods.get(&key) {
            Some(pod) => json_response(200, &pod.object),
            None => not_found(&key.1),
        };
    }
    match delete_pod(shared, &mut st, &key, options) {
        Ok(object) => json_response(200, &object),
        Err(status) => json_response(status["code"].as_u64().unwrap_or(500) as u16, &status),
    }
}

/// Deletes a pod as the registry and the kubelet do together; the object as it is
/// after the delete, or the Status of why not.
fn delete_pod(
    shared: &Arc<Shared>,
    st: &mut State,
    key: &Key,
    options: DeleteOptions,
) -> Result<Value, Value> {
    let Some(pod) = st.pods.get_mut(key) else {
        let message = format!("pods \"{}\" not found", key.1);
        let mut status = status_body(404, "NotFound", &message);
        status["details"] = json!({"name": key.1, "kind": "pods"});
        return Err(status);
    };
    let rv = pod.object["metadata"]["resourceVersion"].as_str();
    if options.uid.as_ref().is_some_and(|uid| *uid != pod.uid)
        || options
            .resource_version
            .as_deref()
            .is_some_and(|r| Some(r) != rv)
    {
        let message = format!(
            "Operation cannot be fulfilled on pods \"{}\": Precondition failed: UID in \
             precondition: {}, UID in object meta: {}",
            key.1,
            options.uid.as_deref().unwrap_or(""),
            pod.uid
        );
        return Err(status_body(409, "Conflict", &message));
    }
    pod.orphan_dependents |= options.orphan;
    let grace = options.grace_seconds.unwrap_or_else(|| {
        pod.object["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or(30)
    });
    let metadata = &mut pod.object["metadata"];
    if metadata["deletionTimestamp"].is_null() {
        metadata["deletionTimestamp"] =
            json!(timestamp(SystemTime::now() + Duration::from_secs(grace)));
    }
    if grace == 0 {
        // A force delete: removed now; the kubelet (or, for a lost node, the simulator)
        // kills the container after.
        metadata["deletionGracePeriodSeconds"] = json!(0);
        if let Some(process) = &pod.process {
            let _ = process.signals.send(libc::SIGKILL);
        }
        return Ok(remove_pod(shared, st, key));
    }
    let ended = matches!(
        pod.object["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    let lost = !ended && st.on_lost_node(key);
    let pod = st.pods.get_mut(key).unwrap();
    let metadata = &mut pod.object["metadata"];
    if lost {
        // No kubelet to stop it and confirm: Terminating until a force delete.
        if metadata["deletionGracePeriodSeconds"].is_null() {
            metadata["deletionGracePeriodSeconds"] = json!(grace);
            return Ok(st.publish(key, "MODIFIED").unwrap());
        }
        return Ok(pod.object.clone());
    }
    let Some(process) = &pod.process else {
        // Nothing runs (never started, ended, a pod with no process): gone at once, as
        // the registry deletes an unbound or terminated pod.
        metadata["deletionGracePeriodSeconds"] = json!(0);
        return Ok(remove_pod(shared, st, key));
    };
    let at = Instant::now() + Duration::from_secs(grace);
    if pod.kill_at.is_some_and(|earlier| earlier <= at) {
        // Already being deleted, sooner than this would.
        return Ok(pod.object.clone());
    }
    if pod.kill_at.is_none() {
        let _ = process.signals.send(libc::SIGTERM);
    }
    pod.kill_at = Some(at);
    metadata["deletionGracePeriodSeconds"] = json!(grace);
    let uid = pod.uid.clone();
    let object = st.publish(key, "MODIFIED").unwrap();
    let (shared2, key) = (shared.clone(), key.clone());
    shared.runtime.spawn(async move {
        tokio::time::sleep_until(at).await;
        let st = shared2.lock();
        if let Some(pod) = st.pods.get(&key)
            && pod.uid == uid
            && pod.kill_at == Some(at)
            && let Some(process) = &pod.process
        {
            let _ = process.signals.send(libc::SIGKILL);
        }
    });
    Ok(object)
}

/// Removes a pod (DELETED, with its final state), then does what the garbage collector
/// does with the pods it owned.
fn remove_pod(shared: &Arc<Shared>, st: &mut State, key: &Key) -> Value {
    let object = st.publish(key, "DELETED").unwrap();
    let gone = st.pods.remove(key).unwrap();
    for dependent in dependents(st, &key.0, &gone.uid) {
        if gone.orphan_dependents {
            st.modify(&dependent, |o| {
                if let Some(owners) = o["metadata"]["ownerReferences"].as_array_mut() {
                    owners.retain(|r| r["uid"] != json!(gone.uid));
                }
            });
        } else {
            let _ = delete_pod(shared, st, &dependent, DeleteOptions::default());
        }
    }
    object
}

/// The pods of `namespace` whose `ownerReferences` name `uid`.
fn dependents(st: &State, namespace: &str, uid: &str) -> Vec<Key> {
    (st.pods.iter())
        .filter(|((ns, _), pod)| ns == namespace && owner_uids(&pod.object).any(|u| u == uid))
        .map(|(k, _)| k.clone())
        .collect()
}

fn owner_uids(pod: &Value) -> impl Iterator<Item = &str> {
    pod["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["uid"].as_str())
}

// ---------------------------------------------------------------------------------
// The scheduler and the kubelet.

/// One pod's life after its creation: bound by the scheduler, its container started,
/// watched until it exits.
async fn kubelet(shared: Arc<Shared>, key: Key, uid: String) {
    // The scheduler.
    loop {
        let mut kicked = pin!(shared.kick.notified());
        kicked.as_mut().enable();
        {
            let mut st = shared.lock();
            let Some(pod) = st.live(&key, &uid) else {
                return;
            };
            if pod.object["spec"]["nodeName"].is_string() {
                break; // bound by its creator
            }
            let shown = condition(&pod.object, "PodScheduled")["message"].clone();
            let node = match st.unschedulable.clone() {
                Some(message) => Err(message),
                None => st.pick_node(),
            };
            match node {
                Ok(node) => {
                    st.modify(&key, |o| {
                        o["spec"]["nodeName"] = json!(node);
                        set_condition(o, "PodScheduled", "True", None, None);
                    });
                    break;
                }
                Err(message) if shown != json!(message) => {
                    st.modify(&key, |o| {
                        let reason = Some("Unschedulable");
                        set_condition(o, "PodScheduled", "False", reason, Some(&message));
                    });
                }
                Err(_) => {}
            }
        }
        kicked.await;
    }
    // The kubelet: the sandbox, then the container's config (which may wait for a
    // secret), then the process.
    {
        let mut st = shared.lock();
        if st.live(&key, &uid).is_none() {
            return;
        }
        st.modify(&key, |o| {
            o["status"]["hostIP"] = json!(POD_IP);
            o["status"]["startTime"] = json!(now());
            set_condition(o, "Initialized", "True", None, None);
            let name = o["spec"]["containers"][0]["name"]
                .as_str()
                .unwrap_or_default();
            let message = format!("containers with unready status: [{name}]");
            for kind in ["Ready", "ContainersReady"] {
                set_condition(o, kind, "False", Some("ContainersNotReady"), Some(&message));
            }
            let waiting = json!({"waiting": {"reason": "ContainerCreating"}});
            set_container_state(o, waiting, false, None);
        });
    }
    let mut config_error = None;
    let (mut child, mut signals, pid) = loop {
        let mut kicked = pin!(shared.kick.notified());
        kicked.as_mut().enable();
        {
            let mut st = shared.lock();
            let Some(pod) = st.live(&key, &uid) else {
                return;
            };
            match launch(&shared, &st, &key, &pod.object) {
                Ok(mut command) => {
                    // Spawned under the lock: a delete cannot come between the start and
                    // the pod knowing its process.
                    match command.spawn() {
                        Ok(child) => {
                            let pid = child.id().unwrap_or_default();
                            let (tx, rx) = mpsc::unbounded_channel();
                            let pod = st.pods.get_mut(&key).unwrap();
                            pod.process = Some(Running { pid, signals: tx });
                            st.modify(&key, |o| running(o, pid));
                            break (child, rx, pid);
                        }
                        Err(e) => {
                            let message = format!("starting {}: {e}", shared.program.display());
                            st.modify(&key, |o| start_error(o, &message));
                            return;
                        }
                    }
                }
                Err(message) => {
                    if config_error.as_ref() != Some(&message) {
                        st.modify(&key, |o| {
                            let waiting = json!({"waiting": {
                                "reason": "CreateContainerConfigError", "message": message,
                            }});
                            set_container_state(o, waiting, false, None);
                        });
                        config_error = Some(message);
                    }
                }
            }
        }
        // The kubelet retries: now if a secret appeared, else in a second.
        tokio::select! {
            _ = kicked => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    // The container's monitor.
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            Some(signal) = signals.recv() => {
                // SAFETY: a plain syscall on our own child, not reaped yet: only this
                // task waits on it.
                unsafe { libc::kill(pid as libc::pid_t, signal) };
            }
        }
    };
    let (code, signal) = match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => (code, None),
            (None, Some(signal)) => (128 + signal, Some(signal)),
            (None, None) => (128, None),
        },
        Err(_) => (128, None),
    };
    let mut st = shared.lock();
    let lost = st.on_lost_node(&key);
    let Some(pod) = st.pods.get_mut(&key).filter(|p| p.uid == uid) else {
        return; // removed already (a delete with no grace)
    };
    pod.process = None;
    if lost {
        return; // no kubelet left to say so
    }
    let (kill, deleting) = (pod.kill, pod.kill_at.is_some());
    st.modify(&key, |o| terminated(o, code, signal, kill));
    if deleting {
        remove_pod(&shared, &mut st, &key);
    }
}

/// The container's process as the kubelet would run it, or why its config cannot be
/// made (CreateContainerConfigError's message).
fn launch(
    shared: &Shared,
    st: &State,
    key: &Key,
    pod: &Value,
) -> Result<tokio::process::Command, String> {
    let (namespace, name) = key;
    let container = &pod["spec"]["containers"][0];
    let dir = shared.root.join(namespace).join(name);
    // emptyDir volumes: fresh dirs standing in for the mounts.
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let (Some(volume), Some(path)) = (mount["name"].as_str(), mount["mountPath"].as_str())
        else {
            continue;
        };
        let is_empty_dir = pod["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["name"] == json!(volume) && v["emptyDir"].is_object());
        let path = path.trim_end_matches('/');
        if is_empty_dir && !path.is_empty() {
            mounts.push((path.to_owned(), dir.join("volumes").join(volume)));
        }
    }
    // The longest mount path first, so that one nested in another wins.
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));

    let secret = |secret: &str| {
        st.secrets
            .get(&(namespace.clone(), secret.to_owned()))
            .ok_or_else(|| format!("secret \"{secret}\" not found"))
    };
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, name: String, value: String| {
        env.retain(|(n, _)| *n != name);
        env.push((name, value));
    };
    for source in container["envFrom"].as_array().into_iter().flatten() {
        let prefix = source["prefix"].as_str().unwrap_or_default();
        let optional = |r: &Value| r["optional"] == json!(true);
        if let Some(name) = source["secretRef"]["name"].as_str() {
            match secret(name) {
                Ok(values) => {
                    for (k, v) in values {
                        set(&mut env, format!("{prefix}{k}"), v.clone());
                    }
                }
                Err(_) if optional(&source["secretRef"]) => {}
                Err(e) => return Err(e),
            }
        } else if let Some(name) = source["configMapRef"]["name"].as_str()
            && !optional(&source["configMapRef"])
        {
            return Err(format!("configmap \"{name}\" not found"));
        }
    }
    for var in container["env"].as_array().into_iter().flatten() {
        let Some(var_name) = var["name"].as_str() else {
            continue;
        };
        let from = &var["valueFrom"];
        let value = if from.is_object() {
            if let Some(secret_name) = from["secretKeyRef"]["name"].as_str() {
                let key = from["secretKeyRef"]["key"].as_str().unwrap_or_default();
                let optional = from["secretKeyRef"]["optional"] == json!(true);
                match secret(secret_name).map(|s| s.get(key)) {
                    Ok(Some(value)) => value.clone(),
                    Ok(None) if optional => continue,
                    Ok(None) => {
                        return Err(format!(
                            "couldn't find key {key} in Secret {namespace}/{secret_name}"
                        ));
                    }
                    Err(_) if optional => continue,
                    Err(e) => return Err(e),
                }
            } else if let Some(path) = from["fieldRef"]["fieldPath"].as_str() {
                field_ref(pod, path)?
            } else if let Some(map) = from["configMapKeyRef"]["name"].as_str() {
                if from["configMapKeyRef"]["optional"] == json!(true) {
                    continue;
                }
                return Err(format!("configmap \"{map}\" not found"));
            } else {
                return Err(format!(
                    "the simulator does not model env {var_name}'s source {from}"
                ));
            }
        } else {
            expand(var["value"].as_str().unwrap_or_default(), &env)
        };
        set(&mut env, var_name.to_owned(), rewrite(&value, &mounts));
    }
    let args: Vec<String> = container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| rewrite_arg(&expand(a.as_str().unwrap_or_default(), &env), &mounts))
        .collect();

    let io = |e: std::io::Error| format!("preparing {}: {e}", dir.display());
    // An emptyDir lives as long as its pod: a new pod of the same name starts empty.
    let _ = std::fs::remove_dir_all(dir.join("volumes"));
    std::fs::create_dir_all(&dir).map_err(io)?;
    for (_, host) in &mounts {
        std::fs::create_dir_all(host).map_err(io)?;
    }
    let stdout = std::fs::File::create(dir.join("stdout")).map_err(io)?;
    let stderr = std::fs::File::create(dir.join("stderr")).map_err(io)?;

    let mut command = tokio::process::Command::new(&shared.program);
    command
        .args(args)
        .current_dir(&dir)
        // A container sees nothing of the host's environment.
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        .env("HOSTNAME", name)
        .env("HOME", &dir);
    if let Some(log) = std::env::var_os("RUST_LOG") {
        command.env("RUST_LOG", log);
    }
    command
        .envs(env)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe, which is all that may run between fork and
    // exec. The kernel SIGKILLs the process when the simulator's thread exits.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(command)
}

/// A `fieldRef`'s value (the downward API).
fn field_ref(pod: &Value, path: &str) -> Result<String, String> {
    let metadata = &pod["metadata"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let keyed = |prefix: &str| {
        path.strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")
            .map(str::to_owned)
    };
    Ok(match path {
        "metadata.name" => text(&metadata["name"]),
        "metadata.namespace" => text(&metadata["namespace"]),
        "metadata.uid" => text(&metadata["uid"]),
        "spec.nodeName" => text(&pod["spec"]["nodeName"]),
        "spec.serviceAccountName" => pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .into(),
        "status.podIP" | "status.hostIP" => POD_IP.into(),
        _ => {
            if let Some(label) = keyed("metadata.labels") {
                text(&metadata["labels"][label])
            } else if let Some(annotation) = keyed("metadata.annotations") {
                text(&metadata["annotations"][annotation])
            } else {
                return Err(format!("the simulator does not model fieldPath {path:?}"));
            }
        }
    })
}

/// The kubelet's `$(VAR)` expansion: a variable defined before is replaced, `$$` is
/// an escaped `$`, anything else stays as written.
fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(inner) = tail.strip_prefix("$(")
            && let Some(end) = inner.find(')')
        {
            match env.iter().find(|(n, _)| n == &inner[..end]) {
                Some((_, value)) => out.push_str(value),
                None => out.push_str(&tail[..end + 3]),
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// A path under an emptyDir's mount path, as the process sees it without a mount
/// namespace: under the volume's dir.
fn rewrite(value: &str, mounts: &[(String, PathBuf)]) -> String {
    for (path, host) in mounts {
        if let Some(rest) = value.strip_prefix(path.as_str())
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return format!("{}{rest}", host.display());
        }
    }
    value.to_owned()
}

/// As `rewrite`, for an arg, or the value of an `--flag=value` arg.
fn rewrite_arg(arg: &str, mounts: &[(String, PathBuf)]) -> String {
    match arg.split_once('=') {
        Some((flag, value)) if flag.starts_with('-') => {
            format!("{flag}={}", rewrite(value, mounts))
        }
        _ => rewrite(arg, mounts),
    }
}

// ---------------------------------------------------------------------------------
// Pod status, as the kubelet writes it.

fn now() -> String {
    timestamp(SystemTime::now())
}

fn timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

fn condition<'a>(pod: &'a Value, kind: &str) -> &'a Value {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == json!(kind)))
        .unwrap_or(&Value::Null)
}

fn set_condition(
    pod: &mut Value,
    kind: &str,
    status: &str,
    reason: Option<&str>,
    message: Option<&str>,
) {
    let mut condition = json!({
        "type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": now(),
    });
    if let Some(reason) = reason {
        condition["reason"] = json!(reason);
    }
    if let Some(message) = message {
        condition["message"] = json!(message);
    }
    let conditions = &mut pod["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let conditions = conditions.as_array_mut().unwrap();
    match conditions.iter_mut().find(|c| c["type"] == json!(kind)) {
        Some(old) => *old = condition,
        None => conditions.push(condition),
    }
}

/// The first (only simulated) container's status.
fn set_container_state(pod: &mut Value, state: Value, ready: bool, container_id: Option<String>) {
    let container = &pod["spec"]["containers"][0];
    let started = state.get("running").is_some();
    let mut status = json!({
        "name": container["name"],
        "image": container["image"],
        "imageID": "",
        "ready": ready,
        "started": started,
        "restartCount": 0,
        "state": state,
        "lastState": {},
    });
    let old_id = pod["status"]["containerStatuses"][0]["containerID"].clone();
    match container_id {
        Some(id) => status["containerID"] = json!(id),
        None if old_id.is_string() => status["containerID"] = old_id,
        None => {}
    }
    pod["status"]["containerStatuses"] = json!([status]);
}

fn running(pod: &mut Value, pid: u32) {
    pod["status"]["phase"] = json!("Running");
    pod["status"]["podIP"] = json!(POD_IP);
    pod["status"]["podIPs"] = json!([{"ip": POD_IP}]);
    let state = json!({"running": {"startedAt": now()}});
    set_container_state(pod, state, true, Some(format!("sim://{pid}")));
    for kind in ["ContainersReady", "Ready"] {
        set_condition(pod, kind, "True", None, None);
    }
}

/// The container ended: its terminated state and the pod's terminal phase.
fn terminated(pod: &mut Value, code: i32, signal: Option<i32>, kill: Option<Kill>) {
    let started_at = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].clone();
    let reason = match (code, kill) {
        (_, Some(Kill::OomKilled)) => "OOMKilled",
        (0, _) => "Completed",
        _ => "Error",
    };
    let mut state = json!({
        "exitCode": code, "reason": reason, "startedAt": started_at, "finishedAt": now(),
    });
    if let Some(signal) = signal {
        state["signal"] = json!(signal);
    }
    state["containerID"] = pod["status"]["containerStatuses"][0]["containerID"].clone();
    set_container_state(pod, json!({"terminated": state}), false, None);
    end_phase(pod, code == 0 && kill.is_none());
    if kill == Some(Kill::Evicted) {
        mark_evicted(pod);
    }
}

fn start_error(pod: &mut Value, message: &str) {
    let state = json!({"terminated": {
        "exitCode": 128, "reason": "StartError", "message": message, "finishedAt": now(),
    }});
    set_container_state(pod, state, false, None);
    end_phase(pod, false);
}

fn end_phase(pod: &mut Value, succeeded: bool) {
    let (phase, reason) = match succeeded {
        true => ("Succeeded", "PodCompleted"),
        false => ("Failed", "PodFailed"),
    };
    pod["status"]["phase"] = json!(phase);
    for kind in ["ContainersReady", "Ready"] {
        set_condition(pod, kind, "False", Some(reason), None);
    }
}

/// What the kubelet's eviction manager writes.
fn mark_evicted(pod: &mut Value) {
    let container = pod["spec"]["containers"][0]["name"]
        .as_str()
        .unwrap_or_default();
    let message = format!(
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. \
         Container {container} was using 1048576Ki, request is 0, has larger consumption of \
         memory. "
    );
    pod["status"]["phase"] = json!("Failed");
    pod["status"]["reason"] = json!("Evicted");
    pod["status"]["message"] = json!(message);
    let reason = Some("TerminationByKubelet");
    set_condition(pod, "DisruptionTarget", "True", reason, Some(&message));
}

// ---------------------------------------------------------------------------------
// Responses.

fn json_response(code: u16, body: &Value) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// A v1 Status, the body of every error.
fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
}

fn status_response(code: u16, reason: &str, message: &str) -> Response {
    json_response(code, &status_body(code, reason, message))
}

fn not_found(name: &str) -> Response {
    let mut body = status_body(404, "NotFound", &format!("pods \"{name}\" not found"));
    body["details"] = json!({"name": name, "kind": "pods"});
    json_response(404, &body)
}

fn invalid(name: &str, field: &str, detail: &str) -> Response {
    let message = format!("Pod \"{name}\" is invalid: {field}: {detail}");
    let mut body = status_body(422, "Invalid", &message);
    body["details"] = json!({
        "name": name, "kind": "Pod",
        "causes": [{"reason": "FieldValueInvalid", "message": detail, "field": field}],
    });
    json_response(422, &body)
}

fn injected_failure(code: u16) -> Response {
    let (reason, message) = match code {
        429 => (
            "TooManyRequests",
            "Too many requests, please try again later.",
        ),
        500 => (
            "InternalError",
            "Internal error occurred: injected by the simulator",
        ),
        503 => (
            "ServiceUnavailable",
            "The server is currently unable to handle the request",
        ),
        504 => ("Timeout", "The server was unable to respond in time"),
        _ => ("", "injected by the simulator"),
    };
    let mut body = status_body(code, reason, message);
    if code != 429 {
        return json_response(code, &body);
    }
    // What API priority and fairness answers: retry after a second.
    body["details"] = json!({"retryAfterSeconds": 1});
    let mut response = json_response(code, &body);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    response
}
