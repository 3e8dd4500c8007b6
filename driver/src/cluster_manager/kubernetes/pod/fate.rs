//! What a pod's status says of its executor: pending (and why, and whether it waits for
//! the cluster or is stuck on its own spec), running, terminated with its exit, or lost
//! with its host. Apart from building the spec because it reads what Kubernetes reports
//! back, the kubelet's and the scheduler's words included.

use flint_protocol::exit::ProcessExit;
use k8s_openapi::api::core::v1::Pod;

use super::CONTAINER;

/// What a pod's status says of its executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodFate {
    /// Not running yet; why, when the scheduler or the kubelet said. `stuck`: the
    /// kubelet cannot start it as it is (a missing Secret, an image it cannot pull),
    /// which no wait for the cluster mends; else it waits for the cluster (a node with
    /// room, its sandbox and image being made).
    Pending { reason: Option<String>, stuck: bool },
    /// Its container runs, on this node.
    Running { node: Option<String> },
    /// Its container ended: the exit code, and the kubelet's reason when it is telling
    /// (`OOMKilled`, not `Error` or `Completed`).
    Terminated {
        exit: ProcessExit,
        cause: Option<String>,
    },
    /// Evicted or failed without its container ending (node pressure, preemption):
    /// the host went away with it.
    Lost(String),
}

pub fn fate(pod: &Pod) -> PodFate {
    let Some(status) = &pod.status else {
        return PodFate::Pending {
            reason: None,
            stuck: false,
        };
    };
    let container = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == CONTAINER)
        .or_else(|| status.container_statuses.iter().flatten().next());
    let state = container.and_then(|c| c.state.as_ref());
    if status.reason.as_deref() == Some("Evicted") {
        let message = status.message.as_deref().unwrap_or("no message");
        return PodFate::Lost(format!("pod evicted: {message}"));
    }
    if let Some(ended) = state.and_then(|s| s.terminated.as_ref()) {
        // The kubelet's exit code is what it reports reliably (137 for a SIGKILL,
        // OOMKilled or not); its `signal` is seldom set.
        let exit = ProcessExit::Code(ended.exit_code);
        let cause = ended
            .reason
            .clone()
            .filter(|r| !matches!(r.as_str(), "Error" | "Completed" | ""));
        return PodFate::Terminated { exit, cause };
    }
    match status.phase.as_deref() {
        Some("Running") if state.is_some_and(|s| s.running.is_some()) => PodFate::Running {
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        },
        Some("Failed") | Some("Succeeded") => PodFate::Lost(format!(
            "pod {}: {}",
            status.phase.as_deref().unwrap_or_default(),
            status
                .message
                .as_deref()
                .or(status.reason.as_deref())
                .unwrap_or("its container has no status")
        )),
        _ => PodFate::Pending {
            reason: pending_reason(pod),
            stuck: stuck(pod),
        },
    }
}

/// The kubelet's reasons for a container it cannot start from the pod as it is: the
/// launch timeout runs for these (they count as failures), not the pending timeout.
/// A pull that fails is here too: a registry's hiccup is retried by the next pod.
const STUCK: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "RunContainerError",
];

fn stuck(pod: &Pod) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    statuses.into_iter().flatten().any(|c| {
        let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
        waiting
            .and_then(|w| w.reason.as_deref())
            .is_some_and(|r| STUCK.contains(&r))
    })
}

/// Why a pod is not running: the scheduler's (`Unschedulable: 0/3 nodes are
/// available: 3 Insufficient cpu.`) or the kubelet's (`ErrImagePull: ...`).
fn pending_reason(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(c) = unscheduled {
        return Some(join(c.reason.as_deref(), c.message.as_deref()));
    }
    status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .find(|w| w.reason.as_deref() != Some("ContainerCreating"))
        .map(|w| join(w.reason.as_deref(), w.message.as_deref()))
}

fn join(reason: Option<&str>, message: Option<&str>) -> String {
    match (reason, message) {
        (Some(r), Some(m)) => format!("{r}: {m}"),
        (Some(s), None) | (None, Some(s)) => s.to_owned(),
        (None, None) => "no reason given".to_owned(),
    }
}
