//! Allow lists: what an entry may be, what it admits, and what covers it.

use proptest::prelude::*;

use super::{list, url};
use crate::PolicyError;
use crate::egress::AllowList;

#[test]
fn an_entry_is_an_http_origin_with_at_most_a_wildcard_first_label() {
    let kind = |e: &PolicyError| match e {
        PolicyError::NotAnOrigin(_) => "origin",
        PolicyError::Userinfo(_) => "userinfo",
        PolicyError::HttpOnly(_) => "scheme",
        PolicyError::Wildcard(_) => "wildcard",
        PolicyError::Malformed { .. } => "malformed",
        _ => "other",
    };
    for (entry, expected) in [
        ("https://api.test/v1", "origin"),
        ("https://api.test/?q=1", "origin"),
        ("https://api.test/#top", "origin"),
        ("https://user@api.test", "userinfo"),
        ("https://user:pw@api.test", "userinfo"),
        ("file:///srv", "scheme"),
        ("s3://bucket", "scheme"),
        ("https://a.*.test", "wildcard"),
        ("https://*", "wildcard"),
        ("https://*a.test", "wildcard"),
        ("https://*.", "wildcard"),
        ("not a url", "malformed"),
    ] {
        let err = AllowList::parse(&["https://fine.test", entry]).unwrap_err();
        assert_eq!(kind(&err), expected, "{entry}: {err:?}");
        assert!(err.to_string().contains(entry), "{entry}: {err}");
    }
    let ok = AllowList::parse(&[
        " https://api.test ",
        "http://127.0.0.1:8080",
        "http://[::1]:1",
        "https://*.example.org:8443",
        "HTTPS://API.Test:443/",
    ])
    .unwrap();
    assert!(!ok.is_empty());
    assert!(AllowList::parse::<&str>(&[]).unwrap().is_empty());
}

#[test]
fn a_wildcard_admits_names_below_its_suffix_and_not_the_suffix_itself() {
    let wild = list(&["https://*.example.org:8443"]);
    for admitted in [
        "https://a.example.org:8443/x",
        "https://a.b.example.org:8443/",
        "https://A.Example.Org:8443/",
    ] {
        assert!(wild.admits(&url(admitted)), "{admitted}");
    }
    for refused in [
        "https://example.org:8443/",
        "https://badexample.org:8443/",
        "https://a.example.org.evil.test:8443/",
        "https://.example.org:8443/",
        "https://a.example.org/",
        "http://a.example.org:8443/",
        "https://a.example.org:8444/",
    ] {
        assert!(!wild.admits(&url(refused)), "{refused}");
    }
}

#[test]
fn a_port_is_the_explicit_one_or_the_schemes_default() {
    let lists = list(&["http://a.test", "https://b.test:8443", "http://c.test:443"]);
    for (u, admitted) in [
        ("http://a.test/", true),
        ("http://a.test:80/", true),
        ("http://a.test:8080/", false),
        ("https://a.test/", false),
        ("https://b.test:8443/", true),
        ("https://b.test/", false),
        ("http://c.test:443/", true),
        ("https://c.test/", false),
    ] {
        assert_eq!(lists.admits(&url(u)), admitted, "{u}");
    }
}

#[test]
fn ip_hosts_are_compared_as_url_parses_them() {
    let loopback = list(&["http://127.0.0.1:8080"]);
    for same in [
        "http://127.0.0.1:8080/",
        "http://0x7f.1:8080/",
        "http://2130706433:8080/",
        "http://0177.0.0.1:8080/",
        "http://127.1:8080/",
    ] {
        assert!(loopback.admits(&url(same)), "{same}");
    }
    // The same IPv4 address in an IPv6 form is another address.
    assert!(!loopback.admits(&url("http://[::ffff:127.0.0.1]:8080/")));
    assert!(!loopback.admits(&url("http://localhost:8080/")));
    assert!(!loopback.admits(&url("http://127.0.0.2:8080/")));
    let mapped = list(&["http://[::ffff:127.0.0.1]:8080"]);
    assert!(mapped.admits(&url("http://[::ffff:7f00:1]:8080/")));
    assert!(!mapped.admits(&url("http://127.0.0.1:8080/")));
}

