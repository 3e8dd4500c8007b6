//! End to end against a real S3-compatible server (moto's server mode, a separate
//! process on loopback): task inputs, job files and modules fetched from `s3://` URLs,
//! inputs and files once per executor; a missing key as a clear `fetch_error`; and the
//! block store in a bucket (`--block-store s3://bucket/prefix`), written by the
//! executors directly and read back by the driver, byte-exact, after the executors that
//! wrote it are gone. With moto checking signatures against its IAM, credentials the
//! driver pushes (`--executor-credentials`) are the ones executors sign with, and a
//! rotation reaches running executors before their next write.
//!
//! The server is found through `FLINT_MOTO_SERVER` (scripts/test sets it) or at
//! `$CARGO_TARGET_DIR/venv-moto/bin/moto_server`; without it these tests fail and say
//! how to install it, rather than pass without having tested anything.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{
    DevCluster, Process, free_port, guests, sha256_hex, signal, splitmix_stream, wait_until,
};

/// A moto server on a free loopback port; killed on drop.
struct Moto {
    _server: Process,
    endpoint: String,
    http: reqwest::blocking::Client,
    _logs: tempfile::TempDir,
}

impl Moto {
    fn binary() -> PathBuf {
        if let Some(path) = std::env::var_os("FLINT_MOTO_SERVER") {
            return PathBuf::from(path);
        }
        // CARGO_TARGET_TMPDIR is `<target dir>/tmp`.
        Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("the target dir")
            .join("venv-moto/bin/moto_server")
    }

    fn start() -> Moto {
        Self::start_with(&[])
    }

    fn start_with(env: &[(&str, &str)]) -> Moto {
        let binary = Self::binary();
        assert!(
            binary.exists(),
            "no S3-compatible server for the S3 tests: {} does not exist. Run scripts/test \
             (it installs it), or: python3 -m venv $CARGO_TARGET_DIR/venv-moto && \
             $CARGO_TARGET_DIR/venv-moto/bin/pip install 'moto[server]>=5,<6' \
             (or point FLINT_MOTO_SERVER at a moto_server)",
            binary.display()
        );
        // moto_server cannot take port 0: find a free port, free it, hand it over. Another
        // process could take it in between; the readiness check below would then fail.
        let port = free_port();
        let logs = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(logs.path().join("moto.log")).unwrap();
        let mut command = Command::new(&binary);
        command
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log);
        // SAFETY: prctl only, between fork and exec: the server dies with the test even
        // when the test is killed before its destructors run.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = Process::spawn(&mut command);
        let endpoint = format!("http://127.0.0.1:{port}");
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .no_proxy()
            .build()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(logs.path().join("moto.log")).unwrap();
                panic!("moto_server exited ({status}) before it served:\n{log}");
            }
            // moto's own API: no S3 action, so not counted against
            // INITIAL_NO_AUTH_ACTION_COUNT.
            if http.get(format!("{endpoint}/moto-api/")).send().is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer in 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Moto {
            _server: child,
            endpoint,
            http,
            _logs: logs,
        }
    }

    /// What object_store's `AmazonS3Builder::from_env` reads, for the driver and the
    /// executors. moto checks no signatures, but object_store wants credentials to sign.
    fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", "flint-test"),
            ("AWS_SECRET_ACCESS_KEY", "flint-test-secret"),
            ("AWS_REGION", "us-east-1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// Plain path-style S3 requests: moto needs no signature, so the test's own view of
    /// the bucket does not go through the code under test.
    fn create_bucket(&self, bucket: &str) {
        let response = self
            .http
            .put(format!("{}/{bucket}", self.endpoint))
            .send()
            .unwrap();
        assert!(response.status().is_success(), "{:?}", response.text());
    }

    fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) {
        let response = self
            .http
            .put(format!("{}/{bucket}/{key}", self.endpoint))
            .body(bytes)
            .send()
            .unwrap();
        assert!(response.status().is_success(), "{:?}", response.text());
    }

    fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        let response = self
            .http
            .get(format!("{}/{bucket}/{key}", self.endpoint))
            .send()
            .unwrap();
        assert!(
            response.status().is_success(),
            "{key}: {}",
            response.status()
        );
        response.bytes().unwrap().to_vec()
    }

    /// The keys under `prefix` (ListObjectsV2; fewer than a page in these tests).
    fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let response = self
            .http
            .get(format!(
                "{}/{bucket}?list-type=2&prefix={prefix}",
                self.endpoint
            ))
            .send()
            .unwrap();
        assert!(response.status().is_success());
        let xml = response.text().unwrap();
        xml.split("<Key>")
            .skip(1)
            .map(|rest| rest.split("</Key>").next().unwrap().to_owned())
            .collect()
    }
}

