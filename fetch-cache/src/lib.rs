//! Fetches a URL into a local cache, once per (URL, timestamp), verified by SHA-256.
//!
//! Spark's executors fetch a job's files through `Utils.fetchFile`, keyed by URL and the
//! timestamp at which the file was added; every task on an executor shares one download.
//! This crate does the same for Flint's modules (and later files and inputs):
//!
//! - **Key** `(url, timestamp_ms)`: a newer timestamp for the same URL fetches again.
//! - **Content** is stored once per SHA-256 under `<dir>/blobs/<hex>`; a digest the caller
//!   expects that does not match the bytes is an error naming both digests.
//! - **Single flight**: concurrent requests for one key wait for one download; a failed
//!   download is not remembered, so the next request tries again.
//! - **Atomic**: bytes stream into a temp file in `<dir>/tmp` while being hashed, are
//!   fsynced, then renamed into place; an interrupted download leaves nothing visible.
//!
//! Invariants: this crate knows nothing of jobs or tasks, and a path it returns always
//! holds bytes whose digest it checked.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flint_protocol::Digest;
use futures_util::StreamExt;
use sha2::{Digest as _, Sha256};
use tokio::sync::OnceCell;

/// What makes two fetches the same fetch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub url: String,
    pub timestamp_ms: u64,
}

/// A fetched blob on local disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    pub path: PathBuf,
    pub digest: Digest,
    pub size: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("fetching {url}: {source}")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("fetching {url}: HTTP status {status}")]
    Status { url: String, status: u16 },
    #[error("fetching {url}: more than the {max_bytes}-byte limit")]
    TooLarge { url: String, max_bytes: u64 },
    #[error("fetching {url}: expected {expected} but the bytes hash to {actual}")]
    DigestMismatch {
        url: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("cache at {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl FetchError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        FetchError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Largest body accepted.
    pub max_bytes: u64,
    /// Deadline for connecting and for the whole transfer.
    pub timeout: Duration,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            max_bytes: 1 << 30,
            timeout: Duration::from_secs(60),
        }
    }
}

pub struct FetchCache {
    dir: PathBuf,
    client: reqwest::Client,
    options: FetchOptions,
    entries: Mutex<HashMap<CacheKey, Arc<OnceCell<Fetched>>>>,
}

