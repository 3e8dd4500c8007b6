//! What a task needs before it can queue for a task thread: its module (fetched, checked
//! against the module rules, compiled or loaded from the compiled-module cache), its input
//! (fetched or assembled from parts) and its job's files. All of it is async I/O on the
//! runtime, kept apart from the task threads' side so that nothing here ever runs a guest;
//! and every failure is classified here, by whose fault it is.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use flint_fetch_cache::{Blame, CacheKey, FetchError, Fetched, Trust};
use flint_protocol::{
    Digest, FailureKind, InputPart, Pins, TaskDescription, TaskFailure, TaskInput, defaults,
};
use tokio::sync::OnceCell;

use super::TaskRunner;

/// What a deterministic attempt runs, by digest: its module's, its job's files' and its
/// whole stdin's (which `launch` has made inline by now). A later attempt must run the
/// bytes the launch pinned (its task's earlier attempt's): other bytes fail it as
/// `fetch_error` naming both digests, before it runs.
pub(super) fn pins(
    desc: &TaskDescription,
    module: Digest,
    files: Option<&JobFiles>,
) -> Result<Box<Pins>, TaskFailure> {
    let input = match &desc.input {
        TaskInput::Inline(bytes) => Digest::of(bytes),
        other => {
            return Err(TaskFailure::new(
                FailureKind::HostError,
                format!("input {other:?} was not fetched before its digest was taken"),
            ));
        }
    };
    let pins = Box::new(Pins {
        module,
        files: files.map(JobFiles::digests).unwrap_or_default(),
        input,
        egress: Vec::new(),
        egress_tape: None,
    });
    if let Some(pinned) = &desc.pins {
        check_pinned(pinned, &pins, desc)?;
    }
    Ok(pins)
}

fn check_pinned(pinned: &Pins, now: &Pins, desc: &TaskDescription) -> Result<(), TaskFailure> {
    let changed = |what: String, was: Digest, is: Digest| {
        Err(TaskFailure::new(
            FailureKind::FetchError,
            format!(
                "{what} is not what the task's earlier attempt ran: {was} was pinned, {is} \
                 was fetched (a deterministic task's attempts all run the same bytes)"
            ),
        ))
    };
    if pinned.module != now.module {
        return changed("the module".into(), pinned.module, now.module);
    }
    let files = desc
        .job
        .files
        .iter()
        .zip(pinned.files.iter().zip(&now.files));
    for (file, (was, is)) in files {
        if was != is {
            return changed(format!("file {:?}", file.name), *was, *is);
        }
    }
    if pinned.files.len() != now.files.len() {
        return Err(TaskFailure::new(
            FailureKind::HostError,
            format!(
                "the launch pinned {} files, the job has {}",
                pinned.files.len(),
                now.files.len()
            ),
        ));
    }
    if pinned.input != now.input {
        return changed("the input".into(), pinned.input, now.input);
    }
    Ok(())
}

/// A job's files, fetched once per executor and hard-linked under one directory that
/// every task of the job gets as `/files`, read-only. Removed when the last task holding
/// it is done and the job has left the cache.
pub(super) struct JobFiles {
    pub(super) dir: std::path::PathBuf,
    /// Keep the cached blobs from eviction while the job may still run here.
    _pins: Vec<Fetched>,
}

impl JobFiles {
    /// The digests of the job's files, in the job's order.
    pub(super) fn digests(&self) -> Vec<Digest> {
        self._pins.iter().map(|f| f.digest).collect()
    }
}

impl Drop for JobFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TaskRunner {
    /// A `results` input as one stdin: the parts in order, fetched a few at a time (each
    /// through the fetch cache, verified by digest), never past
    /// [`defaults::MAX_TASK_INPUT_BYTES`] (the driver checked the sizes it knew; this
    /// holds whatever arrives to it).
    pub(super) async fn assemble(&self, parts: &[InputPart]) -> Result<Vec<u8>, TaskFailure> {
        use futures_util::StreamExt;
        use futures_util::stream::FuturesOrdered;
        /// Fetches in flight for one task: enough to hide round trips to the driver,
        /// few enough not to crowd out other tasks' fetches.
        const PARTS_IN_FLIGHT: usize = 8;
        let max = defaults::MAX_TASK_INPUT_BYTES;
        // The parts' sizes are the job's doing, not this executor's.
        let too_large = || {
            TaskFailure::new(
                FailureKind::FetchError,
                format!("the input's parts come to more than {max} bytes (MAX_TASK_INPUT_BYTES)"),
            )
        };
        // In order, at most PARTS_IN_FLIGHT ahead of the part being copied.
        let mut fetches = FuturesOrdered::new();
        let mut ahead = parts.iter();
        for part in ahead.by_ref().take(PARTS_IN_FLIGHT) {
            fetches.push_back(self.fetch_part(part));
        }
        let mut input = Vec::new();
        for part in parts {
            let blob = fetches.next().await.expect("one fetch per part")?;
            if let Some(next) = ahead.next() {
                fetches.push_back(self.fetch_part(next));
            }
            match (part, blob) {
                (InputPart::Inline(bytes), _) => {
                    if input.len() as u64 + bytes.len() as u64 > max {
                        return Err(too_large());
                    }
                    input.extend_from_slice(bytes);
                }
                (InputPart::Fetch(_), blob) => {
                    let blob = blob.expect("a fetched part");
                    let host = |e: std::io::Error| {
                        TaskFailure::new(
                            FailureKind::HostError,
                            format!("reading the input part {}: {e}", blob.path.display()),
                        )
                    };
                    let mut file = tokio::fs::File::open(&blob.path).await.map_err(host)?;
                    let len = file.metadata().await.map_err(host)?.len();
                    if input.len() as u64 + len > max {
                        return Err(too_large());
                    }
                    input.reserve(len as usize);
                    tokio::io::AsyncReadExt::read_to_end(&mut file, &mut input)
                        .await
                        .map_err(host)?;
                }
            }
        }
        Ok(input)
    }

