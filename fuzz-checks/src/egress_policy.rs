//! Egress's allow lists and request policy (`flint_fetch_cache::egress`), on lists,
//! URLs and headers built from the input. Judging is pure (no DNS, no sockets), so every
//! input is judged whole.
//!
//! The first byte picks the input's shape: text (a request and three lists, one field
//! a line), an IP literal spelt one of several ways, or a URL and a Host header under a
//! policy that lists the URL's own origin. Properties:
//! - nothing panics; every list error names its entry, every refusal formats and begins
//!   with the method and the URL it judged;
//! - narrowing: what the policy admits, every layer admits, and a refusal naming a layer
//!   names the first that does not admit;
//! - `outside` agrees with `admits`: what an entry `outside` leaves out admits, its
//!   ceiling admits; an entry it names admits something its ceiling does not;
//! - a special-purpose IP literal is admitted only when the operator's list names that
//!   exact address (as `url` parses both: `0x7f.1` is 127.0.0.1, `[::ffff:127.0.0.1]`
//!   is not);
//! - a Host header that is not the URL's authority is always refused;
//! - the verdict on a URL is the verdict on its serialization (what is sent is what was
//!   judged).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use flint_fetch_cache::addresses::forbidden;
use flint_fetch_cache::egress::{AllowList, EgressPolicy, EgressRefusal, Layer};
use url::{Host, Url};

/// Entries per list taken from an input: `outside` is quadratic in them.
const MAX_ENTRIES: usize = 16;

/// One input, as the cargo-fuzz target and the corpus replay
/// (tests/e2e/fuzz_corpora.rs) give it: panics where a property fails.
pub fn check_input(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 3 {
        0 => request(&String::from_utf8_lossy(rest)),
        1 => literal(selector / 3, rest),
        _ => {
            let text = String::from_utf8_lossy(rest);
            let (u, host) = text.split_once('\n').unwrap_or((&text, ""));
            host_header(u, host);
        }
    }
}

/// A list as the fuzzer wrote it, its errors checked; `None` when an entry is refused.
fn parse_list(field: &str) -> Option<(Vec<String>, AllowList)> {
    let entries: Vec<String> = field
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .take(MAX_ENTRIES)
        .map(str::to_owned)
        .collect();
    match AllowList::parse(&entries) {
        Ok(list) => Some((entries, list)),
        Err(e) => {
            let message = e.to_string();
            assert!(
                entries.iter().any(|entry| message.contains(entry.as_str())),
                "{message:?} names no entry of {entries:?}"
            );
            None
        }
    }
}

/// Lines: method, URL, Host header (empty for none), operator, tenant (`-` for none), job.
fn request(text: &str) {
    let mut fields = text.split('\n');
    let mut field = || fields.next().unwrap_or("");
    let method = match field() {
        "" => "GET",
        m => m,
    };
    let (u, host, operator, tenant, job) = (field(), field(), field(), field(), field());
    let Ok(url) = Url::parse(u) else { return };
    let (Some((op_entries, operator)), Some((_, job))) = (parse_list(operator), parse_list(job))
    else {
        return;
    };
    let tenant = match tenant {
        "-" => None,
        t => match parse_list(t) {
            Some((_, list)) => Some(list),
            None => return,
        },
    };
    let headers: Vec<(String, String)> = (!host.is_empty())
        .then(|| ("Host".to_owned(), host.to_owned()))
        .into_iter()
        .collect();
    let policy = EgressPolicy::new(Arc::new(operator.clone()), tenant.clone(), job.clone());
    let verdict = policy.judge(method, &url, &headers);
    let layers = [
        (Layer::Job, Some(&job)),
        (Layer::Tenant, tenant.as_ref()),
        (Layer::Operator, Some(&operator)),
    ];
    match &verdict {
        Ok(()) => admitted(&url, &layers, &op_entries),
        Err(refusal) => refused(method, &url, refusal, &layers),
    }
    if let Ok(again) = Url::parse(url.as_str()) {
        let second = policy.judge(method, &again, &headers);
        assert_eq!(second.is_ok(), verdict.is_ok(), "{url} judged twice");
    }
    if let Some(tenant) = &tenant {
        ceilings(&job, tenant, &url);
        ceilings(tenant, &operator, &url);
    }
    ceilings(&job, &operator, &url);
    if !host.is_empty() {
        host_header(u, host);
    }
}

fn admitted(url: &Url, layers: &[(Layer, Option<&AllowList>)], operator: &[String]) {
    for (layer, list) in layers {
        assert!(
            list.is_none_or(|l| l.admits(url)),
            "{url} admitted, not by {layer}"
        );
    }
    let Some(ip) = ip_of(url) else { return };
    if forbidden(ip).is_some() {
        // Read from the entries as written, apart from the list's own rules.
        let listed = operator
            .iter()
            .filter_map(|entry| Url::parse(entry).ok())
            .any(|entry| ip_of(&entry) == Some(ip));
        assert!(listed, "{url}: {ip} admitted, not listed in {operator:?}");
    }
}

fn refused(
    method: &str,
    url: &Url,
    refusal: &EgressRefusal,
    layers: &[(Layer, Option<&AllowList>)],
) {
    let message = refusal.to_string();
    assert!(
        message.starts_with(&format!("{method} {url}: ")),
        "{message:?} does not begin with the request"
    );
    assert_eq!(refusal.request().url, url.as_str());
    let first = layers
        .iter()
        .find(|(_, list)| list.is_some_and(|l| !l.admits(url)))
        .map(|(layer, _)| *layer);
    match refusal {
        EgressRefusal::NotListed { layer, .. } => assert_eq!(first, Some(*layer), "{message}"),
        EgressRefusal::Address { .. } | EgressRefusal::EgressOff { .. } => {
            assert_eq!(first, Some(Layer::Operator), "{message}");
        }
        _ => {}
    }
}

