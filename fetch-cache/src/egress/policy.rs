//! The three layers a request passes (the job's list, the tenant's, the operator's) and
//! the rules on the request itself; pure, so the driver can use the lists at submit and
//! the fuzz target can call it without a network.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use url::{Host, Url};

use super::AllowList;
use crate::addresses::{AddressBlock, AddressClass, forbidden};

/// Headers that belong to a connection rather than to a request (RFC 9110 §7.6.1, and
/// wasmtime-wasi-http's default list): a guest choosing them could steer the pooled
/// connection other tasks share, or smuggle a second request into it.
const CONNECTION_HEADERS: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
];

/// The three layers; a request must pass all three, each only narrows the one above.
#[derive(Clone, Debug)]
pub struct EgressPolicy {
    operator: Arc<AllowList>,
    tenant: Option<AllowList>,
    job: AllowList,
}

/// Which list refused a request; its Display is the list's name where it is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    Job,
    Tenant,
    Operator,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layer::Job => "the job's network.allow",
            Layer::Tenant => "the tenant's egress_allow",
            Layer::Operator => "the operator's --egress-allow",
        })
    }
}

/// The request a refusal is about, as its message begins: `GET http://a.test/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestLine {
    pub method: String,
    pub url: String,
}

impl fmt::Display for RequestLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.url)
    }
}

/// Why a request was refused; Display names the method+URL and the rule (and the flag/field
/// that would allow it: `--egress-allow`, the tenant's `egress_allow`, the job's `network.allow`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressRefusal {
    #[error("{request}: scheme `{scheme}` is not allowed (http and https only)")]
    Scheme {
        request: Box<RequestLine>,
        scheme: String,
    },
    #[error("{request}: the URL has no host")]
    NoHost { request: Box<RequestLine> },
    #[error(
        "{request}: a URL with a user name or password is never sent (credentials go in a header)"
    )]
    Userinfo { request: Box<RequestLine> },
    #[error("{request}: the CONNECT method is never sent (it would open a tunnel)")]
    Connect { request: Box<RequestLine> },
    #[error("{request}: {authority} is not in {layer}")]
    NotListed {
        request: Box<RequestLine>,
        authority: String,
        layer: Layer,
    },
    #[error(
        "{request}: {authority} is not in the operator's --egress-allow (egress is off on this executor)"
    )]
    EgressOff {
        request: Box<RequestLine>,
        authority: String,
    },
    /// An IP literal in a special-purpose range the operator did not list exactly.
    #[error(
        "{request}: {addr} is {article} {class} address ({net}/{len}) and the operator did not list it (--egress-allow)",
        article = class.article(), net = block.network, len = block.prefix_len
    )]
    Address {
        request: Box<RequestLine>,
        addr: IpAddr,
        class: AddressClass,
        block: AddressBlock,
    },
    /// A name whose DNS answer held a special-purpose address the operator did not list
    /// exactly: found at connect, after resolution.
    #[error(
        "{request}: {host} resolves to {addr}, {article} {class} address ({net}/{len}) the operator did not list (--egress-allow)",
        article = class.article(), net = block.network, len = block.prefix_len
    )]
    Resolved {
        request: Box<RequestLine>,
        host: String,
        addr: IpAddr,
        class: AddressClass,
        block: AddressBlock,
    },
    #[error("{request}: the Host header `{value}` is not the URL's authority `{authority}`")]
    HostHeader {
        request: Box<RequestLine>,
        value: String,
        authority: String,
    },
    #[error(
        "{request}: the `{name}` header is never sent: it belongs to the connection, which the executor keeps"
    )]
    ConnectionHeader {
        request: Box<RequestLine>,
        name: String,
    },
}

impl EgressRefusal {
    /// The request refused, which its message begins with.
    pub fn request(&self) -> &RequestLine {
        match self {
            EgressRefusal::Scheme { request, .. }
            | EgressRefusal::NoHost { request }
            | EgressRefusal::Userinfo { request }
            | EgressRefusal::Connect { request }
            | EgressRefusal::NotListed { request, .. }
            | EgressRefusal::EgressOff { request, .. }
            | EgressRefusal::Address { request, .. }
            | EgressRefusal::Resolved { request, .. }
            | EgressRefusal::HostHeader { request, .. }
            | EgressRefusal::ConnectionHeader { request, .. } => request,
        }
    }
}

impl EgressPolicy {
    /// `tenant: None` = the job has no tenant (open cluster): operator and job only.
    pub fn new(
        operator: Arc<AllowList>,
        tenant: Option<AllowList>,
        job: AllowList,
    ) -> EgressPolicy {
        EgressPolicy {
            operator,
            tenant,
            job,
        }
    }