impl FetchCache {
    pub fn open(dir: impl Into<PathBuf>, options: FetchOptions) -> Result<Self, FetchError> {
        let dir = dir.into();
        for sub in ["blobs", "tmp"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|e| FetchError::io(&path, e))?;
        }
        let client = reqwest::Client::builder()
            // A redirect could point anywhere; the URL the driver handed out is the only
            // one we talk to.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(options.timeout)
            .timeout(options.timeout)
            .build()
            .expect("a client without TLS or proxies always builds");
        Ok(FetchCache {
            dir,
            client,
            options,
            entries: Mutex::new(HashMap::new()),
        })
    }

    /// The blob for `key`, downloading it unless this cache already holds it.
    /// Returns whether it was already there (a hit) alongside.
    pub async fn fetch(
        &self,
        key: &CacheKey,
        expected: Option<Digest>,
    ) -> Result<(Fetched, bool), FetchError> {
        let cell = {
            let mut entries = self.entries.lock().expect("fetch-cache lock poisoned");
            entries.entry(key.clone()).or_default().clone()
        };
        if let Some(hit) = cell.get() {
            return Ok((hit.clone(), true));
        }
        let mut downloaded = false;
        let fetched = cell
            .get_or_try_init(|| {
                downloaded = true;
                self.download(&key.url, expected)
            })
            .await?;
        if let Some(expected) = expected
            && fetched.digest != expected
        {
            return Err(FetchError::DigestMismatch {
                url: key.url.clone(),
                expected,
                actual: fetched.digest,
            });
        }
        Ok((fetched.clone(), !downloaded))
    }

    async fn download(&self, url: &str, expected: Option<Digest>) -> Result<Fetched, FetchError> {
        let request_error = |source| FetchError::Request {
            url: url.to_owned(),
            source,
        };
        let response = self.client.get(url).send().await.map_err(request_error)?;
        if !response.status().is_success() {
            return Err(FetchError::Status {
                url: url.to_owned(),
                status: response.status().as_u16(),
            });
        }
        let max_bytes = self.options.max_bytes;
        if response.content_length().is_some_and(|len| len > max_bytes) {
            return Err(FetchError::TooLarge {
                url: url.to_owned(),
                max_bytes,
            });
        }
        let tmp_dir = self.dir.join("tmp");
        let mut tmp =
            tempfile::NamedTempFile::new_in(&tmp_dir).map_err(|e| FetchError::io(&tmp_dir, e))?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(request_error)?;
            size += chunk.len() as u64;
            if size > max_bytes {
                return Err(FetchError::TooLarge {
                    url: url.to_owned(),
                    max_bytes,
                });
            }
            hasher.update(&chunk);
            tmp.write_all(&chunk)
                .map_err(|e| FetchError::io(tmp.path(), e))?;
        }
        let digest = Digest(hasher.finalize().into());
        if let Some(expected) = expected
            && digest != expected
        {
            return Err(FetchError::DigestMismatch {
                url: url.to_owned(),
                expected,
                actual: digest,
            });
        }
        tmp.as_file()
            .sync_all()
            .map_err(|e| FetchError::io(tmp.path(), e))?;
        let path = self.dir.join("blobs").join(digest.hex());
        tmp.persist(&path)
            .map_err(|e| FetchError::io(&path, e.error))?;
        tracing::debug!(url, %digest, size, "fetched");
        Ok(Fetched { path, digest, size })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::routing::get;

    use super::*;

    async fn serve(body: &'static [u8], hits: Arc<AtomicUsize>) -> String {
        let app = Router::new().route(
            "/blob",
            get(move || {
                hits.fetch_add(1, Ordering::SeqCst);
                async move { body }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}/blob")
    }

    #[tokio::test]
    async fn concurrent_fetches_of_one_key_download_once() {
        let hits = Arc::new(AtomicUsize::new(0));
        let url = serve(b"module bytes", hits.clone()).await;
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(FetchCache::open(dir.path(), FetchOptions::default()).unwrap());
        let key = CacheKey {
            url: url.clone(),
            timestamp_ms: 1,
        };
        let expected = Digest::of(b"module bytes");
        let fetches = (0..16).map(|_| {
            let (cache, key) = (cache.clone(), key.clone());
            tokio::spawn(async move { cache.fetch(&key, Some(expected)).await.unwrap() })
        });
        let results = futures_util::future::join_all(fetches).await;
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        let misses = results.iter().filter(|r| !r.as_ref().unwrap().1).count();
        assert_eq!(misses, 1, "exactly one caller downloaded");
        let (fetched, _) = results[0].as_ref().unwrap();
        assert_eq!(std::fs::read(&fetched.path).unwrap(), b"module bytes");

        // A newer timestamp for the same URL is a new key.
        let newer = CacheKey {
            url,
            timestamp_ms: 2,
        };
        cache.fetch(&newer, Some(expected)).await.unwrap();
        assert_eq!(hits.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn digest_mismatch_names_both_digests_and_leaves_nothing() {
        let url = serve(b"other bytes", Arc::default()).await;
        let dir = tempfile::tempdir().unwrap();
        let cache = FetchCache::open(dir.path(), FetchOptions::default()).unwrap();
        let expected = Digest::of(b"module bytes");
        let err = cache
            .fetch(
                &CacheKey {
                    url,
                    timestamp_ms: 1,
                },
                Some(expected),
            )
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(message.contains(&expected.to_string()), "{message}");
        assert!(message.contains(&Digest::of(b"other bytes").to_string()));
        assert_eq!(
            std::fs::read_dir(dir.path().join("blobs")).unwrap().count(),
            0
        );
        assert_eq!(
            std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0
        );
    }

    #[tokio::test]
    async fn oversized_and_missing_bodies_are_errors() {
        let url = serve(b"0123456789", Arc::default()).await;
        let dir = tempfile::tempdir().unwrap();
        let options = FetchOptions {
            max_bytes: 4,
            ..FetchOptions::default()
        };
        let cache = FetchCache::open(dir.path(), options).unwrap();
        let err = cache
            .fetch(
                &CacheKey {
                    url: url.clone(),
                    timestamp_ms: 1,
                },
                None,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, FetchError::TooLarge { max_bytes: 4, .. }),
            "{err}"
        );
        let missing = url.replace("/blob", "/nothing");
        let err = cache
            .fetch(
                &CacheKey {
                    url: missing,
                    timestamp_ms: 1,
                },
                None,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, FetchError::Status { status: 404, .. }),
            "{err}"
        );
    }
}
