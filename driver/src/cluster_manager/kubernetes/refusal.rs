//! What an API error means for asking again: back-pressure (the same request passes in
//! a while), a permission the driver lacks (an administrator can grant it while the
//! driver runs), or a refusal no retry mends. Pure: it reads the API's Status only.

/// Why the API did not do what was asked, and so what to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Back-pressure: throttled (429), the namespace's ResourceQuota full (403 `exceeded
    /// quota`), the server's own trouble (5xx), an expired token (401, reread), or no
    /// answer at all (refused, reset, timed out): asked again after a backoff.
    ForNow(String),
    /// RBAC: the driver's service account may not do this. Retried too, with the same
    /// capped backoff (Spark's allocator asks again as well): an administrator can grant
    /// the permission without restarting the driver, and a driver that gave up would
    /// need one. The log says which permission; `permission` is it, as a `kubectl
    /// create role` would write it.
    NotPermitted { message: String, permission: String },
    /// What no retry mends: the pod invalid (422), forbidden by a policy on its spec
    /// (403 PodSecurity, a LimitRange), a bad request (400), its namespace gone (404).
    Never(String),
}

impl Refusal {
    /// The refusal a failed request met.
    pub(super) fn of(e: &kube::Error) -> Refusal {
        let kube::Error::Api(status) = e else {
            return Refusal::ForNow(describe(e));
        };
        let message = describe(e);
        match status.code {
            401 | 429 => Refusal::ForNow(message),
            code if code >= 500 => Refusal::ForNow(message),
            403 if status.message.contains("exceeded quota") => Refusal::ForNow(message),
            403 => match rbac_permission(&status.message) {
                Some(permission) => Refusal::NotPermitted {
                    message,
                    permission,
                },
                None => Refusal::Never(message),
            },
            _ => Refusal::Never(message),
        }
    }
}

/// An API error as one line: `403 Forbidden: pods "x" is forbidden: exceeded quota: ...`
/// (kube's own Display repeats the whole Status), or the transport's error.
pub(super) fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            format!("{} {}: {}", status.code, status.reason, status.message)
        }
        other => other.to_string(),
    }
}

/// The verb and resource an RBAC denial names (`User "..." cannot create resource
/// "pods" in API group "" in the namespace "flint"`), as `create pods`; `None` for a
/// 403 that is not RBAC's (an admission plugin's, a quota's).
fn rbac_permission(message: &str) -> Option<String> {
    let (_, rest) = message.split_once("\" cannot ")?;
    let (verb, rest) = rest.split_once(" resource \"")?;
    let (resource, rest) = rest.split_once('"')?;
    let group = rest
        .strip_prefix(" in API group \"")
        .and_then(|g| g.split_once('"'))
        .map(|(g, _)| g)
        .filter(|g| !g.is_empty());
    Some(match group {
        Some(group) => format!("{verb} {resource}.{group}"),
        None => format!("{verb} {resource}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn a_full_quota_is_back_pressure_rbac_a_permission_and_an_invalid_pod_final() {
        let quota = api(
            403,
            "Forbidden",
            "pods \"flint-a-1\" is forbidden: exceeded quota: compute, requested: pods=1, \
             used: pods=4, limited: pods=4",
        );
        assert!(matches!(Refusal::of(&quota), Refusal::ForNow(m) if m.contains("exceeded quota")));
        let rbac = api(
            403,
            "Forbidden",
            "pods is forbidden: User \"system:serviceaccount:flint:flint-driver\" cannot \
             create resource \"pods\" in API group \"\" in the namespace \"flint\"",
        );
        assert!(matches!(
            Refusal::of(&rbac),
            Refusal::NotPermitted { permission, .. } if permission == "create pods"
        ));
        let apps = "replicasets.apps \"r\" is forbidden: User \"u\" cannot get resource \
                    \"replicasets\" in API group \"apps\" in the namespace \"flint\"";
        assert_eq!(
            rbac_permission(apps).as_deref(),
            Some("get replicasets.apps")
        );
        let policy = api(
            403,
            "Forbidden",
            "pods \"x\" is forbidden: violates PodSecurity \"restricted:latest\": ...",
        );
        assert!(matches!(Refusal::of(&policy), Refusal::Never(_)));
        assert!(matches!(
            Refusal::of(&api(422, "Invalid", "Pod \"x\" is invalid")),
            Refusal::Never(_)
        ));
        for code in [429, 500, 503, 401] {
            assert!(matches!(
                Refusal::of(&api(code, "", "")),
                Refusal::ForNow(_)
            ));
        }
        assert_eq!(
            describe(&api(429, "TooManyRequests", "slow down")),
            "429 TooManyRequests: slow down"
        );
    }
}
