//! The cache against real HTTP servers on loopback addresses and real files.

mod blame;
mod trust;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Path as UrlPath;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use flint_protocol::Digest;

use super::*;

/// A server on `ip` (any of 127.0.0.0/8) counting every request it answers:
/// `/blob` is `body`, `/b/{name}` is `blob-{name}`, `/slow` trickles a byte every 50ms,
/// `/auth` is the `Authorization` header it was sent (or `none`), `/fail` answers 500,
/// `/redirect?to=URL` answers 302.
async fn serve_on(ip: &str, body: &'static [u8]) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = Router::new()
        .route("/blob", get(move || async move { body }))
        .route(
            "/b/{name}",
            get(|UrlPath(name): UrlPath<String>| async move { format!("blob-{name}") }),
        )
        .route(
            "/slow",
            get(|| async {
                let bytes = futures_util::stream::unfold(0u32, |n| async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    (n < 1000).then(|| (Ok::<_, std::io::Error>(Bytes::from_static(b"x")), n + 1))
                });
                Body::from_stream(bytes)
            }),
        )
        .route(
            "/auth",
            get(|headers: axum::http::HeaderMap| async move {
                headers
                    .get(header::AUTHORIZATION)
                    .map_or("none".to_owned(), |v| v.to_str().unwrap().to_owned())
            }),
        )
        .route("/fail", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
        .route(
            "/redirect",
            get(
                |axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>| async move {
                    (StatusCode::FOUND, [(header::LOCATION, q["to"].clone())]).into_response()
                },
            ),
        )
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                counted.fetch_add(1, Ordering::SeqCst);
                next.run(req)
            },
        ));
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), hits)
}

fn allowing(origin: &str) -> FetchOptions {
    let mut options = FetchOptions::default();
    options.policy.allow_origin(origin).unwrap();
    options
}

fn key(url: impl Into<String>) -> CacheKey {
    CacheKey {
        url: url.into(),
        timestamp_ms: 1,
    }
}

fn count(dir: &std::path::Path, sub: &str) -> usize {
    std::fs::read_dir(dir.join(sub)).unwrap().count()
}

#[tokio::test]
async fn concurrent_fetches_of_one_key_download_once() {
    let (origin, hits) = serve_on("127.0.0.1", b"module bytes").await;
    let url = format!("{origin}/blob");
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(FetchCache::open(dir.path(), allowing(&origin)).unwrap());
    let expected = Digest::of(b"module bytes");
    let fetches = (0..16).map(|_| {
        let (cache, key) = (cache.clone(), key(&url));
        tokio::spawn(async move { cache.fetch(&key, Some(expected), Trust::Job).await.unwrap() })
    });
    let results = futures_util::future::join_all(fetches).await;
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let misses = results.iter().filter(|r| !r.as_ref().unwrap().1).count();
    assert_eq!(misses, 1, "exactly one caller downloaded");
    let (fetched, _) = results[0].as_ref().unwrap();
    assert_eq!(std::fs::read(&fetched.path).unwrap(), b"module bytes");
    assert!(
        cache.lock_in_flight().is_empty(),
        "finished keys leave the map"
    );

    // A newer timestamp for the same URL is a new key.
    let newer = CacheKey {
        url,
        timestamp_ms: 2,
    };
    cache
        .fetch(&newer, Some(expected), Trust::Job)
        .await
        .unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn digest_mismatch_names_both_digests_and_leaves_nothing() {
    let (origin, _) = serve_on("127.0.0.1", b"other bytes").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = FetchCache::open(dir.path(), allowing(&origin)).unwrap();
    let expected = Digest::of(b"module bytes");
    let err = cache
        .fetch(&key(format!("{origin}/blob")), Some(expected), Trust::Job)
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains(&expected.to_string()), "{message}");
    assert!(message.contains(&Digest::of(b"other bytes").to_string()));
    assert_eq!(count(dir.path(), "blobs"), 0);
    assert_eq!(count(dir.path(), "tmp"), 0);
}

