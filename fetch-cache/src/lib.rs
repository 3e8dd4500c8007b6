//! Fetches a URL into a local cache, once per (URL, timestamp), verified by SHA-256.
//!
//! Spark's executors fetch a job's files through `Utils.fetchFile`, keyed by URL and the
//! timestamp at which the file was added; every task on an executor shares one download.
//! This crate does the same for Flint's modules, job files and `url` / `result` inputs:
//!
//! - **Key** `(url, timestamp_ms)`: a newer timestamp for the same URL fetches again. The
//!   digest each key resolved to is kept in `<dir>/keys/<sha256 of url, timestamp and
//!   trust>`, so a restarted cache still knows it; cache keys are derived, never taken as
//!   paths.
//! - **Content** is stored once per SHA-256 under `<dir>/blobs/<hex>`; a digest the caller
//!   expects that does not match the bytes is an error naming both digests.
//! - **Policy** ([`policy`], [`addresses`]): no special-purpose address (loopback,
//!   private, link-local and every other block of the IANA registries) unless the
//!   operator allowed the origin; `file://` only under allowed directories; redirects are
//!   refused. Names are resolved here and the connection goes only to the addresses that
//!   were checked.
//! - **Trust** ([`Trust`]): a fetch says who handed out its URL. Only one the driver
//!   handed out may reach the places trusted for the driver ([`FetchCache::trust_origin`]:
//!   its own origin, the block store's bucket) or carry the bearer token; a URL a job
//!   named is judged by the operator's policy alone, wherever it points, so a job cannot
//!   borrow the executor's credentials to read what the driver would not give it.
//! - **Limits**: a byte cap and one deadline per fetch; a fetch that misses either leaves
//!   nothing behind.
//! - **Credentials** ([`FetchCache::set_bearer`]): a bearer token is sent on driver
//!   fetches to the one origin it was given for and to no other; since redirects are
//!   refused, it cannot follow one elsewhere.
//! - **Blame** ([`FetchError::blame`]): a failure is the source's (what was referred to)
//!   or the executor's (its cache directory), and its message names the URL, never a
//!   host path behind a `file://` URL.
//! - **Single flight**: concurrent requests for one key (and trust) wait for one download; a failed
//!   download is not remembered, so the next request tries again.
//! - **Atomic**: bytes stream into a temp file in `<dir>/tmp` while being hashed, are
//!   fsynced, then renamed into place; an interrupted download leaves nothing visible,
//!   and `open` clears what a crash left in `<dir>/tmp`.
//! - **Budget** ([`FetchOptions::max_cache_bytes`]): after each download the least
//!   recently used blobs are deleted until the cache fits, except blobs pinned by a live
//!   [`Fetched`].
//! - **Restart**: `open` indexes `<dir>/blobs` without reading it; each blob is hashed on
//!   first use, and again whenever its size or modification time changed, and a corrupt
//!   one is refetched. A blob corrupted in place with neither changing (bit rot) is
//!   found at the next open, not before: hashing on every hit would make a hit cost a
//!   read of the whole blob.
//!
//! - **Egress** ([`egress`]): the outbound HTTP a task makes itself, under the operator's,
//!   the tenant's and the job's allow lists, on one pooled client per executor. Stricter
//!   than fetches: a special-purpose address is reached only when the operator lists it
//!   as an IP literal, whatever name stands for it.
//!
//! Invariants: this crate knows nothing of jobs or tasks (egress names their lists in its
//! messages, no more); one `FetchCache` owns a directory; a path it returns holds bytes
//! whose digest it checked, and stays in place while the `Fetched` that names it is alive.

pub mod addresses;
mod cap;
pub mod client;
mod download;
pub mod egress;
mod error;
mod index;
mod keys;
pub mod policy;
pub mod stores;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use flint_protocol::Digest;

pub use addresses::{AddressBlock, AddressClass};
pub use error::{Blame, FetchError};
use index::{Index, Lookup, Pin};
use keys::KeyRecords;
use policy::AdmitError;
pub use policy::{FileProblem, PolicyError, Refusal, UrlPolicy};

