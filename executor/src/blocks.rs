//! The executor's side of the block store: uploads of results too large to travel
//! inline, to the driver (`PUT /v1/blocks/{id}`, the default) or straight to an object
//! store (`--block-store s3://...` on the driver). The task thread hands over chunks
//! through a small bounded channel; the upload runs on the runtime. A block for a driver
//! that is away is kept on disk until it is back ([`held`]).

mod held;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use flint_protocol::Digest;
use flint_protocol::api::ResultInfo;
use object_store::ObjectStore;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::runtime::Handle;

use self::held::{HeldBlocks, Spool};
use crate::results::{BlockSink, BlockWriter};

/// Chunks in flight between the guest and the upload: the memory a large result costs.
const IN_FLIGHT: usize = 4;

type Chunk = Result<Bytes, std::io::Error>;

pub struct BlockClient {
    runtime: Handle,
    target: Target,
}

enum Target {
    Driver {
        client: reqwest::Client,
        base: String,
        /// The cluster secret, which the driver wants for block uploads.
        secret: Option<String>,
        held: Arc<HeldBlocks>,
    },
    Store {
        store: Arc<dyn ObjectStore>,
        prefix: Path,
    },
}

/// Why an upload to the driver did not store the block.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// No answer: the driver is away (refused, reset, gone mid-upload). Try again later.
    #[error("the driver is unreachable: {0}")]
    Unreachable(String),
    /// The driver answered no (or stored other bytes): trying again will not help.
    #[error("{0}")]
    Refused(String),
}

impl BlockClient {
    /// `spec` is the driver's `block_store` setting: `driver`, or an object store URL.
    /// Blocks kept for an absent driver go to `held_dir`, emptied here.
    pub fn new(
        spec: &str,
        driver_http_url: &str,
        secret: Option<String>,
        runtime: Handle,
        held_dir: PathBuf,
    ) -> anyhow::Result<Self> {
        let held = Arc::new(HeldBlocks::clear(held_dir)?);
        let target = if spec == "driver" {
            Target::Driver {
                client: flint_fetch_cache::client::builder_for(driver_http_url)
                    .no_proxy()
                    .build()?,
                base: format!("{driver_http_url}/v1/blocks"),
                secret,
                held,
            }
        } else {
            let url = url::Url::parse(spec)?;
            let (store, prefix) = flint_fetch_cache::stores::object_store_for(&url)?;
            Target::Store { store, prefix }
        };
        Ok(BlockClient { runtime, target })
    }

    /// Uploads a block kept while the driver was away, and forgets it once the driver
    /// has it or refused it.
    pub async fn upload_held(&self, id: &str) -> Result<(), UploadError> {
        let Target::Driver {
            client,
            base,
            secret,
            held,
        } = &self.target
        else {
            return Ok(());
        };
        let Some(block) = held.get(id) else {
            return Ok(());
        };
        let uploaded = async {
            let file = tokio::fs::File::open(&block.path).await.map_err(|e| {
                UploadError::Refused(format!("reading the block kept on this executor: {e}"))
            })?;
            let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
            let mut request = client.put(format!("{base}/{id}")).body(body);
            if let Some(secret) = secret {
                request = request.bearer_auth(secret);
            }
            let stored = answer(request.send().await).await?;
            if stored != (block.size, block.digest) {
                return Err(UploadError::Refused(format!(
                    "the driver stored {} bytes hashing to {}, not the {} bytes hashing to {} kept here",
                    stored.0, stored.1, block.size, block.digest
                )));
            }
            Ok(())
        }
        .await;
        if !matches!(uploaded, Err(UploadError::Unreachable(_))) {
            held.release(id);
        }
        uploaded
    }
}

