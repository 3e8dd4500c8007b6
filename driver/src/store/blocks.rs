//! The block store: results too large to travel inline (Spark's BlockManager for task
//! results). By default it lives in the driver's data dir, behind object_store's local
//! file system, and executors upload to `PUT /v1/blocks/{id}`; with `--block-store
//! s3://bucket/prefix` executors write to the bucket themselves and the driver reads
//! from it. Either way the bytes outlive the executor that produced them, and reads are
//! streamed, never loaded whole. The driver's own blocks count towards the data dir's
//! quota but are never refused by it: they are results of jobs already accepted. An
//! upload that fails (a full disk) leaves no partial block: object_store writes to a
//! staging file and renames it, and removes it on failure.

use std::sync::Arc;

use bytes::Bytes;
use flint_protocol::Digest;
use flint_protocol::api::{CodedError, ErrorCode};
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{GetResult, GetResultPayload, ObjectStore};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;

pub use self::tapes::TAPE_SUFFIX;
use self::tapes::Tapes;
use super::usage::{DataDirUsage, bytes_under, is_disk_full};

mod tapes;

/// The default `--block-store`: the driver's data dir, uploads through the driver.
pub const DRIVER_BLOCK_STORE: &str = "driver";

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("`{0}` is not a block id (`<job>/<name>` of A-Z a-z 0-9 . _ -)")]
    BadId(String),
    #[error("block {id} is larger than the {max}-byte limit")]
    TooLarge { id: String, max: u64 },
    #[error(
        "job {job}'s recorded responses would pass --egress-record-max-bytes {cap}: the \
         attempt's tape is refused"
    )]
    RecordCap { job: String, cap: u64 },
    #[error("block {id}: reading the upload: {message}")]
    Upload { id: String, message: String },
    #[error("block store: {0}")]
    Store(#[from] object_store::Error),
    #[error("block store: {0}")]
    Io(#[from] std::io::Error),
}

impl BlockError {
    /// The disk (or a disk quota of the OS) is full: the block was not stored.
    pub fn is_disk_full(&self) -> bool {
        match self {
            BlockError::Store(e) => is_disk_full(e),
            BlockError::Io(e) => is_disk_full(e),
            _ => false,
        }
    }
}

/// A bad id or body (4xx), a missing block (404), a full disk (507), the store
/// otherwise (500).
impl CodedError for BlockError {
    fn code(&self) -> ErrorCode {
        match self {
            e if e.is_disk_full() => ErrorCode::StorageFull,
            BlockError::BadId(_) => ErrorCode::InvalidBlockId,
            BlockError::TooLarge { .. } | BlockError::RecordCap { .. } => ErrorCode::OutputLimit,
            BlockError::Upload { .. } => ErrorCode::BadBody,
            BlockError::Store(object_store::Error::NotFound { .. }) => ErrorCode::BlockNotFound,
            BlockError::Store(_) | BlockError::Io(_) => ErrorCode::Storage,
        }
    }
}

pub struct BlockStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// `driver`, or the object store URL executors write to.
    spec: String,
    /// The directory of the driver's own block store (`None` for an object store).
    local_dir: Option<std::path::PathBuf>,
    /// Where executors fetch a block that is another task's input.
    fetch_base: String,
    /// The data dir's figure, when the blocks are kept in it.
    usage: Option<Arc<DataDirUsage>>,
    tapes: Tapes,
}

impl BlockStore {
    /// `spec` is `driver` or an object store URL (`s3://bucket/prefix`, `file:///dir`).
    /// The driver's own blocks are counted in `usage`, from what is there at open on.
    pub fn open(
        spec: &str,
        data_dir: &std::path::Path,
        http_base: &str,
        usage: &Arc<DataDirUsage>,
    ) -> anyhow::Result<Self> {
        if spec == DRIVER_BLOCK_STORE {
            let dir = data_dir.join("blocks");
            std::fs::create_dir_all(&dir)?;
            usage.stored(bytes_under(&dir)?);
            let store = object_store::local::LocalFileSystem::new_with_prefix(&dir)?;
            return Ok(BlockStore {
                store: Arc::new(store),
                prefix: Path::default(),
                spec: spec.to_owned(),
                local_dir: Some(dir),
                fetch_base: format!("{http_base}/v1/blocks"),
                usage: Some(usage.clone()),
                tapes: Tapes::default(),
            });
        }
        let url = url::Url::parse(spec).map_err(|e| {
            anyhow::anyhow!("--block-store {spec}: {e} (use `driver` or s3://bucket/prefix)")
        })?;
        let (store, prefix) = flint_fetch_cache::stores::object_store_for(&url)?;
        Ok(BlockStore {
            store,
            prefix,
            spec: spec.trim_end_matches('/').to_owned(),
            local_dir: None,
            fetch_base: spec.trim_end_matches('/').to_owned(),
            usage: None,
            tapes: Tapes::default(),
        })
    }

