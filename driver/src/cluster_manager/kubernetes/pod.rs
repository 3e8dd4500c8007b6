//! An executor's pod: the spec the driver sends (a built-in template, merged into the
//! operator's `--k8s-pod-template` as Spark merges `podTemplateFile`), and what a pod's
//! status says about its executor ([`fate`]). Pure: no API calls.

mod fate;

use std::collections::BTreeSet;

use flint_protocol::ExecutorId;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value, json};

pub use fate::{PodFate, fate};

/// The container the driver fills in: the template's container of this name, else its
/// first, else a new one.
pub const CONTAINER: &str = "flint-executor";
/// Labels every executor pod carries; the watch selects on the app's.
pub const APP_LABEL: &str = "flint.dev/app";
pub const EXECUTOR_LABEL: &str = "flint.dev/executor-id";
/// Where the executor's work dir (fetch cache, scratch files) lives: an emptyDir, so
/// that the root filesystem can stay read-only.
const WORK_MOUNT: &str = "/work";
/// The image's non-root user (Containerfile).
const IMAGE_USER: u32 = 65532;

/// What every executor pod of this driver shares.
#[derive(Clone, Debug)]
pub struct PodSettings {
    pub namespace: String,
    pub app_id: String,
    pub image: String,
    pub image_pull_policy: Option<String>,
    /// `flint://HOST:PORT` the executors dial.
    pub driver_url: String,
    /// The Secret and key holding the cluster secret: executors get it by reference,
    /// never inline in the pod spec.
    pub cluster_secret_ref: Option<(String, String)>,
    /// What owns the driver's pod (its StatefulSet or Deployment, see `owner.rs`): its
    /// executors' owner too, so that Kubernetes deletes them with it, but not with the
    /// driver's pod, which a rollout replaces.
    pub owner: Option<Owner>,
    /// The operator's template (`--k8s-pod-template`), as JSON.
    pub template: Option<Value>,
    /// Matches `--decommission-timeout-ms`: a pod being deleted gets as long to drain
    /// as a decommission does.
    pub termination_grace_seconds: u64,
    pub memory_overhead: MemoryOverhead,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// Memory a pod asks for on top of its tasks' (Spark's `memoryOverheadFactor` and its
/// 384 MiB floor): the executor process, the compiler subprocess, the fetch cache's
/// buffers.
#[derive(Clone, Copy, Debug)]
pub struct MemoryOverhead {
    pub factor: f64,
    pub min_mb: u64,
}

impl MemoryOverhead {
    pub fn of(self, memory_mb: u64) -> u64 {
        ((memory_mb as f64 * self.factor).ceil() as u64).max(self.min_mb)
    }
}

/// A pod name for an executor of an app: DNS-1123 (lowercase letters, digits, '-'), at
/// most 63 bytes so that it can be a host name too.
pub fn pod_name(app_id: &str, id: &ExecutorId) -> String {
    let raw = format!("flint-{app_id}-{}", id.0).to_ascii_lowercase();
    let mut name = String::with_capacity(raw.len());
    for c in raw.chars() {
        let c = if c.is_ascii_alphanumeric() { c } else { '-' };
        if !(c == '-' && name.ends_with('-')) {
            name.push(c);
        }
    }
    name.truncate(63);
    name.trim_end_matches('-').to_owned()
}

/// Whether `s` can be a label value (what the watch's selector matches the app by).
pub fn is_label_value(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && s.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

/// The pod for one executor: the template with the driver's parts put in.
pub fn executor_pod(
    settings: &PodSettings,
    id: &ExecutorId,
    cores: u32,
    memory_mb: u64,
) -> Result<Pod, String> {
    let mut pod = settings.template.clone().unwrap_or_else(|| json!({}));
    let Some(root) = pod.as_object_mut() else {
        return Err("the pod template is not an object".into());
    };
    root.insert("apiVersion".into(), json!("v1"));
    root.insert("kind".into(), json!("Pod"));
    put_metadata(object(root, "metadata")?, settings, id)?;
    let spec = object(root, "spec")?;
    put_pod_spec(spec, settings)?;
    put_container(spec, settings, id, cores, memory_mb)?;
    serde_json::from_value(pod).map_err(|e| format!("the executor pod is not a valid Pod: {e}"))
}

/// The pod's name, namespace, labels (the watch finds executors by them) and owner.
fn put_metadata(
    metadata: &mut Map<String, Value>,
    settings: &PodSettings,
    id: &ExecutorId,
) -> Result<(), String> {
    let name = pod_name(&settings.app_id, id);
    // A template's name would make every executor's pod the same one.
    metadata.remove("generateName");
    metadata.insert("name".into(), json!(name));
    metadata.insert("namespace".into(), json!(settings.namespace));
    let labels = object(metadata, "labels")?;
    for (k, v) in [
        ("app.kubernetes.io/name", "flint"),
        ("app.kubernetes.io/component", "executor"),
        (APP_LABEL, settings.app_id.as_str()),
        (EXECUTOR_LABEL, id.0.as_str()),
    ] {
        labels.insert(k.into(), json!(v));
    }
    if let Some(owner) = &settings.owner {
        // Not a controller reference: the owner's controller must not take the pod
        // for one of its own (nor release it, the StatefulSet's does with what its
        // selector does not match).
        let owners = array(metadata, "ownerReferences")?;
        owners.push(json!({
            "apiVersion": owner.api_version,
            "kind": owner.kind,
            "name": owner.name,
            "uid": owner.uid,
        }));
    }
    Ok(())
}

/// The pod-wide settings an executor needs, and its volumes.
fn put_pod_spec(spec: &mut Map<String, Value>, settings: &PodSettings) -> Result<(), String> {
    // The driver replaces executors itself; a kubelet restarting one in place would
    // bring back an id the driver has already given up on.
    spec.insert("restartPolicy".into(), json!("Never"));
    spec.entry("terminationGracePeriodSeconds")
        .or_insert(json!(settings.termination_grace_seconds));
    // Executors talk to the driver only, never to the API server.
    spec.entry("automountServiceAccountToken")
        .or_insert(json!(false));
    spec.entry("enableServiceLinks").or_insert(json!(false));
    spec.entry("securityContext").or_insert(json!({
        "runAsNonRoot": true,
        "runAsUser": IMAGE_USER,
        "runAsGroup": IMAGE_USER,
        "fsGroup": IMAGE_USER,
        "seccompProfile": { "type": "RuntimeDefault" },
    }));
    let volumes = array(spec, "volumes")?;
    let volume_names: BTreeSet<String> = volumes
        .iter()
        .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect();
    for volume in ["flint-work", "flint-tmp"] {
        if !volume_names.contains(volume) {
            volumes.push(json!({ "name": volume, "emptyDir": {} }));
        }
    }
    Ok(())
}

/// The executor's container: the image, its settings as environment, its resources and
/// mounts.
fn put_container(
    spec: &mut Map<String, Value>,
    settings: &PodSettings,
    id: &ExecutorId,
    cores: u32,
    memory_mb: u64,
) -> Result<(), String> {
    let containers = array(spec, "containers")?;
    let at = containers
        .iter()
        .position(|c| c.get("name").and_then(Value::as_str) == Some(CONTAINER))
        .unwrap_or(0);
    if containers.is_empty() {
        containers.push(json!({}));
    }
    let Some(container) = containers[at].as_object_mut() else {
        return Err("a container of the pod template is not an object".into());
    };
    container.insert("name".into(), json!(CONTAINER));
    container.insert("image".into(), json!(settings.image));
    if let Some(policy) = &settings.image_pull_policy {
        container.insert("imagePullPolicy".into(), json!(policy));
    }
    // The image's entrypoint is flint; its subcommand and everything else come from
    // the environment below.
    container.remove("command");
    container.insert("args".into(), json!(["executor"]));
    let limit_mb = memory_mb + settings.memory_overhead.of(memory_mb);
    let mut env = vec![
        value_env("FLINT_DRIVER_URL", &settings.driver_url),
        value_env("FLINT_EXECUTOR_ID", &id.0),
        value_env("FLINT_CORES", &cores.to_string()),
        value_env("FLINT_MEMORY_MB", &memory_mb.to_string()),
        value_env("FLINT_APP_ID", &settings.app_id),
        value_env("FLINT_WORK_DIR", WORK_MOUNT),
        json!({ "name": "FLINT_HOSTNAME",
                "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }),
    ];
    if let Some((secret, key)) = &settings.cluster_secret_ref {
        env.push(json!({
            "name": "FLINT_CLUSTER_SECRET",
            "valueFrom": { "secretKeyRef": { "name": secret, "key": key } },
        }));
    }
    let ours: BTreeSet<String> = env
        .iter()
        .filter_map(|e| e["name"].as_str().map(str::to_owned))
        .collect();
    let template_env = array(container, "env")?;
    template_env.retain(|e| {
        e.get("name")
            .and_then(Value::as_str)
            .is_none_or(|n| !ours.contains(n))
    });
    template_env.extend(env);
    let resources = object(container, "resources")?;
    let requests = object(resources, "requests")?;
    requests.insert("cpu".into(), json!(cores.to_string()));
    requests.insert("memory".into(), json!(format!("{limit_mb}Mi")));
    let limits = object(resources, "limits")?;
    limits.insert("memory".into(), json!(format!("{limit_mb}Mi")));
    container.entry("securityContext").or_insert(json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": { "drop": ["ALL"] },
    }));
    let mounts = array(container, "volumeMounts")?;
    for (volume, path) in [("flint-work", WORK_MOUNT), ("flint-tmp", "/tmp")] {
        if !mounts
            .iter()
            .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(path))
        {
            mounts.push(json!({ "name": volume, "mountPath": path }));
        }
    }
    Ok(())
}

fn value_env(name: &str, value: &str) -> Value {
    json!({ "name": name, "value": value })
}

fn object<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
) -> Result<&'a mut Map<String, Value>, String> {
    let entry = map.entry(key).or_insert_with(|| json!({}));
    if entry.is_null() {
        *entry = json!({});
    }
    entry
        .as_object_mut()
        .ok_or_else(|| format!("`{key}` in the pod template is not an object"))
}

fn array<'a>(map: &'a mut Map<String, Value>, key: &str) -> Result<&'a mut Vec<Value>, String> {
    let entry = map.entry(key).or_insert_with(|| json!([]));
    if entry.is_null() {
        *entry = json!([]);
    }
    entry
        .as_array_mut()
        .ok_or_else(|| format!("`{key}` in the pod template is not a list"))
}

#[cfg(test)]
mod tests;
