//! Who owns the executors' pods: what owns the driver's own pod (`--k8s-driver-pod`),
//! never that pod itself.
//!
//! The driver's pod is replaced on every rollout (and a StatefulSet's comes back under
//! the same name with another uid): pods it owned would be deleted by the garbage
//! collector with it, and with them the running work that the next driver is to adopt.
//! What owns the driver's pod outlives a rollout: its StatefulSet (the shipped
//! manifests), or, under a Deployment, the Deployment (read through the ReplicaSet,
//! which a rollout replaces; that needs `get` on `replicasets.apps`). Deleting it
//! deletes the executors. The reference is no controller reference, so that the
//! StatefulSet's controller neither claims nor releases the executors' pods.
//!
//! A driver pod owned by nothing (or whose ReplicaSet cannot be read) gives its
//! executors no owner: each exits by itself (code 5) once it has had no driver for its
//! `--driver-loss-grace-ms`, and the next driver deletes the finished pods.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;

use super::pod::Owner;

/// What the driver's pod's owner references make the executors' owner.
#[derive(Debug, PartialEq, Eq)]
enum Choice {
    None,
    This(Owner),
    /// A ReplicaSet's controller (its Deployment), else the ReplicaSet itself.
    ThroughReplicaSet(Owner),
}

/// The owner of the executors' pods, for the driver running in `driver_pod`.
pub(super) async fn executors_owner(
    client: &kube::Client,
    namespace: &str,
    driver_pod: &Pod,
) -> Option<Owner> {
    let refs = driver_pod
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or(&[]);
    match choose(refs) {
        Choice::None => {
            tracing::warn!(
                "the driver's pod has no controller: executor pods get no owner, and \
                 exit on their own once without a driver for their grace"
            );
            None
        }
        Choice::This(owner) => Some(owner),
        Choice::ThroughReplicaSet(set) => {
            let api: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
            match api.get(&set.name).await {
                Ok(found) => {
                    let refs = found.metadata.owner_references.as_deref().unwrap_or(&[]);
                    match choose(refs) {
                        Choice::This(owner) | Choice::ThroughReplicaSet(owner) => Some(owner),
                        Choice::None => Some(set),
                    }
                }
                Err(e) => {
                    tracing::warn!(replica_set = set.name, error = %e,
                        "reading the driver's ReplicaSet for its Deployment (needs get on \
                         replicasets.apps): executor pods get no owner");
                    None
                }
            }
        }
    }
}

fn choose(refs: &[OwnerReference]) -> Choice {
    let Some(controller) = refs.iter().find(|r| r.controller == Some(true)) else {
        return Choice::None;
    };
    let owner = Owner {
        api_version: controller.api_version.clone(),
        kind: controller.kind.clone(),
        name: controller.name.clone(),
        uid: controller.uid.clone(),
    };
    match (controller.api_version.as_str(), controller.kind.as_str()) {
        ("apps/v1", "ReplicaSet") => Choice::ThroughReplicaSet(owner),
        _ => Choice::This(owner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(kind: &str, name: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller,
            block_owner_deletion: None,
        }
    }

    #[test]
    fn the_driver_pods_controller_owns_the_executors_and_a_replica_set_is_seen_through() {
        assert_eq!(choose(&[]), Choice::None);
        // Only a controller reference counts.
        assert_eq!(choose(&[reference("StatefulSet", "x", None)]), Choice::None);
        let set = reference("StatefulSet", "flint-driver", Some(true));
        let Choice::This(owner) = choose(&[reference("Other", "o", Some(false)), set]) else {
            panic!("the StatefulSet owns them");
        };
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("StatefulSet", "flint-driver", "uid-flint-driver")
        );
        let rs = reference("ReplicaSet", "flint-driver-7d9f", Some(true));
        assert!(matches!(
            choose(&[rs]),
            Choice::ThroughReplicaSet(o) if o.name == "flint-driver-7d9f"
        ));
    }
}
