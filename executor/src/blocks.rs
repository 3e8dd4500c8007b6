//! The executor's side of the block store: uploads of results too large to travel
//! inline, to the driver (`PUT /v1/blocks/{id}`, the default) or straight to an object
//! store (`--block-store s3://...` on the driver). The task thread hands over chunks
//! through a small bounded channel; the upload runs on the runtime.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use flint_protocol::Digest;
use flint_protocol::api::ResultInfo;
use object_store::ObjectStore;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::runtime::Handle;

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
    },
    Store {
        store: Arc<dyn ObjectStore>,
        prefix: Path,
    },
}

impl BlockClient {
    /// `spec` is the driver's `block_store` setting: `driver`, or an object store URL.
    pub fn new(
        spec: &str,
        driver_http_url: &str,
        secret: Option<String>,
        runtime: Handle,
    ) -> anyhow::Result<Self> {
        let target = if spec == "driver" {
            Target::Driver {
                client: reqwest::Client::builder().no_proxy().build()?,
                base: format!("{driver_http_url}/v1/blocks"),
                secret,
            }
        } else {
            let url = url::Url::parse(spec)?;
            let (store, prefix) = flint_fetch_cache::stores::object_store_for(&url)?;
            Target::Store { store, prefix }
        };
        Ok(BlockClient { runtime, target })
    }
}

impl BlockWriter for BlockClient {
    fn open(&self, id: &str) -> Box<dyn BlockSink> {
        // A plain blocking channel: the guest's writes arrive inside wasmtime-wasi's own
        // runtime context, where tokio's blocking calls are not allowed.
        let (chunks, rx) = crossbeam_channel::bounded::<Chunk>(IN_FLIGHT);
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let aborted = Arc::new(AtomicBool::new(false));
        let rx = Chunks {
            rx,
            aborted: aborted.clone(),
        };
        let upload = match &self.target {
            Target::Driver {
                client,
                base,
                secret,
            } => {
                let mut request = client.put(format!("{base}/{id}"));
                if let Some(secret) = secret {
                    request = request.bearer_auth(secret);
                }
                futures_util::future::Either::Left(to_driver(request, rx))
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
}

struct Upload {
    chunks: Option<crossbeam_channel::Sender<Chunk>>,
    aborted: Arc<AtomicBool>,
    done: Option<crossbeam_channel::Receiver<Result<(u64, Digest), String>>>,
}

/// The receiving end: after the last chunk, an aborted upload yields an error, so that
/// the request body or the multipart upload ends abnormally and nothing is kept.
struct Chunks {
    rx: crossbeam_channel::Receiver<Chunk>,
    aborted: Arc<AtomicBool>,
}

impl Chunks {
    async fn next(&mut self) -> Option<Chunk> {
        let rx = self.rx.clone();
        // One hop to a blocking thread per chunk (a megabyte): cheap next to the bytes.
        let next = tokio::task::spawn_blocking(move || rx.recv().ok())
            .await
            .ok()
            .flatten();
        match next {
            Some(chunk) => Some(chunk),
            None if self.aborted.swap(false, Ordering::SeqCst) => {
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

async fn to_driver(request: reqwest::RequestBuilder, rx: Chunks) -> Result<(u64, Digest), String> {
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.next().await.map(|chunk| (chunk, rx))
    });
    let response = request
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .map_err(|e| format!("uploading to the driver: {e}"))?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        return Err(format!("the driver refused the upload ({status}): {text}"));
    }
    let info: ResultInfo = response
        .json()
        .await
        .map_err(|e| format!("reading the driver's answer: {e}"))?;
    let digest = format!("sha256:{}", info.sha256)
        .parse::<Digest>()
        .map_err(|e| format!("the driver's digest: {e}"))?;
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