#[tokio::test]
async fn oversized_and_missing_bodies_are_errors() {
    let (origin, _) = serve_on("127.0.0.1", b"0123456789").await;
    let dir = tempfile::tempdir().unwrap();
    let options = FetchOptions {
        max_bytes: 4,
        ..allowing(&origin)
    };
    let cache = FetchCache::open(dir.path(), options).unwrap();
    let err = cache
        .fetch(&key(format!("{origin}/blob")), None, Trust::Job)
        .await
        .unwrap_err();
    assert!(
        matches!(err, FetchError::TooLarge { max_bytes: 4, .. }),
        "{err}"
    );
    let err = cache
        .fetch(&key(format!("{origin}/nothing")), None, Trust::Job)
        .await
        .unwrap_err();
    assert!(
        matches!(err, FetchError::Status { status: 404, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn forbidden_literal_addresses_and_local_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = FetchCache::open(dir.path(), FetchOptions::default()).unwrap();
    let cases = [
        ("http://127.0.0.1:9/x", AddressClass::Loopback),
        (
            "http://169.254.169.254/latest/meta-data/",
            AddressClass::LinkLocal,
        ),
        ("http://10.1.2.3/x", AddressClass::Private),
        ("http://192.168.0.1/x", AddressClass::Private),
        ("http://[::1]:9/x", AddressClass::Loopback),
        ("http://[::ffff:127.0.0.1]:9/x", AddressClass::Loopback),
        ("http://[::ffff:a9fe:a9fe]/x", AddressClass::LinkLocal),
        ("http://2130706433:9/x", AddressClass::Loopback),
        ("http://0.0.0.0:9/x", AddressClass::Unspecified),
        ("http://localhost:9/x", AddressClass::Loopback),
        ("http://[::127.0.0.1]:9/", AddressClass::Ipv4Compatible),
        ("http://198.18.0.1/", AddressClass::Benchmarking),
        ("http://[fec0::1]/", AddressClass::SiteLocal),
        ("http://[64:ff9b:1::1]/", AddressClass::Nat64Local),
        ("http://240.0.0.1/", AddressClass::Reserved),
        ("http://[64:ff9b::7f00:1]:9/", AddressClass::Loopback),
    ];
    // Refused before any connection: an attempt would have been a connect error (nothing
    // listens on these), and the test would see `Request`, not `Refused`.
    for (url, expected) in cases {
        let err = cache.fetch(&key(url), None, Trust::Job).await.unwrap_err();
        match &err {
            FetchError::Refused {
                reason: Refusal::Address { class, .. },
                ..
            } => assert_eq!(*class, expected, "{url}"),
            other => panic!("{url}: {other}"),
        }
        assert!(err.to_string().contains(&expected.to_string()), "{err}");
        assert!(!err.is_retryable());
        assert_eq!(err.blame(), Blame::Source);
    }
    for url in ["ftp://example.com/x", "file:///etc/passwd"] {
        let err = cache.fetch(&key(url), None, Trust::Job).await.unwrap_err();
        assert!(
            matches!(
                err,
                FetchError::Refused {
                    reason: Refusal::Scheme(_),
                    ..
                }
            ),
            "{url}: {err}"
        );
    }
}

#[tokio::test]
async fn a_loopback_server_is_reached_only_when_its_origin_is_allowed() {
    let (origin, hits) = serve_on("127.0.0.2", b"secret").await;
    let (other, _) = serve_on("127.0.0.1", b"").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = FetchCache::open(dir.path(), allowing(&other)).unwrap();
    let url = format!("{origin}/blob");
    let err = cache.fetch(&key(&url), None, Trust::Job).await.unwrap_err();
    assert!(matches!(err, FetchError::Refused { .. }), "{err}");
    assert_eq!(hits.load(Ordering::SeqCst), 0);

    cache.allow_origin(&origin).unwrap();
    let (fetched, hit) = cache.fetch(&key(&url), None, Trust::Job).await.unwrap();
    assert!(!hit);
    assert_eq!(std::fs::read(&fetched.path).unwrap(), b"secret");
    assert!(hits.load(Ordering::SeqCst) > 0);

    // A named host goes through the addresses checked at resolution.
    let (other_origin, other_hits) = serve_on("127.0.0.1", b"named").await;
    let other_port = other_origin.rsplit(':').next().unwrap();
    let named = format!("http://localhost:{other_port}/blob");
    assert!(cache.fetch(&key(&named), None, Trust::Job).await.is_err());
    cache
        .allow_origin(&format!("http://localhost:{other_port}"))
        .unwrap();
    let (fetched, _) = cache.fetch(&key(&named), None, Trust::Job).await.unwrap();
    assert_eq!(std::fs::read(&fetched.path).unwrap(), b"named");
    assert_eq!(other_hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_redirect_to_a_forbidden_address_is_refused_and_names_the_target() {
    let (forbidden, forbidden_hits) = serve_on("127.0.0.2", b"secret").await;
    let (allowed, allowed_hits) = serve_on("127.0.0.1", b"").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = FetchCache::open(dir.path(), allowing(&allowed)).unwrap();
    let target = format!("{forbidden}/blob");
    let err = cache
        .fetch(
            &key(format!("{allowed}/redirect?to={target}")),
            None,
            Trust::Job,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, FetchError::Refused { reason: Refusal::Redirect(to), .. } if *to == target),
        "{err}"
    );
    assert!(err.to_string().contains(&target), "{err}");
    assert_eq!(allowed_hits.load(Ordering::SeqCst), 1);
    assert_eq!(forbidden_hits.load(Ordering::SeqCst), 0);
    assert_eq!(count(dir.path(), "blobs"), 0);
}

#[tokio::test]
async fn file_urls_stay_inside_the_allowed_directory() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("inside.wasm"), b"inside").unwrap();
    std::fs::write(root.path().join("outside.wasm"), b"outside").unwrap();
    std::os::unix::fs::symlink(root.path().join("outside.wasm"), data.join("escape.wasm")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = allowing(&format!("file://{}", data.display()));
    let cache = FetchCache::open(dir.path(), options).unwrap();

    let inside = format!("file://{}/inside.wasm", data.display());
    let (fetched, _) = cache
        .fetch(&key(inside), Some(Digest::of(b"inside")), Trust::Job)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&fetched.path).unwrap(), b"inside");
    assert!(fetched.path.starts_with(dir.path().join("blobs")));

    for outside in [
        format!("file://{}/outside.wasm", root.path().display()),
        format!("file://{}/../outside.wasm", data.display()),
        format!("file://{}/escape.wasm", data.display()),
    ] {
        let err = cache
            .fetch(&key(&outside), None, Trust::Job)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                FetchError::Refused {
                    reason: Refusal::OutsideAllowedDirs(_),
                    ..
                }
            ),
            "{outside}: {err}"
        );
    }
    let err = cache
        .fetch(
            &key(format!("file://{}/", data.display())),
            None,
            Trust::Job,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::File {
                problem: FileProblem::NotRegular,
                ..
            }
        ),
        "a directory: {err}"
    );
    assert_eq!(count(dir.path(), "blobs"), 1);
}

