use super::*;

fn ceiling(operator: &[&str], tenant: Option<&[&str]>) -> EgressCeiling {
    EgressCeiling {
        operator: Arc::new(AllowList::parse(operator).unwrap()),
        tenant: tenant.map(|t| {
            let entries: Vec<String> = t.iter().map(|s| s.to_string()).collect();
            let list = Arc::new(AllowList::parse(&entries).unwrap());
            TenantEgress { entries, list }
        }),
        ..EgressCeiling::default()
    }
}

fn network(allow: &[&str]) -> Option<NetworkSpec> {
    Some(NetworkSpec {
        allow: allow.iter().map(|s| s.to_string()).collect(),
    })
}

fn refused(result: Result<Option<NetworkGrant>, Rejection>, code: ErrorCode, says: &[&str]) {
    let e = result.unwrap_err();
    assert_eq!(e.code, code, "{e}");
    for s in says {
        assert!(e.message.contains(s), "{e:?} does not say {s:?}");
    }
}

#[test]
fn a_job_without_network_has_none_and_may_not_give_egress_limits() {
    let c = ceiling(&["https://api.example.com"], None);
    assert_eq!(grant(None, None, &c, None).unwrap(), None);
    let limits = EgressSpec {
        max_requests: Some(3),
        ..EgressSpec::default()
    };
    refused(
        grant(None, Some(limits), &c, None),
        ErrorCode::InvalidSpec,
        &["resources.egress", "\"network\""],
    );
}

#[test]
fn egress_is_off_until_the_operator_allows_an_origin() {
    let c = ceiling(&[], None);
    refused(
        grant(network(&["https://api.example.com"]), None, &c, None),
        ErrorCode::InvalidSpec,
        &["egress is off", "--egress-allow"],
    );
}

#[test]
fn each_layer_only_narrows_the_one_above_and_a_refusal_names_what_lies_outside() {
    let c = ceiling(&["https://*.example.com", "http://127.0.0.1:8080"], None);
    let granted = grant(network(&["https://api.example.com"]), None, &c, None)
        .unwrap()
        .unwrap();
    assert_eq!(granted.allow, vec!["https://api.example.com".to_string()]);
    assert_eq!(granted.tenant_allow, None);
    assert_eq!(granted.max_requests, defaults::EGRESS_MAX_REQUESTS);
    assert_eq!(granted.max_bytes, defaults::EGRESS_MAX_BYTES);
    assert_eq!(granted.max_concurrent, defaults::EGRESS_MAX_CONCURRENT);
    refused(
        grant(
            network(&["https://api.example.com", "https://evil.test"]),
            None,
            &c,
            None,
        ),
        ErrorCode::InvalidSpec,
        &["\"https://evil.test\" is outside", "--egress-allow"],
    );
    // Another port of an allowed host is another origin.
    refused(
        grant(network(&["http://127.0.0.1:8081"]), None, &c, None),
        ErrorCode::InvalidSpec,
        &["127.0.0.1:8081", "--egress-allow"],
    );

    let t = ceiling(
        &["https://*.example.com"],
        Some(&["https://api.example.com"]),
    );
    let granted = grant(
        network(&["https://api.example.com"]),
        None,
        &t,
        Some("team-a"),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        granted.tenant_allow,
        Some(vec!["https://api.example.com".to_string()])
    );
    // Within the operator's wildcard, beyond the tenant's list.
    refused(
        grant(
            network(&["https://www.example.com"]),
            None,
            &t,
            Some("team-a"),
        ),
        ErrorCode::InvalidSpec,
        &[
            "\"https://www.example.com\" is outside",
            "tenant \"team-a\"",
            "egress_allow",
        ],
    );
    let none = ceiling(&["https://*.example.com"], Some(&[]));
    refused(
        grant(
            network(&["https://api.example.com"]),
            None,
            &none,
            Some("team-b"),
        ),
        ErrorCode::InvalidSpec,
        &["tenant \"team-b\" may call no origin"],
    );
}

#[test]
fn a_list_that_is_not_origins_is_refused_naming_the_entry() {
    let c = ceiling(&["https://*.example.com"], None);
    for bad in [
        "https://api.example.com/v1",
        "ftp://api.example.com",
        "api.example.com",
    ] {
        refused(
            grant(network(&[bad]), None, &c, None),
            ErrorCode::InvalidSpec,
            &["network.allow", bad],
        );
    }
    refused(
        grant(network(&[]), None, &c, None),
        ErrorCode::InvalidSpec,
        &["1 to 64"],
    );
}

#[test]
fn limits_default_within_a_tenants_maxima_and_asking_past_one_is_over_quota() {
    let mut c = ceiling(
        &["https://api.example.com"],
        Some(&["https://api.example.com"]),
    );
    c.max_requests = Some(10);
    c.max_bytes = Some(1 << 20);
    let granted = grant(network(&["https://api.example.com"]), None, &c, Some("a"))
        .unwrap()
        .unwrap();
    assert_eq!(granted.max_requests, 10);
    assert_eq!(granted.max_bytes, 1 << 20);
    assert_eq!(granted.max_concurrent, defaults::EGRESS_MAX_CONCURRENT);
    let asks = |limits: EgressSpec| {
        grant(
            network(&["https://api.example.com"]),
            Some(limits),
            &c,
            Some("a"),
        )
    };
    refused(
        asks(EgressSpec {
            max_requests: Some(11),
            ..EgressSpec::default()
        }),
        ErrorCode::QuotaExceeded,
        &[
            "max_egress_requests is 10",
            "resources.egress.max_requests asks for 11",
        ],
    );
    refused(
        asks(EgressSpec {
            max_bytes: Some(0),
            ..EgressSpec::default()
        }),
        ErrorCode::InvalidSpec,
        &["resources.egress.max_bytes must be at least 1"],
    );
    let granted = asks(EgressSpec {
        max_requests: Some(2),
        max_bytes: Some(1000),
        max_concurrent: Some(1),
    })
    .unwrap()
    .unwrap();
    assert_eq!(
        (
            granted.max_requests,
            granted.max_bytes,
            granted.max_concurrent
        ),
        (2, 1000, 1)
    );
}
