//! What the driver is to the rest of the cluster: where executors reach its HTTP API,
//! and what admission looks up through it (the [`Catalog`] of uploads, the block
//! store's URLs, the URL timestamps, the jobs).

use std::net::SocketAddr;

use flint_protocol::Digest;

use super::Driver;
use crate::admission::Catalog;
use crate::scheduler::ClusterState;
use crate::store::blobs::ModuleInfo;

/// Where executors reach the HTTP API: the advertised URL if there is one; else the
/// listen address, unless that is a wildcard (0.0.0.0, ::), which means "this host" to
/// a local client only: then this machine's host name, as Spark's driver host defaults
/// to it.
pub(super) fn advertised_base(
    advertise: Option<&str>,
    listen: SocketAddr,
    host_name: impl FnOnce() -> Option<String>,
) -> String {
    if let Some(url) = advertise {
        return url.trim_end_matches('/').to_owned();
    }
    if listen.ip().is_unspecified()
        && let Some(host) = host_name().filter(|h| !h.is_empty())
    {
        return format!("http://{host}:{}", listen.port());
    }
    format!("http://{listen}")
}

/// This machine's host name, as the kernel has it.
pub(super) fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
}

impl Catalog for Driver {
    fn module(&self, digest: &Digest) -> Option<ModuleInfo> {
        self.modules.get(digest)
    }

    fn file(&self, digest: &Digest) -> Option<ModuleInfo> {
        self.files.get(digest)
    }

    fn http_base(&self) -> &str {
        &self.http_base
    }

    fn block_url(&self, id: &str) -> String {
        self.blocks.fetch_url(id)
    }

    fn url_timestamp(&self, url: &str, given: Option<u64>) -> u64 {
        Driver::url_timestamp(self, url, given)
    }

    fn read<R>(&self, f: impl FnOnce(&ClusterState) -> R) -> R {
        Driver::read(self, f)
    }
}