#[tokio::test]
async fn a_trickling_server_misses_the_deadline_and_leaves_nothing() {
    let (origin, _) = serve_on("127.0.0.1", b"").await;
    let dir = tempfile::tempdir().unwrap();
    let options = FetchOptions {
        timeout: Duration::from_millis(300),
        ..allowing(&origin)
    };
    let cache = FetchCache::open(dir.path(), options).unwrap();
    let err = cache
        .fetch(&key(format!("{origin}/slow")), None, Trust::Job)
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::Deadline { .. }), "{err}");
    assert!(err.to_string().contains("deadline"), "{err}");
    assert!(err.is_retryable());
    assert_eq!(count(dir.path(), "blobs"), 0);
    assert_eq!(count(dir.path(), "tmp"), 0);

    // A caller that gives up first leaves nothing either, not even its key's lock.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(100),
        cache.fetch(&key(format!("{origin}/slow")), None, Trust::Job),
    )
    .await;
    assert!(gave_up.is_err());
    assert!(cache.lock_in_flight().is_empty());
    assert_eq!(count(dir.path(), "tmp"), 0);
}

#[tokio::test]
async fn eviction_takes_the_least_recently_used_unpinned_blob() {
    let (origin, _) = serve_on("127.0.0.1", b"").await;
    let dir = tempfile::tempdir().unwrap();
    let blob_len = "blob-a".len() as u64;
    let options = FetchOptions {
        max_cache_bytes: 2 * blob_len,
        ..allowing(&origin)
    };
    let cache = FetchCache::open(dir.path(), options).unwrap();
    let fetch = async |name: &str| {
        cache
            .fetch(&key(format!("{origin}/b/{name}")), None, Trust::Job)
            .await
    };

    let (a, _) = fetch("a").await.unwrap();
    let b_digest = fetch("b").await.unwrap().0.digest;
    let (c, _) = fetch("c").await.unwrap();
    // `a` is the least recently used but pinned, so `b` went instead.
    assert!(a.path.exists() && c.path.exists());
    assert!(!dir.path().join("blobs").join(b_digest.hex()).exists());
    assert!(!cache.lock_index().contains(&b_digest));
    assert_eq!(cache.lock_index().total_bytes(), 2 * blob_len);

    let a_path = a.path.clone();
    drop((a, c));
    fetch("d").await.unwrap();
    assert!(
        !a_path.exists(),
        "unpinned now, and the least recently used"
    );
    assert_eq!(count(dir.path(), "blobs"), 2);
}

