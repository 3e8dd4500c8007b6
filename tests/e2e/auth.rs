//! End to end: the API token and the cluster secret guard every listener (API, executor
//! port, module downloads); refusals change nothing in the driver; a driver listening
//! beyond loopback will not start without them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::common::{DevCluster, FLINT, Process, guests, process, spec};

const TOKEN: &str = "api-token-for-tests";
const SECRET: &str = "cluster-secret-for-tests";

fn secured() -> DevCluster {
    DevCluster::start_with(2, 1, &["--token", TOKEN, "--cluster-secret", SECRET])
}

/// Status and error kind of a request sent with `bearer` (or none).
fn send(
    cluster: &DevCluster,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<String>,
) -> (u16, Value) {
    // A client of its own: the cluster's client carries the right token.
    let client = reqwest::blocking::Client::new();
    let mut request = client.request(method.parse().unwrap(), cluster.url(path));
    if let Some(bearer) = bearer {
        request = request.bearer_auth(bearer);
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().unwrap();
    let status = response.status().as_u16();
    if status == 401 {
        assert_eq!(
            response.headers()["www-authenticate"],
            "Bearer",
            "{method} {path}"
        );
    }
    (status, response.json().unwrap_or(Value::Null))
}

fn executor_with_secret(cluster: &DevCluster, id: &str, secret: Option<&str>) -> (i32, String) {
    let work_dir = tempfile::tempdir().unwrap();
    let mut command = process::executor(&cluster.executor_url(), id, work_dir.path());
    command.env_remove("FLINT_CLUSTER_SECRET");
    if let Some(secret) = secret {
        command.args(["--cluster-secret", secret]);
    }
    let output = command.output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn no_or_wrong_credentials_are_refused_on_every_listener_and_change_nothing() {
    let cluster = secured();
    let module = cluster.upload(&guests().testkit);
    let job_spec = spec(&module, &["echo"], &["x"]).to_string();
    let executors_before = cluster.executors();

    let module_path = format!("/v1/modules/{module}");
    let guarded: [(&str, &str, Option<String>); 11] = [
        ("GET", "/v1/jobs", None),
        ("POST", "/v1/jobs", Some(job_spec.clone())),
        ("PUT", "/v1/modules", Some("\0asm".into())),
        ("PUT", "/v1/files", Some("bytes".into())),
        ("GET", &module_path, None),
        ("GET", "/v1/executors", None),
        ("GET", "/metrics", None),
        ("POST", "/v1/jobs/job-x/kill", None),
        ("GET", "/v1/jobs/job-x/events", None),
        ("GET", "/v1/jobs/job-x/tasks/0/result", None),
        ("GET", "/v1/executors/exec-1/log", None),
    ];
    for (method, path, body) in &guarded {
        for bearer in [None, Some("wrong"), Some("")] {
            let (status, error) = send(&cluster, method, path, bearer, body.clone());
            assert_eq!(status, 401, "{method} {path} with {bearer:?}: {error}");
            assert_eq!(error["error"]["kind"], "unauthorized");
        }
    }
    // The cluster secret opens downloads only, not the API.
    let (status, _) = send(&cluster, "POST", "/v1/jobs", Some(SECRET), Some(job_spec));
    assert_eq!(status, 401);
    let (status, _) = send(&cluster, "GET", &module_path, Some(SECRET), None);
    assert_eq!(status, 200, "executors download modules with the secret");
    // ... and earlier results (for `results` inputs), but not a job's events or logs.
    let result = "/v1/jobs/job-x/tasks/0/result";
    let (status, error) = send(&cluster, "GET", result, Some(SECRET), None);
    assert_eq!(status, 404, "past auth: {error}");
    for path in ["/v1/jobs/job-x/events", "/v1/jobs/job-x/tasks/0/log"] {
        assert_eq!(
            send(&cluster, "GET", path, Some(SECRET), None).0,
            401,
            "{path}"
        );
    }
    // Open routes; the web UI's page only, not what is under it.
    assert_eq!(send(&cluster, "GET", "/healthz", None, None).0, 200);
    assert_eq!(send(&cluster, "GET", "/v1/openapi.json", None, None).0, 200);
    assert_eq!(send(&cluster, "GET", "/ui", None, None).0, 200);
    assert_eq!(send(&cluster, "GET", "/ui/x", None, None).0, 401);

    // The executor port: no secret, a wrong one.
    let (code, stderr) = executor_with_secret(&cluster, "intruder-1", None);
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("requires a cluster secret"), "{stderr}");
    let (code, stderr) = executor_with_secret(&cluster, "intruder-2", Some("wrong"));
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("wrong cluster secret"), "{stderr}");

    // Nothing changed: no job, the same executors, not re-registered.
    let (status, jobs) = cluster.get("/v1/jobs");
    assert_eq!(status, 200);
    assert_eq!(jobs["items"], Value::Array(vec![]), "{jobs}");
    let executors = cluster.executors();
    let ids = |list: &[Value]| -> Vec<(Value, Value)> {
        list.iter()
            .map(|e| (e["id"].clone(), e["generation"].clone()))
            .collect()
    };
    assert_eq!(ids(&executors), ids(&executors_before));

    // With the token, work runs: the executors fetched the module with the secret.
    let job = cluster.run_job(spec(&module, &["echo"], &["hello"]));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(cluster.result(&job, 0), b"hello");

    // The web UI's page opens without the token and holds none of the cluster's data;
    // the data it shows still needs the token.
    let page = reqwest::blocking::get(cluster.url("/ui")).unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let page = page.text().unwrap();
    assert!(page.contains("This driver needs its API token"));
    let id = job["id"].as_str().unwrap();
    for secret in [id, "exec-1", "hello", TOKEN, SECRET] {
        assert!(!page.contains(secret), "{secret} in the page");
    }
    let (status, error) = send(&cluster, "GET", "/v1/jobs", None, None);
    assert_eq!(status, 401, "{error}");
    let (status, _) = send(&cluster, "GET", &format!("/v1/jobs/{id}/tasks"), None, None);
    assert_eq!(status, 401);
}

