//! Every example in guest-examples/ run end to end on a real local cluster: grep over a
//! job's files, a large generated result checked by SHA-256, the C and Zig examples,
//! and wordcount as map + reduce through a chained job.

use serde_json::{Value, json};

use crate::common;
use crate::common::{DevCluster, c_wc, guests, sha256_hex, splitmix_stream, zig_sha256};

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap()
}

#[test]
fn grep_finds_lines_in_the_jobs_files_by_pattern_from_args_or_input() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().grep);
    let poem = cluster.upload_file("the needle\nhay\nNEEDLE again\n");
    let notes = cluster.upload_file("no match here\na needle too");
    let job = cluster.run_job(json!({
        "module": module,
        "files": {"poem.txt": poem, "notes.txt": notes},
        "tasks": [
            {"args": ["needle"]},
            {"args": ["-i", "needle", "poem.txt"]},
            {"input": {"text": "match\n"}},
            {"args": ["nothing-matches-this"]},
        ],
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(
        text(cluster.result(&job, 0)),
        "notes.txt:2:a needle too\npoem.txt:1:the needle\n"
    );
    assert_eq!(
        text(cluster.result(&job, 1)),
        "poem.txt:1:the needle\npoem.txt:3:NEEDLE again\n"
    );
    assert_eq!(text(cluster.result(&job, 2)), "notes.txt:1:no match here\n");
    assert_eq!(text(cluster.result(&job, 3)), "");
    let id = job["id"].as_str().unwrap();
    let (_, log) = cluster.get_bytes(&format!("/v1/jobs/{id}/tasks/1/log"));
    assert_eq!(text(log), "[task 1] 2 matching lines in 1 files\n");

    // A file the job does not have is the task's usage error, exit code 64.
    let job = cluster.run_job(json!({
        "module": module,
        "files": {"poem.txt": poem},
        "args": ["x", "missing.txt"],
        "inputs": [{"text": ""}],
    }));
    assert_eq!(job["state"], "failed", "{job}");
    let task = &cluster.tasks(&job)[0];
    assert_eq!(task["exit_code"], 64, "{task}");
    let (_, log) = cluster.get_bytes(&format!(
        "/v1/jobs/{}/tasks/0/log",
        job["id"].as_str().unwrap()
    ));
    assert!(
        text(log).contains("the job has no file `missing.txt`"),
        "{task}"
    );
}

#[test]
fn hashgen_large_results_arrive_intact() {
    // 12 MiB: under the 16 MiB inline cap results have today (the block store raises it).
    const MIB: usize = 12;
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(&guests().hashgen);
    let job = cluster.run_job(json!({
        "module": module,
        "inputs": [{"text": format!(r#"{{"seed": 42, "mib": {MIB}}}"#)},
                   {"text": r#"{"seed": 7, "mib": 1}"#}],
        "resources": {"memory_mb": 64},
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    let expected = sha256_hex(&splitmix_stream(42, MIB));
    let result = cluster.result(&job, 0);
    assert_eq!(result.len(), MIB << 20);
    assert_eq!(sha256_hex(&result), expected);
    let task = &cluster.tasks(&job)[0];
    assert_eq!(task["result"]["sha256"], expected.as_str(), "{task}");
    assert_eq!(task["result"]["size"], MIB << 20, "{task}");
    let id = job["id"].as_str().unwrap();
    let (_, log) = cluster.get_bytes(&format!("/v1/jobs/{id}/tasks/0/log"));
    assert_eq!(
        text(log),
        format!("[task 0] sha256 {expected} bytes {}\n", MIB << 20)
    );
    assert_eq!(cluster.result(&job, 1), splitmix_stream(7, 1));

    // Past the job's output cap the task fails as output_limit; bad input is exit 65.
    let job = cluster.run_job(json!({
        "module": module,
        "inputs": [{"text": r#"{"seed": 1, "mib": 2}"#}],
        "resources": {"max_output_bytes": 1 << 20},
    }));
    assert_eq!(cluster.tasks(&job)[0]["error"]["kind"], "output_limit");
    let job = cluster.run_job(json!({"module": module, "inputs": [{"text": "{\"seed\": -1}"}]}));
    assert_eq!(cluster.tasks(&job)[0]["exit_code"], 65);
}

#[test]
fn the_c_example_counts_its_input_and_the_jobs_files() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(c_wc());
    let data = cluster.upload_file("one two\nthree\n");
    let job = cluster.run_job(json!({
        "module": module,
        "files": {"data.txt": data},
        "tasks": [
            {"input": {"text": "a b  c\nd\n\n"}},
            {"args": ["data.txt", "data.txt"]},
        ],
    }));
    assert_eq!(
        text(cluster.result(&job, 0)),
        r#"{"lines":3,"words":4,"bytes":10}"#
    );
    assert_eq!(
        text(cluster.result(&job, 1)),
        r#"{"lines":4,"words":6,"bytes":28}"#
    );
    // A failing task fails its job, so the usage error gets a job of its own.
    let job = cluster
        .run_job(json!({"module": module, "args": ["absent.txt"], "inputs": [{"text": ""}]}));
    let task = &cluster.tasks(&job)[0];
    assert_eq!(task["exit_code"], 64, "{task}");
}

#[test]
fn the_zig_example_hashes_its_input() {
    let cluster = DevCluster::start(2, 1);
    let module = cluster.upload(zig_sha256());
    let big = "z".repeat(300_000);
    let job = cluster.run_job(json!({
        "module": module,
        "tasks": [
            {"input": {"text": "abc"}},
            {"input": {"text": big}},
            {"input": {"text": "abc"}, "args": ["--upper"]},
        ],
    }));
    assert_eq!(
        text(cluster.result(&job, 0)),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(text(cluster.result(&job, 1)), sha256_hex(big.as_bytes()));
    assert_eq!(
        text(cluster.result(&job, 2)),
        "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"
    );
    let id = job["id"].as_str().unwrap();
    let (_, log) = cluster.get_bytes(&format!("/v1/jobs/{id}/tasks/1/log"));
    assert_eq!(text(log), "sha256: task 1 hashed 300000 bytes\n");
    let job =
        cluster.run_job(json!({"module": module, "args": ["--bogus"], "inputs": [{"text": ""}]}));
    let task = &cluster.tasks(&job)[0];
    assert_eq!(task["exit_code"], 64, "{task}");
}

/// Map: wordcount over each section of examples/sample.txt. Reduce: wordcount-reduce
/// over the map job's results, which the reduce tasks read through the driver (a
/// `results` input: a chained job), never through this test; once through the HTTP API,
/// once through `flint submit --input-results`, as scripts/example does.
#[test]
fn wordcount_map_then_reduce_through_a_chained_job_equals_counting_the_whole_text() {
    let cluster = DevCluster::start(2, 1);
    let sample = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sample.txt"),
    )
    .unwrap();
    let sections: Vec<&str> = sample
        .split("\n\n")
        .filter(|s| !s.trim().is_empty())
        .collect();
    assert!(sections.len() >= 3, "the sample has sections");
    let map = cluster.upload(&guests().wordcount);
    let reduce = cluster.upload(&guests().wordcount_reduce);
    let inputs: Vec<Value> = sections.iter().map(|s| json!({"text": s})).collect();
    let map_job = cluster.run_job(json!({"name": "map", "module": map, "inputs": inputs}));
    assert_eq!(map_job["state"], "succeeded", "{map_job}");
    let map_id = map_job["id"].as_str().unwrap();
    let reduce_job = cluster.run_job(json!({
        "name": "reduce",
        "module": reduce,
        "tasks": [
            {"input": {"results": {"job": map_id}}},
            {"input": {"results": {"job": map_id}}, "args": ["--top", "3"]},
            // The first two sections only, the second one twice.
            {"input": {"results": {"job": map_id, "tasks": [0, 1, 1]}}},
        ],
    }));
    assert_eq!(reduce_job["state"], "succeeded", "{reduce_job}");
    let id = reduce_job["id"].as_str().unwrap();
    let (_, log) = cluster.get_bytes(&format!("/v1/jobs/{id}/tasks/0/log"));
    assert!(
        text(log).contains(&format!("summed {} counts", sections.len())),
        "the reduce read every map result"
    );

    let count = |text: &str| -> Value {
        let job = cluster.run_job(json!({"module": map, "inputs": [{"text": text}]}));
        serde_json::from_slice(&cluster.result(&job, 0)).unwrap()
    };
    let expected = count(&sample);
    let reduced: Value = serde_json::from_slice(&cluster.result(&reduce_job, 0)).unwrap();
    assert_eq!(reduced, expected);
    let top: Value = serde_json::from_slice(&cluster.result(&reduce_job, 1)).unwrap();
    let top = top.as_object().unwrap();
    assert_eq!(top.len(), 3, "{top:?}");
    let smallest_kept = top.values().map(|v| v.as_u64().unwrap()).min().unwrap();
    let dropped_larger = expected
        .as_object()
        .unwrap()
        .iter()
        .filter(|(word, _)| !top.contains_key(*word))
        .any(|(_, n)| n.as_u64().unwrap() > smallest_kept);
    assert!(!dropped_larger, "--top 3 kept {top:?}");
    let picked: Value = serde_json::from_slice(&cluster.result(&reduce_job, 2)).unwrap();
    let text_of_picked = format!("{}\n{}\n{}", sections[0], sections[1], sections[1]);
    assert_eq!(picked, count(&text_of_picked));

    // The CLI, as in scripts/example: the map job's results, one line per task in task
    // order, then a reduce of them to the ten most frequent words of the whole text.
    let output = std::process::Command::new(common::FLINT)
        .args(["results", "--driver", &cluster.http, "--wait", map_id])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let lines: Vec<Value> = text(output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), sections.len());
    assert_eq!(lines[1], count(sections[1]));
    let output = std::process::Command::new(common::FLINT)
        .args([
            "submit",
            "--driver",
            &cluster.http,
            "--wait",
            "--progress",
            "off",
        ])
        .arg(&guests().wordcount_reduce)
        .args(["--arg", "--top", "--arg", "10", "--input-results", map_id])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let top: Value = serde_json::from_slice(&output.stdout).unwrap();
    let top = top.as_object().unwrap();
    assert_eq!(top.len(), 10, "{top:?}");
    for (word, n) in top {
        assert_eq!(&expected[word], n, "{word}");
    }
}
