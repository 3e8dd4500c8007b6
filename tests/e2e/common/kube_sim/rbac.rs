//! The simulator's authentication and RBAC authorization: bearer tokens to users, and
//! the Roles, ClusterRoles and their bindings that `deploy/kubernetes/base` gives the
//! driver's ServiceAccount, read from the manifests (with the kustomization's
//! namespace), so that a driver test fails if the driver needs a permission the shipped
//! manifests do not grant. A request no rule allows gets the real server's 403.
//!
//! Modelled: `apiGroups`, `resources` (`pods`, `pods/log`, `*`), `verbs` (`*` too) and
//! `resourceNames`; Role and ClusterRole through RoleBinding and ClusterRoleBinding;
//! ServiceAccount and User subjects; the request attributes as the API server derives
//! them from a path and method (`list`, `watch`, `get`, `create`, `update`, `patch`,
//! `delete`, `deletecollection`). Not modelled: aggregated ClusterRoles, Group subjects
//! (but `system:masters`), `nonResourceURLs` rules (discovery and `/version` are open to
//! every authenticated user, as the default `system:discovery` role makes them),
//! impersonation, and the RBAC API itself (no Role can be made over HTTP).

use std::collections::BTreeSet;
use std::path::Path;

use axum::http::Method;
use serde_json::{Value, json};

/// What a request asks to do, as the authorizer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Attributes {
    Resource {
        verb: String,
        group: String,
        /// With its subresource, if any: `pods/log`.
        resource: String,
        namespace: Option<String>,
        name: Option<String>,
    },
    NonResource {
        verb: String,
        path: String,
    },
}

impl Attributes {
    /// What the API server's RequestInfoFactory makes of a request.
    pub(super) fn of(method: &Method, path: &str, watch: bool) -> Attributes {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, rest) = match segments.as_slice() {
            ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
            ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
            _ => {
                return Attributes::NonResource {
                    verb: method.as_str().to_ascii_lowercase(),
                    path: path.to_owned(),
                };
            }
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            // `namespaces/NAME` is the namespace object itself.
            _ => (None, rest),
        };
        let resource = match rest {
            [resource, _name, sub, ..] => format!("{resource}/{sub}"),
            [resource, ..] => resource.to_string(),
            [] => String::new(),
        };
        let name = rest.get(1).map(|n| n.to_string());
        let verb = match (method.as_str(), name.is_some()) {
            ("GET" | "HEAD", _) if watch => "watch",
            ("GET" | "HEAD", true) => "get",
            ("GET" | "HEAD", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            (other, _) => return Self::non_resource(other, path),
        };
        Attributes::Resource {
            verb: verb.into(),
            group: group.into(),
            resource,
            namespace,
            name,
        }
    }

    fn non_resource(method: &str, path: &str) -> Attributes {
        Attributes::NonResource {
            verb: method.to_ascii_lowercase(),
            path: path.to_owned(),
        }
    }
}

/// One rule of a Role or ClusterRole.
#[derive(Clone, Debug)]
struct Rule {
    groups: BTreeSet<String>,
    resources: BTreeSet<String>,
    verbs: BTreeSet<String>,
    names: BTreeSet<String>,
}

