//! The fetch cache's address table and allow-list parser, on addresses and URLs built
//! from the input. Written against what any version of the table must do, not its rows.
//!
//! The first byte picks the input's shape: an IPv4 address and its IPv6 forms, an IPv6
//! address, an address inside one of the blocks that are forbidden whatever the table
//! says, or the rest as text (a URL, and an allow list). Properties:
//! - nothing panics, and every refusal formats;
//! - an IPv4 address, its IPv4-mapped form (`::ffff:a.b.c.d`) and its NAT64 form
//!   (`64:ff9b::a.b.c.d`) get the same verdict, and its IPv4-compatible form
//!   (`::a.b.c.d`) is forbidden when it is: no form lets a forbidden IPv4 through;
//! - 127/8, 10/8, 169.254/16, 192.168/16 (and their IPv6 forms), ::1, fe80::/10 and
//!   fc00::/7 are always forbidden;
//! - an IP literal in a URL gets its address's verdict; URLs with a domain name are
//!   skipped (judging one means a DNS lookup, which a fuzz target never does);
//! - an allow-list entry that is accepted is what the policy says it takes: an
//!   http(s) origin with no path, query or fragment, or an `s3://bucket`. `file://`
//!   entries are skipped (they stat the path).
//!
//! `UrlPolicy::admit`, the check of a whole URL, is `pub(crate)`, so it is not called
//! here; its unit tests cover IP literals (fetch-cache/src/policy.rs).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use flint_fetch_cache::{Refusal, UrlPolicy};
use url::{Host, Url};

/// One input, as the cargo-fuzz target and the corpus replay
/// (tests/e2e/fuzz_corpora.rs) give it: panics where a property fails.
pub fn check_input(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 4 {
        0 => drop(v4_forms(Ipv4Addr::from_bits(u32::from_be_bytes(bytes(
            rest,
        ))))),
        1 => drop(v6(Ipv6Addr::from_bits(u128::from_be_bytes(bytes(rest))))),
        2 => anchor(selector / 4, u128::from_be_bytes(bytes(rest))),
        _ => text(&String::from_utf8_lossy(rest)),
    }
}

/// The one call into the table: the rest of the target only asks "forbidden or not".
fn forbidden(ip: IpAddr) -> bool {
    match flint_fetch_cache::addresses::forbidden(ip) {
        Some((class, block)) => {
            let refusal = Refusal::Address {
                addr: ip,
                class,
                block,
            };
            assert!(refusal.to_string().contains(&ip.to_string()), "{refusal}");
            true
        }
        None => false,
    }
}

/// The first `N` bytes of `input`, zero-padded.
fn bytes<const N: usize>(input: &[u8]) -> [u8; N] {
    let mut out = [0; N];
    let n = input.len().min(N);
    out[..n].copy_from_slice(&input[..n]);
    out
}

fn mapped(v4: Ipv4Addr) -> Ipv6Addr {
    v4.to_ipv6_mapped()
}

fn nat64(v4: Ipv4Addr) -> Ipv6Addr {
    Ipv6Addr::from_bits((0x64_ff9b_u128 << 96) | u128::from(v4.to_bits()))
}

fn compatible(v4: Ipv4Addr) -> Ipv6Addr {
    Ipv6Addr::from_bits(u128::from(v4.to_bits()))
}

/// The verdict on `v4`, after checking its IPv6 forms agree with it.
fn v4_forms(v4: Ipv4Addr) -> bool {
    let verdict = forbidden(IpAddr::V4(v4));
    assert_eq!(
        forbidden(IpAddr::V6(mapped(v4))),
        verdict,
        "{v4} and {}",
        mapped(v4)
    );
    assert_eq!(
        forbidden(IpAddr::V6(nat64(v4))),
        verdict,
        "{v4} and {}",
        nat64(v4)
    );
    let compat = compatible(v4);
    assert!(
        !verdict || forbidden(IpAddr::V6(compat)),
        "{v4} forbidden, {compat} not"
    );
    verdict
}

/// An IPv6 address; one that carries an IPv4 address is checked with its forms.
fn v6(ip: Ipv6Addr) -> bool {
    let verdict = forbidden(IpAddr::V6(ip));
    let low = Ipv4Addr::from_bits(ip.to_bits() as u32);
    if ip == mapped(low) || ip == nat64(low) {
        assert_eq!(v4_forms(low), verdict, "{ip} and {low}");
    }
    verdict
}

/// An address in one of the blocks every table forbids, its host bits from `bits`.
fn anchor(which: u8, bits: u128) {
    const V4: [([u8; 4], u32); 4] = [
        ([127, 0, 0, 0], 8),
        ([10, 0, 0, 0], 8),
        ([169, 254, 0, 0], 16),
        ([192, 168, 0, 0], 16),
    ];
    const V6: [(u128, u32); 3] = [(1, 128), (0xfe80 << 112, 10), (0xfc00 << 112, 7)];
    let which = usize::from(which) % (V4.len() + V6.len());
    if let Some(&(net, prefix)) = V4.get(which) {
        let host = (bits as u32).checked_shr(prefix).unwrap_or(0);
        let ip = Ipv4Addr::from_bits(u32::from_be_bytes(net) | host);
        assert!(v4_forms(ip), "{ip} is not forbidden");
    } else {
        let (net, prefix) = V6[which - V4.len()];
        let host = bits.checked_shr(prefix).unwrap_or(0);
        let ip = Ipv6Addr::from_bits(net | host);
        assert!(v6(ip), "{ip} is not forbidden");
    }
}

fn text(text: &str) {
    if let Ok(url) = Url::parse(text) {
        match url.host() {
            Some(Host::Ipv4(ip)) => drop(v4_forms(ip)),
            Some(Host::Ipv6(ip)) => drop(v6(ip)),
            Some(Host::Domain(_)) | None => {}
        }
    }
    // What `UrlPolicy::parse_allow_list` does, an entry at a time, skipping `file://`.
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = Url::parse(entry);
        if parsed.as_ref().is_ok_and(|u| u.scheme() == "file") {
            continue;
        }
        let mut policy = UrlPolicy::default();
        if policy.allow_origin(entry).is_err() {
            continue;
        }
        let url = parsed.expect("an accepted entry parses");
        match url.scheme() {
            "http" | "https" => assert!(
                url.host().is_some()
                    && url.path() == "/"
                    && url.query().is_none()
                    && url.fragment().is_none(),
                "{entry:?} accepted as an origin"
            ),
            "s3" => assert!(
                url.host().is_some() && matches!(url.path(), "" | "/"),
                "{entry:?} accepted as a bucket"
            ),
            other => panic!("{entry:?} accepted with scheme {other}"),
        }
    }
}
