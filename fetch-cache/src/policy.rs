//! Which URLs the fetcher may touch, decided before any byte leaves the host.
//!
//! A URL is admitted when its scheme is http or https and every address its host stands
//! for is public, or when its origin is one the operator (or the caller, for the driver's
//! own URL) allowed explicitly. `file://` is admitted only for a path that, with every
//! symlink resolved, stays under a directory the operator allowed.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use url::{Host, Url};

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
    #[error("{addr} is a {class} address and the origin is not in the allow list")]
    Address { addr: IpAddr, class: AddressClass },
    #[error("{} is not under a directory allowed for file URLs", .0.display())]
    OutsideAllowedDirs(PathBuf),
    #[error("the server redirected to `{0}` and redirects are never followed")]
    Redirect(String),
}

/// The kinds of address that stay unreachable unless their origin is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    Loopback,
    LinkLocal,
    Private,
    Unspecified,
    Multicast,
    Broadcast,
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressClass::Loopback => "loopback",
            AddressClass::LinkLocal => "link-local",
            AddressClass::Private => "private",
            AddressClass::Unspecified => "unspecified",
            AddressClass::Multicast => "multicast",
            AddressClass::Broadcast => "broadcast",
        })
    }
}

/// The class that forbids `ip`, or `None` for a public address. IPv4-mapped IPv6
/// addresses, and NAT64 ones (64:ff9b::/96), are judged as the IPv4 address they carry,
/// since that is where they go.
pub fn forbidden_class(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped().or_else(|| nat64(v6)) {
            Some(v4) => forbidden_v4(v4),
            None => forbidden_v6(v6),
        },
    }
}

fn nat64(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let [a, b, 0, 0, 0, 0, hi, lo] = ip.segments() else {
        return None;
    };
    ((a, b) == (0x64, 0xff9b)).then(|| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)))
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    if ip.is_loopback() {
        Some(AddressClass::Loopback)
    } else if ip.is_link_local() {
        Some(AddressClass::LinkLocal)
    } else if ip.is_private() || (ip.octets()[0] == 100 && ip.octets()[1] & 0xc0 == 64) {
        // 100.64.0.0/10 is shared (carrier-grade NAT) space, and where some clouds put
        // their metadata service (100.100.100.200).
        Some(AddressClass::Private)
    } else if ip.octets()[0] == 0 {
        // 0.0.0.0/8 means "this host" to most stacks, so it reaches loopback services.
        Some(AddressClass::Unspecified)
    } else if ip.is_multicast() {
        Some(AddressClass::Multicast)
    } else if ip.is_broadcast() {
        Some(AddressClass::Broadcast)
    } else {
        None
    }
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some(AddressClass::Loopback)
    } else if ip.is_unspecified() {
        Some(AddressClass::Unspecified)
    } else if first & 0xffc0 == 0xfe80 {
        Some(AddressClass::LinkLocal)
    } else if first & 0xfe00 == 0xfc00 {
        Some(AddressClass::Private)
    } else if ip.is_multicast() {
        Some(AddressClass::Multicast)
    } else {
        None
    }
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
    #[error("allow-list entry `{entry}` is not a usable directory: {source}")]
    Dir {
        entry: String,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

impl Origin {
    /// An http(s) origin written alone: `scheme://host[:port]`, no path.
    pub(crate) fn parse(entry: &str) -> Result<Origin, PolicyError> {
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
        Origin::of(&url).ok_or_else(|| PolicyError::NotAnOrigin(entry.to_owned()))
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
    Io(PathBuf, std::io::Error),
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
        let check = |ip: IpAddr| match forbidden_class(ip) {
            Some(class) if !allowed => Err(refused(Refusal::Address { addr: ip, class })),
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
        let canonical = path
            .canonicalize()
            .map_err(|e| AdmitError::Io(path.clone(), e))?;
        if !self.under_allowed_dir(&canonical) {
            return Err(AdmitError::Refused(Refusal::OutsideAllowedDirs(path)));
        }
        // A FIFO or device would block the read, or never end, rather than fail.
        if !canonical.is_file() {
            return Err(AdmitError::Io(
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"),
            ));
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
    use super::*;

    #[test]
    fn classifies_forbidden_addresses_including_mapped_forms() {
        let cases = [
            ("127.0.0.1", Some(AddressClass::Loopback)),
            ("127.255.0.9", Some(AddressClass::Loopback)),
            ("169.254.169.254", Some(AddressClass::LinkLocal)),
            ("10.1.2.3", Some(AddressClass::Private)),
            ("172.16.0.1", Some(AddressClass::Private)),
            ("172.32.0.1", None),
            ("100.100.100.200", Some(AddressClass::Private)),
            ("100.128.0.1", None),
            ("192.168.1.1", Some(AddressClass::Private)),
            ("0.0.0.0", Some(AddressClass::Unspecified)),
            ("224.0.0.1", Some(AddressClass::Multicast)),
            ("255.255.255.255", Some(AddressClass::Broadcast)),
            ("93.184.216.34", None),
            ("::1", Some(AddressClass::Loopback)),
            ("::", Some(AddressClass::Unspecified)),
            ("fe80::1", Some(AddressClass::LinkLocal)),
            ("febf::1", Some(AddressClass::LinkLocal)),
            ("fc00::1", Some(AddressClass::Private)),
            ("fdff::1", Some(AddressClass::Private)),
            ("ff02::1", Some(AddressClass::Multicast)),
            ("::ffff:127.0.0.1", Some(AddressClass::Loopback)),
            ("::ffff:169.254.169.254", Some(AddressClass::LinkLocal)),
            ("::ffff:10.0.0.1", Some(AddressClass::Private)),
            ("64:ff9b::a9fe:a9fe", Some(AddressClass::LinkLocal)),
            ("64:ff9b::808:808", None),
            ("2606:4700::1111", None),
        ];
        for (ip, class) in cases {
            assert_eq!(forbidden_class(ip.parse().unwrap()), class, "{ip}");
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
