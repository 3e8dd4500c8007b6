//! Creating executor pods: the queue drained a batch at a time (Spark's batch size and
//! delay), one request per pod per batch. What the API refuses for now (a full quota,
//! throttling, its own errors, no answer, a permission not granted yet) goes back to
//! the head of the queue and the creator backs off, capped: back-pressure, never a
//! failure. What it refuses for good (an invalid pod) is a failed launch. No request
//! waits longer than the client's read timeout, so no batch, and no later one, waits
//! on a connection that died. Apart from the watch because this side only writes to the
//! API, and is where its throttling is met.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_protocol::ExecutorId;
use kube::api::PostParams;

use super::refusal::Refusal;
use super::{Inner, pod};
use crate::cluster_manager::{ExecutorEvent, LaunchRequest};

/// Backoff of the creator after the API refused a pod for now.
const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// What became of one creation request.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// The pod exists (made now, or by an earlier try whose answer was lost).
    Created,
    /// Refused for now: the request goes back to the queue.
    Refused,
    /// Refused for good, or no longer wanted: nothing more to do.
    Over,
}

impl Inner {
    /// Asks once for one executor's pod.
    async fn create_once(self: &Arc<Self>, request: &LaunchRequest) -> Attempt {
        let name = self.pod_name(&request.id);
        if !self.still_wanted(&name, &request.id) {
            return Attempt::Over;
        }
        let s = &self.settings;
        let pod = match pod::executor_pod(s, &request.id, request.cores, request.memory_mb) {
            Ok(pod) => pod,
            Err(reason) => return self.refused(&name, &request.id, Refusal::Never(reason)),
        };
        let outcome = match self.api.create(&PostParams::default(), &pod).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.ours_already(&name, &request.id).await
            }
            Err(e) => Err(Refusal::of(&e)),
        };
        match outcome {
            Ok(()) => {
                self.created(&name, &request.id);
                Attempt::Created
            }
            Err(refusal) => self.refused(&name, &request.id, refusal),
        }
    }

    /// Whether the executor is still wanted; one killed before its pod was asked for is
    /// forgotten, and reported gone.
    fn still_wanted(&self, name: &str, id: &ExecutorId) -> bool {
        let mut state = self.lock();
        match state.pods.get(name) {
            None => false,
            Some(tracked) if tracked.deleting => {
                state.pods.remove(name);
                drop(state);
                self.killed_uncreated(id);
                false
            }
            Some(_) => true,
        }
    }

    /// A 409: the name is taken. By this executor's own pod (an earlier try of this
    /// request landed, its answer lost) it is created; by anything else (another
    /// driver's pod, an operator's) it is a pod this one must not take for its own.
    async fn ours_already(&self, name: &str, id: &ExecutorId) -> Result<(), Refusal> {
        let existing = match self.api.get(name).await {
            Ok(existing) => existing,
            // Gone since: asked for again.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(Refusal::ForNow(format!(
                    "pod {name} was in the way, and is gone"
                )));
            }
            Err(e) => return Err(Refusal::of(&e)),
        };
        let labels = existing.metadata.labels.unwrap_or_default();
        let label = |key: &str| labels.get(key).map(String::as_str);
        let s = &self.settings;
        let ours = label(pod::APP_LABEL) == Some(s.app_id.as_str())
            && label(pod::INSTANCE_LABEL) == Some(s.instance.as_str())
            && label(pod::EXECUTOR_LABEL) == Some(id.0.as_str());
        match ours {
            true => Ok(()),
            false => Err(Refusal::Never(format!(
                "a pod named {name} exists and is not this driver's (its labels: {labels:?})"
            ))),
        }
    }

    /// Its pod exists (reported launched when it was queued; the watch says when it
    /// runs, and where), or is deleted at once if it was killed meanwhile.
    fn created(self: &Arc<Self>, name: &str, id: &ExecutorId) {
        let mut state = self.lock();
        tracing::info!(pod = name, executor = %id, "executor pod created");
        let Some(tracked) = state.pods.get_mut(name) else {
            return;
        };
        tracked.created = true;
        tracked.refused = None;
        if tracked.deleting {
            drop(state);
            self.delete_later(name.to_owned(), Some(0));
        }
    }

    /// The API refused the pod: kept queued (and `waiting` says why) if that may pass,
    /// else a failed launch.
    fn refused(&self, name: &str, id: &ExecutorId, refusal: Refusal) -> Attempt {
        let mut state = self.lock();
        let Some(tracked) = state.pods.get_mut(name) else {
            return Attempt::Over;
        };
        if tracked.deleting {
            state.pods.remove(name);
            drop(state);
            self.killed_uncreated(id);
            return Attempt::Over;
        }
        match refusal {
            Refusal::ForNow(why) => {
                tracing::warn!(pod = name, executor = %id, why,
                    "the API server refused an executor pod for now; it stays queued");
                tracked.refused = Some(why);
                Attempt::Refused
            }
            Refusal::NotPermitted {
                message,
                permission,
            } => {
                let namespace = &self.settings.namespace;
                tracing::error!(pod = name, executor = %id, permission, namespace,
                    "the driver's service account may not create executor pods: grant it \
                     the permission (deploy/kubernetes/base/rbac.yaml); retrying");
                tracked.refused = Some(format!(
                    "{message} (the driver's service account needs `{permission}` in \
                     namespace {namespace})"
                ));
                Attempt::Refused
            }
            Refusal::Never(why) => {
                state.pods.remove(name);
                drop(state);
                self.send(ExecutorEvent::LaunchFailed {
                    id: id.clone(),
                    reason: format!("creating pod {name}: {why}"),
                });
                Attempt::Over
            }
        }
    }

    /// Refused requests back at the head of the queue, in their order.
    fn requeue(&self, refused: Vec<LaunchRequest>) {
        let mut state = self.lock();
        for request in refused.into_iter().rev() {
            state.queue.push_front(request);
        }
    }
}

