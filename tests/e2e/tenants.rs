//! Tenants on one real `flint dev`: what another tenant can see and touch (nothing, on
//! any route of the OpenAPI document, nor its load in the cluster's views), quotas, each
//! one's share of the event streams, fair shares and preemption.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

const ADMIN: &str = "admin-token";
const A: &str = "token-of-a";
const B: &str = "token-of-b";

/// `flint hash-token`, the way an operator makes a tenants file.
fn hash(token: &str) -> String {
    let mut child = Command::new(FLINT)
        .arg("hash-token")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{token}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(line.starts_with("sha256:") && line.len() == 71, "{line}");
    line
}

/// A tenants file with tenants `a` and `b` (b's limits as given, in TOML).
fn write_tenants(path: &Path, b_limits: &str) {
    let text = format!(
        "[[tenant]]\nname = \"a\"\ntokens = [\"{}\"]\n\n\
         [[tenant]]\nname = \"b\"\ntokens = [\"{}\"]\nmax_priority = 1\n[tenant.limits]\n{b_limits}\n",
        hash(A),
        hash(B)
    );
    std::fs::write(path, text).unwrap();
}

struct Shared {
    cluster: DevCluster,
    a: Api,
    b: Api,
    _dir: tempfile::TempDir,
    file: PathBuf,
}

fn start(executors: u32, cores: u32, b_limits: &str, more: &[&str]) -> Shared {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    write_tenants(&file, b_limits);
    let mut args = vec![
        "--token",
        ADMIN,
        "--cluster-secret",
        "secret",
        "--tenants",
        file.to_str().unwrap(),
    ];
    args.extend(more);
    let cluster = DevCluster::start_with(executors, cores, &args);
    let a = Api::new(cluster.http.clone(), Some(A.into()));
    let b = Api::new(cluster.http.clone(), Some(B.into()));
    Shared {
        cluster,
        a,
        b,
        _dir: dir,
        file,
    }
}

/// Sends `method path` as `api` with `body`: (status, JSON body or null).
fn call(api: &Api, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
    let mut request = api.client.request(method.clone(), api.url(path));
    if method == reqwest::Method::POST {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    } else if method == reqwest::Method::PUT {
        request = request.body(b"not wasm, and not A's bytes".to_vec());
    }
    // An event stream answers at once with its head; its body never ends.
    let response = request.timeout(Duration::from_secs(5)).send().unwrap();
    let status = response.status().as_u16();
    if response
        .headers()
        .get("content-type")
        .is_some_and(|t| t.to_str().unwrap_or("").starts_with("text/event-stream"))
    {
        return (status, Value::Null);
    }
    let bytes = response.bytes().unwrap_or_default();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, json)
}

