//! Creating executor pods: the queue drained a batch at a time, each creation retried
//! with a backoff while the API refuses for now, and deletions in the background. Apart
//! from the watch because this side only writes to the API, and is where its throttling
//! is met.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{DeleteParams, PostParams};

use super::{Inner, pod};
use crate::cluster_manager::{ExecutorEvent, LaunchRequest};

/// Backoff of a pod creation the API refused for now (429, 5xx, no connection).
const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(30);

impl Inner {
    /// Deletes a pod in the background; `grace` `None` is the pod's own grace.
    pub(super) fn delete_later(self: &Arc<Self>, name: String, grace: Option<u32>) {
        let inner = self.clone();
        tokio::spawn(async move {
            let mut params = DeleteParams::background();
            if let Some(grace) = grace {
                params = params.grace_period(grace);
            }
            let mut wait = FIRST_RETRY;
            for _ in 0..8 {
                match inner.api.delete(&name, &params).await {
                    Ok(_) => return,
                    Err(kube::Error::Api(s)) if s.code == 404 => return,
                    Err(e) if retriable(&e) => {
                        tracing::warn!(pod = name, error = %e, "deleting executor pod; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(MAX_RETRY);
                    }
                    Err(e) => {
                        tracing::error!(pod = name, error = %e, "deleting executor pod");
                        return;
                    }
                }
            }
        });
    }

    /// Creates one executor's pod, retrying what the API refuses for now until the
    /// executor is no longer wanted.
    async fn create(self: &Arc<Self>, request: LaunchRequest) {
        let name = self.pod_name(&request.id);
        let pod = match pod::executor_pod(
            &self.settings,
            &request.id,
            request.cores,
            request.memory_mb,
        ) {
            Ok(pod) => pod,
            Err(reason) => {
                self.lock().pods.remove(&name);
                self.send(ExecutorEvent::LaunchFailed {
                    id: request.id,
                    reason,
                });
                return;
            }
        };
        let mut wait = FIRST_RETRY;
        loop {
            if self.lock().pods.get(&name).is_none_or(|t| t.deleting) {
                // Killed before it was created.
                self.lock().pods.remove(&name);
                return;
            }
            let outcome = self.api.create(&PostParams::default(), &pod).await;
            let failed = match outcome {
                Ok(_) => None,
                // A retried creation whose first try had landed.
                Err(kube::Error::Api(s)) if s.code == 409 => None,
                Err(e) if retriable(&e) => {
                    tracing::warn!(pod = name, error = %e, retry_in = ?wait,
                        "the API refused an executor pod for now; backing off");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(MAX_RETRY);
                    continue;
                }
                Err(e) => Some(e),
            };
            let mut state = self.lock();
            if let Some(e) = failed {
                state.pods.remove(&name);
                drop(state);
                self.send(ExecutorEvent::LaunchFailed {
                    id: request.id,
                    reason: format!("creating pod {name}: {e}"),
                });
                return;
            }
            tracing::info!(pod = name, executor = %request.id, "executor pod created");
            let Some(tracked) = state.pods.get_mut(&name) else {
                return;
            };
            tracked.created = true;
            if tracked.deleting {
                drop(state);
                self.delete_later(name, Some(0));
            } else if !tracked.launched {
                // Listed as launching while it is pending; its node comes once it runs.
                // Sent under the lock: the watch, which may have seen it running already
                // (and said so, with its node), must not be overtaken by this.
                self.send(ExecutorEvent::Launched {
                    id: request.id,
                    worker: None,
                    pid: None,
                    log: None,
                });
            }
            return;
        }
    }
}

/// What the API may answer differently in a moment: throttling, its own errors, no
/// connection at all.
fn retriable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

pub(super) async fn create_pods(inner: Arc<Inner>) {
    let mut last_batch: Option<Instant> = None;
    loop {
        let batch: Vec<LaunchRequest> = {
            let mut state = inner.lock();
            let n = inner.batch_size.min(state.queue.len());
            state.queue.drain(..n).collect()
        };
        if batch.is_empty() {
            inner.queued.notified().await;
            continue;
        }
        // Spark's spark.kubernetes.allocation.batch.delay: a burst of launches reaches
        // the API server a batch at a time.
        if let Some(at) = last_batch {
            tokio::time::sleep_until((at + inner.batch_delay).into()).await;
        }
        last_batch = Some(Instant::now());
        tracing::info!(pods = batch.len(), "creating executor pods");
        futures_util::future::join_all(batch.into_iter().map(|r| inner.create(r))).await;
    }
}
