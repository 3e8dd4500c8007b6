//! What a cache hit costs for a large blob: the time from `fetch` to a verified path
//! for a (URL, timestamp) already in the cache, for a 50 MB file (the figure).
//! The source is a `file://` URL under an allowed directory, so no server is timed;
//! after the one miss every fetch is a hit, and a hit never reads the blob's bytes
//! (one stat checks its size and modification time), so its cost should not grow with
//! the blob. Also printed: the miss, and the first hit after reopening the cache, which
//! hashes the blob once because nothing on disk is trusted after a restart.
//!
//! `cargo bench -p flint-fetch-cache --bench hit_latency [-- --mb 50 --hits 2000]`

use std::time::{Duration, Instant};

use flint_fetch_cache::{CacheKey, FetchCache, FetchOptions, Trust, UrlPolicy};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

fn main() {
    let mb = arg("--mb", 50);
    let hits = arg("--hits", 2000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let source = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let file = source.path().join("big.bin");
    let bytes: Vec<u8> = (0..mb * 1_000_000).map(|i| (i % 251) as u8).collect();
    std::fs::write(&file, &bytes).unwrap();
    let digest = flint_protocol::Digest::of(&bytes);
    drop(bytes);
    let options = || {
        let mut policy = UrlPolicy::default();
        policy
            .allow_origin(&format!("file://{}", source.path().display()))
            .unwrap();
        FetchOptions {
            policy,
            ..FetchOptions::default()
        }
    };
    let key = CacheKey {
        url: format!("file://{}", file.display()),
        timestamp_ms: 1,
    };
    runtime.block_on(async {
        let cache = FetchCache::open(cache_dir.path(), options()).unwrap();
        let t = Instant::now();
        let (_, hit) = cache.fetch(&key, Some(digest), Trust::Job).await.unwrap();
        let miss = t.elapsed();
        assert!(!hit);
        let mut times: Vec<Duration> = Vec::with_capacity(hits);
        for _ in 0..hits {
            let t = Instant::now();
            let (fetched, hit) = cache.fetch(&key, Some(digest), Trust::Job).await.unwrap();
            times.push(t.elapsed());
            assert!(hit && fetched.size == (mb * 1_000_000) as u64);
        }
        drop(cache);
        let cache = FetchCache::open(cache_dir.path(), options()).unwrap();
        let t = Instant::now();
        let (_, hit) = cache.fetch(&key, Some(digest), Trust::Job).await.unwrap();
        let reopened = t.elapsed();
        assert!(hit);
        times.sort();
        let pct = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!("fetch-cache hit latency, {mb} MB blob, {hits} hits (file:// source)");
        println!(
            "  hit: median {:.1} us, p99 {:.1} us, max {:.1} us",
            us(pct(0.5)),
            us(pct(0.99)),
            us(pct(1.0))
        );
        println!(
            "  miss (copy + SHA-256 + fsync + rename): {:.1} ms",
            miss.as_secs_f64() * 1e3
        );
        println!(
            "  first hit after reopening the cache (hashes the blob once): {:.1} ms",
            reopened.as_secs_f64() * 1e3
        );
    });
}