#[test]
fn tenant_b_can_neither_see_nor_touch_any_of_tenant_as_objects_on_any_route() {
    let s = start(1, 2, "", &["--inline-result-bytes", "1000"]);
    // A's objects: a module, a file, a deterministic job with a block result, logs and a
    // timeline.
    let module = s.a.upload(&guests().testkit);
    let file = s.a.upload_file(b"a's private file".to_vec());
    let mut spec_a = spec(&module, &["print", "5000"], &["", ""]);
    spec_a["deterministic"] = json!(true);
    spec_a["files"] = json!({"private.txt": file});
    let job = s.a.run_job(spec_a);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["tenant"], "a", "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    let block_dir = s.cluster.data_dir.path().join("blocks").join(&id);
    let block = std::fs::read_dir(&block_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", block_dir.display()))
        .next()
        .unwrap()
        .unwrap()
        .file_name()
        .into_string()
        .unwrap();
    let executor = s.cluster.executors()[0]["id"].as_str().unwrap().to_owned();
    let none_module = format!("sha256:{}", "0".repeat(64));
    let none_job = "job-0190000000007000800000000000000";
    // And a graph of A's.
    let (status, graph) = s.a.post_raw(
        "/v1/graphs?wait=30",
        json!({"jobs": {"only": {"module": module, "args": ["noop"], "inputs": [{"text": ""}]}}})
            .to_string(),
    );
    assert_eq!(status, 202, "{graph}");
    let graph = graph["id"].as_str().unwrap().to_owned();
    let none_graph = "graph-0190000000007000800000000000000";

    // Every route of the OpenAPI document, and the block routes beside it, as B: once
    // naming A's objects and once naming objects that do not exist. The answers must
    // be the same (no existence leak), never a success that names A's objects, and A's
    // own GETs of the same paths succeed (the ids are right).
    let doc: Value = reqwest::blocking::get(s.cluster.url("/v1/openapi.json"))
        .unwrap()
        .json()
        .unwrap();
    let mut routes: Vec<(String, String)> = Vec::new();
    for (template, methods) in doc["paths"].as_object().unwrap() {
        for method in methods.as_object().unwrap().keys() {
            routes.push((method.clone(), template.clone()));
            // A HEAD is answered by the GET route: it must tell nothing either.
            if method == "get" {
                routes.push(("head".into(), template.clone()));
            }
        }
    }
    routes.push(("get".into(), "/v1/blocks/{job}/{name}".into()));
    routes.push(("put".into(), "/v1/blocks/{job}/{name}".into()));
    assert!(routes.len() > 25, "{routes:?}");
    let fill = |template: &str, real: bool| {
        let (job, module, file, block, tenant, graph) = match real {
            true => (
                id.as_str(),
                module.as_str(),
                file.as_str(),
                block.as_str(),
                "a",
                graph.as_str(),
            ),
            false => (
                none_job,
                none_module.as_str(),
                none_module.as_str(),
                "0-1-1",
                "zz",
                none_graph,
            ),
        };
        let object = if template.starts_with("/v1/modules/") {
            module
        } else if template.starts_with("/v1/graphs/") {
            graph
        } else if template.starts_with("/v1/files/") {
            file
        } else if template.starts_with("/v1/executors/") || template.starts_with("/v1/workers/") {
            executor.as_str()
        } else {
            job
        };
        template
            .replace("{id}", object)
            .replace("{job}", job)
            .replace(
                "{name}",
                if template.starts_with("/v1/tenants/") {
                    tenant
                } else {
                    block
                },
            )
            .replace("{index}", "0")
    };
    let body = |real: bool| {
        let m = if real {
            module.as_str()
        } else {
            none_module.as_str()
        };
        json!({"module": m, "inputs": [{"text": ""}]})
    };
    let leaks = |v: &Value| {
        let text = v.to_string();
        [id.as_str(), module.as_str(), file.as_str()]
            .iter()
            .any(|secret| text.contains(secret))
    };
    let mut checked = Vec::new();
    for (method, template) in &routes {
        let (got, seen) = call(&s.b, method, &fill(template, true), &body(true));
        let (none, unseen) = call(&s.b, method, &fill(template, false), &body(false));
        let what = format!("B: {} {template}", method.to_uppercase());
        assert_eq!(got, none, "{what}: {seen} against {unseen}");
        assert_eq!(
            seen["error"]["kind"], unseen["error"]["kind"],
            "{what}: {seen}"
        );
        if (200..300).contains(&got) {
            assert!(
                !template.contains('{'),
                "{what} succeeded on A's object: {seen}"
            );
            assert!(!leaks(&seen), "{what} shows A's objects: {seen}");
        }
        if template.contains('{') && method == "get" && !template.contains("/v1/tenants/") {
            let expected = match template.as_str() {
                t if t.starts_with("/v1/executors/") || t.starts_with("/v1/workers/") => 403,
                _ => 404,
            };
            assert_eq!(got, expected, "{what}: {seen}");
        }
        checked.push(format!("{} {template} -> {got}", method.to_uppercase()));
    }
    eprintln!("B's answers: {checked:#?}");
    // A reaches every one of its own objects (the walk named the right ids).
    for (method, template) in routes.iter().filter(|(m, t)| m == "get" && t.contains('{')) {
        if template.starts_with("/v1/executors/") || template.starts_with("/v1/workers/") {
            continue;
        }
        let (status, view) = call(&s.a, method, &fill(template, true), &Value::Null);
        assert!(
            (200..300).contains(&status),
            "A: GET {template}: {status} {view}"
        );
    }
    // Naming A's objects in B's job is as naming nothing.
    let named = |extra: Value| {
        let mut spec = json!({"module": s.b.upload(&guests().testkit), "inputs": [{"text": ""}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        s.b.post_raw("/v1/jobs", spec.to_string())
    };
    let (status, refused) = named(json!({"files": {"f": file}}));
    assert_eq!(
        (status, refused["error"]["kind"].as_str()),
        (422, Some("unknown_file"))
    );
    let (status, refused) = named(json!({"inputs": [{"result": {"job": id, "task": 0}}]}));
    assert_eq!(
        (status, refused["error"]["kind"].as_str()),
        (422, Some("unknown_result"))
    );
    // B's listing holds none of A's jobs; the admin's holds A's, and filters by tenant.
    assert_eq!(s.b.get("/v1/jobs").1["items"], json!([]));
    let listed = s.cluster.get("/v1/jobs?tenant=a").1;
    let listed_ids: Vec<&str> = (listed["items"].as_array().unwrap().iter())
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert!(listed_ids.contains(&id.as_str()), "{listed}");
    assert_eq!(s.cluster.get("/v1/jobs?tenant=b").1["items"], json!([]));
    // Nothing B did changed A's job.
    let (status, after) = s.a.get(&format!("/v1/jobs/{id}"));
    assert_eq!((status, &after["state"]), (200, &json!("succeeded")));
    assert_eq!(s.a.result(&after, 1).len(), 5000);
    // A shared upload (the admin's to share) is every tenant's to use; a tenant's
    // `shared`, however it is spelled, is refused.
    for query in ["shared=true", "shared=%74rue", "%73hared=true"] {
        let (status, body) = call(&s.a, "put", &format!("/v1/modules?{query}"), &Value::Null);
        assert_eq!(status, 403, "{query}: {body}");
    }
    // Blocks are the executors' to write, even under a tenant's own job.
    let (status, body) = call(&s.a, "put", &format!("/v1/blocks/{id}/mine"), &Value::Null);
    assert_eq!(status, 403, "{body}");
    // A listing cursor naming A's job is as one naming none.
    assert_eq!(
        s.b.get(&format!("/v1/jobs?after={id}")),
        s.b.get(&format!("/v1/jobs?after={none_job}"))
    );
    let shared = s
        .cluster
        .client
        .put(s.cluster.url("/v1/files?shared=true"))
        .body(b"for everyone".to_vec())
        .send()
        .unwrap()
        .json::<Value>()
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        s.b.get_bytes(&format!("/v1/files/{shared}")).1,
        b"for everyone"
    );
    assert_eq!(s.a.get_bytes(&format!("/v1/files/{shared}")).0, 200);
}

#[test]
fn quotas_refuse_with_quota_exceeded_and_accepted_jobs_survive_a_restart() {
    let testkit = std::fs::metadata(&guests().testkit).unwrap().len();
    let limits = format!(
        "max_jobs = 2\nmax_pending_tasks = 10\nmax_task_memory_mb = 64\nmax_task_timeout_ms = 60000\nmax_storage_bytes = {}\nmax_cores = 1",
        testkit + 1000
    );
    let limits = limits.as_str();
    let s = start(1, 2, limits, &[]);
    let module = s.b.upload(&guests().testkit);
    // Storage: the module fits, a file that would pass the limit does not; the same
    // module again costs nothing.
    let (status, body) = s.b.put_file_bytes(vec![b'x'; 1001]);
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_storage_bytes"),
        "{body}"
    );
    assert_eq!(s.b.put_file_bytes(vec![b'x'; 1000]).0, 201);
    assert_eq!(s.b.upload(&guests().testkit), module);
    assert_eq!(
        s.a.put_file_bytes(vec![b'y'; 5000]).0,
        201,
        "A has no such limit"
    );
    let submit = |patch: Value, inputs: usize| {
        let mut spec = spec(&module, &["sleep", "60000"], &vec![""; inputs]);
        spec["resources"] = json!({"memory_mb": 64, "timeout_ms": 60000});
        for (k, v) in patch.as_object().unwrap() {
            spec[k] = v.clone();
        }
        s.b.post_raw("/v1/jobs", spec.to_string())
    };
    let refused = |(status, body): (u16, Value), limit: &str| {
        assert_eq!(status, 429, "{body}");
        assert_eq!(body["error"]["kind"], "quota_exceeded", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(limit), "{message}");
        message.to_owned()
    };
    refused(
        submit(json!({"resources": {"memory_mb": 128}}), 1),
        "max_task_memory_mb is 64",
    );
    refused(
        submit(
            json!({"resources": {"memory_mb": 64, "timeout_ms": 60001}}),
            1,
        ),
        "max_task_timeout_ms is 60000",
    );
    refused(submit(json!({"priority": 2}), 1), "max_priority is 1");
    refused(
        submit(
            json!({"resources": {"memory_mb": 64, "timeout_ms": 60000, "cores": 2}}),
            1,
        ),
        "max_cores is 1",
    );
    // The CLI says the same, with the tenant's token.
    let out = s.b.cli(&[
        "submit",
        &module,
        "--input-text",
        "x",
        "--memory-mb",
        "64",
        "--priority",
        "2",
        "--token",
        B,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("quota_exceeded") && stderr.contains("max_priority is 1"),
        "{stderr}"
    );
    refused(submit(json!({}), 11), "max_pending_tasks is 10");
    let (status, first) = submit(json!({"priority": 1}), 6);
    assert_eq!(status, 202, "{first}");
    let message = refused(submit(json!({}), 5), "max_pending_tasks is 10");
    assert!(
        message.contains("holds 6") && message.contains("add 5"),
        "{message}"
    );
    let (status, second) = submit(json!({}), 4);
    assert_eq!(status, 202, "{second}");
    let message = refused(submit(json!({}), 1), "max_jobs is 2");
    assert!(message.contains("holds 2"), "{message}");
    // A is not bound by B's limits.
    let a_module = s.a.upload(&guests().testkit);
    let (status, _) = s.a.post_raw(
        "/v1/jobs",
        spec(&a_module, &["noop"], &vec![""; 20]).to_string(),
    );
    assert_eq!(status, 202);
    // Across a restart: both of B's jobs are still there, still B's, still counted.
    let file = s.file.to_str().unwrap().to_owned();
    let cluster = s.cluster.restart_with(
        1,
        2,
        &[
            "--token",
            ADMIN,
            "--cluster-secret",
            "secret",
            "--tenants",
            &file,
        ],
    );
    let b = Api::new(cluster.http.clone(), Some(B.into()));
    let a = Api::new(cluster.http.clone(), Some(A.into()));
    for job in [&first, &second] {
        let id = job["id"].as_str().unwrap();
        let (status, view) = b.get(&format!("/v1/jobs/{id}"));
        assert_eq!((status, &view["tenant"]), (200, &json!("b")), "{view}");
        assert_eq!(a.get(&format!("/v1/jobs/{id}")).0, 404);
    }
    let (status, body) = b.post_raw(
        "/v1/jobs",
        json!({"module": module, "inputs": [{"text": ""}], "resources": {"memory_mb": 64, "timeout_ms": 1000}})
            .to_string(),
    );
    refused((status, body), "max_jobs is 2");
    // Killing one makes room again; the usage route counts what B holds.
    let id = first["id"].as_str().unwrap();
    assert_eq!(b.post_raw(&format!("/v1/jobs/{id}/kill"), "").0, 202);
    wait_until(Duration::from_secs(30), "the kill", || {
        b.get(&format!("/v1/jobs/{id}")).1["state"] == "killed"
    });
    let usage = b.get("/v1/tenants/b/usage").1;
    assert_eq!(usage["live_jobs"], 1, "{usage}");
    assert!(
        usage["running_cores"].as_u64().unwrap() <= 1,
        "max_cores: {usage}"
    );
    assert_eq!(
        usage["pending_tasks"].as_u64().unwrap() + usage["running_tasks"].as_u64().unwrap(),
        4
    );
    assert_eq!(b.get("/v1/tenants/a/usage").0, 404);
    assert_eq!(cluster.get("/v1/tenants/b/usage").0, 200);
}

#[test]
fn keys_and_tokens_are_per_tenant_and_the_file_is_read_again_when_it_changes() {
    let s = start(1, 1, "", &[]);
    let module_a = s.a.upload(&guests().testkit);
    let module_b = s.b.upload(&guests().testkit);
    // The same Idempotency-Key from two tenants makes two jobs.
    let keyed = |api: &Api, module: &str| {
        let response = api
            .client
            .post(api.url("/v1/jobs"))
            .header("Idempotency-Key", "same-key")
            .header("content-type", "application/json")
            .body(spec(module, &["noop"], &[""]).to_string())
            .send()
            .unwrap();
        (
            response.status().as_u16(),
            response.json::<Value>().unwrap(),
        )
    };
    let (sa, ja) = keyed(&s.a, &module_a);
    let (sb, jb) = keyed(&s.b, &module_b);
    assert_eq!((sa, sb), (202, 202), "{ja} {jb}");
    assert_ne!(ja["id"], jb["id"]);
    assert_eq!(
        keyed(&s.a, &module_a).1["id"],
        ja["id"],
        "A's repeat is A's job"
    );
    // A memoized result is its tenant's: B's identical job runs its own task, A's
    // second takes A's first.
    let memo = |api: &Api, module: &str| {
        let mut job = spec(module, &["echo"], &["same input"]);
        job["deterministic"] = json!(true);
        job["seed"] = json!(7);
        job["memoize"] = json!(true);
        let done = api.run_job(job);
        assert_eq!(done["state"], "succeeded", "{done}");
        (done["id"].clone(), api.tasks(&done)[0].clone())
    };
    let (first, _) = memo(&s.a, &module_a);
    let (_, b_task) = memo(&s.b, &module_b);
    assert!(b_task.get("memoized_from").is_none(), "{b_task}");
    let (_, a_task) = memo(&s.a, &module_a);
    assert_eq!(a_task["memoized_from"]["job"], first, "{a_task}");
    // A wrong token, and the hash itself, are no tokens.
    let stranger = Api::new(s.cluster.http.clone(), Some("token-of-c".into()));
    assert_eq!(stranger.get("/v1/jobs").0, 401);
    let by_hash = Api::new(s.cluster.http.clone(), Some(hash(A)));
    assert_eq!(by_hash.get("/v1/jobs").0, 401);
    // c is added and b removed by rewriting the file: in force within the poll.
    let text = format!(
        "[[tenant]]\nname = \"a\"\ntokens = [\"{}\"]\n[[tenant]]\nname = \"c\"\ntokens = [\"{}\"]\n",
        hash(A),
        hash("token-of-c")
    );
    std::fs::write(&s.file, text).unwrap();
    wait_until(Duration::from_secs(10), "c's token to work", || {
        stranger.get("/v1/jobs").0 == 200
    });
    assert_eq!(s.b.get("/v1/jobs").0, 401, "b's token is gone");
    // A broken file keeps what was in force.
    std::fs::write(&s.file, "[[tenant]]\nname = 3\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(stranger.get("/v1/jobs").0, 200);
    assert_eq!(s.a.get("/v1/jobs").0, 200);
}

/// B fills both cores with a 2,000-task backlog of 3 s tasks (and, alone, queues two more
/// on the executor); then A submits one short task. Returns (when A's task started, when
/// B's first attempt that ran to its end ended, how many of B's attempts had ended when
/// A's started, B's outcomes).
fn a_behind_bs_backlog(preemption: bool) -> (u64, Option<u64>, usize, Vec<String>) {
    let more: &[&str] = if preemption {
        &["--preemption-timeout-ms", "300"]
    } else {
        &[]
    };
    let s = start(1, 2, "", more);
    let module_b = s.b.upload(&guests().testkit);
    let (status, big) = s.b.post_raw(
        "/v1/jobs",
        spec(&module_b, &["sleep", "3000"], &vec![""; 2000]).to_string(),
    );
    assert_eq!(status, 202, "{big}");
    let big = big["id"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(30), "B on both cores", || {
        s.b.get(&format!("/v1/jobs/{big}")).1["counts"]["running"]
            .as_u64()
            .unwrap()
            >= 2
    });
    let module_a = s.a.upload(&guests().testkit);
    let small = s.a.run_job(spec(&module_a, &["sleep", "100"], &[""]));
    assert_eq!(small["state"], "succeeded", "{small}");
    let a_start = s.a.spans(small["id"].as_str().unwrap())[0].0;
    let b = s.b.spans(&big);
    let b_first_end = b
        .iter()
        .filter(|s| s.2 == "succeeded")
        .filter_map(|s| s.1)
        .min();
    // B's attempts that had ended when A's started (one starting beside A's is not one
    // A waited for).
    let before_a = b
        .iter()
        .filter(|s| s.1.is_some_and(|end| end <= a_start))
        .count();
    let outcomes = b.iter().map(|s| s.2.clone()).collect();
    let view = s.b.get(&format!("/v1/jobs/{big}")).1;
    assert_eq!(view["counts"]["failed"], 0, "{view}");
    // The admin's /metrics says it per tenant.
    let metrics = String::from_utf8(s.cluster.get_bytes("/metrics").1).unwrap();
    let value = |line: &str| {
        let found = metrics.lines().find_map(|l| l.strip_prefix(line));
        found
            .unwrap_or_else(|| panic!("no {line} in /metrics"))
            .trim()
            .parse::<f64>()
            .unwrap()
    };
    assert!(value("flint_tenant_live_jobs{tenant=\"b\"}") >= 1.0);
    assert!(value("flint_tenant_running_cores{tenant=\"b\"}") >= 1.0);
    assert_eq!(value("flint_tenant_attempts_total{tenant=\"a\"}"), 1.0);
    let preempted = value("flint_tenant_attempts_preempted_total{tenant=\"b\"}");
    assert_eq!(preempted > 0.0, preemption, "{metrics}");
    assert_eq!(s.b.post_raw(&format!("/v1/jobs/{big}/kill"), "").0, 202);
    (a_start, b_first_end, before_a, outcomes)
}

#[test]
fn with_preemption_a_tenants_task_does_not_wait_behind_anothers_backlog() {
    let (a_start, b_first_end, _, outcomes) = a_behind_bs_backlog(true);
    // A ran before any of B's 3 s tasks could end: one was preempted for it.
    assert!(
        b_first_end.is_none_or(|end| a_start < end),
        "A started at {a_start}, after B's first end at {b_first_end:?}"
    );
    assert!(outcomes.iter().any(|o| o == "preempted"), "{outcomes:?}");
}

#[test]
fn without_preemption_a_tenants_task_waits_only_for_what_was_on_the_cores_and_queued() {
    let (a_start, b_first_end, before_a, outcomes) = a_behind_bs_backlog(false);
    let first_end = b_first_end.expect("one of B's tasks ended first");
    assert!(a_start >= first_end, "{a_start} < {first_end}");
    // Not behind the 1,996 others: behind B's two running and the two it had queued on
    // the executor while alone (while shared, 3 s tasks queue none), no more.
    assert!(
        before_a <= 4,
        "{before_a} of B's attempts ended before A's started: {outcomes:?}"
    );
    assert!(!outcomes.iter().any(|o| o == "preempted"), "{outcomes:?}");
}

#[test]
fn submissions_and_uploads_at_once_cannot_pass_a_limit_together() {
    // A client that repeats itself, many times at once: the last place under a limit is
    // taken once.
    let s = start(1, 1, "max_jobs = 1\nmax_storage_bytes = 2000", &[]);
    let module = {
        // The module is the admin's, shared: B's storage holds only its files.
        let response = s
            .cluster
            .client
            .put(s.cluster.url("/v1/modules?shared=true"))
            .body(std::fs::read(&guests().testkit).unwrap())
            .send()
            .unwrap();
        assert_eq!(response.status().as_u16(), 201);
        response.json::<Value>().unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let body = spec(&module, &["sleep", "30000"], &[""]).to_string();
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| s.b.post_raw("/v1/jobs", body.clone()).0))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    assert_eq!(accepted, 1, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 202 || *s == 429),
        "{statuses:?}"
    );
    // Eight different files of 600 bytes against 2,000: three fit, whatever the order.
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8u8)
            .map(|i| {
                let b = &s.b;
                scope.spawn(move || b.put_file_bytes(vec![b'a' + i; 600]).0)
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(s.b.get("/v1/tenants/b/usage").1["storage_bytes"], 1800);
    // The file going away keeps the tenants in force.
    std::fs::remove_file(&s.file).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.b.get("/v1/jobs").0, 200);
}

/// The failure of the one task of `job` as `api` sees it: (kind, message).
fn failure_of(api: &Api, job: &Value) -> (String, String) {
    assert_eq!(job["state"], "failed", "{job}");
    let task = &api.tasks(job)[0];
    (
        task["error"]["kind"].as_str().unwrap().to_owned(),
        task["error"]["message"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn a_tenant_that_knows_anothers_module_digest_cannot_run_it_through_the_executors_cache() {
    let s = start(1, 1, "", &[]);
    // A's private module, file and input have been on the only executor: the module
    // compiled there, the file and input in its fetch cache.
    let module = s.a.upload(&guests().testkit);
    let secret = b"a's private file".to_vec();
    let file = s.a.upload_file(secret.clone());
    let mut job = spec(&module, &["read", "/files/f"], &["a's"]);
    job["files"] = json!({"f": file});
    let job = s.a.run_job(job);
    assert_eq!(job["state"], "succeeded", "{job}");
    let absent = "0".repeat(64);
    let nowhere = "http://no-such-host.invalid/x";
    // B names a URL that does not resolve, with A's digest and with one nobody has:
    // for the module, a file and an input.
    let module_by = |sha256: &str| {
        json!({"module": nowhere, "module_sha256": sha256,
               "args": ["echo"], "inputs": [{"text": "b's"}], "max_failures": 1})
    };
    let b_module = s.b.upload(&guests().testkit);
    let file_by = |sha256: &str| {
        json!({"module": b_module, "args": ["read", "/files/f"], "inputs": [{"text": ""}],
               "files": {"f": {"url": nowhere, "sha256": sha256}}, "max_failures": 1})
    };
    let input_by = |sha256: &str| {
        json!({"module": b_module, "args": ["echo"], "max_failures": 1,
               "inputs": [{"url": nowhere, "sha256": sha256}]})
    };
    type SpecBy<'a> = &'a dyn Fn(&str) -> Value;
    let cases: [(SpecBy, &str); 3] = [
        (&module_by, module.strip_prefix("sha256:").unwrap()),
        (&file_by, file.strip_prefix("sha256:").unwrap()),
        (&input_by, file.strip_prefix("sha256:").unwrap()),
    ];
    for (spec_by, digest) in cases {
        let (kind, with_as) = failure_of(&s.b, &s.b.run_job(spec_by(digest)));
        let (absent_kind, with_absent) = failure_of(&s.b, &s.b.run_job(spec_by(&absent)));
        assert_eq!(kind, "fetch_error", "{with_as}");
        assert_eq!(absent_kind, "fetch_error", "{with_absent}");
        assert_eq!(
            with_as.replace(digest, &absent),
            with_absent,
            "the same failure, whichever digest was named"
        );
    }
}

#[test]
fn a_tenants_escalated_retries_stop_at_its_task_limits() {
    let s = start(
        1,
        1,
        "max_task_memory_mb = 64\nmax_task_timeout_ms = 60000",
        &[],
    );
    let module = s.b.upload(&guests().testkit);
    let needs_100_mib = |escalate: Value| {
        let mut job = spec(&module, &["alloc", "100"], &[""]);
        job["resources"] = json!({"memory_mb": 16, "timeout_ms": 2000});
        job["retry"] = json!({"escalate": escalate});
        job
    };
    let job =
        s.b.run_job(needs_100_mib(json!({"memory": 16, "timeout": 16})));
    assert_eq!(job["state"], "failed", "{job}");
    let task = &s.b.tasks(&job)[0];
    let history: Vec<(u64, &str)> = task["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["memory_mb"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        history,
        [(16, "memory_limit"), (64, "memory_limit")],
        "16 MiB, then the tenant's 64, never 256 or 4096: {task}"
    );
    // Caps past the tenant's limits are refused as its quota, naming the limit.
    for (escalate, limit) in [
        (
            json!({"memory": 2, "max_memory_mb": 128}),
            "max_task_memory_mb is 64",
        ),
        (
            json!({"timeout": 2, "max_timeout_ms": 3_600_000}),
            "max_task_timeout_ms is 60000",
        ),
    ] {
        let (status, body) =
            s.b.post_raw("/v1/jobs", needs_100_mib(escalate.clone()).to_string());
        assert_eq!(status, 429, "{escalate}: {body}");
        assert_eq!(body["error"]["kind"], "quota_exceeded", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(limit), "{escalate}: {message}");
    }
}

/// `body` with `id` written as `{id}`: answers about two jobs compared as one.
fn without(body: &Value, id: &str) -> String {
    body.to_string().replace(id, "{id}")
}

#[test]
fn tenant_b_sees_nothing_of_as_running_job_in_the_cluster_views_and_the_gate() {
    // No task queued ahead on the executor: A's two beyond the cores wait as pending.
    let s = start(1, 2, "", &["--launch-ahead", "0"]);
    let admin_only = |(status, body): (u16, Value)| {
        assert_eq!(
            (status, body["error"]["kind"].as_str()),
            (403, Some("admin_only")),
            "{body}"
        );
    };
    admin_only(s.b.get("/v1/executors"));
    admin_only(s.b.get("/v1/workers"));
    // B's history is its own tasks only: it names B, and holds no cores or executors.
    let quiet = |history: &Value| {
        assert_eq!(history["tenant"], "b", "{history}");
        let samples = history["samples"].as_array().unwrap();
        for sample in samples {
            let mut keys: Vec<&str> = sample
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            keys.sort_unstable();
            assert_eq!(
                keys,
                ["busy_cores", "pending_tasks", "running_tasks", "t_ms"],
                "{sample}"
            );
            for figure in ["busy_cores", "pending_tasks", "running_tasks"] {
                assert_eq!(sample[figure], 0, "{history}");
            }
        }
        samples.len()
    };
    wait_until(Duration::from_secs(10), "B's first samples", || {
        quiet(&s.b.get("/v1/cluster/history").1) >= 1
    });

    // A runs 2 tasks on both cores, with 2 more waiting.
    let module = s.a.upload(&guests().testkit);
    let (status, job) = s.a.post_raw(
        "/v1/jobs",
        spec(&module, &["sleep", "30000"], &["", "", "", ""]).to_string(),
    );
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    let busy = |history: &Value| {
        let samples = history["samples"].as_array().unwrap();
        samples.last().is_some_and(|last| {
            last["running_tasks"] == 2 && last["busy_cores"] == 2 && last["pending_tasks"] == 2
        })
    };
    // The admin's history and A's own show A's work; B's, sampled at the same moments,
    // does not move.
    wait_until(Duration::from_secs(30), "A's job in the history", || {
        busy(&s.cluster.get("/v1/cluster/history").1) && busy(&s.a.get("/v1/cluster/history").1)
    });
    let admins = s.cluster.get("/v1/cluster/history").1;
    let last = admins["samples"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!((&last["cores"], &last["executors"]), (&json!(2), &json!(1)));
    assert!(admins.get("tenant").is_none(), "{admins}");
    let (status, history) = s.b.get("/v1/cluster/history");
    assert_eq!(status, 200);
    let t_ms = |h: &Value| h["samples"].as_array().unwrap().last().unwrap()["t_ms"].clone();
    assert!(
        t_ms(&history).as_u64() >= t_ms(&admins).as_u64(),
        "{history}"
    );
    quiet(&history);
    admin_only(s.b.get("/v1/executors"));
    admin_only(s.b.get("/v1/workers"));
    // The admin still sees everything.
    let executors = s.cluster.get("/v1/executors").1;
    let executor = &executors["items"][0];
    assert_eq!(executor["running"], 2, "{executors}");
    assert!(executor["pid"].is_u64(), "{executors}");
    assert_eq!(s.cluster.get("/v1/workers").0, 200);

    // The gate: A's live job and an absent one answer B alike, on every job route.
    let none = "job-0190000000007000800000000000000";
    for (method, path) in [
        ("get", "/v1/jobs/{id}"),
        ("get", "/v1/jobs/{id}/tasks"),
        ("get", "/v1/jobs/{id}/timeline"),
        ("get", "/v1/jobs/{id}/events"),
        ("get", "/v1/jobs/{id}/results"),
        ("get", "/v1/jobs/{id}/tasks/0/log"),
        ("get", "/v1/jobs/{id}/tasks/0/result"),
        ("get", "/v1/jobs/{id}/tasks/0/replay"),
        ("post", "/v1/jobs/{id}/kill"),
        ("delete", "/v1/jobs/{id}"),
    ] {
        let (got, seen) = call(&s.b, method, &path.replace("{id}", &id), &Value::Null);
        let (absent, unseen) = call(&s.b, method, &path.replace("{id}", none), &Value::Null);
        assert_eq!(
            (got, absent),
            (404, 404),
            "{method} {path}: {seen} {unseen}"
        );
        assert_eq!(
            without(&seen, &id),
            without(&unseen, none),
            "{method} {path}"
        );
    }
    assert_eq!(s.a.get(&format!("/v1/jobs/{id}")).1["state"], "running");
    assert_eq!(s.a.post_raw(&format!("/v1/jobs/{id}/kill"), "").0, 202);
}

#[test]
fn each_tenant_has_its_own_share_of_the_event_streams() {
    // 6 streams among 2 tenants and the admin: 2 each.
    let s = start(1, 1, "", &["--max-event-streams", "6"]);
    let job_of = |api: &Api| {
        let module = api.upload(&guests().testkit);
        api.submit(&spec(&module, &["sleep", "30000"], &[""]))
    };
    let (a_job, b_job) = (job_of(&s.a), job_of(&s.b));
    let a_streams: Vec<EventStream> = (0..2)
        .map(|_| EventStream::open(&s.a, &a_job, Some(A)))
        .collect();
    for stream in &a_streams {
        assert_eq!(stream.status, 200, "{}", stream.head);
    }
    // A's next is refused, naming its share; B and the admin still open theirs.
    let refused = EventStream::open(&s.a, &a_job, Some(A));
    assert_eq!(refused.status, 503, "{}", refused.head);
    assert!(
        refused.head.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        refused.head
    );
    let body: Value = serde_json::from_str(&refused.body()).unwrap();
    assert_eq!(body["error"]["kind"], "overloaded", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tenant \"a\" holds its share") && message.contains("2 at once"),
        "{message}"
    );
    let b_stream = EventStream::open(&s.b, &b_job, Some(B));
    assert_eq!(b_stream.status, 200, "{}", b_stream.head);
    let admins = EventStream::open(&s.cluster, &a_job, Some(ADMIN));
    assert_eq!(admins.status, 200, "{}", admins.head);
    // One of A's closed gives A its place back.
    drop(a_streams);
    wait_until(Duration::from_secs(10), "A's place back", || {
        EventStream::open(&s.a, &a_job, Some(A)).status == 200
    });
    for (api, job) in [(&s.a, &a_job), (&s.b, &b_job)] {
        assert_eq!(api.post_raw(&format!("/v1/jobs/{job}/kill"), "").0, 202);
    }
}

#[test]
fn a_graph_is_its_tenants_its_waiting_tasks_count_and_it_cannot_name_anothers_job() {
    let s = start(1, 1, "max_pending_tasks = 5", &[]);
    let a_module = s.a.upload(&guests().testkit);
    let b_module = s.b.upload(&guests().testkit);
    let a_job = s.a.submit(&spec(&a_module, &["sleep", "60000"], &[""]));
    let graph = |module: &str, upstream: &str, readers: usize| {
        json!({"jobs": {
            "up": {"module": module, "args": ["sleep", "60000"], "inputs": [{"text": ""}]},
            "down": {"module": module, "args": ["echo"],
                     "inputs": vec![json!({"results": {"job": upstream}}); readers]},
        }})
    };
    // Another tenant's job is as if it did not exist.
    let (status, body) =
        s.b.post_raw("/v1/graphs", graph(&b_module, &a_job, 1).to_string());
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["kind"], "unknown_result", "{body}");
    // 1 + 5 waiting tasks: over max_pending_tasks (5), counted over the whole graph.
    let (status, body) =
        s.b.post_raw("/v1/graphs", graph(&b_module, "up", 5).to_string());
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_pending_tasks is 5"),
        "{body}"
    );
    let (_, list) = s.b.get("/v1/jobs");
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        0,
        "nothing stored: {list}"
    );
    // 1 + 4 fit; then the waiting tasks hold the quota: one more task does not fit.
    let (status, created) =
        s.b.post_raw("/v1/graphs", graph(&b_module, "up", 4).to_string());
    assert_eq!(status, 202, "{created}");
    let (status, body) =
        s.b.post_raw("/v1/jobs", spec(&b_module, &["noop"], &[""]).to_string());
    assert_eq!(status, 429, "{body}");
    // A sees nothing of B's graph.
    let id = created["id"].as_str().unwrap();
    let (status, body) = s.a.get(&format!("/v1/graphs/{id}"));
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (404, Some("graph_not_found"))
    );
    let (status, view) = s.b.get(&format!("/v1/graphs/{id}"));
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["jobs"]["down"]["counts"]["waiting"], 4, "{view}");
}
