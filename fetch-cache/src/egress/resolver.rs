//! The DNS resolver of the egress client: every answer is checked against the address
//! table when a connection is about to be made, so a name that was allowed cannot lead
//! to an address that is not, however its answers change between requests (rebinding).
//!
//! hyper asks the resolver for every new connection and connects only to what it
//! returns; IP literals never reach it, and are judged by [`super::EgressPolicy::judge`].

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::addresses::{AddressBlock, AddressClass, forbidden};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where the answers come from: the system's resolver, or a test's script of answers.
pub(crate) trait Lookup: Send + Sync + 'static {
    fn lookup(&self, host: &str) -> BoxFuture<'static, io::Result<Vec<IpAddr>>>;
}

/// The system's resolver (getaddrinfo, through tokio's blocking pool).
pub(crate) struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, host: &str) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        let host = host.to_owned();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addrs.map(|addr| addr.ip()).collect())
        })
    }
}

/// An answer held an address the operator did not list: the error the resolver fails
/// with, found again in reqwest's error by walking its sources.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{host} resolves to {addr}, {article} {class} address ({net}/{len}) the operator did not list",
    article = class.article(), net = block.network, len = block.prefix_len
)]
pub(crate) struct ForbiddenAnswer {
    pub(crate) host: String,
    pub(crate) addr: IpAddr,
    pub(crate) class: AddressClass,
    pub(crate) block: AddressBlock,
}

pub(crate) struct GuardedResolver {
    lookup: Arc<dyn Lookup>,
    /// The operator's IP literals: the special-purpose addresses an answer may hold.
    exact: Arc<[IpAddr]>,
}

impl GuardedResolver {
    pub(crate) fn new(lookup: Arc<dyn Lookup>, exact: Arc<[IpAddr]>) -> GuardedResolver {
        GuardedResolver { lookup, exact }
    }

    /// Refuses the whole answer if any address in it is forbidden and not listed, as
    /// fetches do: which address a connection tries first is not ours to choose.
    pub(crate) fn check(&self, host: &str, answer: &[IpAddr]) -> Result<(), ForbiddenAnswer> {
        for &addr in answer {
            if self.exact.contains(&addr) {
                continue;
            }
            if let Some((class, block)) = forbidden(addr) {
                return Err(ForbiddenAnswer {
                    host: host.to_owned(),
                    addr,
                    class,
                    block,
                });
            }
        }
        Ok(())
    }

    /// Not an `io::Error` for a refusal: its `source()` skips what it wraps, and the
    /// client finds the refusal by walking sources.
    pub(crate) async fn resolve_checked(&self, host: &str) -> Result<Vec<IpAddr>, BoxError> {
        let answer = self.lookup.lookup(host).await?;
        self.check(host, &answer)?;
        if answer.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{host} has no addresses"),
            )
            .into());
        }
        Ok(answer)
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let resolver = GuardedResolver {
            lookup: self.lookup.clone(),
            exact: self.exact.clone(),
        };
        Box::pin(async move {
            let answer = resolver.resolve_checked(name.as_str()).await?;
            // Port 0: the connector puts in the URL's port, or the scheme's default.
            let addrs: Addrs = Box::new(answer.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}
