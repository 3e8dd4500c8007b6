//! Where a job's module and files come from: an upload by id (which the caller must be
//! able to see in the catalog) or a URL the executors fetch, with its digest and
//! timestamp checked for shape here and everything else left to the executors' URL
//! policy, where the fetch happens.

use flint_protocol::api::{ErrorCode, FileSpec, JobSpec};
use flint_protocol::{Digest, FileRef, ModuleRef};

use super::{Catalog, Rejection};

/// The job's module: an uploaded one by id, or a URL the executors fetch through their
/// fetch cache and URL policy (cached by (URL, timestamp) like files; its bytes are
/// checked as wasm where they are compiled, so a bad one fails its tasks as
/// `invalid_module`).
pub(super) fn module_ref(catalog: &impl Catalog, spec: &JobSpec) -> Result<ModuleRef, Rejection> {
    let module = spec.module.as_str();
    if module.starts_with("sha256:") {
        if spec.module_sha256.is_some() || spec.module_timestamp_ms.is_some() {
            return Err(Rejection::new(
                ErrorCode::InvalidSpec,
                "module_sha256 and module_timestamp_ms are for a module by URL; an uploaded module's id is already its digest",
            ));
        }
        let digest = parse_module_id(module)?;
        let info = catalog.module(&digest).ok_or_else(|| {
            Rejection::new(
                ErrorCode::UnknownModule,
                format!("no module {digest} has been uploaded; PUT it to /v1/modules first"),
            )
        })?;
        return Ok(ModuleRef {
            digest: Some(digest),
            url: format!("{}/v1/modules/{digest}", catalog.http_base()),
            timestamp_ms: info.timestamp_ms,
            size: Some(info.size),
        });
    }
    if !["http://", "https://", "s3://", "file://"]
        .iter()
        .any(|scheme| module.starts_with(scheme))
    {
        return Err(Rejection::new(
            ErrorCode::InvalidModuleId,
            format!(
                "module `{module}` is neither an uploaded module's id (`sha256:<hex>`) nor a URL (http://, https://, s3://, file://)"
            ),
        ));
    }
    check_url(module, "module")?;
    Ok(ModuleRef {
        digest: parse_sha256(spec.module_sha256.as_deref(), "module")?,
        url: module.to_owned(),
        timestamp_ms: catalog.url_timestamp(module, spec.module_timestamp_ms),
        // Never a size, wherever the URL points (the driver's own routes included): a
        // size marks a module the driver serves, which executors fetch with the cluster
        // secret (`ModuleRef::served_by_driver`).
        size: None,
    })
}

/// A job file: a safe name (it becomes a path under `/files`) and an uploaded file or a
/// URL.
pub(super) fn file_ref(
    catalog: &impl Catalog,
    name: &str,
    spec: &FileSpec,
) -> Result<FileRef, Rejection> {
    let safe = !name.is_empty()
        && name.len() <= 128
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !safe {
        return Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!(
                "files: `{name}` is not a file name: use 1-128 of A-Z a-z 0-9 . _ - (not `.` or `..`)"
            ),
        ));
    }
    // A plain string is an uploaded file's id, or a URL written as the API's first sketch
    // writes it: the same as `{"url": ...}` with no digest or timestamp.
    let (url, sha256, timestamp_ms) = match spec {
        FileSpec::Id(id) if !is_url(id) => return uploaded_file(catalog, name, id),
        FileSpec::Id(url) => (url, None, None),
        FileSpec::Url(u) => (&u.url, u.sha256.as_deref(), u.timestamp_ms),
    };
    let at = format!("files.{name}");
    check_url(url, &at)?;
    Ok(FileRef {
        name: name.to_owned(),
        digest: parse_sha256(sha256, &at)?,
        url: url.clone(),
        timestamp_ms: catalog.url_timestamp(url, timestamp_ms),
        // Never a size: that marks the driver's own uploads
        // (`FileRef::served_by_driver`), whatever this URL points at.
        size: None,
    })
}

/// Whether a job's string names a URL (of a scheme Flint fetches, or any other: a bad
/// scheme is then refused as such) rather than an uploaded id.
fn is_url(s: &str) -> bool {
    !s.starts_with("sha256:") && s.contains("://")
}

/// A job file given by the id of an upload.
fn uploaded_file(catalog: &impl Catalog, name: &str, id: &str) -> Result<FileRef, Rejection> {
    let digest = id.parse::<Digest>().map_err(|_| {
        Rejection::new(
            ErrorCode::InvalidSpec,
            format!("files.{name}: `{id}` is not a file id; upload the file with PUT /v1/files and use the `sha256:` id it returns"),
        )
    })?;
    let info = catalog.file(&digest).ok_or_else(|| {
        Rejection::new(
            ErrorCode::UnknownFile,
            format!("files.{name}: no file {digest} has been uploaded; PUT it to /v1/files first"),
        )
    })?;
    Ok(FileRef {
        name: name.to_owned(),
        digest: Some(digest),
        url: format!("{}/v1/files/{digest}", catalog.http_base()),
        timestamp_ms: info.timestamp_ms,
        size: Some(info.size),
    })
}

/// Only the shape is checked here; whether executors may fetch it is their URL policy's
/// call, made where the fetch happens.
pub(super) fn check_url(url: &str, at: &str) -> Result<(), Rejection> {
    match url::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https" | "s3" | "file") => Ok(()),
        Ok(u) => Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!(
                "{at}: scheme `{}` is not fetchable (http, https, s3, file)",
                u.scheme()
            ),
        )),
        Err(e) => Err(Rejection::new(
            ErrorCode::InvalidSpec,
            format!("{at}: `{url}` is not a URL: {e}"),
        )),
    }
}

pub(super) fn parse_sha256(hex: Option<&str>, at: &str) -> Result<Option<Digest>, Rejection> {
    hex.map(|h| {
        let h = h.strip_prefix("sha256:").unwrap_or(h);
        format!("sha256:{h}")
            .parse::<Digest>()
            .map_err(|e| Rejection::new(ErrorCode::InvalidSpec, format!("{at}.sha256: {e}")))
    })
    .transpose()
}

/// An uploaded module's (or file's) id, `sha256:<hex>`.
pub fn parse_module_id(id: &str) -> Result<Digest, Rejection> {
    id.parse::<Digest>()
        .map_err(|e| Rejection::new(ErrorCode::InvalidModuleId, e.to_string()))
}
