//! The three layers and the rules on a request, as messages a user reads.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use proptest::prelude::*;

use super::{list, policy, url};
use crate::AddressClass;
use crate::addresses::forbidden;
use crate::egress::{AllowList, EgressPolicy, EgressRefusal, Layer};

fn judged(
    policy: &EgressPolicy,
    method: &str,
    u: &str,
    headers: &[(&str, &str)],
) -> Result<(), String> {
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
    policy
        .judge(method, &url(u), &headers)
        .map_err(|refusal| refusal.to_string())
}

#[test]
fn each_layer_refuses_in_its_own_words() {
    let open = policy(
        &["http://a.test", "http://b.test"],
        Some(&["http://a.test"]),
        &["http://a.test", "http://c.test"],
    );
    assert_eq!(judged(&open, "GET", "http://a.test/x", &[]), Ok(()));
    assert_eq!(
        judged(&open, "GET", "http://b.test/", &[]).unwrap_err(),
        "GET http://b.test/: b.test is not in the job's network.allow"
    );
    assert_eq!(
        judged(&open, "POST", "http://c.test/", &[]).unwrap_err(),
        "POST http://c.test/: c.test is not in the tenant's egress_allow"
    );
    let no_tenant = policy(
        &["http://a.test"],
        None,
        &["http://a.test", "http://c.test:81"],
    );
    assert_eq!(
        judged(&no_tenant, "GET", "http://c.test:81/", &[]).unwrap_err(),
        "GET http://c.test:81/: c.test:81 is not in the operator's --egress-allow"
    );
    let off = policy(&[], None, &["http://b.test"]);
    assert_eq!(
        judged(&off, "GET", "http://b.test/", &[]).unwrap_err(),
        "GET http://b.test/: b.test is not in the operator's --egress-allow (egress is off on this executor)"
    );
}

#[test]
fn a_special_purpose_literal_is_reached_only_when_the_operator_lists_that_address() {
    let everyone = [
        "http://127.0.0.1:9",
        "http://169.254.169.254",
        "http://10.1.2.3",
    ];
    let unlisted = policy(&["http://public.test"], None, &everyone);
    assert_eq!(
        judged(&unlisted, "GET", "http://127.0.0.1:9/", &[]).unwrap_err(),
        "GET http://127.0.0.1:9/: 127.0.0.1 is a loopback address (127.0.0.0/8) and the operator did not list it (--egress-allow)"
    );
    let metadata = judged(
        &unlisted,
        "GET",
        "http://169.254.169.254/latest/meta-data/",
        &[],
    );
    assert!(
        metadata
            .unwrap_err()
            .contains("169.254.169.254 is a link-local address (169.254.0.0/16)")
    );
    // Spelt otherwise, judged as what `url` makes of it: the address that is dialled.
    for other_spelling in [
        "http://0x7f.1:9/",
        "http://2130706433:9/",
        "http://0177.0.0.1:9/",
    ] {
        let refusal = unlisted
            .judge("GET", &url(other_spelling), &[])
            .unwrap_err();
        assert!(
            matches!(
                refusal,
                EgressRefusal::Address {
                    class: AddressClass::Loopback,
                    ..
                }
            ),
            "{other_spelling}: {refusal}"
        );
        assert!(
            refusal.to_string().starts_with("GET http://127.0.0.1:9/: "),
            "{refusal}"
        );
    }
    let listed = policy(&everyone, None, &everyone);
    assert_eq!(judged(&listed, "GET", "http://0x7f.1:9/", &[]), Ok(()));
    assert_eq!(judged(&listed, "GET", "http://10.1.2.3/", &[]), Ok(()));
    // The mapped form is another address, which nobody listed.
    let mapped = judged(&listed, "GET", "http://[::ffff:127.0.0.1]:9/", &[]).unwrap_err();
    assert!(
        mapped.contains("not in the job's network.allow"),
        "{mapped}"
    );
    let job_too = policy(&everyone, None, &["http://[::ffff:127.0.0.1]:9"]);
    let mapped = judged(&job_too, "GET", "http://[::ffff:127.0.0.1]:9/", &[]).unwrap_err();
    assert!(
        mapped.contains("::ffff:127.0.0.1 is a loopback address"),
        "{mapped}"
    );
    // Listed on another port, the address is known: what is missing is the origin.
    let elsewhere = judged(&listed, "GET", "http://127.0.0.1:10/", &[]);
    let job_any_port = policy(&everyone, None, &["http://127.0.0.1:10"]);
    assert!(elsewhere.unwrap_err().contains("not in the job's"));
    assert_eq!(
        judged(&job_any_port, "GET", "http://127.0.0.1:10/", &[]).unwrap_err(),
        "GET http://127.0.0.1:10/: 127.0.0.1:10 is not in the operator's --egress-allow"
    );
}

