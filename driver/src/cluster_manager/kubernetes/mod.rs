//! `kubernetes`: executors as pods (Spark's KubernetesClusterManager, its
//! ExecutorPodsAllocator and ExecutorPodsWatchSnapshotSource). A launch queues a pod;
//! pods are created in batches (`--k8s-allocation-batch-size` every
//! `--k8s-allocation-batch-delay-ms`); one watch of this driver's pods (kube's watcher:
//! it resumes from the last resourceVersion and re-lists on 410 Gone) turns their
//! statuses into executor events: running, exited with its code and the kubelet's reason
//! (`OOMKilled`), evicted or deleted (lost, and replaced).
//!
//! What the API server refuses for now is back-pressure, not a failure: a full
//! ResourceQuota (403 `exceeded quota`), throttling (429), its own errors (5xx), no
//! answer (a request unanswered for 30 s is given up on): the pod stays queued and is
//! asked for again with a capped backoff, as is one RBAC does not allow (an admin can
//! grant it while the driver runs; the log names the permission). Only a pod the API
//! calls invalid (422) or a policy forbids is a failed launch. Until its container runs,
//! an executor is [`ClusterManager::waiting`] (queued, refused for now, unscheduled,
//! its sandbox or image being made): the launch timeout does not run, and the
//! supervisor gives up on it, as no failure, after `--executor-pending-timeout-ms`. A
//! pod stuck on its own spec (a missing Secret, an image that cannot be pulled) does not
//! wait: the launch timeout counts it. Deletions are retried until the API says done,
//! however long it is away (`deleter.rs`).
//!
//! Executor pods outlive the driver: one that stops to come back (a rollout, the
//! default) or crashes leaves them running, and the next driver on its data dir adopts
//! every pending or running pod of its instance when it starts (their executors register
//! again with what they run); only a stop for good (`--stop-executors-on-exit`) deletes
//! them. Every pod carries the driver's instance id (`instance.rs`): what a driver
//! adopts, watches and deletes is its own, never another's of the same app id. They are
//! owned by what owns the driver's pod, never by that pod (see `owner.rs`).

mod creator;
mod deleter;
pub(crate) mod instance;
mod owner;
pub mod pod;
mod refusal;
mod watch;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use flint_protocol::ExecutorId;
use futures_util::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use self::creator::create_pods;
use self::pod::PodSettings;
use self::watch::watch_pods;
use super::{ClusterManager, Departure, Dial, ExecutorEvent, LaunchRequest};
use crate::config::KubernetesConfig;