    /// What executors are told in their config.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// The URL an executor fetches block `id` from.
    pub fn fetch_url(&self, id: &str) -> String {
        format!("{}/{id}", self.fetch_base)
    }

    fn path(&self, id: &str) -> Result<Path, BlockError> {
        let parts: Vec<&str> = id.split('/').collect();
        let ok = parts.len() == 2
            && parts.iter().all(|p| {
                !p.is_empty()
                    && p.len() <= 128
                    && *p != "."
                    && *p != ".."
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            });
        if !ok {
            return Err(BlockError::BadId(id.to_owned()));
        }
        Ok(parts
            .iter()
            .fold(self.prefix.clone(), |path, part| path.child(*part)))
    }

    /// Deletes every block of a job (they are named `<job>/<name>`: results, and the
    /// uploads of attempts that lost), returning how many there were.
    pub async fn delete_job(&self, job: &flint_protocol::JobId) -> Result<u64, BlockError> {
        let dir = self.path(&format!("{}/x", job.0))?;
        let dir = Path::from_iter(dir.parts().take(dir.parts().count() - 1));
        self.tapes.forget(&job.0);
        let mut listed = self.store.list(Some(&dir));
        let mut deleted = 0;
        while let Some(meta) = listed.next().await.transpose()? {
            match self.store.delete(&meta.location).await {
                Ok(()) => {
                    deleted += 1;
                    if let Some(usage) = &self.usage {
                        usage.released(meta.size);
                    }
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(local) = &self.local_dir {
            // The local store leaves the job's directory behind, empty.
            match tokio::fs::remove_dir(local.join(&job.0)).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(deleted)
    }

    /// Streams an upload into the store, hashing as it goes; nothing is visible under
    /// `id` unless every byte arrived (the multipart upload is aborted otherwise).
    pub async fn put_stream<S, E>(
        &self,
        id: &str,
        mut body: S,
        max: u64,
    ) -> Result<(u64, Digest), BlockError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let path = self.path(id)?;
        // A block uploaded again (a retried upload) replaces the one before.
        let replaced = match &self.usage {
            Some(_) => self.store.head(&path).await.map_or(0, |meta| meta.size),
            None => 0,
        };
        let mut writer = BufWriter::new(self.store.clone(), path);
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let result = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| BlockError::Upload {
                    id: id.to_owned(),
                    message: e.to_string(),
                })?;
                size += chunk.len() as u64;
                if size > max {
                    return Err(BlockError::TooLarge {
                        id: id.to_owned(),
                        max,
                    });
                }
                hasher.update(&chunk);
                // `put` keeps the chunk as it is; `write_all` would copy it into a buffer.
                writer.put(chunk).await?;
            }
            writer.shutdown().await?;
            Ok(())
        }
        .await;
        if let Err(e) = result {
            let _ = writer.abort().await;
            return Err(e);
        }
        if let Some(usage) = &self.usage {
            usage.stored(size);
            usage.released(replaced);
        }
        Ok((size, Digest(hasher.finalize().into())))
    }

    /// The block's bytes, as a stream.
    pub async fn get(&self, id: &str) -> Result<GetResult, BlockError> {
        Ok(self.store.get(&self.path(id)?).await?)
    }

    /// The block's size and its bytes as a stream: a local file mapped in windows
    /// ([`super::mapped`]); object_store streams local files 8 KiB at a time, one
    /// blocking-pool hop each, which made serving a large result several times slower
    /// than writing it.
    pub async fn get_stream(
        &self,
        id: &str,
    ) -> Result<(u64, BoxStream<'static, std::io::Result<Bytes>>), BlockError> {
        let got = self.get(id).await?;
        let size = got.meta.size;
        let stream = match got.payload {
            GetResultPayload::File(file, _) if got.range.start == 0 && got.range.end == size => {
                super::mapped::stream(file, size).boxed()
            }
            _ => got
                .into_stream()
                .map(|r| r.map_err(std::io::Error::other))
                .boxed(),
        };
        Ok((size, stream))
    }
}