#[test]
fn outside_names_the_entries_no_ceiling_entry_covers() {
    let ceiling = list(&[
        "https://*.example.org",
        "https://api.test",
        "http://10.0.0.1:8080",
    ]);
    let job = list(&[
        "https://a.example.org",
        "https://*.b.example.org",
        "https://*.example.org",
        "https://api.test:443",
        "http://10.0.0.1:8080",
        // Below a wildcard, not the wildcard's own suffix.
        "https://example.org",
        "https://*.org",
        "https://*.badexample.org",
        "https://badexample.org",
        "http://api.test",
        "https://api.test:8443",
        "https://other.test",
        "http://10.0.0.2:8080",
        "http://[::ffff:10.0.0.1]:8080",
    ]);
    assert_eq!(
        job.outside(&ceiling),
        vec![
            "https://example.org",
            "https://*.org",
            "https://*.badexample.org",
            "https://badexample.org",
            "http://api.test",
            "https://api.test:8443",
            "https://other.test",
            "http://10.0.0.2:8080",
            "http://[::ffff:10.0.0.1]:8080",
        ]
    );
    assert!(ceiling.outside(&ceiling).is_empty());
    assert_eq!(
        ceiling.outside(&AllowList::default()).len(),
        3,
        "an empty ceiling covers nothing"
    );
}

/// Hosts from a small alphabet, so that entries and URLs often share labels.
fn arb_label() -> impl Strategy<Value = &'static str> {
    // "ample" ends "example": a suffix test on strings, not labels, would mix them up.
    prop::sample::select(vec!["a", "b", "example", "ample", "org", "test"])
}

fn arb_host(wildcard: bool) -> impl Strategy<Value = String> {
    (prop::collection::vec(arb_label(), 1..4), any::<bool>()).prop_map(move |(labels, star)| {
        let name = labels.join(".");
        if wildcard && star {
            format!("*.{name}")
        } else {
            name
        }
    })
}

fn arb_entry() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        arb_host(true),
        prop::option::of(prop_oneof![Just(80u16), Just(443), Just(8443)]),
    )
        .prop_map(|(https, host, port)| {
            let scheme = if https { "https" } else { "http" };
            match port {
                Some(port) => format!("{scheme}://{host}:{port}"),
                None => format!("{scheme}://{host}"),
            }
        })
}

fn arb_url() -> impl Strategy<Value = String> {
    arb_entry().prop_filter_map("no wildcard in a URL", |e| {
        (!e.contains('*')).then(|| format!("{e}/path"))
    })
}

proptest! {
    /// Each entry `outside` leaves out admits only what the ceiling admits: a job whose
    /// list `outside` finds nothing in can reach nothing its ceiling cannot.
    #[test]
    fn what_a_covered_entry_admits_its_ceiling_admits(
        ceiling in prop::collection::vec(arb_entry(), 0..4),
        entries in prop::collection::vec(arb_entry(), 1..4),
        urls in prop::collection::vec(arb_url(), 1..8),
    ) {
        let ceiling = list(&ceiling);
        let outside = list(&entries).outside(&ceiling);
        for entry in &entries {
            let single = list(std::slice::from_ref(entry));
            if outside.contains(entry) {
                continue;
            }
            // Beside the random URLs, what the entry itself names: random ones seldom
            // land under a wildcard.
            let probes = ["z", "z.y"].map(|label| format!("{}/", entry.replace('*', label)));
            for u in urls.iter().chain(&probes) {
                let u = url(u);
                prop_assert!(!single.admits(&u) || ceiling.admits(&u), "{entry} covered, {u} not admitted");
            }
        }
    }

    /// And an entry `outside` names admits something the ceiling does not: its own
    /// origin, or a name below its wildcard that no ceiling entry names.
    #[test]
    fn an_entry_outside_its_ceiling_admits_something_the_ceiling_does_not(
        ceiling in prop::collection::vec(arb_entry(), 0..4),
        entry in arb_entry(),
    ) {
        let ceiling = list(&ceiling);
        if list(std::slice::from_ref(&entry)).outside(&ceiling).is_empty() {
            return Ok(());
        }
        let witness = (0..5)
            .map(|n| url(&format!("{}/", entry.replace('*', &format!("z{n}")))))
            .find(|u| !ceiling.admits(u));
        prop_assert!(witness.is_some(), "{entry} outside, yet every probe is admitted");
    }
}