#[test]
fn the_cli_sends_the_token_and_says_when_it_is_missing() {
    let cluster = secured();
    let without = Command::new(FLINT)
        .args(["executors", "--driver", &cluster.http])
        .env_remove("FLINT_TOKEN")
        .output()
        .unwrap();
    assert_eq!(without.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert!(stderr.contains("unauthorized"), "{stderr}");
    assert!(stderr.contains("FLINT_TOKEN"), "{stderr}");

    let with_env = Command::new(FLINT)
        .args(["executors", "--json", "--driver", &cluster.http])
        .env("FLINT_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        with_env.status.success(),
        "{}",
        String::from_utf8_lossy(&with_env.stderr)
    );
    let submitted = Command::new(FLINT)
        .arg("submit")
        .arg(&guests().testkit)
        .args(["--arg", "echo", "--input-text", "via the cli", "--wait"])
        .args(["--driver", &cluster.http, "--token", TOKEN])
        .env_remove("FLINT_TOKEN")
        .output()
        .unwrap();
    assert!(
        submitted.status.success(),
        "{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    assert!(String::from_utf8_lossy(&submitted.stdout).contains("via the cli"));
}

/// `flint driver` with `args` and none of the credentials the test's environment may hold.
fn driver(args: &[&str], data_dir: &Path) -> Command {
    let mut command = process::driver(args, data_dir);
    command
        .env_remove("FLINT_TOKEN")
        .env_remove("FLINT_CLUSTER_SECRET")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

#[test]
fn a_driver_beyond_loopback_needs_auth_or_insecure() {
    let exposed = ["--listen", "0.0.0.0:0", "--executor-listen", "127.0.0.1:0"];
    let data_dir = tempfile::tempdir().unwrap();
    let refused = driver(&exposed, data_dir.path()).output().unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("refusing to listen on 0.0.0.0"), "{stderr}");
    assert!(stderr.contains("--insecure"), "{stderr}");

    let data_dir = tempfile::tempdir().unwrap();
    let token_only = [&exposed[..], &["--token", TOKEN]].concat();
    let half = driver(&token_only, data_dir.path()).output().unwrap();
    assert_eq!(half.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&half.stderr).contains("--cluster-secret"));

    for started in [
        [&exposed[..], &["--insecure"]].concat(),
        [
            &exposed[..],
            &["--token", TOKEN, "--cluster-secret", SECRET],
        ]
        .concat(),
    ] {
        let data_dir = tempfile::tempdir().unwrap();
        let mut child = Process::spawn(&mut driver(&started, data_dir.path()));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        assert!(first.starts_with("http: http://0.0.0.0:"), "{first}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
