//! A driver that keeps what it should and no more, end to end on a real `flint dev`:
//! `DELETE /v1/jobs/{id}` and `flint delete` (409 while the job runs, 204, then 404),
//! retention deleting a finished job with its records, results, logs and blocks, a
//! chained job naming a deleted job refused with `unknown_result`, an upload still named
//! by a kept job surviving `--blob-retention` while an unused one goes, and finished
//! jobs served from the job store across a restart. The S3 block store's side is in
//! tests/e2e/s3.rs; the job store's tables are checked one by one in the driver's unit tests.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{DevCluster, guests, spec, wait_until};

fn delete(cluster: &DevCluster, id: &str) -> (u16, Value) {
    let response = cluster
        .client
        .delete(cluster.url(&format!("/v1/jobs/{id}")))
        .send()
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

/// The ids `GET /v1/jobs{query}` lists.
fn listed(cluster: &DevCluster, query: &str) -> Vec<String> {
    let (status, body) = cluster.get(&format!("/v1/jobs{query}"));
    assert_eq!(status, 200, "{query}: {body}");
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Every path under `dir` whose name holds `needle`.
fn paths_naming(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.to_string_lossy().contains(needle) {
                found.push(path.display().to_string());
            }
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    found
}

#[test]
fn a_running_job_is_not_deleted_a_finished_one_is_and_then_is_gone() {
    let cluster = DevCluster::start(1, 1);
    let module = cluster.upload(&guests().testkit);
    let running = cluster.submit(&spec(&module, &["sleep", "60000"], &["x"]));
    wait_until(Duration::from_secs(30), "the task to start", || {
        cluster.get(&format!("/v1/jobs/{running}")).1["counts"]["running"] == 1
    });
    let (status, body) = delete(&cluster, &running);
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["kind"], "job_running", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("kill it first"),
        "{body}"
    );
    let (status, _) = cluster.post_raw(&format!("/v1/jobs/{running}/kill"), "");
    assert_eq!(status, 202);
    let (status, body) = delete(&cluster, &running);
    assert_eq!(status, 204, "{body}");
    let (status, body) = cluster.get(&format!("/v1/jobs/{running}"));
    assert_eq!(status, 404);
    assert_eq!(body["error"]["kind"], "job_not_found");
    assert_eq!(delete(&cluster, &running).0, 404, "deleted once");
    assert_eq!(delete(&cluster, "job-none").0, 404);

    // The CLI: every job named, a failure for each one it could not delete.
    let a = cluster.run_job(spec(&module, &["echo"], &["a"]));
    let b = cluster.run_job(spec(&module, &["echo"], &["b"]));
    let (a, b) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());
    let out = cluster.cli(&["delete", a, b]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("deleted {a}")) && stdout.contains(&format!("deleted {b}")));
    let out = cluster.cli(&["delete", a]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("job_not_found"),
        "{out:?}"
    );
    let listed = cluster.get("/v1/jobs").1;
    assert_eq!(listed["items"].as_array().unwrap().len(), 0, "{listed}");
}