#[test]
fn the_url_itself_must_be_plain_http() {
    let open = policy(&["http://a.test"], None, &["http://a.test"]);
    let cases = [
        ("GET", "ftp://a.test/", "scheme `ftp` is not allowed"),
        ("GET", "http://user@a.test/", "user name or password"),
        ("GET", "http://:pw@a.test/", "user name or password"),
        ("CONNECT", "http://a.test/", "CONNECT method"),
        ("GET", "data:text/plain,hi", "scheme `data`"),
    ];
    for (method, u, rule) in cases {
        let refusal = judged(&open, method, u, &[]).unwrap_err();
        assert!(refusal.contains(rule), "{u}: {refusal}");
        assert!(
            refusal.starts_with(&format!("{method} {}", url(u))),
            "{refusal}"
        );
    }
    assert_eq!(judged(&open, "connect", "http://a.test/", &[]), Ok(()));
}

#[test]
fn a_host_header_must_name_the_urls_authority() {
    let open = policy(
        &["http://a.test", "http://a.test:8080"],
        None,
        &["http://a.test", "http://a.test:8080"],
    );
    for (u, host) in [
        ("http://a.test/", "a.test"),
        ("http://a.test/", "A.TEST"),
        ("http://a.test/", "a.test:80"),
        ("http://a.test:8080/", "a.test:8080"),
    ] {
        assert_eq!(
            judged(&open, "GET", u, &[("Host", host)]),
            Ok(()),
            "{u} {host}"
        );
    }
    for (u, name, host) in [
        ("http://a.test/", "host", "b.test"),
        ("http://a.test/", "HOST", "a.test:8080"),
        ("http://a.test:8080/", "Host", "a.test"),
        ("http://a.test/", "host", "a.test "),
        ("http://a.test/", "host", "a.test\r\nX: 1"),
    ] {
        let refusal = judged(&open, "GET", u, &[("accept", "*/*"), (name, host)]).unwrap_err();
        assert!(
            refusal.contains("is not the URL's authority"),
            "{u} {host}: {refusal}"
        );
    }
    assert_eq!(
        judged(&open, "GET", "http://a.test:8080/", &[("host", "b.test")]).unwrap_err(),
        "GET http://a.test:8080/: the Host header `b.test` is not the URL's authority `a.test:8080`"
    );
}

#[test]
fn connection_headers_are_refused_by_name() {
    let open = policy(&["http://a.test"], None, &["http://a.test"]);
    for name in [
        "connection",
        "Keep-Alive",
        "proxy-authenticate",
        "Proxy-Authorization",
        "proxy-connection",
        "Transfer-Encoding",
        "UPGRADE",
        "te",
        "trailer",
    ] {
        let refusal = judged(
            &open,
            "POST",
            "http://a.test/",
            &[("x-fine", "1"), (name, "x")],
        )
        .unwrap_err();
        assert_eq!(
            refusal,
            format!(
                "POST http://a.test/: the `{name}` header is never sent: it belongs to the connection, which the executor keeps"
            )
        );
    }
    assert_eq!(
        judged(
            &open,
            "POST",
            "http://a.test/",
            &[("authorization", "Bearer x"), ("tea", "1")]
        ),
        Ok(())
    );
}

/// Entries over a few hosts, names and literals both, so that the layers often agree.
fn arb_entry() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec![
            "a.test",
            "*.test",
            "b.a.test",
            "127.0.0.1",
            "[::1]",
            "93.184.216.34",
        ]),
        prop::sample::select(vec!["", ":80", ":8080"]),
    )
        .prop_map(|(host, port)| format!("http://{host}{port}"))
}

