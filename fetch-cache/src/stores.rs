//! Object stores by URL, for fetching `s3://` inputs and for the block store: one place
//! that turns `s3://bucket/prefix` or `file:///dir` into an object_store client and the
//! path under it.
//!
//! S3's endpoint, region and credentials are the operator's: they come from the usual
//! environment (`AWS_ENDPOINT`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP` for a plain-http endpoint such as a local
//! S3-compatible server), never from a job. An executor whose driver pushes
//! credentials ([`expect_pushed_credentials`]) signs with the newest of those instead,
//! in every store it has made, so a rotation takes effect at the next request.

use std::sync::{Arc, RwLock};

use object_store::aws::{AmazonS3Builder, AwsCredential};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{CredentialProvider, ObjectStore};
use url::Url;

/// The store holding `url` and the object's (or prefix's) path in it.
pub fn object_store_for(url: &Url) -> object_store::Result<(Arc<dyn ObjectStore>, Path)> {
    let generic = |message: String| object_store::Error::Generic {
        store: "url",
        source: message.into(),
    };
    match url.scheme() {
        "s3" => {
            let bucket = url
                .host_str()
                .ok_or_else(|| generic(format!("{url}: no bucket")))?;
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
            if pushed_lock().is_some() {
                builder = builder.with_credentials(Arc::new(Pushed));
            }
            let store = builder.build()?;
            let path = Path::from_url_path(url.path())?;
            Ok((Arc::new(store), path))
        }
        "file" => {
            let dir = url
                .to_file_path()
                .map_err(|()| generic(format!("{url}: not a local path")))?;
            std::fs::create_dir_all(&dir).map_err(|e| generic(format!("{url}: {e}")))?;
            let store = LocalFileSystem::new_with_prefix(&dir)?;
            Ok((Arc::new(store), Path::default()))
        }
        other => Err(generic(format!(
            "{url}: scheme `{other}` is not an object store (use s3:// or file://)"
        ))),
    }
}

/// The credentials the driver pushed: `None` outside executors whose driver pushes
/// them; `Some(None)` until the first arrives.
static PUSHED: RwLock<Option<Option<Arc<AwsCredential>>>> = RwLock::new(None);

fn pushed_lock() -> Option<Option<Arc<AwsCredential>>> {
    PUSHED
        .read()
        .expect("pushed credentials lock poisoned")
        .clone()
}

/// From now on, S3 stores made in this process sign with the credentials given to
/// [`set_pushed_credentials`], never with the environment's.
pub fn expect_pushed_credentials() {
    let mut pushed = PUSHED.write().expect("pushed credentials lock poisoned");
    if pushed.is_none() {
        *pushed = Some(None);
    }
}

/// The newest credentials: every store, made before or after, uses them for its next
/// request.
pub fn set_pushed_credentials(key_id: String, secret_key: String, token: Option<String>) {
    *PUSHED.write().expect("pushed credentials lock poisoned") =
        Some(Some(Arc::new(AwsCredential {
            key_id,
            secret_key,
            token,
        })));
}

/// Reads [`PUSHED`] at each request.
#[derive(Debug)]
struct Pushed;

#[async_trait::async_trait]
impl CredentialProvider for Pushed {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        match pushed_lock() {
            Some(Some(credential)) => Ok(credential),
            _ => Err(object_store::Error::Generic {
                store: "S3",
                source: "no credentials yet: the driver pushes them (--executor-credentials) and has not sent any".into(),
            }),
        }
    }
}