    async fn fetch_part(&self, part: &InputPart) -> Result<Option<Fetched>, TaskFailure> {
        match part {
            InputPart::Inline(_) => Ok(None),
            InputPart::Fetch(r) => self
                .fetch(
                    &r.url,
                    r.timestamp_ms,
                    r.digest,
                    trust(r.served_by_driver()),
                )
                .await
                .map(Some),
        }
    }

    /// The job's files, ready under one directory (fetched and linked by the first task
    /// of the job to need them; the others wait for that).
    pub(super) async fn job_files(
        &self,
        desc: &TaskDescription,
    ) -> Result<Arc<JobFiles>, TaskFailure> {
        let cell = {
            let mut jobs = self.job_files.lock().expect("job files lock poisoned");
            jobs.get_or_insert(desc.task.job.clone(), || Arc::new(OnceCell::new()))
                .clone()
        };
        cell.get_or_try_init(|| async {
            let dir = self.files_root.join(&desc.task.job.0);
            let host = |what: &str, e: std::io::Error| {
                TaskFailure::new(
                    FailureKind::HostError,
                    format!("{what} {}: {e}", dir.display()),
                )
            };
            // A directory from an earlier run of this executor is stale: start afresh.
            let _ = tokio::fs::remove_dir_all(&dir).await;
            tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|e| host("creating", e))?;
            let mut pins = Vec::with_capacity(desc.job.files.len());
            for file in &desc.job.files {
                let fetched = self
                    .fetch(
                        &file.url,
                        file.timestamp_ms,
                        file.digest,
                        trust(file.served_by_driver()),
                    )
                    .await?;
                // The driver checked the name: one path component, never `.` or `..`.
                let target = dir.join(&file.name);
                // A deterministic job's files get fixed times (below): a copy of their
                // own, so that the cache's blob keeps its own.
                let link = match desc.job.determinism {
                    None => tokio::fs::hard_link(&fetched.path, &target).await,
                    Some(_) => Err(std::io::ErrorKind::Unsupported.into()),
                };
                if link.is_err() {
                    tokio::fs::copy(&fetched.path, &target)
                        .await
                        .map_err(|e| host("copying a file into", e))?;
                }
                pins.push(fetched);
            }
            if desc.job.determinism.is_some() {
                crate::sandbox::fixed_times(&dir, desc.job.files.iter().map(|f| f.name.as_str()))
                    .map_err(|e| host("fixing the times of", e))?;
            }
            Ok(Arc::new(JobFiles { dir, _pins: pins }))
        })
        .await
        .cloned()
    }

    /// A blob the driver referred to, through the fetch cache; it must hash to `digest`.
    /// Only what the driver made itself is fetched as [`Trust::Driver`] (with the cluster
    /// secret): a URL a job named goes through the operator's policy alone, wherever it
    /// points.
    pub(super) async fn fetch(
        &self,
        url: &str,
        timestamp_ms: u64,
        digest: Option<Digest>,
        trust: Trust,
    ) -> Result<Fetched, TaskFailure> {
        let key = CacheKey {
            url: url.to_owned(),
            timestamp_ms,
        };
        let mut link = self.driver_link.clone();
        let mut tries = 0;
        let (fetched, hit) = loop {
            let seen = link.as_ref().map(|l| l.borrow().registrations);
            let e = match self.fetcher.fetch(&key, digest, trust).await {
                Ok(fetched) => break fetched,
                Err(e) => e,
            };
            // A driver restarting is no failure of the task's: the fetch waits for it to
            // be back (the executor gives up on its tasks at its grace anyway) and tries
            // again, a few times at most.
            if let (Some(link), Some(seen)) = (link.as_mut(), seen)
                && trust == Trust::Driver
                && driver_transport_failure(&e)
                && tries < DRIVER_RETRIES
                && driver_came_back(link, seen).await
            {
                tries += 1;
                tracing::info!(url, "the driver is back; fetching again");
                continue;
            }
            // The source's fault fails the task on the job's budget; only the executor's
            // own (its cache's disk) may count against this executor.
            let kind = match (e.blame(), trust) {
                (Blame::Executor, _) => FailureKind::HostError,
                // What the driver handed out is there to be had: not reaching it, or
                // being refused it, is this executor's network or credentials.
                (Blame::Source, Trust::Driver) if driver_unreachable(&e) => FailureKind::HostError,
                (Blame::Source, _) => FailureKind::FetchError,
            };
            return Err(TaskFailure::new(kind, with_causes(&e)));
        };
        if hit {
            self.fetch_hits.fetch_add(1, Ordering::Relaxed);
        } else {
            self.fetch_misses.fetch_add(1, Ordering::Relaxed);
            self.bytes_fetched
                .fetch_add(fetched.size, Ordering::Relaxed);
            super::count_fetched(fetched.size);
        }
        Ok(fetched)
    }

    /// The module rules the driver checks uploads with, against this executor's engine: a
    /// module by URL reaches the executor unchecked, and one the engine cannot take must
    /// fail as the module's fault (never retried, never counted against the executor).
    pub(super) async fn check_module(&self, path: &std::path::Path) -> Result<(), TaskFailure> {
        let wasm = tokio::fs::read(path).await.map_err(|e| {
            TaskFailure::new(
                FailureKind::HostError,
                format!("reading the fetched module {}: {e}", path.display()),
            )
        })?;
        let limits = flint_module_rules::Limits {
            max_memory_bytes: self.sandbox.max_memory_bytes() as u64,
            ..flint_module_rules::Limits::DEFAULT
        };
        let checked =
            tokio::task::spawn_blocking(move || flint_module_rules::check_limits(&wasm, &limits))
                .await
                .map_err(|e| {
                    TaskFailure::new(FailureKind::HostError, format!("checking the module: {e}"))
                })?;
        checked.map(drop).map_err(|rejection| {
            let kind = match rejection.limit {
                flint_module_rules::Limit::InitialMemory => FailureKind::MemoryLimit,
                _ => FailureKind::InvalidModule,
            };
            TaskFailure::new(kind, rejection.message)
        })
    }
}

