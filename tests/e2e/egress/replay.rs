//! Recorded egress: a deterministic task's responses are kept with its attempt, and
//! `flint replay` serves them again with the server gone, byte for byte; a replay whose
//! guest asks for another URL stops naming both; a job's recordings stop at the driver's
//! `--egress-record-max-bytes`.

use serde_json::{Value, json};

use super::{cluster, job, names, response_line, succeeded};
use crate::common::{DevCluster, Origin, Reply, guests, sha256_hex};

/// A deterministic job of one task making `count` GETs of `url`, one after another.
fn calls(module: &str, url: &str, count: u32, allow: &str) -> Value {
    let mut spec = job(module, &["http-n", url, &count.to_string()], "", &[allow]);
    spec["deterministic"] = json!(true);
    spec
}

/// `flint replay` with `args`: (exit code, stdout, stderr).
fn replay(cluster: &DevCluster, args: &[&str]) -> (i32, Vec<u8>, String) {
    let out = cluster.cli(&[&["replay"], args].concat());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), out.stdout, stderr)
}

#[test]
fn three_calls_replay_byte_for_byte_with_the_server_stopped_and_another_url_stops_naming_it() {
    let body = b"an answer worth recording".to_vec();
    let server = Origin::start(&[("/n", Reply::Body(body.clone()))]);
    let url = server.url("/n");
    let cluster = cluster(&[&server.origin]);
    let module = cluster.upload(&guests().testkit);
    let ran = cluster.run_job(calls(&module, &url, 3, &server.origin));
    let (text, task) = succeeded(&cluster, &ran);
    assert_eq!(text, response_line(200, &body).repeat(3));
    assert_eq!(server.log().len(), 3);

    // The attempt's pins list the three requests, in order, with what each got.
    let pins = &task["history"][0]["pins"]["egress"];
    let pins = pins
        .as_array()
        .unwrap_or_else(|| panic!("no egress pins in {task}"));
    assert_eq!(pins.len(), 3, "{task}");
    for pin in pins {
        assert_eq!(
            (&pin["method"], &pin["url"], &pin["status"]),
            (&json!("GET"), &json!(url), &json!(200)),
            "{pin}"
        );
        assert_eq!(pin["request_sha256"], format!("sha256:{}", sha256_hex(b"")));
    }

    server.stop();
    assert!(
        std::net::TcpStream::connect(server.origin.trim_start_matches("http://")).is_err(),
        "the server is gone"
    );
    let id = ran["id"].as_str().unwrap();
    let (code, stdout, stderr) = replay(&cluster, &[id, "0"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, text.as_bytes(), "{stderr}");
    names(&stderr, &["the same result as the recorded attempt"]);

    // The bundle says what was recorded and under which grant.
    let out = cluster.cli(&["replay", id, "0", "--bundle"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut bundle: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        bundle["network"]["allow"],
        json!([server.origin]),
        "{bundle}"
    );
    assert_eq!(bundle["egress"].as_array().unwrap().len(), 3, "{bundle}");
    let tape = bundle["egress_tape"]["url"].as_str().unwrap().to_owned();
    let block = format!("/v1/blocks/{id}/0-1-");
    assert!(
        tape.starts_with(&block) && tape.ends_with(".egress"),
        "{tape}"
    );

    // The same bundle with the guest given another URL: it asks for what the attempt
    // never did, and the replay stops there, naming both.
    let other = server.url("/other");
    let args = bundle["args"].as_array_mut().unwrap();
    let at = args.iter().position(|a| a == &json!(url)).unwrap();
    args[at] = json!(other);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), bundle.to_string()).unwrap();
    let (code, _, stderr) = replay(&cluster, &["--from", file.path().to_str().unwrap()]);
    assert_eq!(code, 3, "{stderr}");
    names(
        &stderr,
        &[
            &format!("the guest asked for GET {other}"),
            &format!("the attempt's request 1 was GET {url}"),
            "not what the attempt did",
        ],
    );
}

#[test]
fn a_jobs_recordings_past_egress_record_max_bytes_fail_the_attempt_naming_the_flag() {
    let server = Origin::start(&[("/big", Reply::Body(vec![b'x'; 4000]))]);
    let url = server.url("/big");
    let cluster = DevCluster::start_with(
        1,
        1,
        &[
            "--egress-allow",
            &server.origin,
            "--egress-record-max-bytes",
            "6000",
        ],
    );
    let module = cluster.upload(&guests().testkit);
    // Two tasks, each recording a 4,000-byte response: the first tape fits under the
    // job's 6,000 bytes, the second would take the job past them.
    let mut spec = calls(&module, &url, 1, &server.origin);
    spec["inputs"] = json!([{"text": ""}, {"text": ""}]);
    let ended = cluster.run_job(spec);
    assert_eq!(ended["state"], "failed", "{ended}");
    let tasks = cluster.tasks(&ended);
    let refused: Vec<&Value> = tasks.iter().filter(|t| t["state"] == "failed").collect();
    assert_eq!(
        refused.len(),
        1,
        "one tape fits, the other does not: {tasks:?}"
    );
    let error = &refused[0]["error"];
    assert_eq!(error["kind"], "host_error", "{error}");
    names(
        error["message"].as_str().unwrap(),
        &["--egress-record-max-bytes 6000", "recorded responses"],
    );
}
