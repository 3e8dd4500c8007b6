//! Uploaded modules and files as the API stores and serves them: an upload is checked
//! against its tenant's storage limit, stored by digest, then owned (see [`super::tenancy`]
//! for who sees what); a download is opened to stream. Both touch the disk: an upload
//! runs off the runtime, a download's file is opened by tokio's.

use std::sync::Arc;

use bytes::Bytes;
use flint_protocol::Digest;
use flint_protocol::api::{CodedError, ErrorCode};

use super::Driver;
use super::reads::{Panicked, off_runtime};
use crate::admission::{Rejection, parse_module_id};
use crate::store::StoreError;
use crate::store::blobs::{ModuleError, ModuleInfo, ModuleStore};
use crate::tenants::Caller;

/// Why an upload was not stored (or, stored, not owned).
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// It would take the tenant past its `max_storage_bytes`.
    #[error("{0}")]
    Quota(Rejection),
    #[error(transparent)]
    Store(#[from] ModuleError),
    /// Stored, but its owner's row could not be written.
    #[error(transparent)]
    Owner(#[from] StoreError),
    #[error(transparent)]
    Panicked(#[from] Panicked),
}

impl CodedError for UploadError {
    fn code(&self) -> ErrorCode {
        match self {
            UploadError::Quota(r) => r.code,
            UploadError::Store(e) => e.code(),
            UploadError::Owner(e) => e.code(),
            UploadError::Panicked(e) => e.code(),
        }
    }

    fn message(&self) -> String {
        match self {
            UploadError::Store(e) => e.message(),
            other => other.to_string(),
        }
    }
}

/// Why an upload cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// Not a `sha256:<hex>` id.
    #[error("{0}")]
    BadId(Rejection),
    #[error("no {} {digest}", noun(.files))]
    NotFound { files: bool, digest: Digest },
    /// Known, but its bytes cannot be read: the driver's disk.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn noun(files: &bool) -> &'static str {
    match files {
        true => "file",
        false => "module",
    }
}

impl CodedError for DownloadError {
    fn code(&self) -> ErrorCode {
        match self {
            DownloadError::BadId(r) => r.code,
            DownloadError::NotFound { files: true, .. } => ErrorCode::FileNotFound,
            DownloadError::NotFound { files: false, .. } => ErrorCode::ModuleNotFound,
            DownloadError::Io(_) => ErrorCode::Storage,
        }
    }
}

impl Driver {
    /// The store of uploaded files (`files`) or modules.
    pub fn uploads(&self, files: bool) -> &ModuleStore {
        match files {
            true => &self.uploads.files,
            false => &self.uploads.modules,
        }
    }

    /// Stores `body` as a file (`files`) or a module uploaded by `caller`, shared with
    /// every tenant when the admin says `shared`: within the tenant's storage limit,
    /// stored, then owned.
    pub async fn upload(
        self: &Arc<Self>,
        caller: Caller,
        (files, shared): (bool, bool),
        body: Bytes,
    ) -> Result<(Digest, ModuleInfo), UploadError> {
        let driver = self.clone();
        off_runtime(move || {
            // Held from the check to the owner's row, for a tenant with a storage limit:
            // uploads side by side would each pass the check alone.
            let _quota = driver.upload_quota_lock(&caller);
            driver
                .check_upload_quota(&caller, files, &body)
                .map_err(UploadError::Quota)?;
            let (id, info) = driver.uploads(files).put(&body)?;
            // Stored, then owned: a crash between the two leaves bytes no tenant sees (the
            // uploader's retry owns them), never a tenant's bytes another sees.
            driver.record_upload(&caller, &id, files, shared)?;
            Ok((id, info))
        })
        .await?
    }

    /// Upload `id` (a file's when `files`, else a module's) opened to stream, and its
    /// length.
    pub async fn open_upload(
        &self,
        files: bool,
        id: &str,
    ) -> Result<(tokio::fs::File, u64), DownloadError> {
        let digest = parse_module_id(id).map_err(DownloadError::BadId)?;
        let store = self.uploads(files);
        if store.get(&digest).is_none() {
            return Err(DownloadError::NotFound { files, digest });
        }
        let file = tokio::fs::File::open(store.path(&digest)).await?;
        let len = file.metadata().await?.len();
        Ok((file, len))
    }
}