/// The executor's connection to its driver: how many times it registered, and whether
/// it is connected now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverLink {
    pub registrations: u64,
    pub connected: bool,
}

/// Fetches from a driver that went away tried again after it came back, at most.
const DRIVER_RETRIES: u32 = 3;

/// How long a fetch from the driver that failed waits to see the connection to the driver
/// break too: if it does not, the driver is there and the failure is this executor's.
const DRIVER_LOSS_SEEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the driver, which `link` showed registered `seen` times when the failed fetch
/// began, went away and is back (registered again): then the fetch is worth another try.
/// False at once if the connection stays up: the driver is there, and not reaching it is
/// this executor's network.
async fn driver_came_back(link: &mut tokio::sync::watch::Receiver<DriverLink>, seen: u64) -> bool {
    let away = |l: &DriverLink| !l.connected || l.registrations > seen;
    if tokio::time::timeout(DRIVER_LOSS_SEEN_WITHIN, link.wait_for(away))
        .await
        .is_err()
    {
        return false;
    }
    link.wait_for(|l| l.connected && l.registrations > seen)
        .await
        .is_ok()
}

/// A request to the driver that did not get an answer (refused, reset, timed out).
fn driver_transport_failure(e: &FetchError) -> bool {
    matches!(
        e,
        FetchError::Request { .. } | FetchError::Resolve { .. } | FetchError::Deadline { .. }
    )
}

/// A failure to reach the driver's own routes at all, or to be let in.
fn driver_unreachable(e: &FetchError) -> bool {
    match e {
        FetchError::Request { .. } | FetchError::Resolve { .. } | FetchError::Deadline { .. } => {
            true
        }
        FetchError::Status { status, .. } => matches!(status, 401 | 403),
        _ => false,
    }
}

pub(super) fn trust(served_by_driver: bool) -> Trust {
    match served_by_driver {
        true => Trust::Driver,
        false => Trust::Job,
    }
}

/// An error's message followed by each of its causes not already in it: the fetch cache's
/// messages name the URL and the direct cause, but what went wrong underneath (a body
/// cut short, a connection reset) is only further down the chain.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = c.source();
    }
    message
}
