//! Which URLs the fetcher may touch, decided before any byte leaves the host.
//!
//! A URL is admitted when its scheme is http or https and no address its host stands for
//! is in the table of special-purpose blocks ([`crate::addresses`]), or when its origin is
//! one the policy allows explicitly. `file://` is admitted only for a path that, with
//! every symlink resolved, stays under an allowed directory and is a regular file.
//!
//! The cache keeps two policies: the operator's, which judges every fetch, and the
//! places the driver is trusted to send the executor to, added to it only for fetches
//! the driver handed out ([`crate::Trust`]).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use url::{Host, Url};

pub use crate::addresses::{AddressBlock, AddressClass};

/// Why a URL was refused; the message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the URL does not parse: {0}")]
    Malformed(#[from] url::ParseError),
    #[error(
        "scheme `{0}` is not allowed (only http, https, file under an allowed directory, and s3 buckets the operator allows)"
    )]
    Scheme(String),
    #[error("the URL has no host")]
    NoHost,
    #[error("a file URL must name a local path, with no host")]
    FileHost,
    #[error(
        "{addr} is {article} {class} address ({block}) and the origin is not in the allow list",
        article = class.article()
    )]
    Address {
        addr: IpAddr,
        class: AddressClass,
        block: AddressBlock,
    },
    #[error("{} is not under a directory allowed for file URLs", .0.display())]
    OutsideAllowedDirs(PathBuf),
    #[error("the server redirected to `{0}` and redirects are never followed")]
    Redirect(String),
}

/// An entry of an allow list that is not an origin or an existing directory.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("allow-list entry `{entry}` does not parse: {source}")]
    Malformed {
        entry: String,
        #[source]
        source: url::ParseError,
    },
    #[error("allow-list entry `{0}` must be an origin (scheme://host[:port]) with no path")]
    NotAnOrigin(String),
    #[error("allow-list entry `{0}` must use http, https or file")]
    Scheme(String),
    #[error("allow-list entry `{0}` must use http or https")]
    HttpOnly(String),
    #[error("allow-list entry `{0}` must not carry a user name or password")]
    Userinfo(String),
    #[error("allow-list entry `{0}` may use `*` only as the whole first label of its host")]
    Wildcard(String),
    #[error("allow-list entry `{entry}` is not a usable directory: {source}")]
    Dir {
        entry: String,
        #[source]
        source: std::io::Error,
    },
    #[error("trusted entry `{0}` must be an http(s) origin or an s3://bucket")]
    NotTrustable(String),
    #[error("a bearer token for `{0}` needs that origin trusted first (trust_origin)")]
    BearerUntrusted(String),
}