impl BlockWriter for BlockClient {
    fn open(&self, id: &str) -> Box<dyn BlockSink> {
        // A plain blocking channel: the guest's writes arrive inside wasmtime-wasi's own
        // runtime context, where tokio's blocking calls are not allowed.
        let (chunks, rx) = crossbeam_channel::bounded::<Chunk>(IN_FLIGHT);
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let aborted = Arc::new(AtomicBool::new(false));
        let mut rx = Chunks {
            rx,
            aborted: aborted.clone(),
            spool: None,
        };
        let upload = match &self.target {
            Target::Driver {
                client,
                base,
                secret,
                held,
            } => {
                let mut request = client.put(format!("{base}/{id}"));
                if let Some(secret) = secret {
                    request = request.bearer_auth(secret);
                }
                rx.spool = held.spool(id).map(|spool| Arc::new(Mutex::new(spool)));
                let keep = (held.clone(), id.to_owned());
                futures_util::future::Either::Left(to_driver(request, rx, keep))
            }
            Target::Store { store, prefix } => {
                let path = id
                    .split('/')
                    .fold(prefix.clone(), |path, part| path.child(part));
                futures_util::future::Either::Right(to_store(store.clone(), path, rx))
            }
        };
        self.runtime.spawn(async move {
            let _ = done_tx.send(upload.await);
        });
        Box::new(Upload {
            chunks: Some(chunks),
            aborted,
            done: Some(done),
        })
    }

    fn held(&self, id: &str) -> Option<u64> {
        match &self.target {
            Target::Driver { held, .. } => held.size(id),
            Target::Store { .. } => None,
        }
    }
}

struct Upload {
    chunks: Option<crossbeam_channel::Sender<Chunk>>,
    aborted: Arc<AtomicBool>,
    done: Option<crossbeam_channel::Receiver<Result<(u64, Digest), String>>>,
}

/// The receiving end: after the last chunk, an aborted upload yields an error, so that
/// the request body or the multipart upload ends abnormally and nothing is kept. With a
/// spool, every chunk taken is written to it too.
#[derive(Clone)]
struct Chunks {
    rx: crossbeam_channel::Receiver<Chunk>,
    aborted: Arc<AtomicBool>,
    spool: Option<Arc<Mutex<Spool>>>,
}

impl Chunks {
    async fn next(&mut self) -> Option<Chunk> {
        let (rx, spool) = (self.rx.clone(), self.spool.clone());
        // One hop to a blocking thread per chunk (a megabyte): cheap next to the bytes.
        let next = tokio::task::spawn_blocking(move || match spool {
            // Taken and spooled under one lock: whoever reads the chunks (the request
            // body, then the rest once the driver is found gone) spools them in order.
            Some(spool) => {
                let mut spool = spool.lock().expect("spool lock poisoned");
                let chunk = rx.recv().ok();
                if let Some(Ok(bytes)) = &chunk {
                    spool.write(bytes);
                }
                chunk
            }
            None => rx.recv().ok(),
        })
        .await
        .ok()
        .flatten();
        match next {
            Some(chunk) => Some(chunk),
            // Every time, not once: the rest of an upload read after the request failed
            // must see the abort too.
            None if self.aborted.load(Ordering::SeqCst) => {
                Some(Err(std::io::Error::other("the task failed")))
            }
            None => None,
        }
    }
}

impl Upload {
    /// Why the upload stopped taking bytes.
    fn failure(&mut self) -> String {
        self.chunks = None;
        match self.done.take().map(|done| done.recv()) {
            Some(Ok(Err(e))) => e,
            Some(Ok(Ok(_))) => "the upload ended early".into(),
            Some(Err(_)) => "the upload was dropped".into(),
            None => "the upload had already failed".into(),
        }
    }
}

impl BlockSink for Upload {
    fn write(&mut self, chunk: Bytes, stopped: &dyn Fn() -> bool) -> Result<(), String> {
        /// How often a write held back by a slow upload looks whether its attempt is over.
        const RECHECK: std::time::Duration = std::time::Duration::from_millis(5);
        let Some(chunks) = &self.chunks else {
            return Err(self.failure());
        };
        let mut chunk = Ok(chunk);
        loop {
            match chunks.send_timeout(chunk, RECHECK) {
                Ok(()) => return Ok(()),
                Err(crossbeam_channel::SendTimeoutError::Timeout(back)) if !stopped() => {
                    chunk = back;
                }
                Err(crossbeam_channel::SendTimeoutError::Timeout(_)) => {
                    return Err("the attempt is over".into());
                }
                Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => {
                    return Err(self.failure());
                }
            }
        }
    }

