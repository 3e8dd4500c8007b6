//! End to end: wasm32-wasip2 command components run under the same guest ABI, limits and
//! outcomes as preview-1 modules.

use serde_json::json;

use crate::common::{DevCluster, guests, spec};

#[test]
fn components_follow_the_same_abi_and_outcomes_as_modules() {
    let cluster = DevCluster::start(2, 1);
    let before = cluster.executors();
    let wordcount = cluster.upload(&guests().wordcount_component);
    let job = cluster.run_job(spec(&wordcount, &[], &["b a b", "Zürich zürich"]));
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(cluster.result(&job, 0), br#"{"a":1,"b":2}"#);
    assert_eq!(cluster.result(&job, 1), r#"{"zürich":2}"#.as_bytes());

    let testkit = cluster.upload(&guests().testkit_component);
    let job = cluster.run_job(json!({
        "name": "p2", "module": testkit, "args": ["env", "x"], "tasks": [{"args": ["y"]}],
    }));
    assert_eq!(job["state"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap();
    assert_eq!(
        String::from_utf8(cluster.result(&job, 0)).unwrap(),
        format!(
            "FLINT_ATTEMPT=1\nFLINT_JOB_ID={id}\nFLINT_TASK_COUNT=1\nFLINT_TASK_INDEX=0\nARGS=env x y\n"
        )
    );

    let echo = cluster.run_job(spec(&testkit, &["echo"], &["round trip"]));
    assert_eq!(cluster.result(&echo, 0), b"round trip");

    for (args, resources, kind, exit_code) in [
        // WASI 0.2's `exit` carries success or failure only: any non-zero code is 1.
        (vec!["exit", "3"], json!({}), "exit", json!(1)),
        (vec!["panic"], json!({}), "trap", json!(null)),
        (
            vec!["spin"],
            json!({"timeout_ms": 300}),
            "timeout",
            json!(null),
        ),
        (
            vec!["alloc", "512"],
            json!({"memory_mb": 32}),
            "memory_limit",
            json!(null),
        ),
        (
            vec!["print", "100000"],
            json!({"max_output_bytes": 1000}),
            "output_limit",
            json!(null),
        ),
        (vec!["recurse"], json!({}), "stack_overflow", json!(null)),
        (vec!["read", "/etc/passwd"], json!({}), "exit", json!(1)),
    ] {
        let mut job = spec(&testkit, &args, &[""]);
        job["resources"] = resources;
        let job = cluster.run_job(job);
        assert_eq!(job["state"], "failed", "{args:?}: {job}");
        let task = &cluster.tasks(&job)[0];
        assert_eq!(task["error"]["kind"], kind, "{args:?}: {task}");
        assert_eq!(task["exit_code"], exit_code, "{args:?}: {task}");
    }
    let after = cluster.executors();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a["state"], "alive", "{a}");
        assert_eq!((&a["pid"], &a["generation"]), (&b["pid"], &b["generation"]));
    }
}
