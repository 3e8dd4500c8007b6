//! What the driver is to the rest of the cluster: where executors reach its HTTP API,
//! and what admission looks up through it (the [`Catalog`] of uploads, the block
//! store's URLs, the URL timestamps, the jobs).

use std::net::SocketAddr;

use flint_protocol::records::JobRecord;
use flint_protocol::{Digest, InputPart, JobId, TaskInput};

use super::Driver;
use crate::admission::{Catalog, Rejection};
use crate::scheduler::Job;
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

/// Points what the driver serves itself in a stored job (uploaded modules and files,
/// results and blocks it hands out) at `base`, the address it serves at now: a driver
/// restarted on another address (a new port, a new `--advertise-url`) would otherwise
/// send executors to the old one, where nothing answers or, worse, the URL policy
/// refuses it as a job's own URL. Refs a job named are left as they are.
pub(super) fn rebase(job: &mut JobRecord, base: &str) {
    let to_base = |url: &mut String| {
        let authority = url.find("://").map_or(0, |at| at + 3);
        if url.starts_with("http")
            && let Some(at) = url[authority..].find("/v1/")
        {
            *url = format!("{base}{}", &url[authority + at..]);
        }
    };
    if job.def.module.served_by_driver() {
        to_base(&mut job.def.module.url);
    }
    for file in job.def.files.iter_mut().filter(|f| f.served_by_driver()) {
        to_base(&mut file.url);
    }
    for task in &mut job.tasks {
        match &mut task.input {
            TaskInput::Fetch(fetch) if fetch.served_by_driver() => to_base(&mut fetch.url),
            TaskInput::Parts(parts) => {
                for part in parts {
                    if let InputPart::Fetch(fetch) = part
                        && fetch.served_by_driver()
                    {
                        to_base(&mut fetch.url);
                    }
                }
            }
            _ => {}
        }
    }
}

/// This machine's host name, as the kernel has it.
pub(super) fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
}

impl Catalog for Driver {
    /// Named by a job being admitted: used now, so retention keeps it.
    fn module(&self, digest: &Digest) -> Option<ModuleInfo> {
        self.uploads.modules.touch(digest)
    }

    fn file(&self, digest: &Digest) -> Option<ModuleInfo> {
        self.uploads.files.touch(digest)
    }

    fn http_base(&self) -> &str {
        &self.http_base
    }

    fn block_url(&self, id: &str) -> String {
        self.uploads.blocks.fetch_url(id)
    }

    fn url_timestamp(&self, url: &str, given: Option<u64>) -> u64 {
        Driver::url_timestamp(self, url, given)
    }

    fn job<R>(&self, id: &JobId, f: impl FnOnce(&Job) -> R) -> Result<Option<R>, Rejection> {
        Driver::job(self, id, f).map_err(Rejection::from)
    }
}

#[cfg(test)]
mod tests {
    use flint_protocol::FetchRef;

    use super::*;

    #[test]
    fn what_the_driver_serves_moves_to_its_new_address_and_job_urls_stay() {
        let mut job = crate::store::durable::job_record(&crate::scheduler::tests::job("j", 2, 1));
        job.def.module.url = "http://10.0.0.1:7070/v1/modules/sha256:ab".into();
        job.def.module.size = Some(3);
        let served = |url: &str| FetchRef {
            url: url.into(),
            timestamp_ms: FetchRef::DRIVER_MADE,
            digest: None,
        };
        job.tasks[0].input = TaskInput::Parts(vec![
            InputPart::Fetch(served("http://10.0.0.1:7070/v1/blocks/j0/r")),
            InputPart::Fetch(served("s3://bucket/prefix/j0/r")),
        ]);
        // A job's own URL that happens to look like the driver's is the job's.
        job.tasks[1].input = TaskInput::Fetch(Box::new(FetchRef {
            url: "http://10.0.0.1:7070/v1/blocks/j0/r".into(),
            timestamp_ms: 5,
            digest: None,
        }));
        rebase(&mut job, "http://driver.example:8080");
        assert_eq!(
            job.def.module.url,
            "http://driver.example:8080/v1/modules/sha256:ab"
        );
        let TaskInput::Parts(parts) = &job.tasks[0].input else {
            panic!()
        };
        let urls: Vec<&str> = parts
            .iter()
            .map(|p| match p {
                InputPart::Fetch(f) => f.url.as_str(),
                InputPart::Inline(_) => "",
            })
            .collect();
        assert_eq!(
            urls,
            [
                "http://driver.example:8080/v1/blocks/j0/r",
                "s3://bucket/prefix/j0/r"
            ]
        );
        let TaskInput::Fetch(own) = &job.tasks[1].input else {
            panic!()
        };
        assert_eq!(own.url, "http://10.0.0.1:7070/v1/blocks/j0/r");
    }
}