    fn finish(mut self: Box<Self>) -> Result<(u64, Digest), String> {
        self.chunks = None;
        match self.done.take() {
            Some(done) => done
                .recv()
                .unwrap_or_else(|_| Err("the upload was dropped".into())),
            None => Err("the upload had already failed".into()),
        }
    }

    fn abort(mut self: Box<Self>) {
        // Set before the sender is dropped, so the receiver sees it when the chunks end.
        self.aborted.store(true, Ordering::SeqCst);
        self.chunks = None;
    }
}

/// Streams a result to the driver. When the driver cannot be reached (refused, reset,
/// gone mid-upload), the rest of the result is spooled too and the block is kept for it
/// ([`held`]); a refusal fails the attempt as before.
async fn to_driver(
    request: reqwest::RequestBuilder,
    rx: Chunks,
    (held, id): (Arc<HeldBlocks>, String),
) -> Result<(u64, Digest), String> {
    let rest = rx.clone();
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.next().await.map(|chunk| (chunk, rx))
    });
    match answer(request.body(reqwest::Body::wrap_stream(body)).send().await).await {
        Ok(stored) => Ok(stored),
        Err(UploadError::Refused(why)) => Err(why),
        Err(UploadError::Unreachable(why)) => keep(rest, held, id, why).await,
    }
}

/// Reads the rest of a result the driver did not get into its spool, and keeps the
/// spool as the block.
async fn keep(
    mut rest: Chunks,
    held: Arc<HeldBlocks>,
    id: String,
    why: String,
) -> Result<(u64, Digest), String> {
    while let Some(chunk) = rest.next().await {
        if let Err(e) = chunk {
            return Err(format!("uploading to the driver: {e}"));
        }
    }
    let Some(spool) = rest.spool.take() else {
        return Err(format!("uploading to the driver: {why}"));
    };
    let kept = tokio::task::spawn_blocking(move || {
        let mut spool = spool.lock().expect("spool lock poisoned");
        held.keep(&id, &mut spool).map(|stored| (stored, id))
    })
    .await
    .map_err(|e| format!("keeping the block: {e}"))?;
    match kept {
        Ok((stored, id)) => {
            tracing::warn!(
                block = id,
                error = why,
                "the driver is away: keeping a result block on disk until it is back"
            );
            Ok(stored)
        }
        Err(e) => Err(format!(
            "uploading to the driver: {why}; keeping the block: {e}"
        )),
    }
}

/// The driver's answer to a block upload: the size and digest it stored.
async fn answer(
    sent: Result<reqwest::Response, reqwest::Error>,
) -> Result<(u64, Digest), UploadError> {
    let unreachable =
        |e: reqwest::Error| UploadError::Unreachable(format!("uploading to the driver: {e}"));
    let response = sent.map_err(unreachable)?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        return Err(UploadError::Refused(format!(
            "the driver refused the upload ({status}): {text}"
        )));
    }
    // The driver stored the block but its answer was lost: keeping it to upload again
    // is safe (an upload again replaces it).
    let info: ResultInfo = response.json().await.map_err(unreachable)?;
    let digest = format!("sha256:{}", info.sha256)
        .parse::<Digest>()
        .map_err(|e| UploadError::Refused(format!("the driver's digest: {e}")))?;
    Ok((info.size, digest))
}

async fn to_store(
    store: Arc<dyn ObjectStore>,
    path: Path,
    mut rx: Chunks,
) -> Result<(u64, Digest), String> {
    let mut writer = BufWriter::new(store, path.clone());
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let written: std::io::Result<()> = async {
        while let Some(chunk) = rx.next().await {
            let chunk = chunk?;
            size += chunk.len() as u64;
            hasher.update(&chunk);
            // `put` keeps the chunk as it is; `write_all` would copy it into a buffer.
            writer.put(chunk).await?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = written {
        let _ = writer.abort().await;
        return Err(format!("writing block {path}: {e}"));
    }
    // Not followed by `abort`: object_store's BufWriter panics on an abort after a
    // shutdown, which took the store's answer (a 403, say) down with the upload task.
    if let Err(e) = writer.shutdown().await {
        return Err(format!("writing block {path}: {e}"));
    }
    Ok((size, Digest(hasher.finalize().into())))
}

#[cfg(test)]
mod tests;
