//! The pod spec as built from the settings and a template, pod names, and the fates
//! pod statuses map to.

use flint_protocol::exit::ProcessExit;

use super::*;

fn settings() -> PodSettings {
    PodSettings {
        namespace: "flint".into(),
        app_id: "batch_7".into(),
        instance: "0195f3c2a1b24c3d8e9f0a1b2c3d4e5f".into(),
        image: "localhost/flint:dev".into(),
        image_pull_policy: Some("IfNotPresent".into()),
        driver_url: "flint://flint-driver.flint.svc:7071".into(),
        cluster_secret_ref: Some(("flint-secrets".into(), "cluster-secret".into())),
        owner: Some(Owner {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: "flint-driver".into(),
            uid: "u-1".into(),
        }),
        template: None,
        termination_grace_seconds: 120,
        memory_overhead: MemoryOverhead {
            factor: 0.1,
            min_mb: 384,
        },
    }
}

fn env_of(pod: &Pod) -> Value {
    let c = &pod.spec.as_ref().unwrap().containers[0];
    serde_json::to_value(&c.env).unwrap()
}

#[test]
fn the_built_in_pod_carries_env_limits_labels_owner_and_no_inline_secret() {
    let s = settings();
    let id = ExecutorId("exec-3".into());
    let pod = executor_pod(&s, &id, 2, 2048).unwrap();
    let json = serde_json::to_value(&pod).unwrap();
    assert_eq!(
        json["metadata"]["name"],
        pod_name(&s.app_id, &s.instance, &id)
    );
    assert_eq!(json["metadata"]["labels"][APP_LABEL], "batch_7");
    assert_eq!(json["metadata"]["labels"][EXECUTOR_LABEL], "exec-3");
    assert_eq!(json["metadata"]["labels"][INSTANCE_LABEL], s.instance);
    let owner = &json["metadata"]["ownerReferences"][0];
    assert_eq!(owner["uid"], "u-1");
    assert_eq!(owner["kind"], "StatefulSet");
    assert!(owner.get("controller").is_none(), "{owner}");
    let c = &json["spec"]["containers"][0];
    assert_eq!(c["args"], json!(["executor"]));
    // 10 % of 2048 is under the 384 MiB floor.
    assert_eq!(c["resources"]["limits"]["memory"], "2432Mi");
    assert_eq!(c["resources"]["requests"]["cpu"], "2");
    assert_eq!(json["spec"]["restartPolicy"], "Never");
    assert_eq!(json["spec"]["terminationGracePeriodSeconds"], 120);
    let env = env_of(&pod);
    let secret = env
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "FLINT_CLUSTER_SECRET")
        .unwrap();
    assert!(secret.get("value").is_none(), "{secret}");
    assert_eq!(secret["valueFrom"]["secretKeyRef"]["key"], "cluster-secret");
    for name in [
        "FLINT_DRIVER_URL",
        "FLINT_EXECUTOR_ID",
        "FLINT_CORES",
        "FLINT_MEMORY_MB",
        "FLINT_APP_ID",
        "FLINT_CONNECT_TIMEOUT_MS",
    ] {
        assert!(
            env.as_array().unwrap().iter().any(|e| e["name"] == name),
            "{name}"
        );
    }
}

