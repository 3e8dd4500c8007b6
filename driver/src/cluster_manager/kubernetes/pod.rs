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
/// Labels every executor pod carries. The watch, the adoption at start and a stop for
/// good select on the app's and the driver instance's together: two drivers of the same
/// app id in one namespace (the default id, say) never see each other's pods.
pub const APP_LABEL: &str = "flint.dev/app";
pub const EXECUTOR_LABEL: &str = "flint.dev/executor-id";
pub const INSTANCE_LABEL: &str = "flint.dev/driver-instance";
/// How long an executor keeps dialling the driver at its start (`--connect-timeout-ms`,
/// whose own default is 10 s): a pod can start before the driver's name resolves or its
/// listener is up (a driver restarting, its Service's DNS record not there yet, Spark's
/// SPARK-32975), and an executor that gives up then exits 4 and counts as a failure. As
/// long as the launch timeout, which counts from when the pod runs: one that never
/// reaches the driver still exits, and counts, by then. A template's value is kept.
pub const EXECUTOR_CONNECT_TIMEOUT_MS: u64 = 60_000;
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
    /// This driver's instance (`instance.rs`): in each pod's labels and name.
    pub instance: String,
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

/// A pod name for an executor of an app's driver instance: DNS-1123 (lowercase
/// letters, digits, '-'), at most 63 bytes so that it can be a host name too, and unique
/// for every app id, instance and executor id: the app id is cut to fit, a hash of it
/// and the instance makes up for what was cut, and an executor id that is not already a
/// short DNS label is cut and hashed too (`exec-10` and `exec-100` never meet at the
/// limit).
pub fn pod_name(app_id: &str, instance: &str, id: &ExecutorId) -> String {
    const PREFIX: &str = "flint-";
    let tag = short_hash(&[app_id, instance]);
    let executor = executor_part(&id.0);
    let room = NAME_MAX - PREFIX.len() - tag.len() - 1 - executor.len() - 1;
    let app = dns_fragment(app_id, room);
    let mut name = String::from(PREFIX);
    if !app.is_empty() {
        name.push_str(&app);
        name.push('-');
    }
    name.push_str(&tag);
    name.push('-');
    name.push_str(&executor);
    name
}

/// The longest DNS label, and so the longest pod name that is also a host name.
const NAME_MAX: usize = 63;
/// An executor id longer than this is cut, and hashed.
const EXECUTOR_PART_MAX: usize = 40;

/// The executor id as it is when it is a short DNS label (`exec-12`), else its start
/// made one and a hash of the whole.
fn executor_part(id: &str) -> String {
    let clean = dns_fragment(id, EXECUTOR_PART_MAX);
    if clean == id && !clean.is_empty() {
        return clean;
    }
    let start = dns_fragment(id, EXECUTOR_PART_MAX / 2);
    match start.is_empty() {
        true => short_hash(&[id]),
        false => format!("{start}-{}", short_hash(&[id])),
    }
}

/// `s` lowercased, every run of other characters than letters and digits one '-', none
/// at either end, at most `max` bytes.
fn dns_fragment(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    for c in s.chars().map(|c| c.to_ascii_lowercase()) {
        let c = if c.is_ascii_alphanumeric() { c } else { '-' };
        if !(c == '-' && (out.is_empty() || out.ends_with('-'))) {
            out.push(c);
        }
    }
    out.truncate(max);
    out.trim_end_matches('-').to_owned()
}

/// Eight hex digits of the SHA-256 of `parts`: one in 4 billion for two names to meet.
pub(super) fn short_hash(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hex::encode(&hasher.finalize()[..4])
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
    let name = pod_name(&settings.app_id, &settings.instance, id);
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
        (INSTANCE_LABEL, settings.instance.as_str()),
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
    // A default, not the driver's to impose: an operator may want it longer still.
    if !template_env
        .iter()
        .any(|e| e.get("name").and_then(Value::as_str) == Some("FLINT_CONNECT_TIMEOUT_MS"))
    {
        let timeout = EXECUTOR_CONNECT_TIMEOUT_MS.to_string();
        template_env.push(value_env("FLINT_CONNECT_TIMEOUT_MS", &timeout));
    }
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
