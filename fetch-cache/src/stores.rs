//! Object stores by URL, for fetching `s3://` inputs and for the block store: one place
//! that turns `s3://bucket/prefix` or `file:///dir` into an object_store client and the
//! path under it.
//!
//! S3's endpoint, region and credentials are the operator's: they come from the usual
//! environment (`AWS_ENDPOINT`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP` for a plain-http endpoint such as a local
//! S3-compatible server), never from a job.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
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
            let store = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()?;
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