/// When the next batch may go: `--k8s-allocation-batch-delay-ms` after the last, and
/// after the backoff while the API refuses.
struct Pace {
    delay: Duration,
    last: Option<Instant>,
    backoff: Duration,
}

impl Pace {
    async fn wait(&self) {
        if let Some(last) = self.last {
            tokio::time::sleep_until((last + self.delay.max(self.backoff)).into()).await;
        }
    }

    /// A batch went; `refused` whether the API refused any of it for now.
    fn went(&mut self, at: Instant, refused: bool) {
        self.last = Some(at);
        self.backoff = match (refused, self.backoff.is_zero()) {
            (false, _) => Duration::ZERO,
            (true, true) => FIRST_RETRY,
            (true, false) => (self.backoff * 2).min(MAX_RETRY),
        };
    }
}

pub(super) async fn create_pods(inner: Arc<Inner>) {
    let mut pace = Pace {
        delay: inner.batch_delay,
        last: None,
        backoff: Duration::ZERO,
    };
    loop {
        if inner.lock().queue.is_empty() {
            inner.queued.notified().await;
            continue;
        }
        pace.wait().await;
        let batch: Vec<LaunchRequest> = {
            let mut state = inner.lock();
            let n = inner.batch_size.min(state.queue.len());
            state.queue.drain(..n).collect()
        };
        if batch.is_empty() {
            continue;
        }
        let started = Instant::now();
        tracing::info!(pods = batch.len(), "creating executor pods");
        let attempts =
            futures_util::future::join_all(batch.iter().map(|r| inner.create_once(r))).await;
        let refused: Vec<LaunchRequest> = (batch.into_iter().zip(attempts))
            .filter(|(_, attempt)| *attempt == Attempt::Refused)
            .map(|(request, _)| request)
            .collect();
        pace.went(started, !refused.is_empty());
        if !refused.is_empty() {
            tracing::info!(pods = refused.len(), retry_in = ?pace.backoff,
                "executor pods refused for now; backing off");
        }
        inner.requeue(refused);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_back_the_creator_off_doubling_to_a_cap_and_a_batch_that_goes_resets_it() {
        let mut pace = Pace {
            delay: Duration::from_millis(100),
            last: None,
            backoff: Duration::ZERO,
        };
        let now = Instant::now();
        let mut seen = Vec::new();
        for _ in 0..10 {
            pace.went(now, true);
            seen.push(pace.backoff);
        }
        assert_eq!(seen[0], FIRST_RETRY);
        assert_eq!(seen[1], FIRST_RETRY * 2);
        assert_eq!(*seen.last().unwrap(), MAX_RETRY);
        pace.went(now, false);
        assert_eq!(pace.backoff, Duration::ZERO);
    }
}
