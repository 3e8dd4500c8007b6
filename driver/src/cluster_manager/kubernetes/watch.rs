//! The watch of this driver instance's pods: each status it reports turned into the
//! executor events it means (launched, pending, exited, lost), and pods deleted while it
//! was down found by comparing a re-list with what it had seen; before it, the pods an
//! earlier run of the driver on its data dir left running, adopted. Apart from creation
//! because this side only reads, and owns what a pod's state means to the driver.

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::Context;
use flint_protocol::ExecutorId;
use flint_protocol::exit::ProcessExit;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use super::pod::{self, PodFate};
use super::{Inner, Tracked};
use crate::cluster_manager::ExecutorEvent;

impl Inner {
    /// Lists this driver instance's pods and adopts those an earlier run left pending or
    /// running: tracked as created, reported [`ExecutorEvent::Adopted`] (before the
    /// supervisor's first launch), never created again. Finished pods, pods being
    /// deleted and pods not named as this driver's executors are left to the watch,
    /// which deletes them. Another driver's pods are not listed.
    pub(super) async fn adopt_existing(&self) -> anyhow::Result<()> {
        let params = ListParams::default().labels(&self.selector());
        let listed = self
            .api
            .list(&params)
            .await
            .context("listing the app's executor pods (to adopt those of an earlier run)")?;
        for found in &listed.items {
            let Some((name, id, fate)) = self.adoptable(found) else {
                continue;
            };
            let (launched, pending, stuck, worker) = match fate {
                PodFate::Running { node } => (true, None, false, node),
                PodFate::Pending { reason, stuck } => (false, reason, stuck, None),
                _ => continue,
            };
            tracing::info!(pod = name, executor = %id, launched, "adopting an executor pod");
            let mut tracked = Tracked::launching(id.clone());
            tracked.created = true;
            tracked.observed = true;
            tracked.launched = launched;
            tracked.pending = pending;
            tracked.stuck = stuck;
            self.lock().pods.insert(name, tracked);
            self.send(ExecutorEvent::Adopted { id, worker });
        }
        Ok(())
    }

    /// A listed pod's name, executor id and fate, if it is an executor's pod as this
    /// driver instance names them, and not being deleted.
    fn adoptable(&self, found: &Pod) -> Option<(String, ExecutorId, PodFate)> {
        let name = found.metadata.name.clone()?;
        let labels = found.metadata.labels.as_ref()?;
        let id = ExecutorId(labels.get(pod::EXECUTOR_LABEL)?.clone());
        let ours = found.metadata.deletion_timestamp.is_none() && self.pod_name(&id) == name;
        ours.then(|| (name, id, pod::fate(found)))
    }

    fn on_pod(self: &Arc<Self>, pod: &Pod) {
        let Some(name) = pod.metadata.name.clone() else {
            return;
        };
        let mut state = self.lock();
        let Some(tracked) = state.pods.get_mut(&name) else {
            drop(state);
            // A pod of this driver instance it did not ask for: left by an earlier run
            // (its tasks run again anyway, and its id could be taken by a launch).
            if pod.metadata.deletion_timestamp.is_none() {
                tracing::warn!(
                    pod = name,
                    "a pod of this driver that it neither created nor adopted; deleting it"
                );
                self.delete_later(name, Some(0));
            }
            return;
        };
        tracked.observed = true;
        if tracked.ended {
            return;
        }
        let id = tracked.id.clone();
        match pod::fate(pod) {
            PodFate::Pending { reason, stuck } => {
                if reason.is_some() && reason != tracked.pending {
                    tracing::warn!(pod = name, executor = %id, reason, stuck,
                        "executor pod pending");
                }
                tracked.pending = reason;
                tracked.stuck = stuck;
            }
            PodFate::Running { node } => {
                if !tracked.launched {
                    tracked.launched = true;
                    // Under the lock, as the creator's report of the creation is.
                    self.send(ExecutorEvent::Launched {
                        id,
                        worker: node,
                        pid: None,
                        log: None,
                    });
                }
            }
            PodFate::Terminated { exit, cause } => {
                tracked.ended = true;
                let deleting = tracked.deleting;
                drop(state);
                self.send(ExecutorEvent::Exited { id, exit, cause });
                // `restartPolicy: Never` leaves a finished pod behind until deleted.
                if !deleting {
                    self.delete_later(name, Some(0));
                }
            }
            PodFate::Lost(reason) => {
                tracked.ended = true;
                drop(state);
                self.send(ExecutorEvent::Lost {
                    id,
                    reason: format!("{name}: {reason}"),
                });
                self.delete_later(name, Some(0));
            }
        }
    }

    fn on_deleted(&self, name: &str, how: &str) {
        let Some(tracked) = self.lock().pods.remove(name) else {
            return;
        };
        if tracked.ended {
            return;
        }
        let event = match tracked.deleting {
            // Killed on the driver's word: as a SIGKILLed process.
            true => ExecutorEvent::Exited {
                id: tracked.id,
                exit: ProcessExit::Signal(libc::SIGKILL),
                cause: None,
            },
            false => ExecutorEvent::Lost {
                id: tracked.id,
                reason: format!("pod {name} {how}"),
            },
        };
        self.send(event);
    }
}

pub(super) async fn watch_pods(inner: Arc<Inner>) {
    let config = (watcher::Config::default().labels(&inner.selector()))
        .timeout(super::WATCH_TIMEOUT_SECONDS);
    let mut stream = watcher::watcher(inner.api.clone(), config)
        .default_backoff()
        .boxed();
    // During a (re-)list: the pods the watch had seen before it, and those listed.
    let mut relist: Option<(HashSet<String>, HashSet<String>)> = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => {
                let observed = inner
                    .lock()
                    .pods
                    .iter()
                    .filter(|(_, t)| t.observed)
                    .map(|(name, _)| name.clone())
                    .collect();
                tracing::info!("listing executor pods");
                relist = Some((observed, HashSet::new()));
            }
            Ok(Event::InitApply(pod)) => {
                if let (Some((_, listed)), Some(name)) = (&mut relist, &pod.metadata.name) {
                    listed.insert(name.clone());
                }
                inner.on_pod(&pod);
            }
            Ok(Event::InitDone) => {
                if let Some((observed, listed)) = relist.take() {
                    for name in observed.difference(&listed) {
                        inner.on_deleted(name, "was deleted while the watch was down");
                    }
                }
            }
            Ok(Event::Apply(pod)) => inner.on_pod(&pod),
            Ok(Event::Delete(pod)) => {
                inner.on_pod(&pod);
                if let Some(name) = &pod.metadata.name {
                    inner.on_deleted(name, "was deleted");
                }
            }
            Err(e) => tracing::warn!(error = %e, "watching executor pods"),
        }
    }
}