#[test]
fn a_template_keeps_its_sidecars_env_and_volumes_and_loses_what_flint_owns() {
    let mut s = settings();
    s.template = Some(json!({
        "metadata": { "name": "ignored", "labels": { "team": "ml" } },
        "spec": {
            "restartPolicy": "Always",
            "nodeSelector": { "pool": "wasm" },
            "containers": [
                { "name": "proxy", "image": "envoy" },
                { "name": "flint-executor", "image": "old", "command": ["/bin/sh"],
                  "env": [ { "name": "RUST_LOG", "value": "debug" },
                           { "name": "FLINT_CORES", "value": "99" },
                           { "name": "FLINT_CONNECT_TIMEOUT_MS", "value": "300000" } ],
                  "resources": { "limits": { "ephemeral-storage": "1Gi" } } }
            ]
        }
    }));
    let pod = executor_pod(&s, &ExecutorId("exec-1".into()), 4, 8192).unwrap();
    let json = serde_json::to_value(&pod).unwrap();
    assert!(
        json["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("flint-batch-7-"),
        "{json}"
    );
    assert_eq!(json["metadata"]["labels"]["team"], "ml");
    assert_eq!(json["spec"]["restartPolicy"], "Never");
    assert_eq!(json["spec"]["nodeSelector"]["pool"], "wasm");
    let containers = json["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers[0]["image"], "envoy");
    let c = &containers[1];
    assert_eq!(c["image"], "localhost/flint:dev");
    assert!(c.get("command").is_none());
    assert_eq!(c["resources"]["limits"]["ephemeral-storage"], "1Gi");
    // 10 % of 8192 is above the floor.
    assert_eq!(c["resources"]["limits"]["memory"], "9012Mi");
    let env = c["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e["name"] == "RUST_LOG"));
    let cores: Vec<&Value> = env.iter().filter(|e| e["name"] == "FLINT_CORES").collect();
    assert_eq!(cores.len(), 1);
    assert_eq!(cores[0]["value"], "4");
    // The connect timeout is a default the template may set longer.
    let connect: Vec<&Value> = (env.iter())
        .filter(|e| e["name"] == "FLINT_CONNECT_TIMEOUT_MS")
        .collect();
    assert_eq!(connect.len(), 1);
    assert_eq!(connect[0]["value"], "300000");
}

#[test]
fn pod_names_are_dns_labels() {
    let id = ExecutorId("exec-12".into());
    let name = pod_name("My.App_x", "i-1", &id);
    assert!(
        name.starts_with("flint-my-app-x-") && name.ends_with("-exec-12"),
        "{name}"
    );
    let long = "a".repeat(64);
    assert!(is_label_value("batch_7") && !is_label_value("-x") && !is_label_value(&long));
    for app in ["", "-", "x", &long, "Ünïcode app", "a.b_c-d"] {
        for id in ["exec-1", "", "EXEC_1", &"9".repeat(100)] {
            let name = pod_name(app, "i-1", &ExecutorId(id.into()));
            assert!(is_dns_label(&name), "{app:?} {id:?}: {name:?}");
        }
    }
}

fn is_dns_label(s: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (1..=63).contains(&s.len())
        && s.bytes().all(|b| ok(b) || b == b'-')
        && s.bytes().next().is_some_and(ok)
        && s.bytes().last().is_some_and(ok)
}

/// The regression: at a 49-character app id the old names were cut to 63 bytes, and
/// `exec-100`'s became `exec-10`'s; at 63 characters every executor's was the same.
#[test]
fn pod_names_are_unique_for_a_63_character_app_id_and_executor_ids_of_any_length() {
    let mut seen = std::collections::BTreeSet::new();
    let apps = ["a".repeat(49), "b".repeat(63), "flint".to_owned()];
    for app in &apps {
        for n in (1..=120).chain([999, 1000, 123_456_789]) {
            let name = pod_name(app, "i-1", &ExecutorId(format!("exec-{n}")));
            assert!(is_dns_label(&name), "{name}");
            assert!(seen.insert(name.clone()), "{name} twice");
        }
        // Ids that are no DNS label, or too long for one, hashed apart.
        for id in ["Exec_1", "exec.1", &format!("exec-{}", "1".repeat(60))] {
            let name = pod_name(app, "i-1", &ExecutorId(id.into()));
            assert!(is_dns_label(&name), "{name}");
            assert!(seen.insert(name.clone()), "{name} twice");
        }
    }
    // Another driver instance of the same app names its pods apart.
    let id = ExecutorId("exec-1".into());
    assert_ne!(pod_name("flint", "i-1", &id), pod_name("flint", "i-2", &id));
    // A short app id is there whole, for people to read.
    assert!(pod_name("batch-7", "i-1", &id).starts_with("flint-batch-7-"));
}

fn pod(status: Value) -> Pod {
    serde_json::from_value(json!({ "metadata": { "name": "p" }, "status": status })).unwrap()
}

#[test]
fn statuses_map_to_fates() {
    assert_eq!(
        fate(&pod(json!({ "phase": "Pending", "conditions": [
            { "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
              "message": "0/1 nodes are available: 1 Insufficient cpu." } ] }))),
        PodFate::Pending {
            reason: Some("Unschedulable: 0/1 nodes are available: 1 Insufficient cpu.".into()),
            stuck: false
        }
    );
    assert_eq!(
        fate(&pod(json!({ "phase": "Pending", "containerStatuses": [
            { "name": CONTAINER, "image": "x", "imageID": "", "ready": false, "restartCount": 0,
              "state": { "waiting": { "reason": "ContainerCreating" } } } ] }))),
        PodFate::Pending {
            reason: None,
            stuck: false
        }
    );
    assert_eq!(
        fate(&pod(json!({ "phase": "Pending", "containerStatuses": [
            { "name": CONTAINER, "image": "x", "imageID": "", "ready": false, "restartCount": 0,
              "state": { "waiting": { "reason": "ImagePullBackOff", "message": "Back-off pulling image" } } } ] }))),
        PodFate::Pending {
            reason: Some("ImagePullBackOff: Back-off pulling image".into()),
            stuck: true
        }
    );
    assert_eq!(
        fate(&pod(json!({ "phase": "Failed", "containerStatuses": [
            { "name": CONTAINER, "image": "x", "imageID": "", "ready": false, "restartCount": 0,
              "state": { "terminated": { "exitCode": 137, "reason": "OOMKilled" } } } ] }))),
        PodFate::Terminated {
            exit: ProcessExit::Code(137),
            cause: Some("OOMKilled".into())
        }
    );
    assert_eq!(
        fate(&pod(json!({ "phase": "Succeeded", "containerStatuses": [
            { "name": CONTAINER, "image": "x", "imageID": "", "ready": false, "restartCount": 0,
              "state": { "terminated": { "exitCode": 0, "reason": "Completed" } } } ] }))),
        PodFate::Terminated {
            exit: ProcessExit::Code(0),
            cause: None
        }
    );
    assert!(matches!(
        fate(&pod(json!({ "phase": "Failed", "reason": "Evicted",
                          "message": "The node was low on resource: memory." }))),
        PodFate::Lost(m) if m.contains("evicted") && m.contains("low on resource")
    ));
}