/// What is wrong with a `file://` source that was admitted by the allow list but cannot
/// be read; the job named it, so it is the job's to fix.
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    #[error("not a regular file (a FIFO, device or directory is never read)")]
    NotRegular,
    #[error("cannot be read: {0}")]
    Unreadable(#[source] std::io::Error),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

/// An http(s) origin alone (`scheme://host[:port]`): fetch's and egress's shared checks.
pub(crate) fn origin_url(entry: &str) -> Result<Url, PolicyError> {
    let url = Url::parse(entry).map_err(|source| PolicyError::Malformed {
        entry: entry.to_owned(),
        source,
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(PolicyError::Scheme(entry.to_owned()));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(PolicyError::NotAnOrigin(entry.to_owned()));
    }
    Ok(url)
}

impl Origin {
    /// An http(s) origin written alone: `scheme://host[:port]`, no path.
    pub(crate) fn parse(entry: &str) -> Result<Origin, PolicyError> {
        Origin::of(&origin_url(entry)?).ok_or_else(|| PolicyError::NotAnOrigin(entry.to_owned()))
    }

    pub(crate) fn of(url: &Url) -> Option<Origin> {
        Some(Origin {
            scheme: url.scheme().to_owned(),
            host: url.host_str()?.to_owned(),
            port: url.port_or_known_default(),
        })
    }
}

/// The URL policy; `UrlPolicy::default()` is the strict one: public http(s) only.
#[derive(Debug, Clone, Default)]
pub struct UrlPolicy {
    origins: Vec<Origin>,
    /// Canonical, so a prefix test on a canonical path is a containment test.
    dirs: Vec<PathBuf>,
    /// `s3://bucket` entries: buckets that may be read, through the object store the
    /// operator configured (its endpoint and credentials come from the environment).
    buckets: Vec<String>,
}

/// Where an admitted URL may be read from.
#[derive(Debug)]
pub(crate) enum Target {
    /// `addrs` are the checked addresses of a named host; empty for an IP literal, which
    /// needs no resolving.
    Http {
        url: Url,
        domain: Option<String>,
        addrs: Vec<SocketAddr>,
    },
    File(PathBuf),
    /// An object in an allowed bucket.
    ObjectStore(Url),
}

/// Why a URL could not be admitted.
#[derive(Debug)]
pub(crate) enum AdmitError {
    Refused(Refusal),
    Resolve(std::io::Error),
    File(FileProblem),
}

impl UrlPolicy {
    /// Parses a comma-separated allow list, the form of `--fetch-allow`:
    /// `http://127.0.0.1:8000,file:///srv/data`. Blank entries are ignored.
    pub fn parse_allow_list(list: &str) -> Result<UrlPolicy, PolicyError> {
        let mut policy = UrlPolicy::default();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            policy.allow_origin(entry)?;
        }
        Ok(policy)
    }

    /// Allows an origin (`http://127.0.0.1:7070`) whatever its addresses are, or, for a
    /// `file:///dir` entry, every file under that existing directory.
    pub fn allow_origin(&mut self, entry: &str) -> Result<(), PolicyError> {
        let url = Url::parse(entry).map_err(|source| PolicyError::Malformed {
            entry: entry.to_owned(),
            source,
        })?;
        match url.scheme() {
            "file" => {
                let dir = url
                    .to_file_path()
                    .map_err(|()| PolicyError::NotAnOrigin(entry.to_owned()))?;
                let canonical = dir.canonicalize().map_err(|source| PolicyError::Dir {
                    entry: entry.to_owned(),
                    source,
                })?;
                if !canonical.is_dir() {
                    return Err(PolicyError::Dir {
                        entry: entry.to_owned(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::NotADirectory,
                            "not a directory",
                        ),
                    });
                }
                self.dirs.push(canonical);
            }
            // A path would suggest a narrower grant than the origin this really is.
            "http" | "https" => self.origins.push(Origin::parse(entry)?),
            "s3" => {
                let bucket = url
                    .host_str()
                    .filter(|_| url.path().is_empty() || url.path() == "/")
                    .ok_or_else(|| PolicyError::NotAnOrigin(entry.to_owned()))?;
                self.buckets.push(bucket.to_owned());
            }
            _ => return Err(PolicyError::Scheme(entry.to_owned())),
        }
        Ok(())
    }

    /// This policy with everything `other` allows allowed too.
    pub(crate) fn with(&self, other: &UrlPolicy) -> UrlPolicy {
        let mut both = self.clone();
        both.origins.extend(other.origins.iter().cloned());
        both.dirs.extend(other.dirs.iter().cloned());
        both.buckets.extend(other.buckets.iter().cloned());
        both
    }

    pub(crate) fn allows_origin(&self, origin: &Origin) -> bool {
        self.origins.contains(origin)
    }

    /// Checks `url` and resolves its host, refusing it if any address it stands for is
    /// forbidden; the caller must then connect only to the returned addresses.
    pub(crate) async fn admit(&self, url: &str) -> Result<Target, AdmitError> {
        let refused = |r| AdmitError::Refused(r);
        let url = Url::parse(url).map_err(|e| refused(Refusal::Malformed(e)))?;
        match url.scheme() {
            "http" | "https" => {}
            "file" => return self.admit_file(&url).map(Target::File),
            "s3" if url
                .host_str()
                .is_some_and(|b| self.buckets.iter().any(|a| a == b)) =>
            {
                return Ok(Target::ObjectStore(url));
            }
            other => return Err(refused(Refusal::Scheme(other.to_owned()))),
        }
        let allowed = Origin::of(&url).is_some_and(|o| self.origins.contains(&o));
        let port = url.port_or_known_default().unwrap_or(80);
        let check = |ip: IpAddr| match crate::addresses::forbidden(ip) {
            Some((class, block)) if !allowed => Err(refused(Refusal::Address {
                addr: ip,
                class,
                block,
            })),
            _ => Ok(()),
        };
        match url.host() {
            None => Err(refused(Refusal::NoHost)),
            Some(Host::Ipv4(ip)) => check(IpAddr::V4(ip)).map(|()| Target::Http {
                url,
                domain: None,
                addrs: Vec::new(),
            }),
            Some(Host::Ipv6(ip)) => check(IpAddr::V6(ip)).map(|()| Target::Http {
                url,
                domain: None,
                addrs: Vec::new(),
            }),
            Some(Host::Domain(domain)) => {
                let domain = domain.to_owned();
                let addrs: Vec<SocketAddr> = tokio::net::lookup_host((domain.as_str(), port))
                    .await
                    .map_err(AdmitError::Resolve)?
                    .collect();
                for addr in &addrs {
                    check(addr.ip())?;
                }
                if addrs.is_empty() {
                    return Err(AdmitError::Resolve(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "the host name has no addresses",
                    )));
                }
                Ok(Target::Http {
                    url,
                    domain: Some(domain),
                    addrs,
                })
            }
        }
    }

    fn admit_file(&self, url: &Url) -> Result<PathBuf, AdmitError> {
        if self.dirs.is_empty() {
            return Err(AdmitError::Refused(Refusal::Scheme("file".into())));
        }
        let path = url
            .to_file_path()
            .map_err(|()| AdmitError::Refused(Refusal::FileHost))?;
        // The lexical test first, so a path outside every allowed directory is refused
        // without telling the caller whether it exists.
        if !self.under_allowed_dir(&path) {
            return Err(AdmitError::Refused(Refusal::OutsideAllowedDirs(path)));
        }
        // The canonical path is the host's business: errors name the URL, never it.
        let canonical = path
            .canonicalize()
            .map_err(|e| AdmitError::File(FileProblem::Unreadable(e)))?;
        if !self.under_allowed_dir(&canonical) {
            return Err(AdmitError::Refused(Refusal::OutsideAllowedDirs(path)));
        }
        // A FIFO or device would block the read, or never end, rather than fail.
        if !canonical.is_file() {
            return Err(AdmitError::File(FileProblem::NotRegular));
        }
        Ok(canonical)
    }

    fn under_allowed_dir(&self, path: &Path) -> bool {
        // `Path::starts_with` compares whole components, so `/srv/data2` is not under
        // `/srv/data`, and a parsed file URL has no `..` left in it.
        self.dirs.iter().any(|dir| path.starts_with(dir))
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use futures_util::FutureExt;
    use proptest::prelude::*;

    use super::*;

    fn admit_now(policy: &UrlPolicy, url: &str) -> Result<Target, AdmitError> {
        policy
            .admit(url)
            .now_or_never()
            .expect("an IP literal is judged without resolving or connecting")
    }

    #[test]
    fn literal_special_purpose_addresses_are_refused_by_admit() {
        let policy = UrlPolicy::default();
        let cases = [
            ("http://[::127.0.0.1]/", AddressClass::Ipv4Compatible),
            ("http://198.18.0.1/", AddressClass::Benchmarking),
            ("http://[fec0::1]/", AddressClass::SiteLocal),
            ("http://[64:ff9b:1::1]/", AddressClass::Nat64Local),
            ("http://240.0.0.1/", AddressClass::Reserved),
            ("http://[64:ff9b::7f00:1]:8080/", AddressClass::Loopback),
            ("http://[::ffff:192.168.0.1]/", AddressClass::Private),
            ("http://[2001:db8::1]/", AddressClass::Documentation),
            ("http://[2002:a00:1::1]/", AddressClass::SixToFour),
            ("https://192.0.0.170/", AddressClass::ProtocolAssignment),
        ];
        for (url, expected) in cases {
            match admit_now(&policy, url) {
                Err(AdmitError::Refused(refusal @ Refusal::Address { class, .. })) => {
                    assert_eq!(class, expected, "{url}");
                    assert!(refusal.to_string().contains(&expected.to_string()));
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        let refusal = match admit_now(&policy, "http://[::ffff:127.0.0.1]/") {
            Err(AdmitError::Refused(r)) => r.to_string(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            refusal,
            "::ffff:127.0.0.1 is a loopback address (127.0.0.0/8, Loopback) \
             and the origin is not in the allow list"
        );
        for url in [
            "http://93.184.216.34/",
            "https://[2606:4700::1111]/",
            "http://[64:ff9b::808:808]/",
        ] {
            assert!(
                matches!(admit_now(&policy, url), Ok(Target::Http { .. })),
                "{url}"
            );
        }
    }

    /// Whether any row holds `ip`, after reading the IPv4 out of the two forms judged by
    /// it: written apart from the lookup (leading bits in common, any row rather than the
    /// longest), so the property does not restate the code it checks.
    fn in_a_forbidden_row(ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => match v6.segments() {
                [0, 0, 0, 0, 0, 0xffff, ..] | [0x64, 0xff9b, 0, 0, 0, 0, ..] => {
                    IpAddr::V4(Ipv4Addr::from_bits(v6.to_bits() as u32))
                }
                _ => ip,
            },
            IpAddr::V4(_) => ip,
        };
        crate::addresses::table_blocks().any(|block| match (block.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                (net.to_bits() ^ ip.to_bits()).leading_zeros() >= u32::from(block.prefix_len)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                (net.to_bits() ^ ip.to_bits()).leading_zeros() >= u32::from(block.prefix_len)
            }
            _ => false,
        })
    }

    /// Addresses anywhere, and (since random bits would almost never land in a /32) in,
    /// just before and just after each row, and IPv4 addresses in every IPv6 form that
    /// carries one.
    fn arb_ip() -> impl Strategy<Value = IpAddr> {
        let blocks: Vec<AddressBlock> = crate::addresses::table_blocks().collect();
        prop_oneof![
            any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from_bits(b))),
            any::<u128>().prop_map(|b| IpAddr::V6(Ipv6Addr::from_bits(b))),
            (prop::sample::select(blocks), any::<u128>(), -1i128..=1).prop_map(
                |(block, bits, edge)| {
                    let (width, net) = match block.network {
                        IpAddr::V4(ip) => (32, u128::from(ip.to_bits())),
                        IpAddr::V6(ip) => (128, ip.to_bits()),
                    };
                    let host_bits = u32::from(width - block.prefix_len);
                    let host_mask = 1u128.checked_shl(host_bits).map_or(u128::MAX, |b| b - 1);
                    let address = match edge {
                        -1 => net.wrapping_sub(1),
                        0 => net | (bits & host_mask),
                        _ => (net | host_mask).wrapping_add(1),
                    };
                    match block.network {
                        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from_bits(address as u32)),
                        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from_bits(address)),
                    }
                }
            ),
            (any::<u32>(), 0..4u8).prop_map(|(v4, form)| {
                let prefix: u128 = match form {
                    0 => 0xffff << 32,
                    1 => 0x64_ff9b << 96,
                    2 => 0,
                    _ => 0x2002 << 112,
                };
                let shift = if form == 3 { 80 } else { 0 };
                IpAddr::V6(Ipv6Addr::from_bits(prefix | (u128::from(v4) << shift)))
            }),
        ]
    }

    proptest! {
        #[test]
        fn an_ip_literal_is_admitted_exactly_when_no_row_forbids_it_or_its_origin_is_allowed(
            ip in arb_ip(),
            port in 1u16..,
            https in any::<bool>(),
        ) {
            let origin = format!(
                "{}://{}",
                if https { "https" } else { "http" },
                SocketAddr::new(ip, port)
            );
            let url = format!("{origin}/input");
            let strict = admit_now(&UrlPolicy::default(), &url);
            match &strict {
                Ok(Target::Http { domain: None, addrs, .. }) => {
                    prop_assert!(addrs.is_empty());
                    prop_assert!(!in_a_forbidden_row(ip), "{url} was admitted");
                }
                Err(AdmitError::Refused(Refusal::Address { addr, .. })) => {
                    prop_assert_eq!(*addr, ip);
                    prop_assert!(in_a_forbidden_row(ip), "{url} was refused");
                }
                other => prop_assert!(false, "{url}: {other:?}"),
            }
            let allowed = UrlPolicy::parse_allow_list(&origin).unwrap();
            prop_assert!(admit_now(&allowed, &url).is_ok(), "{url} with its origin allowed");
            // An allowed origin on another port allows nothing else.
            let neighbour = format!("http://{}", SocketAddr::new(ip, port.wrapping_add(1).max(1)));
            let elsewhere = UrlPolicy::parse_allow_list(&neighbour).unwrap();
            prop_assert_eq!(admit_now(&elsewhere, &url).is_ok(), strict.is_ok());
        }
    }

    #[test]
    fn allow_list_takes_origins_and_directories_and_rejects_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let list = format!(
            " http://127.0.0.1:8000 ,https://example.com/,,file://{}",
            dir.path().display()
        );
        let policy = UrlPolicy::parse_allow_list(&list).unwrap();
        assert_eq!(policy.origins.len(), 2);
        assert_eq!(policy.origins[1].port, Some(443));
        assert_eq!(policy.dirs, vec![dir.path().canonicalize().unwrap()]);

        for bad in [
            "http://127.0.0.1:8000/some/path",
            "ftp://example.com",
            "not a url",
            "file:///does/not/exist/anywhere",
        ] {
            assert!(UrlPolicy::parse_allow_list(bad).is_err(), "{bad}");
        }
    }
}