/// What makes two fetches the same fetch, with the [`Trust`] they are made under: a key
/// fetched for the driver is never a hit for a job, nor the other way round.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub url: String,
    pub timestamp_ms: u64,
}

/// Who handed out the URL of a fetch, which decides where it may go and what it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Trust {
    /// Handed out by the driver (a module or file it serves, an earlier task's result):
    /// the places given to [`FetchCache::trust_origin`] are reachable too, whatever their
    /// addresses, and the bearer token goes to the origin it was set for. Any other URL
    /// is judged as a job's would be.
    Driver,
    /// Named by a job: the operator's policy alone decides, and no credentials are ever
    /// sent.
    Job,
}

/// A fetched blob on local disk. The blob is not evicted while this (or a clone) lives.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub path: PathBuf,
    pub digest: Digest,
    pub size: u64,
    _pin: Pin,
}

#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Largest body accepted.
    pub max_bytes: u64,
    /// Deadline for one whole fetch: resolving, connecting and the transfer.
    pub timeout: Duration,
    /// Bytes of blobs kept on disk before the least recently used are deleted.
    pub max_cache_bytes: u64,
    /// Which URLs may be fetched; the default admits public http(s) addresses only.
    pub policy: UrlPolicy,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            max_bytes: 1 << 30,
            timeout: Duration::from_secs(60),
            max_cache_bytes: 10 << 30,
            policy: UrlPolicy::default(),
        }
    }
}

pub struct FetchCache {
    dir: PathBuf,
    options: FetchOptions,
    /// The operator's policy, judging every fetch; behind a lock so the caller can add
    /// the allow list the driver sends at registration.
    policy: RwLock<UrlPolicy>,
    /// What [`Trust::Driver`] fetches may reach besides; learnt from the driver too.
    trusted: RwLock<UrlPolicy>,
    /// Bearer tokens by exact origin, each one trusted (the driver's cluster secret for
    /// the driver).
    bearers: RwLock<Vec<(policy::Origin, String)>>,
    index: Mutex<Index>,
    keys: KeyRecords,
    /// One lock per key and trust being fetched; an entry leaves when its last waiter
    /// does, and the key's digest is then found in `<dir>/keys`.
    in_flight: Mutex<HashMap<(CacheKey, Trust), FlightLock>>,
}

type FlightLock = Arc<tokio::sync::Mutex<()>>;