pub struct KubernetesManager {
    inner: Arc<Inner>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

struct Inner {
    api: Api<Pod>,
    settings: PodSettings,
    batch_size: usize,
    batch_delay: Duration,
    events: mpsc::UnboundedSender<ExecutorEvent>,
    state: Mutex<State>,
    queued: Notify,
}

#[derive(Default)]
struct State {
    /// Asked for, their pods not created yet (refused ones back at the head).
    queue: VecDeque<LaunchRequest>,
    /// Pods of this driver's executors, by pod name, from the creation request until
    /// the watch has seen them deleted.
    pods: HashMap<String, Tracked>,
    /// Pods being deleted, until the API says done (200, 404): one retrying task each.
    deleting: HashSet<String>,
}

struct Tracked {
    id: ExecutorId,
    created: bool,
    /// Seen by the watch: only those can be missing from a re-list.
    observed: bool,
    /// Its container runs: it no longer waits for the cluster.
    launched: bool,
    /// Its end was reported (exited, lost): later statuses are news to nobody.
    ended: bool,
    /// The driver deleted it (a kill): its deletion is no loss.
    deleting: bool,
    /// Why the scheduler or the kubelet has not started it.
    pending: Option<String>,
    /// The kubelet cannot start it as it is (a missing Secret, an image it cannot
    /// pull): it no longer waits for the cluster.
    stuck: bool,
    /// Why the API server refused its creation for now, the last time it did.
    refused: Option<String>,
}

impl Tracked {
    fn launching(id: ExecutorId) -> Tracked {
        Tracked {
            id,
            created: false,
            observed: false,
            launched: false,
            ended: false,
            deleting: false,
            pending: None,
            stuck: false,
            refused: None,
        }
    }
}

/// A request the API server has sent nothing of for this long is given up on (and
/// retried): a half-open connection must not hold a creation, and its batch, for ever.
/// Far longer than a healthy server takes to answer.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The API server ends each watch after this long (the watcher opens it again from
/// where it was): under [`READ_TIMEOUT`], so that a quiet watch is never taken for a
/// dead connection.
const WATCH_TIMEOUT_SECONDS: u32 = 25;

impl KubernetesManager {
    /// Connects to the API (`--kubeconfig`, else `KUBECONFIG`, `~/.kube/config` or the
    /// pod's service account), finds the owner of the driver's own pod for owner
    /// references, adopts the pods of this driver instance (its id kept in `work_root`,
    /// the driver's `DATA_DIR/work`) an earlier run left running (their events queued
    /// before this returns), and starts the pod creator and the watch.
    pub async fn start_in(
        config: &KubernetesConfig,
        app_id: &str,
        dial: &Dial,
        termination_grace: Duration,
        work_root: Option<&Path>,
        events: mpsc::UnboundedSender<ExecutorEvent>,
    ) -> anyhow::Result<Self> {
        if !pod::is_label_value(app_id) {
            anyhow::bail!(
                "--app-id {app_id:?} cannot be a Kubernetes label value (at most 63 letters, \
                 digits, '-', '_' or '.', beginning and ending with a letter or digit)"
            );
        }
        if dial.cluster_secret.is_some() && config.cluster_secret_ref.is_none() {
            anyhow::bail!(
                "with --cluster-secret, executor pods need --k8s-cluster-secret-ref \
                 SECRET:KEY, the Secret that holds it (it is never written into a pod spec)"
            );
        }
        let client_config = client_config(config).await?;
        let namespace = config
            .namespace
            .clone()
            .unwrap_or_else(|| client_config.default_namespace.clone());
        let client = kube::Client::try_from(client_config).context("the Kubernetes client")?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let owner = match &config.driver_pod {
            Some(name) => {
                let me = api.get(name).await.with_context(|| {
                    format!("getting the driver's own pod {namespace}/{name} (--k8s-driver-pod)")
                })?;
                owner::executors_owner(&client, &namespace, &me).await
            }
            None => None,
        };
        let template = match &config.pod_template {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading --k8s-pod-template {}", path.display()))?;
                let value: serde_json::Value = serde_yaml_ng::from_str(&text)
                    .with_context(|| format!("--k8s-pod-template {}", path.display()))?;
                Some(value)
            }
            None => None,
        };
        let driver_url = (config.driver_url.clone()).unwrap_or_else(|| dial.driver_url.clone());
        let settings = PodSettings {
            namespace: namespace.clone(),
            app_id: app_id.to_owned(),
            instance: instance::driver_instance(work_root, &driver_url)?,
            image: config.image.clone(),
            image_pull_policy: config.image_pull_policy.clone(),
            driver_url,
            cluster_secret_ref: config.cluster_secret_ref.clone(),
            owner,
            template,
            termination_grace_seconds: termination_grace.as_secs().max(1),
            memory_overhead: pod::MemoryOverhead {
                factor: config.memory_overhead_factor,
                min_mb: config.min_memory_overhead_mb,
            },
        };
        // A template that cannot make a pod is an error now, not at the first launch.
        pod::executor_pod(&settings, &ExecutorId("exec-0".into()), 1, 1)
            .map_err(|e| anyhow::anyhow!("--k8s-pod-template: {e}"))?;
        tracing::info!(namespace, image = settings.image, driver_url = settings.driver_url,
            instance = settings.instance,
            owner = ?settings.owner.as_ref().map(|o| format!("{}/{}", o.kind, o.name)),
            "kubernetes cluster manager");
        let inner = Arc::new(Inner {
            api,
            settings,
            batch_size: config.batch_size.max(1) as usize,
            batch_delay: config.batch_delay,
            events,
            state: Mutex::default(),
            queued: Notify::new(),
        });
        inner.adopt_existing().await?;
        let tasks = vec![
            tokio::spawn(create_pods(inner.clone())),
            tokio::spawn(watch_pods(inner.clone())),
        ];
        Ok(KubernetesManager {
            inner,
            tasks: Mutex::new(tasks),
        })
    }
}