#[tokio::test]
async fn a_reopened_cache_serves_earlier_fetches_without_the_network() {
    let (origin, hits) = serve_on("127.0.0.1", b"module bytes").await;
    let url = format!("{origin}/blob");
    let dir = tempfile::tempdir().unwrap();
    let expected = Digest::of(b"module bytes");
    let cache = FetchCache::open(dir.path(), allowing(&origin)).unwrap();
    cache
        .fetch(&key(&url), Some(expected), Trust::Job)
        .await
        .unwrap();
    drop(cache);
    std::fs::write(dir.path().join("tmp").join("left-by-a-crash"), b"partial").unwrap();

    let cache = FetchCache::open(dir.path(), allowing(&origin)).unwrap();
    assert_eq!(count(dir.path(), "tmp"), 0);
    let (fetched, hit) = cache
        .fetch(&key(&url), Some(expected), Trust::Job)
        .await
        .unwrap();
    assert!(hit);
    assert_eq!(std::fs::read(&fetched.path).unwrap(), b"module bytes");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_corrupt_blob_is_deleted_and_refetched() {
    let (origin, hits) = serve_on("127.0.0.1", b"module bytes").await;
    let url = format!("{origin}/blob");
    let dir = tempfile::tempdir().unwrap();
    let expected = Digest::of(b"module bytes");
    let cache = FetchCache::open(dir.path(), allowing(&origin)).unwrap();
    let path = cache
        .fetch(&key(&url), Some(expected), Trust::Job)
        .await
        .unwrap()
        .0
        .path;
    drop(cache);

    // Same size, other bytes: only hashing on first use after open can tell.
    std::fs::write(&path, b"MODULE BYTES").unwrap();
    let cache = FetchCache::open(dir.path(), allowing(&origin)).unwrap();
    let (fetched, hit) = cache
        .fetch(&key(&url), Some(expected), Trust::Job)
        .await
        .unwrap();
    assert!(!hit);
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert_eq!(std::fs::read(&fetched.path).unwrap(), b"module bytes");
    drop(fetched);

    // Same size, other bytes, without reopening: the modification time tells. File
    // times tick with the kernel's coarse clock (a few ms), so a rewrite right after the
    // download could carry the same time: stamp it as written a second later.
    std::fs::write(&path, b"MODULE BYTES").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(1))
        .unwrap();
    let (fetched, hit) = cache
        .fetch(&key(&url), Some(expected), Trust::Job)
        .await
        .unwrap();
    assert!(!hit);
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    assert_eq!(std::fs::read(&fetched.path).unwrap(), b"module bytes");
    drop(fetched);

    // A size change is noticed without reopening.
    std::fs::write(&path, b"module bytes, truncated or grown").unwrap();
    let (fetched, hit) = cache
        .fetch(&key(&url), Some(expected), Trust::Job)
        .await
        .unwrap();
    assert!(!hit);
    assert_eq!(hits.load(Ordering::SeqCst), 4);
    assert_eq!(std::fs::read(&fetched.path).unwrap(), b"module bytes");
    let (_, hit) = cache
        .fetch(&key(&url), Some(expected), Trust::Job)
        .await
        .unwrap();
    assert!(hit);
}

#[test]
fn the_cache_is_shareable_and_its_fetches_can_be_spawned() {
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    fn assert_send<T: Send>(_: &T) {}
    let dir = tempfile::tempdir().unwrap();
    let cache = FetchCache::open(dir.path(), FetchOptions::default()).unwrap();
    assert_send_sync(&cache);
    let key = key("http://example.invalid/");
    assert_send(&cache.fetch(&key, None, Trust::Job));
}
