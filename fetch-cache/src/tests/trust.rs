//! Driver fetches against job fetches: who reaches the driver's origin, who carries its
//! bearer token, and that neither is handed the other's bytes.

use super::*;

/// A cache whose operator allowed `allowed` and which trusts `driver`, with a bearer
/// token for it: the way an executor sets itself up once it has registered.
fn cache_for_driver(dir: &Path, driver: &str, allowed: &[&str]) -> FetchCache {
    let mut options = FetchOptions::default();
    for origin in allowed {
        options.policy.allow_origin(origin).unwrap();
    }
    let cache = FetchCache::open(dir, options).unwrap();
    cache.trust_origin(driver).unwrap();
    cache.set_bearer(driver, "cluster-secret").unwrap();
    cache
}

fn read(fetched: &Fetched) -> String {
    std::fs::read_to_string(&fetched.path).unwrap()
}

#[tokio::test]
async fn the_bearer_goes_with_driver_fetches_to_its_origin_only() {
    let (driver, _) = serve_on("127.0.0.1", b"").await;
    let (other, _) = serve_on("127.0.0.2", b"").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for_driver(dir.path(), &driver, &[&other]);

    let (to_driver, _) = cache
        .fetch(&key(format!("{driver}/auth")), None, Trust::Driver)
        .await
        .unwrap();
    assert_eq!(read(&to_driver), "Bearer cluster-secret");
    // A driver fetch outside its trusted origins is just a URL: the operator allowed
    // this one, and it goes without the token.
    let (to_other, _) = cache
        .fetch(&key(format!("{other}/auth")), None, Trust::Driver)
        .await
        .unwrap();
    assert_eq!(read(&to_other), "none");
    // Same host, other port: another origin.
    let port = driver.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let next_port = format!("http://127.0.0.1:{}/auth", port + 1);
    assert!(cache.bearer_for(&next_port, Trust::Driver).is_none());
    assert!(cache.set_bearer("http://127.0.0.1:1/path", "x").is_err());
    assert!(matches!(
        cache.set_bearer(&other, "x"),
        Err(PolicyError::BearerUntrusted(_))
    ));
}

#[tokio::test]
async fn a_job_url_at_the_trusted_driver_origin_is_refused_before_connecting() {
    // The confused deputy: a job names the driver's result route, which the executor
    // used to fetch with the cluster secret.
    let (driver, hits) = serve_on("127.0.0.1", b"another job's result").await;
    let (unrelated, unrelated_hits) = serve_on("127.0.0.3", b"").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for_driver(dir.path(), &driver, &[]);

    let err = cache
        .fetch(&key(format!("{driver}/blob")), None, Trust::Job)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            FetchError::Refused {
                reason: Refusal::Address {
                    class: AddressClass::Loopback,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    // Nor may a driver fetch reach a loopback origin nobody trusted or allowed.
    let err = cache
        .fetch(&key(format!("{unrelated}/blob")), None, Trust::Driver)
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::Refused { .. }), "{err}");
    assert_eq!(unrelated_hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_job_url_at_an_origin_the_operator_allowed_goes_without_the_bearer() {
    let (driver, hits) = serve_on("127.0.0.1", b"").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for_driver(dir.path(), &driver, &[&driver]);
    let (fetched, _) = cache
        .fetch(&key(format!("{driver}/auth")), None, Trust::Job)
        .await
        .unwrap();
    assert_eq!(read(&fetched), "none");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_driver_fetch_is_never_a_cache_hit_for_a_job_of_the_same_key() {
    let (driver, hits) = serve_on("127.0.0.1", b"").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_for_driver(dir.path(), &driver, &[&driver]);
    let same = key(format!("{driver}/auth"));

    let (for_driver, hit) = cache.fetch(&same, None, Trust::Driver).await.unwrap();
    assert!(!hit);
    assert_eq!(read(&for_driver), "Bearer cluster-secret");
    let (for_job, hit) = cache.fetch(&same, None, Trust::Job).await.unwrap();
    assert!(!hit, "the job fetched for itself");
    assert_eq!(read(&for_job), "none");
    assert_eq!(hits.load(Ordering::SeqCst), 2);

    // Each is a hit for its own kind, after a restart too.
    drop((for_driver, for_job, cache));
    let cache = cache_for_driver(dir.path(), &driver, &[&driver]);
    let (for_job, hit) = cache.fetch(&same, None, Trust::Job).await.unwrap();
    assert!(hit);
    assert_eq!(read(&for_job), "none");
    let (for_driver, hit) = cache.fetch(&same, None, Trust::Driver).await.unwrap();
    assert!(hit);
    assert_eq!(read(&for_driver), "Bearer cluster-secret");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_trusted_bucket_is_reachable_by_driver_fetches_only() {
    let dir = tempfile::tempdir().unwrap();
    let cache = FetchCache::open(dir.path(), FetchOptions::default()).unwrap();
    cache.trust_origin("s3://results").unwrap();
    let err = cache
        .fetch(&key("s3://results/job-1/task-0"), None, Trust::Job)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            FetchError::Refused {
                reason: Refusal::Scheme(s),
                ..
            } if s == "s3"
        ),
        "{err}"
    );
    // What a driver fetch is judged by (admitting it here reads no bucket).
    let for_driver = cache.policy_for(Trust::Driver);
    assert!(matches!(
        for_driver.admit("s3://results/job-1/task-0").await,
        Ok(policy::Target::ObjectStore(_))
    ));

    let files = tempfile::tempdir().unwrap();
    for entry in [
        format!("file://{}", files.path().display()),
        "ftp://example.com".to_owned(),
    ] {
        assert!(
            matches!(
                cache.trust_origin(&entry),
                Err(PolicyError::NotTrustable(_))
            ),
            "{entry}"
        );
    }
}
