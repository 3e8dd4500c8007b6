//! Whose fault a failed fetch is, and that its message says which URL failed.

use super::*;

fn assert_names_the_source(err: &FetchError, url: &str) {
    assert_eq!(err.blame(), Blame::Source, "{err}");
    let message = err.to_string();
    assert!(message.contains(url), "{message}");
    assert!(!message.contains("cache at"), "{message}");
}

#[tokio::test]
async fn a_fifo_is_the_sources_fault_and_named_by_its_url_not_its_host_path() {
    // Regression: a FIFO under an allowed directory came back as `cache at <canonical
    // path>: not a regular file`, blaming the executor and naming a host path.
    let data = tempfile::tempdir().unwrap();
    let fifo = data.path().join("hidden-fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    std::os::unix::fs::symlink(&fifo, data.path().join("input")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = allowing(&format!("file://{}", data.path().display()));
    let cache = FetchCache::open(dir.path(), options).unwrap();

    let url = format!("file://{}/input", data.path().display());
    let err = cache.fetch(&key(&url), None, Trust::Job).await.unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::File {
                problem: FileProblem::NotRegular,
                ..
            }
        ),
        "{err}"
    );
    assert_names_the_source(&err, &url);
    assert!(!err.to_string().contains("hidden-fifo"), "{err}");
    assert!(!err.is_retryable());

    let missing = format!("file://{}/missing", data.path().display());
    let err = cache
        .fetch(&key(&missing), None, Trust::Job)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::File {
                problem: FileProblem::Unreadable(_),
                ..
            }
        ),
        "{err}"
    );
    assert_names_the_source(&err, &missing);
}

#[tokio::test]
async fn what_a_server_answers_or_sends_is_the_sources_fault() {
    let (origin, _) = serve_on("127.0.0.1", b"0123456789").await;
    let dir = tempfile::tempdir().unwrap();
    // Room for `blob-x`, not for `0123456789`.
    let options = FetchOptions {
        max_bytes: 8,
        ..allowing(&origin)
    };
    let cache = FetchCache::open(dir.path(), options).unwrap();

    let url = format!("{origin}/fail");
    let err = cache.fetch(&key(&url), None, Trust::Job).await.unwrap_err();
    assert!(
        matches!(err, FetchError::Status { status: 500, .. }),
        "{err}"
    );
    assert_names_the_source(&err, &url);
    assert!(err.is_retryable());

    let url = format!("{origin}/blob");
    let err = cache.fetch(&key(&url), None, Trust::Job).await.unwrap_err();
    assert!(matches!(err, FetchError::TooLarge { .. }), "{err}");
    assert_names_the_source(&err, &url);

    let url = format!("{origin}/b/x");
    let err = cache
        .fetch(&key(&url), Some(Digest::of(b"other")), Trust::Job)
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::DigestMismatch { .. }), "{err}");
    assert_names_the_source(&err, &url);

    let url = "http://10.0.0.1/x";
    let err = cache.fetch(&key(url), None, Trust::Job).await.unwrap_err();
    assert_names_the_source(&err, url);
}

#[tokio::test]
async fn an_unwritable_cache_directory_is_the_executors_fault() {
    let (origin, hits) = serve_on("127.0.0.1", b"module bytes").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = FetchCache::open(dir.path(), allowing(&origin)).unwrap();
    // A file where the temp directory was: tests may run as root, whom no mode stops.
    let tmp = dir.path().join("tmp");
    std::fs::remove_dir(&tmp).unwrap();
    std::fs::write(&tmp, b"").unwrap();

    let url = format!("{origin}/blob");
    let err = cache.fetch(&key(&url), None, Trust::Job).await.unwrap_err();
    assert!(
        matches!(&err, FetchError::Io { path, .. } if *path == tmp),
        "{err}"
    );
    assert_eq!(err.blame(), Blame::Executor);
    assert!(err.to_string().starts_with("cache at "), "{err}");
    // The temp file is made before any request, so the server never heard of it.
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}