#[test]
fn retention_deletes_a_job_with_everything_it_had_and_keeps_uploads_kept_jobs_name() {
    // Finished jobs go 4 s after they end; uploads no kept job names, 1 s after upload.
    // Results over 1 KiB go to the block store (the driver's data dir).
    let cluster = DevCluster::start_with(
        1,
        2,
        &[
            "--job-retention",
            "4s",
            "--blob-retention",
            "1s",
            "--inline-result-bytes",
            "1024",
        ],
    );
    let module = cluster.upload(&guests().testkit);
    let unused = cluster.upload_wat(r#"(module (func (export "_start")))"#);
    // A block result, an inline one with a log, and a failed task with its log.
    let job = cluster.run_job(json!({
        "module": module,
        "tasks": [
            {"args": ["print", "5000"], "input": {"text": "x"}},
            {"args": ["eprint", "100"], "input": {"text": "y"}},
        ],
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    assert_eq!(cluster.result(&job, 0).len(), 5000);
    assert_eq!(
        cluster
            .get_bytes(&format!("/v1/jobs/{id}/tasks/1/log"))
            .1
            .len(),
        100
    );
    let blocks = paths_naming(cluster.data_dir.path(), &id);
    assert!(!blocks.is_empty(), "the 5,000-byte result is a block file");

    // Past the blob retention, the job still kept: its module stays, the unused one goes.
    wait_until(Duration::from_secs(20), "the unused module to go", || {
        cluster.get(&format!("/v1/modules/{unused}")).0 == 404
    });
    assert_eq!(
        cluster.get_bytes(&format!("/v1/modules/{module}")).0,
        200,
        "named by a kept job"
    );
    assert_eq!(cluster.get(&format!("/v1/jobs/{id}")).0, 200);

    // Past the job retention: nothing of the job is left, anywhere.
    wait_until(
        Duration::from_secs(30),
        "retention to delete the job",
        || cluster.get(&format!("/v1/jobs/{id}")).0 == 404,
    );
    for path in [
        format!("/v1/jobs/{id}/tasks"),
        format!("/v1/jobs/{id}/tasks/0/result"),
        format!("/v1/jobs/{id}/tasks/1/log"),
        format!("/v1/jobs/{id}/events"),
    ] {
        let (status, body) = cluster.get(&path);
        assert_eq!(status, 404, "{path}: {body}");
    }
    assert_eq!(
        paths_naming(cluster.data_dir.path(), &id),
        Vec::<String>::new(),
        "no file of the job is left in the data dir"
    );
    let listed = cluster.get("/v1/jobs").1;
    assert!(
        !listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["id"] == id.as_str()),
        "{listed}"
    );
    // Its module went with the last job that named it; uploading the same bytes
    // stores them again.
    wait_until(Duration::from_secs(20), "the module to go too", || {
        cluster.get(&format!("/v1/modules/{module}")).0 == 404
    });
    assert_eq!(cluster.upload(&guests().testkit), module);
    // A chained job naming the deleted job is refused as naming no job.
    let (status, body) = cluster.post_raw(
        "/v1/jobs",
        json!({"module": module, "args": ["echo"], "inputs": [{"result": {"job": id, "task": 0}}]})
            .to_string(),
    );
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (422, Some("unknown_result")),
        "{body}"
    );
    let metrics = String::from_utf8(cluster.get_bytes("/metrics").1).unwrap();
    assert!(metrics.contains("flint_jobs_deleted_total 1"), "{metrics}");
}

#[test]
fn finished_jobs_are_listed_filtered_and_served_from_the_store_after_a_restart() {
    let cluster = DevCluster::start(1, 2);
    let module = cluster.upload(&guests().testkit);
    let mut ids = Vec::new();
    for (name, args) in [("a", ["echo"]), ("b", ["echo"]), ("a", ["panic"])] {
        let job = cluster.run_job(json!({
            "name": name, "module": module, "args": args, "inputs": [{"text": name}],
        }));
        ids.push((job["id"].as_str().unwrap().to_owned(), job["state"].clone()));
    }
    assert_eq!(ids[2].1, "failed");
    let list = |query: &str| listed(&cluster, query);
    let id = |i: usize| ids[i].0.clone();
    assert_eq!(list(""), [id(2), id(1), id(0)]);
    assert_eq!(list("?name=a"), [id(2), id(0)]);
    assert_eq!(list("?state=failed"), [id(2)]);
    assert_eq!(list("?state=succeeded&name=a"), [id(0)]);
    assert_eq!(list("?state=running"), Vec::<String>::new());
    // Pages of one, each `next` the cursor of the following page.
    let (_, first) = cluster.get("/v1/jobs?limit=1");
    let next = first["next"].as_str().unwrap().to_owned();
    assert_eq!(list(&format!("?limit=1&after={next}")), [id(1)]);
    // Created after the first job: RFC 3339, inclusive.
    let created = cluster.get(&format!("/v1/jobs/{}", id(1))).1["created_at"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(list(&format!("?created_after={created}")), [id(2), id(1)]);
    assert_eq!(list(&format!("?created_before={created}")), [id(0)]);
    let (status, body) = cluster.get("/v1/jobs?created_after=yesterday");
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (400, Some("bad_query"))
    );

    // After a restart the finished jobs are served from the store, results and all.
    let restarted = cluster.restart(1, 2);
    assert_eq!(
        restarted.get("/v1/jobs").1["items"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let job = restarted.get(&format!("/v1/jobs/{}", id(1))).1;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(restarted.result(&job, 0), b"b");
    let metrics = String::from_utf8(restarted.get_bytes("/metrics").1).unwrap();
    assert!(
        metrics.contains("flint_jobs{state=\"succeeded\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("flint_jobs{state=\"failed\"} 1"),
        "{metrics}"
    );
}

#[test]
fn a_job_whose_results_a_live_job_reads_is_not_deleted_until_that_job_ends() {
    let cluster = DevCluster::start_with(1, 2, &["--inline-result-bytes", "1024"]);
    let module = cluster.upload(&guests().testkit);
    let source = cluster.run_job(spec(&module, &["print", "5000"], &["x"]));
    let source = source["id"].as_str().unwrap().to_owned();
    // Its 5,000-byte result is a block the reader's task fetches.
    let reader = cluster.submit(&json!({
        "module": module, "args": ["sleep", "60000"],
        "inputs": [{"result": {"job": source, "task": 0}}],
    }));
    let (status, body) = delete(&cluster, &source);
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (409, Some("job_in_use")),
        "{body}"
    );
    assert!(
        body["error"]["message"].as_str().unwrap().contains(&reader),
        "{body}"
    );
    let (status, _) = cluster.post_raw(&format!("/v1/jobs/{reader}/kill"), "");
    assert_eq!(status, 202);
    assert_eq!(delete(&cluster, &source).0, 204);
}