fn arb_layer() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(arb_entry(), 0..4)
}

proptest! {
    /// Whatever the whole policy admits, every layer admits on its own; and what a layer
    /// refuses first is the one the refusal names.
    #[test]
    fn whatever_the_policy_admits_every_layer_admits(
        operator in arb_layer(),
        tenant in prop::option::of(arb_layer()),
        job in arb_layer(),
        target in arb_entry(),
    ) {
        let u = url(&format!("{}/p", target.replace('*', "x")));
        let (operator, tenant, job) = (list(&operator), tenant.map(|t| list(&t)), list(&job));
        let policy = EgressPolicy::new(Arc::new(operator.clone()), tenant.clone(), job.clone());
        let layers = [(Layer::Job, Some(&job)), (Layer::Tenant, tenant.as_ref()), (Layer::Operator, Some(&operator))];
        match policy.judge("GET", &u, &[]) {
            Ok(()) => for (layer, list) in layers {
                prop_assert!(list.is_none_or(|l| l.admits(&u)), "{u} admitted, not by {layer}");
            },
            Err(EgressRefusal::NotListed { layer, .. }) => {
                let first = layers.iter().find(|(_, l)| l.is_some_and(|l| !l.admits(&u)));
                prop_assert_eq!(first.map(|(l, _)| *l), Some(layer));
            }
            Err(refusal) => {
                prop_assert!(!operator.admits(&u), "{refusal}, yet the operator admits {u}");
                let start = format!("GET {u}: ");
                prop_assert!(refusal.to_string().starts_with(&start), "{}", refusal);
            }
        }
    }

    /// An IP literal in a special-purpose range passes only when the operator names
    /// that very address, whatever the job and tenant say; a public one needs no more
    /// than its origin listed.
    #[test]
    fn a_forbidden_literal_is_admitted_only_when_listed_exactly(
        ip in prop_oneof![
            any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from_bits(b))),
            any::<u128>().prop_map(|b| IpAddr::V6(Ipv6Addr::from_bits(b))),
            (0..=255u8, any::<u16>()).prop_map(|(a, b)| IpAddr::V4(Ipv4Addr::new(127, a, (b >> 8) as u8, b as u8))),
            any::<u32>().prop_map(|b| IpAddr::V6(Ipv4Addr::from_bits(b).to_ipv6_mapped())),
        ],
        neighbour in 1..=255u8,
        port in 1u16..,
        listed in any::<bool>(),
    ) {
        let origin = format!("http://{}", SocketAddr::new(ip, port));
        let other = match ip {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from_bits(v4.to_bits() ^ u32::from(neighbour))),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() ^ u128::from(neighbour))),
        };
        let other_origin = format!("http://{}", SocketAddr::new(other, port));
        let operator = if listed { vec![origin.clone()] } else { vec![other_origin, "http://a.test".to_owned()] };
        let operator: Vec<&str> = operator.iter().map(String::as_str).collect();
        let policy = policy(&operator, Some(&[origin.as_str()]), &[origin.as_str()]);
        let verdict = policy.judge("GET", &url(&format!("{origin}/")), &[]);
        if listed {
            prop_assert!(verdict.is_ok(), "{origin} listed: {verdict:?}");
        } else if forbidden(ip).is_some() {
            let refused_by_address = matches!(verdict, Err(EgressRefusal::Address { addr, .. }) if addr == ip);
            prop_assert!(refused_by_address, "{origin}: {verdict:?}");
        } else {
            prop_assert!(matches!(verdict, Err(EgressRefusal::NotListed { layer: Layer::Operator, .. })), "{origin}: {verdict:?}");
        }
    }
}

#[test]
fn an_empty_policy_refuses_everything_with_the_jobs_list_named_first() {
    let none = EgressPolicy::new(Arc::new(AllowList::default()), None, AllowList::default());
    assert!(
        judged(&none, "GET", "https://a.test/", &[])
            .unwrap_err()
            .contains("network.allow")
    );
}