/// The API client's settings: where the API is, and how long a request may go
/// unanswered.
async fn client_config(config: &KubernetesConfig) -> anyhow::Result<kube::Config> {
    let mut client_config = match &config.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding the Kubernetes API (in-cluster service account or kubeconfig)")?,
    };
    client_config.connect_timeout = Some(CONNECT_TIMEOUT);
    client_config.read_timeout = Some(READ_TIMEOUT);
    // Counted from the request, not from when its pooled connection went idle.
    client_config.reset_reader_on_write = true;
    // The creator and the deleter retry with backoffs of their own, which `waiting`
    // reports; kube's would hold a request for minutes on 503s, unseen.
    client_config.default_retry = false;
    Ok(client_config)
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("kubernetes state lock poisoned")
    }

    fn pod_name(&self, id: &ExecutorId) -> String {
        pod::pod_name(&self.settings.app_id, &self.settings.instance, id)
    }

    /// The label selector of this driver instance's pods.
    fn selector(&self) -> String {
        let s = &self.settings;
        format!(
            "{}={},{}={}",
            pod::APP_LABEL,
            s.app_id,
            pod::INSTANCE_LABEL,
            s.instance
        )
    }

    fn send(&self, event: ExecutorEvent) {
        let _ = self.events.send(event);
    }

    /// Killed on the driver's word before its pod was created: as a SIGKILLed process,
    /// as one whose pod the driver deleted (the supervisor's note on why it was killed
    /// stays).
    fn killed_uncreated(&self, id: &ExecutorId) {
        self.send(ExecutorEvent::Exited {
            id: id.clone(),
            exit: flint_protocol::exit::ProcessExit::Signal(libc::SIGKILL),
            cause: None,
        });
    }
}

impl ClusterManager for KubernetesManager {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    /// Queues its pod, and reports it launched at once (listed as launching, its node
    /// to come once it runs): one the API refuses for now is there to see, with why
    /// once it is given up on.
    fn launch(&self, request: LaunchRequest) {
        let name = self.inner.pod_name(&request.id);
        let mut state = self.inner.lock();
        state
            .pods
            .insert(name, Tracked::launching(request.id.clone()));
        self.inner.send(ExecutorEvent::Launched {
            id: request.id.clone(),
            worker: None,
            pid: None,
            log: None,
        });
        state.queue.push_back(request);
        drop(state);
        self.inner.queued.notify_one();
    }

    /// Idempotent: a queued pod is dropped, a created one deleted (with no grace: a pod
    /// on a node that is gone stays Terminating for good otherwise, the kubelet that
    /// would end it gone too), one being created deleted once its creation returns.
    fn kill(&self, id: &ExecutorId) {
        let name = self.inner.pod_name(id);
        let mut state = self.inner.lock();
        if let Some(at) = state.queue.iter().position(|r| r.id == *id) {
            state.queue.remove(at);
            state.pods.remove(&name);
            drop(state);
            self.inner.killed_uncreated(id);
            return;
        }
        let Some(tracked) = state.pods.get_mut(&name) else {
            return;
        };
        tracked.deleting = true;
        let created = tracked.created;
        drop(state);
        if created {
            self.inner.delete_later(name, Some(0));
        }
    }

    fn pending_reason(&self, id: &ExecutorId) -> Option<String> {
        let name = self.inner.pod_name(id);
        let state = self.inner.lock();
        let tracked = state.pods.get(&name)?;
        Some(match (&tracked.pending, tracked.created) {
            (Some(reason), _) => format!("pod {name} pending: {reason}"),
            (None, true) => format!("pod {name} pending"),
            (None, false) => not_created(&name, tracked),
        })
    }

    /// Until its container runs: queued, refused for now, unscheduled, its sandbox or
    /// image being made. Not a pod stuck on its own spec, nor one being deleted or
    /// ended: the supervisor deals with those.
    fn waiting(&self, id: &ExecutorId) -> Option<String> {
        let name = self.inner.pod_name(id);
        let state = self.inner.lock();
        let tracked = state.pods.get(&name)?;
        if tracked.launched || tracked.ended || tracked.deleting {
            return None;
        }
        if !tracked.created {
            return Some(not_created(&name, tracked));
        }
        if tracked.stuck {
            return None;
        }
        Some(match &tracked.pending {
            Some(reason) => format!("pod {name} pending: {reason}"),
            None => format!("pod {name} pending"),
        })
    }

    fn executors_outlive_driver(&self) -> bool {
        // A driver outside the cluster that crashes leaves its pods running.
        true
    }

    fn stop(&self, grace: Duration, departure: Departure) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let tasks: Vec<JoinHandle<()>> =
                std::mem::take(&mut *self.tasks.lock().expect("kubernetes tasks lock poisoned"));
            self.inner.lock().queue.clear();
            if departure == Departure::ForGood {
                // No creation may land after the list that deletes everything.
                for task in &tasks {
                    task.abort();
                }
                self.inner.delete_all(grace).await;
            } else {
                let pods = self.inner.lock().pods.len();
                tracing::info!(pods, "leaving the executor pods to the next driver");
            }
            for task in tasks {
                task.abort();
            }
        })
    }
}

/// Why a pod is not created yet.
fn not_created(name: &str, tracked: &Tracked) -> String {
    match &tracked.refused {
        Some(why) => format!("pod {name} not created: the API server refused it for now: {why}"),
        None => format!("pod {name} not created yet (queued)"),
    }
}