    /// Scheme, userinfo, host, port against job, tenant, operator (in that order: the message
    /// names the first layer that refuses); Host header (if any) must equal the URL's authority;
    /// forbidden headers; an IP-literal host in a special-purpose range (addresses::forbidden)
    /// is refused unless the operator's list names that exact address.
    pub fn judge(
        &self,
        method: &str,
        url: &Url,
        headers: &[(String, String)],
    ) -> Result<(), EgressRefusal> {
        let asked = Asked { method, url };
        asked.check_url()?;
        self.check_layers(&asked)?;
        asked.check_headers(headers)
    }

    /// The IP literals the operator lists: the only special-purpose addresses a request
    /// may reach, whatever name it used.
    pub(crate) fn operator_addresses(&self) -> Vec<IpAddr> {
        let mut addrs: Vec<IpAddr> = self.operator.addresses().collect();
        addrs.sort_unstable();
        addrs.dedup();
        addrs
    }

    fn check_layers(&self, asked: &Asked<'_>) -> Result<(), EgressRefusal> {
        let url = asked.url;
        let layers = [
            (Layer::Job, Some(&self.job)),
            (Layer::Tenant, self.tenant.as_ref()),
            (Layer::Operator, Some(&*self.operator)),
        ];
        for (layer, list) in layers {
            let Some(list) = list.filter(|list| !list.admits(url)) else {
                continue;
            };
            let (request, authority) = (asked.line(), authority(url));
            return Err(match (layer, special_literal(url)) {
                // The operator's list admits an IP literal only by a rule naming that very
                // address, so this is where "only when listed exactly" is enforced. Listed
                // on another port or scheme, the origin is what is missing, not the address.
                (Layer::Operator, Some((addr, class, block)))
                    if !list.addresses().any(|listed| listed == addr) =>
                {
                    EgressRefusal::Address {
                        request,
                        addr,
                        class,
                        block,
                    }
                }
                (Layer::Operator, _) if list.is_empty() => {
                    EgressRefusal::EgressOff { request, authority }
                }
                _ => EgressRefusal::NotListed {
                    request,
                    authority,
                    layer,
                },
            });
        }
        Ok(())
    }
}

/// The request being judged; its [`RequestLine`] is only built for a refusal.
struct Asked<'a> {
    method: &'a str,
    url: &'a Url,
}

impl Asked<'_> {
    fn line(&self) -> Box<RequestLine> {
        Box::new(RequestLine {
            method: self.method.to_owned(),
            url: self.url.as_str().to_owned(),
        })
    }

    fn check_url(&self) -> Result<(), EgressRefusal> {
        let url = self.url;
        if !matches!(url.scheme(), "http" | "https") {
            let scheme = url.scheme().to_owned();
            return Err(EgressRefusal::Scheme {
                request: self.line(),
                scheme,
            });
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(EgressRefusal::Userinfo {
                request: self.line(),
            });
        }
        if url.host().is_none() {
            return Err(EgressRefusal::NoHost {
                request: self.line(),
            });
        }
        // Methods are case-sensitive: only this spelling is the one that opens a tunnel.
        if self.method == "CONNECT" {
            return Err(EgressRefusal::Connect {
                request: self.line(),
            });
        }
        Ok(())
    }

    fn check_headers(&self, headers: &[(String, String)]) -> Result<(), EgressRefusal> {
        for (name, value) in headers {
            if name.eq_ignore_ascii_case("host") {
                if !is_authority_of(value, self.url) {
                    return Err(EgressRefusal::HostHeader {
                        request: self.line(),
                        value: value.clone(),
                        authority: authority(self.url),
                    });
                }
            } else if CONNECTION_HEADERS
                .iter()
                .any(|forbidden| name.eq_ignore_ascii_case(forbidden))
            {
                return Err(EgressRefusal::ConnectionHeader {
                    request: self.line(),
                    name: name.clone(),
                });
            }
        }
        Ok(())
    }
}

/// `host[:port]` as the URL writes it: the port only when it is not the scheme's default.
fn authority(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

/// Whether a Host header names the URL's host and port: the port may be left out when
/// it is the scheme's default, and case does not matter in a host name.
fn is_authority_of(value: &str, url: &Url) -> bool {
    let written = authority(url);
    let with_default = url
        .port_or_known_default()
        .filter(|_| url.port().is_none())
        .map(|port| format!("{written}:{port}"));
    value.eq_ignore_ascii_case(&written)
        || with_default.is_some_and(|full| value.eq_ignore_ascii_case(&full))
}

/// The URL's host when it is an IP literal in a special-purpose range.
fn special_literal(url: &Url) -> Option<(IpAddr, AddressClass, AddressBlock)> {
    let ip = match url.host()? {
        Host::Ipv4(v4) => IpAddr::V4(v4),
        Host::Ipv6(v6) => IpAddr::V6(v6),
        Host::Domain(_) => return None,
    };
    forbidden(ip).map(|(class, block)| (ip, class, block))
}
