//! Streams an admitted URL into a temp file, hashing and counting as the bytes arrive.
//!
//! The temp file lives in `<dir>/tmp` and deletes itself when dropped, so an error, a
//! missed deadline or a cancelled future leaves nothing behind; only the caller's rename
//! makes the bytes visible.

use std::io::Write;
use std::path::Path;

use flint_protocol::Digest;
use futures_util::StreamExt;
use sha2::{Digest as _, Sha256};
use tempfile::NamedTempFile;
use tokio::io::AsyncReadExt;

use crate::FetchError;
use crate::cap::ByteCap;
use crate::policy::{FileProblem, Refusal, Target};

/// Bytes on disk, not yet in place, with their digest and size.
pub(crate) struct Downloaded {
    pub(crate) file: NamedTempFile,
    pub(crate) digest: Digest,
    pub(crate) size: u64,
}

struct Sink<'a> {
    url: &'a str,
    file: NamedTempFile,
    hasher: Sha256,
    cap: ByteCap,
}

impl Sink<'_> {
    fn too_large(&self) -> FetchError {
        FetchError::TooLarge {
            url: self.url.to_owned(),
            max_bytes: self.cap.max(),
        }
    }

    /// Refuses a source whose declared size is already past the cap.
    fn expect(&self, length: Option<u64>) -> Result<(), FetchError> {
        self.cap.declared(length).map_err(|_| self.too_large())
    }

    fn write(&mut self, chunk: &[u8]) -> Result<(), FetchError> {
        if self.cap.count(chunk.len()).is_err() {
            return Err(self.too_large());
        }
        self.hasher.update(chunk);
        self.file
            .write_all(chunk)
            .map_err(|e| FetchError::io(self.file.path(), e))
    }

    fn finish(self) -> Result<Downloaded, FetchError> {
        // Durable before the rename, or a crash could leave a named blob with no bytes.
        self.file
            .as_file()
            .sync_all()
            .map_err(|e| FetchError::io(self.file.path(), e))?;
        Ok(Downloaded {
            file: self.file,
            digest: Digest(self.hasher.finalize().into()),
            size: self.cap.seen(),
        })
    }
}

pub(crate) async fn download(
    url: &str,
    target: Target,
    bearer: Option<&str>,
    tmp_dir: &Path,
    max_bytes: u64,
) -> Result<Downloaded, FetchError> {
    let file = NamedTempFile::new_in(tmp_dir).map_err(|e| FetchError::io(tmp_dir, e))?;
    let mut sink = Sink {
        url,
        file,
        hasher: Sha256::new(),
        cap: ByteCap::new(max_bytes),
    };
    match target {
        Target::File(path) => read_file(&path, &mut sink).await?,
        Target::ObjectStore(parsed) => read_object(url, &parsed, &mut sink).await?,
        Target::Http {
            url: parsed,
            domain,
            addrs,
        } => {
            get(url, parsed, domain, &addrs, bearer, &mut sink).await?;
        }
    }
    sink.finish()
}

/// Reads the source file `path` (canonical, so not named in errors: they name the URL).
async fn read_file(path: &Path, sink: &mut Sink<'_>) -> Result<(), FetchError> {
    let url = sink.url;
    let unreadable = |e| FetchError::File {
        url: url.to_owned(),
        problem: FileProblem::Unreadable(e),
    };
    let mut file = tokio::fs::File::open(path).await.map_err(unreadable)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).await.map_err(unreadable)?;
        if n == 0 {
            return Ok(());
        }
        sink.write(&buf[..n])?;
    }
}

async fn read_object(url: &str, parsed: &url::Url, sink: &mut Sink<'_>) -> Result<(), FetchError> {
    let failed = |e: object_store::Error| FetchError::ObjectStore {
        url: url.to_owned(),
        message: e.to_string(),
    };
    let (store, path) = crate::stores::object_store_for(parsed).map_err(failed)?;
    let got = store.get(&path).await.map_err(failed)?;
    sink.expect(Some(got.meta.size))?;
    let mut body = got.into_stream();
    while let Some(chunk) = body.next().await {
        sink.write(&chunk.map_err(failed)?)?;
    }
    Ok(())
}

async fn get(
    url: &str,
    parsed: url::Url,
    domain: Option<String>,
    addrs: &[std::net::SocketAddr],
    bearer: Option<&str>,
    sink: &mut Sink<'_>,
) -> Result<(), FetchError> {
    let request_error = |source| FetchError::Request {
        url: url.to_owned(),
        source,
    };
    // One client per fetch, pinned to the addresses the policy checked: with the name
    // resolved here, a DNS answer that changes between the check and the connect
    // (rebinding) cannot send us elsewhere. Connecting to the IP and setting `Host`
    // instead would break TLS (SNI and certificate checks use the URL's host), which the
    // override keeps intact. No proxy, since a proxy would resolve the name itself.
    let mut builder = crate::client::builder_for(url)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy();
    if let Some(domain) = &domain {
        builder = builder.resolve_to_addrs(domain, addrs);
    }
    let client = builder.build().map_err(request_error)?;
    let mut request = client.get(parsed);
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(request_error)?;
    let status = response.status();
    if status.is_redirection() {
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned())
            .unwrap_or_default();
        return Err(FetchError::Refused {
            url: url.to_owned(),
            reason: Refusal::Redirect(location),
        });
    }
    if !status.is_success() {
        return Err(FetchError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
        });
    }
    sink.expect(response.content_length())?;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        sink.write(&chunk.map_err(request_error)?)?;
    }
    Ok(())
}

/// Hashes a blob already on disk, off the async threads since it can be large.
pub(crate) async fn hash_file(path: &Path) -> std::io::Result<(Digest, u64)> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut file = std::fs::File::open(&path)?;
        let mut hasher = Sha256::new();
        let size = std::io::copy(&mut file, &mut hasher)?;
        Ok((Digest(hasher.finalize().into()), size))
    })
    .await
    .map_err(std::io::Error::other)?
}
