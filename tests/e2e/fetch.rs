//! End to end: what executors fetch by URL, through a running cluster. Modules by URL
//! (fetched once per executor, a bad one failing its tasks clearly), and each way a
//! fetch can go wrong ending the task as a `fetch_error` whose message says which: 404,
//! past the size cap, past the deadline, a connection cut mid-body (which leaves nothing
//! in the cache), and a cached blob changed on disk (refetched, not served). The server
//! is a real HTTP server on loopback that counts the requests for each path.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common;
use crate::common::{DevCluster, Origin, Reply, guests, sha256_hex};

/// The one task's error of a failed single-task job.
fn failure(cluster: &DevCluster, spec: Value) -> (String, String) {
    let job = cluster.run_job(spec);
    assert_eq!(job["state"], "failed", "{job}");
    let task = &cluster.tasks(&job)[0];
    (
        task["error"]["kind"].as_str().unwrap().to_owned(),
        task["error"]["message"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn a_module_by_url_is_fetched_once_per_executor_and_a_bad_one_fails_clearly() {
    let testkit = std::fs::read(&guests().testkit).unwrap();
    let server = Origin::start(&[
        ("/testkit.wasm", Reply::Body(testkit)),
        (
            "/garbage.wasm",
            Reply::Body(b"\0asm but not really".to_vec()),
        ),
    ]);
    // Another loopback origin, which the cluster does not allow.
    let elsewhere = Origin::start(&[]);
    let cluster = DevCluster::start_with(2, 1, &["--fetch-allow", &server.origin]);
    let module = server.url("/testkit.wasm");
    let run = || {
        let job = cluster.run_job(json!({
            "module": module,
            "args": ["echo"],
            "inputs": (0..10).map(|i| json!({"text": format!("input {i}")})).collect::<Vec<_>>(),
        }));
        assert_eq!(job["state"], "succeeded", "{job}");
        job
    };
    let first = run();
    assert_eq!(cluster.result(&first, 7), b"input 7");
    let ran_on: std::collections::BTreeSet<String> = cluster
        .tasks(&first)
        .iter()
        .map(|t| t["executor"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        server.hits("/testkit.wasm"),
        ran_on.len(),
        "one download per executor"
    );
    // Same URL, same timestamp: every executor has it compiled, nothing is fetched.
    run();
    assert_eq!(server.hits("/testkit.wasm"), ran_on.len());

    // The module's expected digest: a wrong one fails the task as a fetch error naming
    // both digests (one more download, nothing cached under the wrong name); the right
    // one runs.
    let wrong = "ab".repeat(32);
    let stamp = 4_102_444_800_000u64; // 2100-01-01: newer than the driver's first sight
    let (kind, message) = failure(
        &cluster,
        json!({"module": module, "module_sha256": wrong, "module_timestamp_ms": stamp,
               "args": ["noop"], "inputs": [{"text": ""}], "max_failures": 1}),
    );
    assert_eq!(kind, "fetch_error", "{message}");
    let testkit_sha = sha256_hex(&std::fs::read(&guests().testkit).unwrap());
    assert!(
        message.contains(&wrong) && message.contains(&testkit_sha),
        "names both digests: {message}"
    );
    let hits = server.hits("/testkit.wasm");
    assert_eq!(hits, ran_on.len() + 1);
    // A newer timestamp (and the right digest, given as `sha256:<hex>`): the executors
    // that run it fetch it again, once each; the CLI passes a URL on as it is.
    let before = server.hits("/testkit.wasm");
    let output = cluster.cli(&[
        "submit",
        &module,
        "--module-sha256",
        &format!("sha256:{testkit_sha}"),
        "--module-timestamp-ms",
        &(stamp + 1).to_string(),
        "--arg",
        "echo",
        "--input-text",
        "by url",
        "--wait",
        "--progress",
        "off",
    ]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "by url");
    assert_eq!(
        server.hits("/testkit.wasm"),
        before + 1,
        "one task, one executor"
    );
    // Digest and timestamp are for URLs: with an uploaded module's id they are refused.
    let id = cluster.upload(&guests().testkit);
    let (status, body) = cluster.post_raw(
        "/v1/jobs",
        json!({"module": id, "module_sha256": testkit_sha, "inputs": [{"text": ""}]}).to_string(),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("module_sha256"),
        "{body}"
    );

    // Bytes that are not wasm fail the task as invalid_module, not retried.
    let (kind, message) = failure(
        &cluster,
        json!({"module": server.url("/garbage.wasm"), "inputs": [{"text": ""}]}),
    );
    assert_eq!(kind, "invalid_module", "{message}");
    assert_eq!(server.hits("/garbage.wasm"), 1, "not retried");
    // A 404 and an origin the policy refuses are fetch errors naming the URL; the
    // refused origin is never contacted.
    let missing = server.url("/missing.wasm");
    let (kind, message) = failure(
        &cluster,
        json!({"module": missing, "inputs": [{"text": ""}], "max_failures": 1}),
    );
    assert_eq!(kind, "fetch_error", "{message}");
    assert!(
        message.contains(&missing) && message.contains("404"),
        "{message}"
    );
    let refused = elsewhere.url("/testkit.wasm");
    let (kind, message) = failure(
        &cluster,
        json!({"module": refused, "inputs": [{"text": ""}], "max_failures": 1}),
    );
    assert_eq!(kind, "fetch_error", "{message}");
    assert!(
        message.contains(&refused) && message.contains("refused"),
        "{message}"
    );
    assert_eq!(elsewhere.hits("/testkit.wasm"), 0);

    // What is neither an id nor a fetchable URL is refused at submit.
    for (module, kind) in [
        ("ftp://example.com/m.wasm", "invalid_module_id"),
        ("http://", "invalid_spec"),
        ("testkit.wasm", "invalid_module_id"),
    ] {
        let (status, body) = cluster.post_raw(
            "/v1/jobs",
            json!({"module": module, "inputs": [{"text": ""}]}).to_string(),
        );
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["kind"], kind, "{body}");
    }
}

/// The executor's fetch cache directory in a `flint dev` cluster.
fn cache_dir(cluster: &DevCluster, executor: &str) -> PathBuf {
    cluster
        .data_dir
        .path()
        .join("work/flint")
        .join(executor)
        .join("cache")
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn fetch_faults_end_tasks_as_clear_fetch_errors_and_leave_nothing_cached() {
    const CAP: usize = 1_000_000;
    let whole: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
    let server = Origin::start(&[
        ("/big", Reply::Body(vec![7u8; CAP + 1])),
        (
            "/slow",
            Reply::Trickle {
                total: 100,
                every: Duration::from_millis(50),
            },
        ),
        (
            "/cut",
            Reply::Cut {
                declared: whole.len(),
                sent: whole[..whole.len() / 2].to_vec(),
            },
        ),
    ]);
    let cluster = DevCluster::start_with(
        1,
        1,
        &[
            "--fetch-allow",
            &server.origin,
            &format!("--executor-arg=--fetch-max-bytes={CAP}"),
            "--executor-arg=--fetch-timeout-ms=1000",
        ],
    );
    let module = cluster.upload(&guests().testkit);
    let warm =
        cluster.run_job(json!({"module": module, "args": ["noop"], "inputs": [{"text": ""}]}));
    assert_eq!(warm["state"], "succeeded", "{warm}");
    let cache = cache_dir(&cluster, "exec-1");
    let blobs_before = entries(&cache.join("blobs"));
    assert_eq!(blobs_before.len(), 1, "the module: {blobs_before:?}");

    let input = |path: &str| {
        json!({
            "module": module,
            "args": ["echo"],
            "inputs": [{"url": server.url(path)}],
            "max_failures": 1,
        })
    };
    let cases = [
        ("/missing", "HTTP status 404".to_owned()),
        ("/big", format!("more than the {CAP}-byte limit")),
        ("/slow", "not done within the 1s deadline".to_owned()),
        // The body ended before its declared length.
        ("/cut", "before message length reached".to_owned()),
    ];
    for (path, why) in &cases {
        let started = std::time::Instant::now();
        let (kind, message) = failure(&cluster, input(path));
        assert_eq!(kind, "fetch_error", "{path}: {message}");
        assert!(
            message.contains(&server.url(path)) && message.contains(why.as_str()),
            "{path}: {message}"
        );
        // The deadline holds: a 5-second trickle is cut at 1 s.
        assert!(started.elapsed() < Duration::from_secs(4), "{path}");
        assert_eq!(server.hits(path), 1, "{path}: max_failures 1, one request");
    }
    // Nothing of the failed fetches stayed: no blob, no temp file.
    assert_eq!(entries(&cache.join("blobs")), blobs_before);
    assert!(entries(&cache.join("tmp")).is_empty());

    // The server heals: the same URL is fetched afresh (a failure is not remembered)
    // and the bytes are whole.
    server.set("/cut", Reply::Body(whole.clone()));
    let job = cluster.run_job(json!({
        "module": module,
        "args": ["echo"],
        "inputs": [{"url": server.url("/cut"), "sha256": sha256_hex(&whole)}],
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(cluster.result(&job, 0), whole);
    assert_eq!(server.hits("/cut"), 2);
}

#[test]
fn a_cached_blob_changed_on_disk_is_refetched_not_served() {
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 239) as u8).collect();
    let server = Origin::start(&[("/data.bin", Reply::Body(data.clone()))]);
    let cluster = DevCluster::start_with(1, 1, &["--fetch-allow", &server.origin]);
    let module = cluster.upload(&guests().testkit);
    let spec = json!({
        "module": module,
        "args": ["echo"],
        "inputs": [{"url": server.url("/data.bin")}],
    });
    let job = cluster.run_job(spec.clone());
    assert_eq!(cluster.result(&job, 0), data);
    assert_eq!(server.hits("/data.bin"), 1);
    let job = cluster.run_job(spec.clone());
    assert_eq!(cluster.result(&job, 0), data);
    assert_eq!(
        server.hits("/data.bin"),
        1,
        "the second job was served from the cache"
    );

    // Same size, other bytes, as a stray process (or a bad disk write) would leave it.
    let blob = cache_dir(&cluster, "exec-1")
        .join("blobs")
        .join(sha256_hex(&data));
    let mut corrupt = data.clone();
    corrupt[1000] ^= 0xff;
    std::fs::write(&blob, &corrupt).unwrap();
    // File times tick with the kernel's coarse clock; stamp the write a second later so
    // the test does not depend on when in a tick it ran.
    std::fs::File::options()
        .write(true)
        .open(&blob)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(1))
        .unwrap();
    let job = cluster.run_job(spec);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(
        cluster.result(&job, 0),
        data,
        "the corrupt bytes were served"
    );
    assert_eq!(server.hits("/data.bin"), 2, "refetched");
    assert_eq!(std::fs::read(&blob).unwrap(), data);
}

/// Whether any executor is excluded, and the figures that say so.
fn exclusions(cluster: &DevCluster) -> Vec<Value> {
    cluster
        .executors()
        .into_iter()
        .filter(|e| !e["excluded_for_ms"].is_null() || e["recent_task_failures"] != 0)
        .collect()
}

#[test]
fn a_job_whose_urls_answer_500_fails_on_its_own_budget_and_excludes_no_executor() {
    let paths: Vec<String> = (0..8).map(|i| format!("/broken-{i}")).collect();
    let routes: Vec<(&str, Reply)> = paths
        .iter()
        .map(|p| (p.as_str(), Reply::Status(500)))
        .collect();
    let server = Origin::start(&routes);
    let cluster = DevCluster::start_with(2, 1, &["--fetch-allow", &server.origin]);
    let module = cluster.upload(&guests().testkit);
    let inputs: Vec<Value> = paths
        .iter()
        .map(|p| json!({"url": server.url(p)}))
        .collect();
    let job = cluster.run_job(json!({"module": module, "args": ["echo"], "inputs": inputs}));
    assert_eq!(job["state"], "failed", "{job}");
    let failed = cluster
        .tasks(&job)
        .into_iter()
        .find(|t| t["state"] == "failed")
        .expect("a failed task");
    assert_eq!(failed["error"]["kind"], "fetch_error", "{failed}");
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&server.origin) && message.contains("HTTP status 500"),
        "{message}"
    );
    // Retried on the job's own budget (max_failures, 4), never held against the
    // executors: the server's answers are the job's problem.
    assert!(
        paths.iter().any(|p| server.hits(p) > 1),
        "retried at least once"
    );
    assert_eq!(exclusions(&cluster), Vec::<Value>::new());
    // Both executors take the next job at once.
    let started = std::time::Instant::now();
    let healthy = cluster.run_job(json!({
        "module": module, "args": ["echo"], "inputs": [{"text": "a"}, {"text": "b"}],
    }));
    assert_eq!(healthy["state"], "succeeded", "{healthy}");
    println!("healthy job after the failed one: {:?}", started.elapsed());
    assert_eq!(exclusions(&cluster), Vec::<Value>::new());
}

#[test]
fn a_jobs_url_at_the_drivers_own_origin_is_refused_and_never_carries_the_secret() {
    const SECRET: &str = "cluster-secret-for-the-deputy-test";
    // Auth is on only with a token: then the driver's downloads want the secret.
    const TOKEN: &str = "api-token-for-the-deputy-test";
    // A secured one-executor cluster at a known origin, whose operator may allow that
    // origin for jobs' URLs; a job there names the driver's own module route as input.
    let attempt = |allow_own_origin: bool| {
        let port = common::free_port();
        let origin = format!("http://127.0.0.1:{port}");
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec![
            "--listen",
            &listen,
            "--cluster-secret",
            SECRET,
            "--token",
            TOKEN,
        ];
        if allow_own_origin {
            args.extend(["--fetch-allow", origin.as_str()]);
        }
        let cluster = DevCluster::start_with(1, 1, &args);
        let module = cluster.upload(&guests().testkit);
        // The driver hands its own module out: that fetch carries the secret and works.
        let own =
            cluster.run_job(json!({"module": module, "args": ["noop"], "inputs": [{"text": ""}]}));
        assert_eq!(own["state"], "succeeded", "{own}");
        let route = format!("{origin}/v1/modules/{module}");
        let (kind, message) = failure(
            &cluster,
            json!({"module": module, "args": ["echo"], "inputs": [{"url": route}], "max_failures": 1}),
        );
        assert_eq!(kind, "fetch_error", "{message}");
        assert!(message.contains(&route), "{message}");
        assert_eq!(exclusions(&cluster), Vec::<Value>::new());
        message
    };
    // By default the driver's own origin is a loopback URL like any other.
    let message = attempt(false);
    assert!(
        message.contains("loopback"),
        "refused by the policy: {message}"
    );
    // An operator who allows it for jobs gets it fetched, but the route sees no secret
    // and refuses: the executor's credentials never serve a job's URL.
    let message = attempt(true);
    assert!(
        message.contains("HTTP status 401"),
        "the driver's route refused a request without the secret: {message}"
    );
}

#[test]
fn a_task_killed_while_its_input_is_still_being_fetched_gives_its_core_back_at_once() {
    let server = Origin::start(&[(
        "/trickle",
        Reply::Trickle {
            total: 100,
            every: Duration::from_millis(200),
        },
    )]);
    let cluster = DevCluster::start_with(1, 1, &["--fetch-allow", &server.origin]);
    let module = cluster.upload(&guests().testkit);
    let (status, job) = cluster.post_raw(
        "/v1/jobs",
        json!({"module": module, "args": ["echo"], "inputs": [{"url": server.url("/trickle")}]})
            .to_string(),
    );
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    common::wait_until(Duration::from_secs(10), "the fetch to start", || {
        server.hits("/trickle") == 1
    });
    let (status, killed) = cluster.post_raw(&format!("/v1/jobs/{id}/kill"), "");
    assert_eq!(status, 202, "{killed}");
    let started = std::time::Instant::now();
    // The 20-second trickle is dropped, not waited out.
    common::wait_until(Duration::from_secs(5), "the core to come back", || {
        cluster
            .executors()
            .iter()
            .all(|e| e["free_cores"] == e["cores"] && e["running"] == 0)
    });
    println!("core back {:?} after the kill", started.elapsed());
}

#[test]
fn a_deterministic_tasks_later_attempt_runs_the_bytes_its_first_attempt_pinned_or_fails() {
    let first_bytes = b"the bytes the first attempt read".to_vec();
    let server = Origin::start(&[("/in", Reply::Body(first_bytes.clone()))]);
    let cluster = DevCluster::driver(&["--fetch-allow".into(), server.origin.clone()]);
    let work = tempfile::tempdir().unwrap();
    let executor = |id: &str| {
        let dir = work.path().join(id);
        common::Process::spawn(&mut common::process::executor(
            &cluster.executor_url(),
            id,
            &dir,
        ))
    };
    let first = executor("first");
    cluster.wait_for_alive_executors(1);
    let module = cluster.upload(&guests().testkit);
    // A deterministic task whose input is a URL given without its sha256: what it ran is
    // known only from its attempt's pins.
    let id = cluster.submit(&json!({
        "module": module, "args": ["spin"], "deterministic": true,
        "inputs": [{"url": server.url("/in")}],
        "resources": {"timeout_ms": 120_000}, "max_failures": 3,
    }));
    common::wait_until(Duration::from_secs(30), "the first fetch", || {
        server.hits("/in") == 1
    });
    // The guest spins once its module is compiled: the executor burns CPU then.
    let cpu = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", first.id())).unwrap();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let fetched_at = cpu();
    common::wait_until(
        Duration::from_secs(60),
        "the first attempt spinning",
        || cpu() >= fetched_at + 30,
    );
    // The URL now serves other bytes, and the task moves to an executor that has not
    // fetched it: the first executor stops, withdrawing (and reporting) its attempt.
    let other_bytes = b"other bytes, served after the first attempt".to_vec();
    server.set("/in", Reply::Body(other_bytes.clone()));
    let _second = executor("second");
    cluster.wait_for_alive_executors(2);
    first.stop();
    let job = cluster.wait_for_job(&id, Duration::from_secs(60));
    let (kind, message) = {
        assert_eq!(job["state"], "failed", "{job}");
        let task = &cluster.tasks(&job)[0];
        (
            task["error"]["kind"].as_str().unwrap().to_owned(),
            task["error"]["message"].as_str().unwrap().to_owned(),
        )
    };
    assert_eq!(kind, "fetch_error", "{message}");
    for bytes in [&first_bytes, &other_bytes] {
        assert!(
            message.contains(&sha256_hex(bytes)),
            "names both: {message}"
        );
    }
    assert_eq!(server.hits("/in"), 2, "the second executor fetched it once");
}
