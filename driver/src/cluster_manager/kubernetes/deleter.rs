//! Deleting executor pods: each deletion retried in the background until the API says
//! it is done (200, or 404: gone already), for as long as the driver runs, however long
//! the API is away (a deletion abandoned is a pod left running, and paid for, for good);
//! and at a stop for good, every pod of this driver instance. Apart from creation
//! because its retries never end and it answers to no batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{DeleteParams, ListParams};

use super::Inner;
use super::refusal::{Refusal, describe};

/// Backoff of a deletion the API did not do: capped lower than a creation's, as a
/// deletion frees what a quota or a node holds.
const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(10);

impl Inner {
    /// Deletes a pod in the background, retrying until the API says it is done; `grace`
    /// `None` is the pod's own grace. A pod already being deleted is left to that.
    pub(super) fn delete_later(self: &Arc<Self>, name: String, grace: Option<u32>) {
        if !self.lock().deleting.insert(name.clone()) {
            return;
        }
        let inner = self.clone();
        tokio::spawn(async move {
            inner.delete_until_done(&name, grace).await;
            inner.lock().deleting.remove(&name);
        });
    }

    async fn delete_until_done(&self, name: &str, grace: Option<u32>) {
        let mut params = DeleteParams::background();
        if let Some(grace) = grace {
            params = params.grace_period(grace);
        }
        let mut wait = FIRST_RETRY;
        for attempt in 1u64.. {
            let e = match self.api.delete(name, &params).await {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => e,
            };
            match Refusal::of(&e) {
                Refusal::NotPermitted { permission, .. } => tracing::error!(
                    pod = name,
                    permission,
                    namespace = self.settings.namespace,
                    "the driver's service account may not delete executor pods: grant it \
                     the permission (deploy/kubernetes/base/rbac.yaml); retrying"
                ),
                _ => tracing::warn!(pod = name, attempt, error = describe(&e), retry_in = ?wait,
                    "deleting executor pod; retrying"),
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_RETRY);
        }
    }

    /// Deletes every pod of this driver instance (those whose deletions are still being
    /// retried too): their executors get `grace` to stop, then none.
    pub(super) async fn delete_all(&self, grace: Duration) {
        let list = ListParams::default().labels(&self.selector());
        let deadline = Instant::now() + grace;
        // Past the grace, what is left is deleted at once; past this, given up on.
        let give_up = deadline + Duration::from_secs(5);
        let mut forced = false;
        loop {
            let now = Instant::now();
            let pods = match self.api.list(&list).await {
                Ok(pods) => pods.items,
                Err(e) if now < give_up => {
                    tracing::warn!(error = describe(&e), "listing executor pods to delete them");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = describe(&e), "executor pods may be left behind");
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
            // grace, then none (a pod left Terminating by a node that is gone too).
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
        if let Err(e) = self.api.delete(name, &params).await
            && !matches!(&e, kube::Error::Api(s) if s.code == 404)
        {
            tracing::warn!(pod = name, error = describe(&e), "deleting executor pod");
        }
    }
}
