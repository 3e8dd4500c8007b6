//! One allow list (the operator's, a tenant's or a job's): origins, some with a wildcard
//! first label, matched against a request's scheme, host and port.
//!
//! Hosts are compared as `url` writes them (lowercase, punycode, IP literals in their
//! canonical form), so `http://0x7f.1` and `http://127.0.0.1` are one origin, and the
//! string an entry was written as never decides a match.

use std::net::IpAddr;

use url::{Host, Url};

use crate::policy::{PolicyError, origin_url};

/// An operator's, a tenant's or a job's list: origins `scheme://host[:port]`, `*.` only as
/// the first label of a host (`https://*.example.org:8443`), http and https only.
#[derive(Clone, Debug, Default)]
pub struct AllowList {
    rules: Vec<Rule>,
}

#[derive(Clone, Debug)]
struct Rule {
    scheme: String,
    host: HostRule,
    /// Explicit, or the scheme's default: `http://a` and `http://a:80` are one rule.
    port: u16,
    /// As written (trimmed), so that a refusal at submit names what the user wrote.
    entry: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostRule {
    Name(String),
    /// `*.suffix`: every name with one label or more before `.suffix`, not `suffix` itself.
    Under(String),
    /// Only this address: the one way a special-purpose address is ever reached.
    Ip(IpAddr),
}

impl AllowList {
    /// Parses every entry; the first one that is not an http(s) origin fails the whole
    /// list, its error naming it.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, PolicyError> {
        let rules = entries
            .iter()
            .map(|entry| Rule::parse(entry.as_ref().trim()))
            .collect::<Result<_, _>>()?;
        Ok(AllowList { rules })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether an entry names `url`'s scheme, host and port (userinfo, path and query
    /// are [`super::EgressPolicy::judge`]'s business).
    pub fn admits(&self, url: &Url) -> bool {
        let (Some(host), Some(port)) = (url.host(), url.port_or_known_default()) else {
            return false;
        };
        self.rules
            .iter()
            .any(|rule| rule.scheme == url.scheme() && rule.port == port && rule.host.admits(&host))
    }

    /// The entries of `self` that no entry of `ceiling` covers (a 422 names them).
    pub fn outside(&self, ceiling: &AllowList) -> Vec<String> {
        self.rules
            .iter()
            .filter(|rule| !ceiling.rules.iter().any(|wider| rule.covered_by(wider)))
            .map(|rule| rule.entry.clone())
            .collect()
    }

    /// The IP literals the list names as hosts.
    pub(crate) fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.rules.iter().filter_map(|rule| match rule.host {
            HostRule::Ip(ip) => Some(ip),
            HostRule::Name(_) | HostRule::Under(_) => None,
        })
    }
}

impl Rule {
    fn parse(entry: &str) -> Result<Rule, PolicyError> {
        // Fetch's origin checks (a host, no path, query or fragment), with egress's own
        // word for a scheme: fetch's would offer `file`, which egress never takes.
        let url = origin_url(entry).map_err(|e| match e {
            PolicyError::Scheme(entry) => PolicyError::HttpOnly(entry),
            other => other,
        })?;
        // Credentials in an allow list would be sent nowhere, yet read as a grant.
        if !url.username().is_empty() || url.password().is_some() {
            return Err(PolicyError::Userinfo(entry.to_owned()));
        }
        let host = match url.host() {
            Some(Host::Ipv4(ip)) => HostRule::Ip(ip.into()),
            Some(Host::Ipv6(ip)) => HostRule::Ip(ip.into()),
            Some(Host::Domain(name)) => match name.strip_prefix("*.") {
                Some(suffix) if !suffix.is_empty() && !suffix.contains('*') => {
                    HostRule::Under(suffix.to_owned())
                }
                _ if name.contains('*') => return Err(PolicyError::Wildcard(entry.to_owned())),
                _ => HostRule::Name(name.to_owned()),
            },
            None => return Err(PolicyError::NotAnOrigin(entry.to_owned())),
        };
        Ok(Rule {
            scheme: url.scheme().to_owned(),
            host,
            port: url
                .port_or_known_default()
                .expect("http and https have default ports"),
            entry: entry.to_owned(),
        })
    }

    /// Whether every URL this rule admits, `wider` admits too.
    fn covered_by(&self, wider: &Rule) -> bool {
        self.scheme == wider.scheme
            && self.port == wider.port
            && match (&self.host, &wider.host) {
                (HostRule::Name(name), HostRule::Name(other)) => name == other,
                (HostRule::Name(name), HostRule::Under(suffix)) => under(name, suffix),
                (HostRule::Under(narrow), HostRule::Under(suffix)) => {
                    narrow == suffix || under(narrow, suffix)
                }
                (HostRule::Ip(ip), HostRule::Ip(other)) => ip == other,
                _ => false,
            }
    }
}

impl HostRule {
    fn admits(&self, host: &Host<&str>) -> bool {
        match (self, host) {
            (HostRule::Name(name), Host::Domain(domain)) => name == domain,
            (HostRule::Under(suffix), Host::Domain(domain)) => under(domain, suffix),
            (HostRule::Ip(ip), Host::Ipv4(v4)) => *ip == IpAddr::V4(*v4),
            (HostRule::Ip(ip), Host::Ipv6(v6)) => *ip == IpAddr::V6(*v6),
            _ => false,
        }
    }
}

/// Whether `name` is `label(s).suffix`, with at least one non-empty label before the dot.
fn under(name: &str, suffix: &str) -> bool {
    name.strip_suffix(suffix)
        .and_then(|labels| labels.strip_suffix('.'))
        .is_some_and(|labels| !labels.is_empty())
}