fn ip_of(url: &Url) -> Option<IpAddr> {
    match url.host()? {
        Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        Host::Domain(_) => None,
    }
}

/// `outside` against `admits`, entry by entry of `narrow`, on the input's URL and on
/// URLs the entry itself names (random URLs seldom land under a wildcard).
fn ceilings(narrow: &AllowList, ceiling: &AllowList, url: &Url) {
    // An empty ceiling covers nothing: `outside` it is every entry, as written.
    for entry in narrow.outside(&AllowList::default()) {
        let single = AllowList::parse(&[entry.as_str()]).expect("an entry of a parsed list parses");
        let probes = probes(&entry);
        if single.outside(ceiling).is_empty() {
            for probe in probes.iter().chain([url]) {
                assert!(
                    !single.admits(probe) || ceiling.admits(probe),
                    "{entry} is covered, yet {probe} is not admitted by its ceiling"
                );
            }
        } else {
            assert!(
                probes
                    .iter()
                    .any(|p| single.admits(p) && !ceiling.admits(p)),
                "{entry} is outside its ceiling, yet the ceiling admits all of {probes:?}"
            );
        }
    }
}

/// URLs an entry admits: its origin, or for a wildcard, names below it with first
/// labels no ceiling of at most [`MAX_ENTRIES`] entries can all name.
fn probes(entry: &str) -> Vec<Url> {
    let url = Url::parse(entry).expect("an accepted entry parses");
    let host = url.host_str().unwrap_or_default().to_owned();
    let Some(suffix) = host.strip_prefix("*.") else {
        return vec![url];
    };
    (0..=MAX_ENTRIES)
        .filter_map(|n| {
            let mut probe = url.clone();
            probe.set_host(Some(&format!("z{n}.{suffix}"))).ok()?;
            Some(probe)
        })
        .collect()
}

/// An address in one of four spellings, listed by the operator or not.
fn literal(choice: u8, rest: &[u8]) {
    let mut bytes = [0u8; 16];
    let n = rest.len().min(16);
    bytes[..n].copy_from_slice(&rest[..n]);
    let v4 = Ipv4Addr::from(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
    let (ip, host) = match choice % 5 {
        0 => (IpAddr::V4(v4), v4.to_string()),
        1 => (IpAddr::V4(v4), v4.to_bits().to_string()),
        2 => (IpAddr::V4(v4), format!("{:#x}", v4.to_bits())),
        3 => (IpAddr::V6(v4.to_ipv6_mapped()), format!("[::ffff:{v4}]")),
        _ => {
            let v6 = Ipv6Addr::from(bytes);
            (IpAddr::V6(v6), format!("[{v6}]"))
        }
    };
    let listed = (choice / 5).is_multiple_of(2);
    let origin = format!("http://{host}:8080");
    let Ok(url) = Url::parse(&format!("{origin}/x")) else {
        return;
    };
    assert_eq!(ip_of(&url), Some(ip), "{origin} parsed as another address");
    let neighbour = match ip {
        IpAddr::V4(v4) => format!("http://{}:8080", Ipv4Addr::from_bits(v4.to_bits() ^ 1)),
        IpAddr::V6(v6) => format!("http://[{}]:8080", Ipv6Addr::from_bits(v6.to_bits() ^ 1)),
    };
    let operator = if listed { &origin } else { &neighbour };
    let list = |entry: &str| AllowList::parse(&[entry]).expect("a literal origin parses");
    let policy = EgressPolicy::new(Arc::new(list(operator)), Some(list(&origin)), list(&origin));
    let verdict = policy.judge("GET", &url, &[]);
    match (listed, forbidden(ip).is_some(), &verdict) {
        (true, _, Ok(())) => {}
        (false, true, Err(EgressRefusal::Address { addr, .. })) if *addr == ip => {}
        (
            false,
            false,
            Err(EgressRefusal::NotListed {
                layer: Layer::Operator,
                ..
            }),
        ) => {}
        _ => panic!("{url} (listed: {listed}): {verdict:?}"),
    }
    if let Err(refusal) = verdict {
        assert!(refusal.to_string().contains(url.as_str()), "{refusal}");
    }
}

/// Under a policy that lists the URL's own origin (and so its address, if a literal),
/// the Host header alone decides.
fn host_header(u: &str, host: &str) {
    let Ok(url) = Url::parse(u) else { return };
    if !matches!(url.scheme(), "http" | "https")
        || !url.username().is_empty()
        || url.password().is_some()
        || url.host().is_none()
    {
        return;
    }
    let origin = url.origin().ascii_serialization();
    let Ok(list) = AllowList::parse(&[origin.as_str()]) else {
        return;
    };
    let policy = EgressPolicy::new(Arc::new(list.clone()), None, list);
    let headers = [("host".to_owned(), host.to_owned())];
    let authority = origin.split_once("://").map(|(_, a)| a).unwrap_or_default();
    let default_port = url.port_or_known_default().filter(|_| url.port().is_none());
    let matches = host.eq_ignore_ascii_case(authority)
        || default_port.is_some_and(|p| host.eq_ignore_ascii_case(&format!("{authority}:{p}")));
    match (matches, policy.judge("GET", &url, &headers)) {
        (true, Ok(())) | (false, Err(EgressRefusal::HostHeader { .. })) => {}
        (_, verdict) => panic!("{url} with Host {host:?}: {verdict:?}"),
    }
}