impl FetchCache {
    pub fn open(dir: impl Into<PathBuf>, mut options: FetchOptions) -> Result<Self, FetchError> {
        let dir = dir.into();
        for sub in ["blobs", "tmp", "keys"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|e| FetchError::io(&path, e))?;
        }
        clear_dir(&dir.join("tmp"))?;
        let blobs = dir.join("blobs");
        let index =
            Index::load(&blobs, options.max_cache_bytes).map_err(|e| FetchError::io(&blobs, e))?;
        Ok(FetchCache {
            keys: KeyRecords::new(&dir.join("keys"), &dir.join("tmp")),
            dir,
            policy: RwLock::new(std::mem::take(&mut options.policy)),
            trusted: RwLock::new(UrlPolicy::default()),
            bearers: RwLock::new(Vec::new()),
            options,
            index: Mutex::new(index),
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// Allows one more origin (or `file://` directory, or `s3://bucket`) for every later
    /// fetch, whoever handed out its URL: the operator's allow list. See
    /// [`UrlPolicy::allow_origin`].
    pub fn allow_origin(&self, entry: &str) -> Result<(), PolicyError> {
        self.policy
            .write()
            .expect("fetch-cache policy lock poisoned")
            .allow_origin(entry)
    }

    /// Makes an http(s) origin (`scheme://host[:port]`) or an `s3://bucket` reachable by
    /// [`Trust::Driver`] fetches, whatever its addresses, and by no others.
    pub fn trust_origin(&self, entry: &str) -> Result<(), PolicyError> {
        let url = url::Url::parse(entry).map_err(|source| PolicyError::Malformed {
            entry: entry.to_owned(),
            source,
        })?;
        if !matches!(url.scheme(), "http" | "https" | "s3") {
            return Err(PolicyError::NotTrustable(entry.to_owned()));
        }
        self.trusted
            .write()
            .expect("fetch-cache trust lock poisoned")
            .allow_origin(entry)
    }

    /// Sends `Authorization: Bearer <token>` with every [`Trust::Driver`] fetch from
    /// `origin` (`scheme://host[:port]`), which must be trusted already, and with no
    /// other fetch.
    pub fn set_bearer(&self, origin: &str, token: &str) -> Result<(), PolicyError> {
        let parsed = policy::Origin::parse(origin)?;
        // A token for an origin the driver's fetches could not reach would never be sent;
        // better the caller hears of it now than wonders later.
        if !self
            .trusted
            .read()
            .expect("fetch-cache trust lock poisoned")
            .allows_origin(&parsed)
        {
            return Err(PolicyError::BearerUntrusted(origin.to_owned()));
        }
        let mut bearers = self
            .bearers
            .write()
            .expect("fetch-cache bearer lock poisoned");
        bearers.retain(|(o, _)| *o != parsed);
        bearers.push((parsed, token.to_owned()));
        Ok(())
    }

    fn bearer_for(&self, url: &str, trust: Trust) -> Option<String> {
        if trust == Trust::Job {
            return None;
        }
        let origin = url::Url::parse(url)
            .ok()
            .and_then(|u| policy::Origin::of(&u))?;
        self.bearers
            .read()
            .expect("fetch-cache bearer lock poisoned")
            .iter()
            .find(|(o, _)| *o == origin)
            .map(|(_, token)| token.clone())
    }

    /// The blob for `key`, downloading it unless this cache already holds it from a
    /// fetch under the same `trust`. Returns whether it was already there (a hit)
    /// alongside.
    pub async fn fetch(
        &self,
        key: &CacheKey,
        expected: Option<Digest>,
        trust: Trust,
    ) -> Result<(Fetched, bool), FetchError> {
        let flight_key = (key.clone(), trust);
        let flight = Flight {
            lock: self
                .lock_in_flight()
                .entry(flight_key.clone())
                .or_default()
                .clone(),
            cache: self,
            key: flight_key,
        };
        // Declared after `flight`, so dropped before it: the key is unlocked by then.
        let _one_at_a_time = flight.lock.lock().await;
        self.fetch_alone(key, expected, trust).await
    }

    async fn fetch_alone(
        &self,
        key: &CacheKey,
        expected: Option<Digest>,
        trust: Trust,
    ) -> Result<(Fetched, bool), FetchError> {
        if let Some(digest) = self.keys.get(key, trust)? {
            if let Some(expected) = expected
                && digest != expected
            {
                return Err(FetchError::DigestMismatch {
                    url: key.url.clone(),
                    expected,
                    actual: digest,
                });
            }
            if let Some(hit) = self.checkout(digest).await? {
                return Ok((hit, true));
            }
        }
        let timeout = self.options.timeout;
        let fetched = tokio::time::timeout(timeout, self.download(&key.url, expected, trust))
            .await
            .map_err(|_| FetchError::Deadline {
                url: key.url.clone(),
                timeout,
            })??;
        self.keys.put(key, trust, fetched.digest)?;
        Ok((fetched, false))
    }

    /// The blob for `digest` if it is on disk with the right bytes, pinned.
    async fn checkout(&self, digest: Digest) -> Result<Option<Fetched>, FetchError> {
        let (lookup, path) = {
            let mut index = self.lock_index();
            (index.lookup(&digest), index.path(&digest))
        };
        let Lookup::Present {
            size,
            verified,
            modified,
        } = lookup
        else {
            return Ok(None);
        };
        let (on_disk, on_disk_modified) = match std::fs::metadata(&path) {
            Ok(meta) => (Some(meta.len()), meta.modified().ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, None),
            Err(e) => return Err(FetchError::io(&path, e)),
        };
        let mut size = size;
        // One stat per hit rather than a hash: a blob is hashed again when it was never
        // hashed since open, or its size or modification time changed since it was.
        if !verified || on_disk != Some(size) || on_disk_modified != modified {
            let hashed = match on_disk {
                Some(_) => match download::hash_file(&path).await {
                    Ok(hashed) => Some(hashed),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(FetchError::io(&path, e)),
                },
                None => None,
            };
            match hashed {
                Some((actual, actual_size)) if actual == digest => size = actual_size,
                _ => {
                    tracing::warn!(%digest, path = %path.display(), "cached blob is corrupt; refetching");
                    self.lock_index()
                        .remove_corrupt(&digest)
                        .map_err(|e| FetchError::io(&path, e))?;
                    return Ok(None);
                }
            }
        }
        // `None` when evicted while being hashed, which makes this a miss like any other.
        let pin = self
            .lock_index()
            .pin_verified(&digest, size, on_disk_modified);
        Ok(pin.map(|pin| Fetched {
            path,
            digest,
            size,
            _pin: pin,
        }))
    }

    /// What a fetch under `trust` is judged by: a copy, so no lock is held across the
    /// name lookup.
    fn policy_for(&self, trust: Trust) -> UrlPolicy {
        let operator = self
            .policy
            .read()
            .expect("fetch-cache policy lock poisoned");
        match trust {
            Trust::Driver => operator.with(
                &self
                    .trusted
                    .read()
                    .expect("fetch-cache trust lock poisoned"),
            ),
            Trust::Job => operator.clone(),
        }
    }

    async fn download(
        &self,
        url: &str,
        expected: Option<Digest>,
        trust: Trust,
    ) -> Result<Fetched, FetchError> {
        let policy = self.policy_for(trust);
        let target = policy.admit(url).await.map_err(|e| match e {
            AdmitError::Refused(reason) => FetchError::Refused {
                url: url.to_owned(),
                reason,
            },
            AdmitError::Resolve(source) => FetchError::Resolve {
                url: url.to_owned(),
                source,
            },
            AdmitError::File(problem) => FetchError::File {
                url: url.to_owned(),
                problem,
            },
        })?;
        let tmp_dir = self.dir.join("tmp");
        let bearer = self.bearer_for(url, trust);
        let downloaded = download::download(
            url,
            target,
            bearer.as_deref(),
            &tmp_dir,
            self.options.max_bytes,
        )
        .await?;
        let (digest, size) = (downloaded.digest, downloaded.size);
        if let Some(expected) = expected
            && digest != expected
        {
            return Err(FetchError::DigestMismatch {
                url: url.to_owned(),
                expected,
                actual: digest,
            });
        }
        let mut index = self.lock_index();
        let path = index.path(&digest);
        let pin = index
            .insert(digest, size, |path| {
                downloaded.file.persist(path).map(drop).map_err(|e| e.error)
            })
            .map_err(|e| FetchError::io(&path, e))?;
        drop(index);
        tracing::debug!(url, %digest, size, "fetched");
        Ok(Fetched {
            path,
            digest,
            size,
            _pin: pin,
        })
    }

    fn lock_index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().expect("fetch-cache index lock poisoned")
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<(CacheKey, Trust), FlightLock>> {
        self.in_flight
            .lock()
            .expect("fetch-cache in-flight lock poisoned")
    }
}

/// A caller's place in the single flight for one key; dropping it, on success, error
/// or cancellation alike, removes the key's lock once nobody else waits on it.
struct Flight<'a> {
    cache: &'a FetchCache,
    key: (CacheKey, Trust),
    lock: FlightLock,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.cache.lock_in_flight();
        // Two references, the map's and ours, mean nobody else waits on this key; others
        // only take a reference under the map lock, so none can appear meanwhile.
        if Arc::strong_count(&self.lock) == 2 {
            in_flight.remove(&self.key);
        }
    }
}

/// Deletes what an interrupted process left in `<dir>/tmp`.
fn clear_dir(dir: &Path) -> Result<(), FetchError> {
    let entries = std::fs::read_dir(dir).map_err(|e| FetchError::io(dir, e))?;
    for entry in entries {
        let path = entry.map_err(|e| FetchError::io(dir, e))?.path();
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| FetchError::io(&path, e))?;
    }
    Ok(())
}
