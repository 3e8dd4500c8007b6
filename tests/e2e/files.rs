//! End to end: a job's named files, uploaded once, mounted read-only at `/files/<name>`
//! for every task; nothing outside them is reachable and nothing in them is writable.

use serde_json::{Value, json};

use crate::common::{DevCluster, Origin, Reply, guests};

fn job_with_files(module: &str, files: Value, tasks: Vec<Vec<&str>>) -> Value {
    json!({
        "module": module,
        "files": files,
        "tasks": tasks.into_iter().map(|args| json!({"args": args})).collect::<Vec<_>>(),
    })
}

#[test]
fn job_files_are_readable_at_slash_files_by_modules_and_components() {
    let cluster = DevCluster::start(2, 1);
    let contents = b"the stop words: a an the\n".repeat(1000);
    let file = cluster.upload_file(contents.clone());
    for module in [&guests().testkit, &guests().testkit_component] {
        let module = cluster.upload(module);
        // Every task of a job sees the same bytes.
        let job = cluster.run_job(job_with_files(
            &module,
            json!({"stopwords.txt": file}),
            vec![vec!["read", "/files/stopwords.txt"]; 20],
        ));
        assert_eq!(job["state"], "succeeded", "{job}");
        for index in 0..20 {
            assert_eq!(cluster.result(&job, index), contents);
        }
        let job = cluster.run_job(job_with_files(
            &module,
            json!({"stopwords.txt": file}),
            vec![vec!["write", "/files/stopwords.txt"]],
        ));
        assert_eq!(job["state"], "failed", "read-only: {job}");
    }
}

#[test]
fn writes_and_escapes_fail_one_by_one() {
    let cluster = DevCluster::start(1, 1);
    let file = cluster.upload_file(b"read me".as_slice());
    let module = cluster.upload(&guests().testkit);
    for args in [
        vec!["write", "/files/data"],
        vec!["write", "/files/other"],
        vec!["read", "/files/../../etc/passwd"],
        vec!["read", "/files/./../files/../../proc/self/environ"],
    ] {
        let job = cluster.run_job(job_with_files(
            &module,
            json!({"data": file}),
            vec![args.clone()],
        ));
        let task = &cluster.tasks(&job)[0];
        assert_eq!(task["exit_code"], 1, "{args:?}: {task}");
    }
    let job = cluster.run_job(job_with_files(
        &module,
        json!({"data": file}),
        vec![vec!["read", "/files/data"]],
    ));
    assert_eq!(cluster.result(&job, 0), b"read me");
}

#[test]
fn bad_file_references_are_refused_by_name() {
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    let file = cluster.upload_file(b"x".as_slice());
    let unknown = format!("sha256:{}", "cd".repeat(32));
    for (files, kind, mentions) in [
        (
            json!({"../escape": file}),
            "invalid_spec",
            "is not a file name",
        ),
        (json!({"a/b": file}), "invalid_spec", "is not a file name"),
        (json!({"..": file}), "invalid_spec", "is not a file name"),
        // A plain string that is not a URL is taken for an id (a URL string is a URL:
        // `a_file_named_by_a_plain_url_string_is_fetched`).
        (
            json!({"ok.txt": "stopwords.txt"}),
            "invalid_spec",
            "is not a file id",
        ),
        (
            json!({"ok.txt": "ftp://example.com/x"}),
            "invalid_spec",
            "scheme `ftp` is not fetchable",
        ),
        (
            json!({"ok.txt": unknown}),
            "unknown_file",
            "PUT it to /v1/files",
        ),
    ] {
        let spec = job_with_files(&module, files, vec![vec!["noop"]]);
        let (status, body) = cluster.post_raw("/v1/jobs", spec.to_string());
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["kind"], kind, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(mentions),
            "{body}"
        );
    }
    let (status, body) = cluster.get(&format!("/v1/files/{unknown}"));
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (404, Some("file_not_found"))
    );
}

/// The API's first sketch wrote a file by URL as a plain string; it means what
/// `{"url": ...}` means.
#[test]
fn a_file_named_by_a_plain_url_string_is_fetched() {
    let words = b"a plain string, fetched\n".to_vec();
    let server = Origin::start(&[("/words.txt", Reply::Body(words.clone()))]);
    let cluster = DevCluster::start_with(1, 1, &["--fetch-allow", &server.origin]);
    let module = cluster.upload(&guests().testkit);
    let job = cluster.run_job(job_with_files(
        &module,
        json!({"words.txt": server.url("/words.txt")}),
        vec![vec!["read", "/files/words.txt"]],
    ));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(cluster.result(&job, 0), words);
    assert_eq!(server.hits("/words.txt"), 1);
}