impl Rule {
    fn of(rule: &Value) -> Rule {
        let set = |key: &str| -> BTreeSet<String> {
            (rule[key].as_array().into_iter().flatten())
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        Rule {
            groups: set("apiGroups"),
            resources: set("resources"),
            verbs: set("verbs"),
            names: set("resourceNames"),
        }
    }

    fn allows(&self, verb: &str, group: &str, resource: &str, name: Option<&str>) -> bool {
        let has = |set: &BTreeSet<String>, v: &str| set.contains("*") || set.contains(v);
        has(&self.verbs, verb)
            && has(&self.groups, group)
            && has(&self.resources, resource)
            && (self.names.is_empty() || name.is_some_and(|n| self.names.contains(n)))
    }
}

/// Rules a user holds: in one namespace (a RoleBinding), or in all (a
/// ClusterRoleBinding).
#[derive(Clone, Debug)]
struct Grant {
    user: String,
    namespace: Option<String>,
    rules: Vec<Rule>,
}

/// Who may do what: the grants read from the manifests, and what a test revoked.
#[derive(Clone, Debug, Default)]
pub struct Rbac {
    grants: Vec<Grant>,
    /// (verb, resource) taken from everyone by [`super::KubeSim::revoke`].
    revoked: BTreeSet<(String, String)>,
}

impl Rbac {
    /// The grants of every Role, ClusterRole and binding in the kustomization at `dir`
    /// (its `resources` files), in its `namespace`.
    pub fn from_kustomization(dir: &Path) -> Rbac {
        let kustomization = read_yaml(&dir.join("kustomization.yaml"));
        let kustomization = &kustomization[0];
        let namespace = kustomization["namespace"].as_str().map(str::to_owned);
        let mut objects = Vec::new();
        for file in kustomization["resources"].as_array().into_iter().flatten() {
            objects.extend(read_yaml(&dir.join(file.as_str().unwrap())));
        }
        let namespace_of = |o: &Value| {
            (o["metadata"]["namespace"].as_str().map(str::to_owned)).or_else(|| namespace.clone())
        };
        let role = |kind: &str, name: &str, ns: Option<&str>| -> Vec<Rule> {
            let found = objects.iter().find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == name
                    && (kind == "ClusterRole" || namespace_of(o).as_deref() == ns)
            });
            let rules = found.map(|o| o["rules"].clone()).unwrap_or(Value::Null);
            rules
                .as_array()
                .into_iter()
                .flatten()
                .map(Rule::of)
                .collect()
        };
        let mut grants = Vec::new();
        for binding in &objects {
            let cluster_wide = match binding["kind"].as_str() {
                Some("RoleBinding") => false,
                Some("ClusterRoleBinding") => true,
                _ => continue,
            };
            let ns = namespace_of(binding).filter(|_| !cluster_wide);
            let role_ref = &binding["roleRef"];
            let (kind, name) = (role_ref["kind"].as_str(), role_ref["name"].as_str());
            let rules = role(
                kind.unwrap_or_default(),
                name.unwrap_or_default(),
                ns.as_deref(),
            );
            for subject in binding["subjects"].as_array().into_iter().flatten() {
                let Some(user) = user_of(subject, namespace_of(binding).as_deref()) else {
                    continue;
                };
                grants.push(Grant {
                    user,
                    namespace: ns.clone(),
                    rules: rules.clone(),
                });
            }
        }
        Rbac {
            grants,
            revoked: BTreeSet::new(),
        }
    }

    pub(super) fn revoke(&mut self, verb: &str, resource: &str) {
        self.revoked.insert((verb.into(), resource.into()));
    }

    pub(super) fn restore(&mut self) {
        self.revoked.clear();
    }

    /// `Ok` if `user` may; else the 403 Status the API server answers.
    pub(super) fn authorize(&self, user: &str, attributes: &Attributes) -> Result<(), Value> {
        let Attributes::Resource {
            verb,
            group,
            resource,
            namespace,
            name,
        } = attributes
        else {
            // system:discovery and system:public-info-viewer: every authenticated user.
            return Ok(());
        };
        let revoked = self.revoked.contains(&(verb.clone(), resource.clone()));
        let granted = self.grants.iter().any(|g| {
            g.user == user
                && (g.namespace.is_none() || g.namespace == *namespace)
                && (g.rules.iter()).any(|r| r.allows(verb, group, resource, name.as_deref()))
        });
        if user == ADMIN || (granted && !revoked) {
            return Ok(());
        }
        Err(forbidden(user, attributes))
    }
}

/// The user a token stands for that every rule allows (`system:masters`).
pub const ADMIN: &str = "kubernetes-admin";

/// The user a binding's subject is: a ServiceAccount's `system:serviceaccount:NS:NAME`.
fn user_of(subject: &Value, binding_namespace: Option<&str>) -> Option<String> {
    let name = subject["name"].as_str()?;
    match subject["kind"].as_str()? {
        "ServiceAccount" => {
            let ns = subject["namespace"].as_str().or(binding_namespace)?;
            Some(format!("system:serviceaccount:{ns}:{name}"))
        }
        "User" => Some(name.to_owned()),
        _ => None,
    }
}

/// The API server's 403 for an RBAC denial (its `forbiddenMessage`, wrapped by
/// `NewForbidden`).
fn forbidden(user: &str, attributes: &Attributes) -> Value {
    let (message, details) = match attributes {
        Attributes::NonResource { verb, path } => (
            format!("forbidden: User {user:?} cannot {verb} path {path:?}"),
            json!({}),
        ),
        Attributes::Resource {
            verb,
            group,
            resource,
            namespace,
            name,
        } => {
            let scope = match namespace {
                Some(ns) => format!("in the namespace {ns:?}"),
                None => "at the cluster scope".to_owned(),
            };
            let why = format!(
                "User {user:?} cannot {verb} resource {resource:?} in API group {group:?} {scope}"
            );
            let base = resource.split('/').next().unwrap_or_default();
            let qualified = match group.as_str() {
                "" => base.to_owned(),
                group => format!("{base}.{group}"),
            };
            let message = match name {
                Some(name) => format!("{qualified} {name:?} is forbidden: {why}"),
                None => format!("{qualified} is forbidden: {why}"),
            };
            let mut details = json!({"group": group, "kind": base});
            if let Some(name) = name {
                details["name"] = json!(name);
            }
            (message, details)
        }
    };
    let mut status = super::status_body(403, "Forbidden", &message);
    status["details"] = details;
    status
}

fn read_yaml(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
        })
        .filter(|v: &Value| !v.is_null())
        .collect()
}
