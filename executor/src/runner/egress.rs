//! A task's outbound HTTP as the runner hands it to the sandbox: the operator's ceiling
//! (`--egress-allow`, from the driver's config), the job's grant, and the executor's one
//! client, made when the first task with a grant runs (an executor that never runs a
//! networked task starts no egress threads).

use std::sync::{Arc, Mutex};

use flint_fetch_cache::egress::{AllowList, EgressClient, EgressPolicy};
use flint_protocol::{FailureKind, NetworkGrant, TaskFailure};

use crate::sandbox::{Egress, EgressLimits, Grant, NoNetwork};

pub(super) struct Networks {
    operator: Arc<AllowList>,
    client: Mutex<Option<Arc<EgressClient>>>,
    /// The policy of the last grant's lists: the tasks of a job share them, and parsing
    /// them for each (URLs, IDNA) was a visible part of a task that makes one request.
    last: Mutex<Option<Judged>>,
}

/// A grant's lists and the policy made of them.
struct Judged {
    allow: Vec<String>,
    tenant_allow: Option<Vec<String>>,
    policy: Arc<EgressPolicy>,
}

impl Networks {
    pub(super) fn new(operator: Arc<AllowList>) -> Self {
        Networks {
            operator,
            client: Mutex::new(None),
            last: Mutex::new(None),
        }
    }

    /// What an attempt of a job with `grant` may call. A grant whose lists do not parse
    /// is the host's failure: the driver admitted them.
    pub(super) fn egress(&self, grant: Option<&NetworkGrant>) -> Result<Egress, TaskFailure> {
        let Some(grant) = grant else {
            return Ok(Egress::Off(match self.operator.is_empty() {
                true => NoNetwork::JobAndExecutor,
                false => NoNetwork::Job,
            }));
        };
        Ok(Egress::Live(Grant {
            policy: self.policy(grant)?,
            limits: EgressLimits {
                max_requests: grant.max_requests,
                max_bytes: grant.max_bytes,
                max_concurrent: grant.max_concurrent,
            },
            client: self.client()?,
        }))
    }

    /// The policy of `grant`'s lists with the operator's: the last grant's if they are
    /// the same.
    fn policy(&self, grant: &NetworkGrant) -> Result<Arc<EgressPolicy>, TaskFailure> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(judged) = &*last
            && judged.allow == grant.allow
            && judged.tenant_allow == grant.tenant_allow
        {
            return Ok(judged.policy.clone());
        }
        let host = |what: &str, e: &dyn std::fmt::Display| {
            let message = format!("the job's network grant: {what} does not parse: {e}");
            TaskFailure::new(FailureKind::HostError, message)
        };
        let job = AllowList::parse(&grant.allow).map_err(|e| host("network.allow", &e))?;
        let tenant = (grant.tenant_allow.as_deref())
            .map(AllowList::parse)
            .transpose()
            .map_err(|e| host("the tenant's egress_allow", &e))?;
        let policy = Arc::new(EgressPolicy::new(self.operator.clone(), tenant, job));
        *last = Some(Judged {
            allow: grant.allow.clone(),
            tenant_allow: grant.tenant_allow.clone(),
            policy: policy.clone(),
        });
        Ok(policy)
    }

    /// The executor's client, made on first use; a failure to make it is not kept, so
    /// that the next networked task tries again.
    fn client(&self) -> Result<Arc<EgressClient>, TaskFailure> {
        let mut client = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = &*client {
            return Ok(client.clone());
        }
        let made = EgressClient::new().map_err(|e| {
            let message = format!("starting the executor's egress client: {e}");
            TaskFailure::new(FailureKind::HostError, message)
        })?;
        *client = Some(made.clone());
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(allow: &[&str], tenant: Option<&[&str]>) -> NetworkGrant {
        let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        NetworkGrant {
            allow: strings(allow),
            tenant_allow: tenant.map(strings),
            max_requests: 3,
            max_bytes: 1000,
            max_concurrent: 2,
        }
    }

    #[test]
    fn no_grant_says_whether_the_executor_allows_any_egress() {
        let off = Networks::new(Arc::default());
        assert!(matches!(
            off.egress(None),
            Ok(Egress::Off(NoNetwork::JobAndExecutor))
        ));
        let operator = AllowList::parse(&["https://api.example.com"]).unwrap();
        let on = Networks::new(Arc::new(operator));
        assert!(matches!(on.egress(None), Ok(Egress::Off(NoNetwork::Job))));
        // No grant, no client: an executor without networked tasks starts no threads.
        assert!(on.client.lock().unwrap().is_none());
    }

    #[test]
    fn a_grant_that_does_not_parse_fails_the_attempt_as_the_hosts_naming_the_list() {
        let operator = AllowList::parse(&["https://api.example.com"]).unwrap();
        let networks = Networks::new(Arc::new(operator));
        for (grant, names) in [
            (grant(&["ftp://a.example"], None), "network.allow"),
            (
                grant(&["https://api.example.com"], Some(&["not an origin"])),
                "egress_allow",
            ),
        ] {
            let Err(failure) = networks.egress(Some(&grant)) else {
                panic!("{grant:?} should not parse");
            };
            assert_eq!(failure.kind, FailureKind::HostError);
            assert!(failure.message.contains(names), "{}", failure.message);
        }
    }

    #[test]
    fn a_grant_carries_its_limits_and_one_client_serves_every_attempt() {
        let operator = AllowList::parse(&["https://api.example.com"]).unwrap();
        let networks = Networks::new(Arc::new(operator));
        let wide = grant(
            &["https://api.example.com"],
            Some(&["https://api.example.com"]),
        );
        let (Ok(Egress::Live(first)), Ok(Egress::Live(second))) =
            (networks.egress(Some(&wide)), networks.egress(Some(&wide)))
        else {
            panic!("a valid grant is live");
        };
        assert_eq!(
            first.limits,
            EgressLimits {
                max_requests: 3,
                max_bytes: 1000,
                max_concurrent: 2
            }
        );
        assert!(Arc::ptr_eq(&first.client, &second.client));
        assert!(Arc::ptr_eq(&first.policy, &second.policy), "parsed once");
        let narrower = grant(&["https://api.example.com:8443"], None);
        let Ok(Egress::Live(third)) = networks.egress(Some(&narrower)) else {
            panic!("a valid grant is live");
        };
        assert!(!Arc::ptr_eq(&first.policy, &third.policy), "other lists");
    }
}