/// Per executor, a counter from the driver's /metrics (reported by heartbeats).
fn per_executor(cluster: &DevCluster, metric: &str) -> BTreeMap<String, u64> {
    let (status, text) = cluster.get_bytes("/metrics");
    assert_eq!(status, 200);
    let prefix = format!("{metric}{{executor=\"");
    String::from_utf8(text)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (id, value) = rest.split_once("\"} ")?;
            Some((id.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// How many of a job's tasks ran on each executor.
fn tasks_per_executor(cluster: &DevCluster, job: &Value) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for task in cluster.tasks(job) {
        *counts
            .entry(task["executor"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    counts
}

/// Waits until every executor's heartbeat has reported the expected misses (each thing
/// downloaded once) and at least the expected hits: a task launched ahead while the
/// module is still compiling looks the module up again (a hit, nothing downloaded), so
/// how many more lookups there are is timing's (1 run in 5 saw 2 more per executor).
fn wait_for_fetches(
    cluster: &DevCluster,
    misses: &BTreeMap<String, u64>,
    hits: &BTreeMap<String, u64>,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now_misses = per_executor(cluster, "flint_executor_fetch_cache_misses_total");
        let now_hits = per_executor(cluster, "flint_executor_fetch_cache_hits_total");
        let matches = |want: &BTreeMap<String, u64>, got: &BTreeMap<String, u64>| {
            got.iter()
                .all(|(id, n)| *n == want.get(id).copied().unwrap_or(0))
        };
        let at_least = |want: &BTreeMap<String, u64>, got: &BTreeMap<String, u64>| {
            (want.iter()).all(|(id, n)| got.get(id).copied().unwrap_or(0) >= *n)
        };
        if matches(misses, &now_misses) && at_least(hits, &now_hits) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "fetch counters: misses {now_misses:?} (want {misses:?}), hits {now_hits:?} (want {hits:?})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn s3_inputs_and_files_are_fetched_once_per_executor_and_a_missing_key_names_its_url() {
    let moto = Moto::start();
    moto.create_bucket("flint-in");
    // Past the 1 MiB inline limit when echoed back: the result goes to the block store too.
    let input: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    moto.put("flint-in", "data/input.bin", input.clone());
    moto.put("flint-in", "data/words.txt", b"alpha\nbeta\n".to_vec());
    let cluster =
        DevCluster::start_with_env(2, 1, &["--fetch-allow", "s3://flint-in"], &moto.env());
    let module = cluster.upload(&guests().testkit);
    let input_url = "s3://flint-in/data/input.bin";
    let run = |tasks: usize| {
        let job = cluster.run_job(json!({
            "module": module,
            "files": {"words.txt": {"url": "s3://flint-in/data/words.txt"}},
            "args": ["echo"],
            "inputs": vec![json!({"url": input_url, "sha256": sha256_hex(&input)}); tasks],
        }));
        assert_eq!(job["state"], "succeeded", "{job}");
        job
    };
    let first = run(12);
    for index in [0, 11] {
        assert_eq!(
            sha256_hex(&cluster.result(&first, index)),
            sha256_hex(&input),
            "task {index}"
        );
    }
    // Each executor that ran tasks downloaded three things once: the module (from the
    // driver), the input and the file (from S3); every other task's input was a hit.
    let ran = tasks_per_executor(&cluster, &first);
    let misses: BTreeMap<String, u64> = ran.keys().map(|id| (id.clone(), 3)).collect();
    let mut hits: BTreeMap<String, u64> = ran.iter().map(|(id, n)| (id.clone(), n - 1)).collect();
    wait_for_fetches(&cluster, &misses, &hits);

    // The same URLs again (same driver timestamp): nothing downloaded, all hits. The
    // module is already compiled there and the job's files are fetched once per job.
    let second = run(6);
    for (id, n) in tasks_per_executor(&cluster, &second) {
        // A new job's files: one more (hit) per executor that runs it, plus its inputs.
        *hits.entry(id).or_default() += n + 1;
    }
    wait_for_fetches(&cluster, &misses, &hits);

    // A task reads the file that came from S3.
    let read = cluster.run_job(json!({
        "module": module,
        "files": {"words.txt": {"url": "s3://flint-in/data/words.txt"}},
        "args": ["read", "/files/words.txt"],
        "inputs": [{"text": ""}],
    }));
    assert_eq!(read["state"], "succeeded", "{read}");
    assert_eq!(cluster.result(&read, 0), b"alpha\nbeta\n");

    // A module by s3:// URL, fetched by the executors from the bucket.
    moto.put(
        "flint-in",
        "modules/testkit.wasm",
        std::fs::read(&guests().testkit).unwrap(),
    );
    let by_url = cluster.run_job(json!({
        "module": "s3://flint-in/modules/testkit.wasm",
        "args": ["echo"],
        "inputs": [{"text": "from a module in a bucket"}],
    }));
    assert_eq!(by_url["state"], "succeeded", "{by_url}");
    assert_eq!(cluster.result(&by_url, 0), b"from a module in a bucket");

    // A key that does not exist, and a bucket that is not allowed: fetch errors that name
    // the URL, and say why.
    for (url, why) in [
        ("s3://flint-in/data/missing.bin", "not found"),
        ("s3://other-bucket/data/input.bin", "refused"),
    ] {
        let job = cluster.run_job(json!({
            "module": module,
            "args": ["echo"],
            "inputs": [{"url": url}],
            "max_failures": 1,
        }));
        assert_eq!(job["state"], "failed", "{job}");
        let task = &cluster.tasks(&job)[0];
        assert_eq!(task["error"]["kind"], "fetch_error", "{task}");
        let message = task["error"]["message"].as_str().unwrap().to_lowercase();
        assert!(
            message.contains(url) && message.contains(why),
            "{url}: {message}"
        );
    }
}

#[test]
fn large_results_go_to_s3_and_come_back_byte_exact_after_their_executors_die() {
    // 12 MiB: past object_store's 10 MiB buffer, so each block is a multipart upload.
    const MIB: usize = 12;
    let moto = Moto::start();
    moto.create_bucket("flint-blocks");
    let cluster = DevCluster::start_with_env(
        2,
        1,
        &["--block-store", "s3://flint-blocks/results"],
        &moto.env(),
    );
    let module = cluster.upload(&guests().hashgen);
    let seeds = [1u64, 2, 3, 4];
    let job = cluster.run_job(json!({
        "module": module,
        "inputs": seeds.iter().map(|s| json!({"text": format!(r#"{{"seed": {s}, "mib": {MIB}}}"#)})).collect::<Vec<_>>(),
        "resources": {"memory_mb": 64},
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    let expected: Vec<String> = seeds
        .iter()
        .map(|&s| sha256_hex(&splitmix_stream(s, MIB)))
        .collect();
    let id = job["id"].as_str().unwrap();

    // The blocks are in the bucket, under the prefix, with the bytes the tasks wrote.
    let keys = moto.keys("flint-blocks", "results/");
    assert_eq!(keys.len(), seeds.len(), "{keys:?}");
    let by_sha: HashMap<String, String> = keys
        .iter()
        .map(|key| (sha256_hex(&moto.get("flint-blocks", key)), key.clone()))
        .collect();
    for (index, sha) in expected.iter().enumerate() {
        let key = by_sha
            .get(sha)
            .unwrap_or_else(|| panic!("task {index}: no object holds its bytes: {keys:?}"));
        assert!(key.starts_with(&format!("results/{id}/")), "{key}");
    }

    // A chained job reads one of them back from the bucket as its input.
    let chained = cluster.run_job(json!({
        "module": cluster.upload(&guests().testkit),
        "args": ["echo"],
        "inputs": [{"result": {"job": id, "task": 2}}],
    }));
    assert_eq!(chained["state"], "succeeded", "{chained}");
    assert_eq!(sha256_hex(&cluster.result(&chained, 0)), expected[2]);

    // Every executor gone: the driver streams the results from the bucket.
    // (`flint dev` launches replacements; they never held these results.)
    let executors = cluster.executors();
    for e in &executors {
        signal(e["pid"].as_u64().unwrap() as u32, libc::SIGKILL);
    }
    let killed: Vec<&Value> = executors.iter().map(|e| &e["id"]).collect();
    wait_until(Duration::from_secs(10), "the executors to be lost", || {
        cluster
            .executors()
            .iter()
            .filter(|e| killed.contains(&&e["id"]))
            .all(|e| e["state"] != "alive")
    });
    for (index, task) in cluster.tasks(&job).iter().enumerate() {
        let bytes = cluster.result(&job, index as u64);
        assert_eq!(bytes.len(), MIB << 20, "task {index}");
        assert_eq!(sha256_hex(&bytes), expected[index], "task {index}");
        assert_eq!(task["result"]["sha256"], expected[index].as_str(), "{task}");
    }
}

#[test]
fn deleting_a_job_deletes_its_blocks_in_the_bucket_and_retention_does_too() {
    let moto = Moto::start();
    moto.create_bucket("flint-blocks");
    // Results over 1 KiB go to the bucket; finished jobs go 3 s after they end.
    let cluster = DevCluster::start_with_env(
        1,
        2,
        &[
            "--block-store",
            "s3://flint-blocks/results",
            "--inline-result-bytes",
            "1024",
            "--job-retention",
            "3s",
        ],
        &moto.env(),
    );
    let module = cluster.upload(&guests().testkit);
    let spec = json!({"module": module, "args": ["print", "5000"], "inputs": [{"text": "a"}, {"text": "b"}]});
    let deleted = cluster.run_job(spec.clone());
    let retained = cluster.run_job(spec);
    let (deleted, retained) = (
        deleted["id"].as_str().unwrap().to_owned(),
        retained["id"].as_str().unwrap().to_owned(),
    );
    assert_eq!(
        moto.keys("flint-blocks", &format!("results/{deleted}/"))
            .len(),
        2
    );
    assert_eq!(
        moto.keys("flint-blocks", &format!("results/{retained}/"))
            .len(),
        2
    );

    // By request: its blocks go at once, the other job's stay.
    let response = cluster
        .client
        .delete(cluster.url(&format!("/v1/jobs/{deleted}")))
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 204);
    assert_eq!(
        moto.keys("flint-blocks", &format!("results/{deleted}/")),
        Vec::<String>::new()
    );
    assert_eq!(
        moto.keys("flint-blocks", &format!("results/{retained}/"))
            .len(),
        2
    );

    // By retention: nothing of the other job is left in the bucket either.
    wait_until(
        Duration::from_secs(30),
        "retention to delete the job",
        || cluster.get(&format!("/v1/jobs/{retained}")).0 == 404,
    );
    assert_eq!(moto.keys("flint-blocks", "results/"), Vec::<String>::new());
}

/// IAM in moto: a bucket, a user for the executors with two access keys and one for
/// the driver with one, each allowed S3 and IAM. Made with boto3 from moto's venv while
/// moto still lets unsigned requests through (INITIAL_NO_AUTH_ACTION_COUNT: exactly
/// these 8 actions); every request after them must be signed with a key that exists.
fn iam_keys(moto: &Moto, bucket: &str) -> Value {
    let script = r#"
import boto3, json, sys
endpoint, bucket = sys.argv[1:3]
kw = dict(endpoint_url=endpoint, region_name="us-east-1",
          aws_access_key_id="setup", aws_secret_access_key="setup")
boto3.client("s3", **kw).create_bucket(Bucket=bucket)
iam = boto3.client("iam", **kw)
policy = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": ["s3:*", "iam:*"], "Resource": "*"}]})
keys = {}
for user, n in (("executors", 2), ("driver", 1)):
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=policy)
    keys[user] = [iam.create_access_key(UserName=user)["AccessKey"] for _ in range(n)]
print(json.dumps({u: [{"id": k["AccessKeyId"], "secret": k["SecretAccessKey"]} for k in ks]
                  for u, ks in keys.items()}))
"#;
    serde_json::from_slice(&boto3(script, &[&moto.endpoint, bucket])).unwrap()
}

/// Runs a boto3 script with moto's venv's python; its stdout.
fn boto3(script: &str, args: &[&str]) -> Vec<u8> {
    let python = Moto::binary().with_file_name("python");
    let out = Command::new(&python)
        .args(["-c", script])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Deletes an access key, signed with another that may.
fn delete_key(moto: &Moto, with: &Value, user: &str, key: &Value) {
    let script = r#"
import boto3, sys
endpoint, kid, secret, user, victim = sys.argv[1:6]
iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                   aws_access_key_id=kid, aws_secret_access_key=secret)
iam.delete_access_key(UserName=user, AccessKeyId=victim)
"#;
    let id = |k: &Value| k["id"].as_str().unwrap().to_owned();
    let secret = with["secret"].as_str().unwrap();
    boto3(script, &[&moto.endpoint, &id(with), secret, user, &id(key)]);
}

fn write_credentials(path: &Path, key: &Value) {
    let json = json!({
        "Version": 1,
        "AccessKeyId": key["id"],
        "SecretAccessKey": key["secret"],
    });
    // As a refresher would: the whole file at once.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json.to_string()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

#[test]
fn pushed_credentials_sign_executor_writes_and_a_rotation_reaches_running_executors() {
    let moto = Moto::start_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "8")]);
    let keys = iam_keys(&moto, "flint-blocks");
    let (first, second) = (&keys["executors"][0], &keys["executors"][1]);
    let driver_key = &keys["driver"][0];
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials.json");
    write_credentials(&credentials, first);
    // The driver's own key is in the environment the executors inherit too: that they
    // sign with the pushed ones shows only when the pushed one stops working.
    let mut env = moto.env();
    for (k, v) in env.iter_mut() {
        match k.as_str() {
            "AWS_ACCESS_KEY_ID" => *v = driver_key["id"].as_str().unwrap().to_owned(),
            "AWS_SECRET_ACCESS_KEY" => *v = driver_key["secret"].as_str().unwrap().to_owned(),
            _ => {}
        }
    }
    let credentials_arg = credentials.to_str().unwrap().to_owned();
    let cluster = DevCluster::start_with_env(
        1,
        1,
        &[
            "--block-store",
            "s3://flint-blocks/results",
            "--inline-result-bytes",
            "1024",
            "--executor-credentials",
            &credentials_arg,
        ],
        &env,
    );
    let module = cluster.upload(&guests().testkit);
    let big = "x".repeat(64 << 10);
    let write_a_block = |cluster: &DevCluster| {
        cluster.run_job(json!({
            "module": module, "args": ["echo"], "inputs": [{"text": big}], "max_failures": 1,
        }))
    };
    let job = write_a_block(&cluster);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(cluster.result(&job, 0).len(), big.len());

    // The pushed key revoked: the executor's next write is refused, though the key in
    // its environment would still do.
    delete_key(&moto, driver_key, "executors", first);
    let refused = write_a_block(&cluster);
    assert_eq!(refused["state"], "failed", "{refused}");
    let task = &cluster.tasks(&refused)[0];
    assert!(
        task["error"].to_string().contains("InvalidAccessKeyId")
            || task["error"].to_string().contains("403"),
        "{task}"
    );

    // Rotated: the file changes, the driver pushes, the same executor's next write
    // signs with the new key.
    write_credentials(&credentials, second);
    let executor = cluster.executors()[0]["id"].clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    let job = loop {
        let job = write_a_block(&cluster);
        if job["state"] == "succeeded" || Instant::now() > deadline {
            break job;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(cluster.result(&job, 0).len(), big.len());
    assert_eq!(
        cluster.executors()[0]["id"],
        executor,
        "the same executor, not a new one"
    );
    assert_eq!(cluster.alive_executors(), 1);
}
