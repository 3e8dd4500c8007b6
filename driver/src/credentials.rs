//! Object-store credentials the driver hands its executors (Spark's delegation tokens):
//! read from `--executor-credentials`, a JSON file in the AWS `credential_process`
//! format (`{"Version": 1, "AccessKeyId": .., "SecretAccessKey": .., "SessionToken": ..,
//! "Expiration": ..}`), which whatever issues short-lived credentials rewrites (a
//! mounted Kubernetes Secret, an STS refresher, Vault's agent). The file is read again
//! when it changes and the new credentials go to every executor at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flint_protocol::messages::{Credentials, S3Credentials};
use serde::Deserialize;

use crate::service::Driver;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
struct ProcessCredentials {
    version: u32,
    access_key_id: String,
    secret_access_key: String,
    #[serde(default)]
    session_token: Option<String>,
    /// RFC 3339.
    #[serde(default)]
    expiration: Option<String>,
}

/// Reads and checks the file; errors name it and what is wrong, never its secrets.
pub fn read(path: &Path) -> anyhow::Result<Credentials> {
    let text = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("reading --executor-credentials {}: {e}", path.display()))?;
    parse(&text).map_err(|e| anyhow::anyhow!("--executor-credentials {}: {e}", path.display()))
}

fn parse(text: &[u8]) -> Result<Credentials, String> {
    // serde's message could quote a secret; where the problem is, is enough.
    let c: ProcessCredentials = serde_json::from_slice(text).map_err(|e| {
        format!(
            "not credential_process JSON ({{\"Version\": 1, \"AccessKeyId\": .., \"SecretAccessKey\": ..}}): \
             {:?} error at line {} column {}",
            e.classify(),
            e.line(),
            e.column()
        )
    })?;
    if c.version != 1 {
        return Err(format!("Version {} (only 1 is known)", c.version));
    }
    if c.access_key_id.is_empty() || c.secret_access_key.is_empty() {
        return Err("AccessKeyId and SecretAccessKey must not be empty".into());
    }
    let expires_at_ms = match &c.expiration {
        Some(at) => Some(
            chrono::DateTime::parse_from_rfc3339(at)
                .map_err(|e| format!("Expiration {at:?}: {e}"))?
                .timestamp_millis()
                .max(0) as u64,
        ),
        None => None,
    };
    Ok(Credentials {
        s3: Some(S3Credentials {
            access_key_id: c.access_key_id,
            secret_access_key: c.secret_access_key,
            session_token: c.session_token.filter(|t| !t.is_empty()),
            expires_at_ms,
        }),
    })
}

/// Loads the file now (an unreadable or invalid one stops the start), then pushes
/// every change to it until the driver stops. A later bad write keeps the last good
/// credentials and is logged.
pub fn watch(driver: &Arc<Driver>, path: PathBuf) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let first = read(&path)?;
    let last = std::fs::read(&path).unwrap_or_default();
    driver.set_credentials(first);
    let driver = driver.clone();
    Ok(crate::watched::watch(
        path,
        "executor credentials",
        last,
        move |text| {
            let credentials = parse(text)?;
            let key = credentials.s3.as_ref().map(|s| s.access_key_id.clone());
            tracing::info!(
                access_key_id = key,
                "executor credentials changed; pushing them"
            );
            driver.set_credentials(credentials);
            Ok(())
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_process_json_is_read_and_bad_files_are_named_without_secrets() {
        let c = parse(
            br#"{"Version":1,"AccessKeyId":"AKIA1","SecretAccessKey":"s3cr3t","SessionToken":"tok","Expiration":"2026-12-02T20:00:00Z"}"#,
        )
        .unwrap();
        let s3 = c.s3.unwrap();
        assert_eq!(s3.access_key_id, "AKIA1");
        assert_eq!(s3.session_token.as_deref(), Some("tok"));
        assert_eq!(s3.expires_at_ms, Some(1_796_241_600_000));
        assert!(!format!("{s3:?}").contains("s3cr3t"));
        let e = parse(br#"{"Version":2,"AccessKeyId":"a","SecretAccessKey":"b"}"#).unwrap_err();
        assert!(e.contains("Version 2"), "{e}");
        let e = parse(br#"{"Version":1,"AccessKeyId":"a","SecretAccessKey":"hunter2","Extra":1}"#)
            .unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(parse(br#"{"Version":1,"AccessKeyId":"","SecretAccessKey":"b"}"#).is_err());
    }
}
