//! `kubernetes`: executors as pods (Spark's KubernetesClusterManager, its
//! ExecutorPodsAllocator and ExecutorPodsWatchSnapshotSource). A launch queues a pod;
//! pods are created in batches (`--k8s-allocation-batch-size` every
//! `--k8s-allocation-batch-delay-ms`), retried with a backoff on 429 and 5xx; one watch
//! of the app's pods (kube's watcher: it resumes from the last resourceVersion and
//! re-lists on 410 Gone) turns their statuses into executor events: running, exited
//! with its code and the kubelet's reason (`OOMKilled`), evicted or deleted (lost, and
//! replaced). Pending pods count as launched; one pending past
//! `--executor-launch-timeout-ms` is deleted by the supervisor and reported with the
//! scheduler's or kubelet's reason.
//!
//! Executor pods outlive the driver: one that stops to come back (a rollout, the
//! default) or crashes leaves them running, and the next driver adopts every pending or
//! running pod of its app when it starts (their executors register again with what they
//! run); only a stop for good (`--stop-executors-on-exit`) deletes them. They are owned
//! by what owns the driver's pod, never by that pod (see `owner.rs`).

mod creator;
mod owner;
pub mod pod;
mod watch;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use flint_protocol::ExecutorId;
use futures_util::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
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
    /// Asked for, their pods not created yet.
    queue: VecDeque<LaunchRequest>,
    /// Pods of this driver's executors, by pod name, from the creation request until
    /// the watch has seen them deleted.
    pods: HashMap<String, Tracked>,
}

struct Tracked {
    id: ExecutorId,
    created: bool,
    /// Seen by the watch: only those can be missing from a re-list.
    observed: bool,
    launched: bool,
    /// Its end was reported (exited, lost): later statuses are news to nobody.
    ended: bool,
    /// The driver deleted it (a kill): its deletion is no loss.
    deleting: bool,
    pending: Option<String>,
}

impl KubernetesManager {
    /// Connects to the API (`--kubeconfig`, else `KUBECONFIG`, `~/.kube/config` or the
    /// pod's service account), finds the owner of the driver's own pod for owner
    /// references, adopts the app's pods an earlier run left running (their events
    /// queued before this returns), and starts the pod creator and the watch.
    pub async fn start(
        config: &KubernetesConfig,
        app_id: &str,
        dial: &Dial,
        termination_grace: Duration,
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
        let client_config = match &config.kubeconfig {
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
        let settings = PodSettings {
            namespace: namespace.clone(),
            app_id: app_id.to_owned(),
            image: config.image.clone(),
            image_pull_policy: config.image_pull_policy.clone(),
            driver_url: config
                .driver_url
                .clone()
                .unwrap_or_else(|| dial.driver_url.clone()),
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

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("kubernetes state lock poisoned")
    }

    fn pod_name(&self, id: &ExecutorId) -> String {
        pod::pod_name(&self.settings.app_id, id)
    }

    fn send(&self, event: ExecutorEvent) {
        let _ = self.events.send(event);
    }
}

impl ClusterManager for KubernetesManager {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn launch(&self, request: LaunchRequest) {
        let name = self.inner.pod_name(&request.id);
        let mut state = self.inner.lock();
        state.pods.insert(
            name,
            Tracked {
                id: request.id.clone(),
                created: false,
                observed: false,
                launched: false,
                ended: false,
                deleting: false,
                pending: None,
            },
        );
        state.queue.push_back(request);
        drop(state);
        self.inner.queued.notify_one();
    }

    fn kill(&self, id: &ExecutorId) {
        let name = self.inner.pod_name(id);
        let mut state = self.inner.lock();
        if let Some(at) = state.queue.iter().position(|r| r.id == *id) {
            state.queue.remove(at);
            state.pods.remove(&name);
            drop(state);
            self.inner.send(ExecutorEvent::Lost {
                id: id.clone(),
                reason: "killed before its pod was created".into(),
            });
            return;
        }
        let Some(tracked) = state.pods.get_mut(&name) else {
            return;
        };
        tracked.deleting = true;
        let created = tracked.created;
        drop(state);
        // One still being created is deleted once its creation returns.
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
            (None, false) => {
                format!("pod {name} not created yet (the API server refused it for now)")
            }
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
                self.delete_all(grace).await;
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

impl KubernetesManager {
    /// Deletes every pod of the app: their executors get `grace` to stop, then none.
    async fn delete_all(&self, grace: Duration) {
        let api = &self.inner.api;
        let selector = format!("{}={}", pod::APP_LABEL, self.inner.settings.app_id);
        let list = ListParams::default().labels(&selector);
        let deadline = Instant::now() + grace;
        // Past the grace, what is left is deleted at once; past this, given up on.
        let give_up = deadline + Duration::from_secs(5);
        let mut forced = false;
        loop {
            let now = Instant::now();
            let pods = match api.list(&list).await {
                Ok(pods) => pods.items,
                Err(e) if now < give_up => {
                    tracing::warn!(error = %e, "listing executor pods to delete them");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "executor pods may be left behind");
                    return;
                }
            };
            if pods.is_empty() {
                return;
            }
            if now >= give_up {
                tracing::error!(pods = pods.len(), "executor pods not gone in time");
                return;
            }
            let past = now >= deadline;
            // Their executors were told to stop: what is left gets the rest of the
            // grace, then none.
            let seconds = deadline.saturating_duration_since(now).as_secs() as u32;
            for pod in &pods {
                let fresh = pod.metadata.deletion_timestamp.is_none();
                if let Some(name) = &pod.metadata.name
                    && (fresh || (past && !forced))
                {
                    self.delete_now(name, seconds).await;
                }
            }
            forced |= past;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn delete_now(&self, name: &str, grace_seconds: u32) {
        let params = DeleteParams::background().grace_period(grace_seconds);
        if let Err(e) = self.inner.api.delete(name, &params).await
            && !matches!(&e, kube::Error::Api(s) if s.code == 404)
        {
            tracing::warn!(pod = name, error = %e, "deleting executor pod");
        }
    }
}
