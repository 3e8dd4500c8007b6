//! The submit path's checks, driven through `accept` and its helpers on a driver that
//! listens nowhere: what a job may give its guests, and which refs the executors may
//! fetch with the cluster secret ([`ModuleRef::served_by_driver`] and its kin); and the
//! tenancy gate's reads of a job's owner, counted and made to fail.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::http::{Method, StatusCode, Uri};
use flint_protocol::api::{InputSpec, ResultRef, ResultsRef, TaskState};
use flint_protocol::{BlockRef, Digest, FetchRef, InputPart, JobId, TaskInput, TaskResult};
use serde_json::json;

use super::access::gate;
use super::error::{ApiError, ApiResult};
use crate::admission::inputs::InputBudget;
use crate::admission::{Catalog, Ceiling, accept, decode_input, parse_job_spec};
use crate::scheduler::{NewJob, set_state};
use crate::service::Driver;
use crate::service::tenancy::TenantCatalog;
use crate::service::tests::{EMPTY_MODULE, driver};
use crate::tenants::{Caller, Tenants, hash_token};

fn submit(driver: &Driver, spec: serde_json::Value) -> ApiResult<NewJob> {
    submit_as(driver, spec, &Ceiling::default())
}

fn submit_as(driver: &Driver, spec: serde_json::Value, ceiling: &Ceiling) -> ApiResult<NewJob> {
    Ok(accept(
        driver,
        parse_job_spec(spec.to_string().as_bytes())?,
        ceiling,
    )?)
}

fn refused(driver: &Driver, spec: serde_json::Value) -> (StatusCode, &'static str, String) {
    let e: ApiError = submit(driver, spec).err().expect("refused");
    (e.status(), e.kind(), e.message)
}

#[test]
fn args_and_env_guests_cannot_be_given_are_refused_at_submit_naming_where() {
    let (_dir, driver) = driver();
    let (digest, _) = driver.uploads.modules.put(EMPTY_MODULE).unwrap();
    let module = digest.to_string();
    let cases = [
        (
            json!({"module": module, "args": ["a\u{0}b"], "inputs": [{"text": ""}]}),
            "args[0] contains a NUL byte".to_owned(),
        ),
        (
            json!({"module": module, "env": {"FLINT_TASK_INDEX": "forged"},
                   "inputs": [{"text": ""}]}),
            concat!(
                r#"env: name "FLINT_TASK_INDEX" starts with `FLINT_`, which is reserved for "#,
                "the variables the executor sets (FLINT_JOB_ID, FLINT_TASK_INDEX, ",
                "FLINT_TASK_COUNT, FLINT_ATTEMPT)"
            )
            .to_owned(),
        ),
        (
            json!({"module": module, "tasks": [{}, {}, {}, {"env": {"A=B": "1"}}]}),
            r#"tasks[3].env: name "A=B" contains '='"#.to_owned(),
        ),
        (
            json!({"module": module, "tasks": [{"args": ["ok", "x\u{0}"]}]}),
            "tasks[0].args[1] contains a NUL byte".to_owned(),
        ),
        (
            json!({"module": module, "tasks": [{"env": {"": "1"}}]}),
            "tasks[0].env: a name is empty".to_owned(),
        ),
        (
            json!({"module": module, "name": "j\u{0}", "inputs": [{"text": ""}]}),
            "name contains a NUL byte".to_owned(),
        ),
    ];
    for (spec, message) in cases {
        assert_eq!(
            refused(&driver, spec),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_spec", message)
        );
    }
    let fine = json!({"module": module, "args": ["a=b"], "env": {"A": "x=y"},
                      "tasks": [{"args": [""], "env": {"flint_lower": ""}}]});
    assert!(submit(&driver, fine).is_ok());
}

#[test]
fn a_module_url_at_the_drivers_own_route_is_not_served_by_the_driver() {
    let (_dir, driver) = driver();
    let (digest, _) = driver.uploads.modules.put(EMPTY_MODULE).unwrap();
    let uploaded = submit(
        &driver,
        json!({"module": digest.to_string(), "inputs": [{"text": ""}]}),
    )
    .unwrap()
    .def
    .module;
    assert!(uploaded.served_by_driver(), "{uploaded:?}");
    // The same URL, named by a job, with the timestamp the driver reserves for itself.
    let url = format!("{}/v1/modules/{digest}", driver.http_base);
    assert_eq!(uploaded.url, url);
    let named = submit(
        &driver,
        json!({"module": url, "module_timestamp_ms": 0, "inputs": [{"text": ""}]}),
    )
    .unwrap()
    .def
    .module;
    assert!(!named.served_by_driver(), "{named:?}");
    assert_eq!((named.size, named.timestamp_ms), (None, 1));
}

#[test]
fn a_file_url_at_the_drivers_own_route_is_not_served_by_the_driver() {
    let (_dir, driver) = driver();
    let (module, _) = driver.uploads.modules.put(EMPTY_MODULE).unwrap();
    let (file, _) = driver.uploads.files.put(b"data").unwrap();
    let url = format!("{}/v1/files/{file}", driver.http_base);
    let job = submit(
        &driver,
        json!({"module": module.to_string(), "inputs": [{"text": ""}], "files": {
            "uploaded": file.to_string(),
            "named": {"url": url, "timestamp_ms": 0},
        }}),
    )
    .unwrap();
    let [named, uploaded] = &job.def.files[..] else {
        panic!("{:?}", job.def.files);
    };
    assert_eq!(
        (uploaded.name.as_str(), uploaded.url.as_str()),
        ("uploaded", url.as_str())
    );
    assert!(uploaded.served_by_driver(), "{uploaded:?}");
    assert!(!named.served_by_driver(), "{named:?}");
    assert_eq!((named.size, named.timestamp_ms), (None, 1));
}

#[test]
fn a_url_input_at_the_drivers_result_route_is_not_served_by_the_driver_and_a_result_is() {
    let (_dir, driver) = driver();
    // An earlier job: task 0's result in the block store, task 1's inline.
    driver.apply(|s| {
        s.insert_job(crate::scheduler::tests::job("earlier", 2, 1));
        let job = s.jobs.get_mut(&JobId("earlier".into())).unwrap();
        let results = [
            TaskResult::Block(BlockRef {
                id: "earlier/0-1-1".into(),
                size: 5,
                digest: Digest::of(b"block"),
            }),
            TaskResult::Inline(b"inline".to_vec()),
        ];
        for (task, result) in job.tasks.iter_mut().zip(results) {
            set_state(&mut job.counts, task, TaskState::Succeeded);
            task.result_digest = Some(result.digest());
            task.result = Some(result);
        }
        ((), Vec::new())
    });
    let mut budget = InputBudget {
        parts_left: 10,
        // Nothing inline: every result is fetched.
        inline_left: 0,
    };
    let mut decode =
        |input| decode_input(driver.as_ref(), input, "inputs[0]", &mut budget).unwrap();
    let fetched = |input| match input {
        TaskInput::Fetch(r) => *r,
        other => panic!("{other:?}"),
    };

    let route = format!("{}/v1/jobs/earlier/tasks/1/result", driver.http_base);
    let named = fetched(decode(InputSpec::Url {
        url: route.clone(),
        sha256: None,
    }));
    assert!(!named.served_by_driver(), "{named:?}");
    assert!(named.timestamp_ms >= 1);

    let result = fetched(decode(InputSpec::Result(ResultRef {
        job: JobId("earlier".into()),
        task: 0,
    })));
    assert!(result.served_by_driver(), "{result:?}");

    let TaskInput::Parts(parts) = decode(InputSpec::Results(ResultsRef {
        job: JobId("earlier".into()),
        tasks: None,
    })) else {
        panic!("a results input is parts");
    };
    let refs: Vec<&FetchRef> = parts
        .iter()
        .map(|p| match p {
            InputPart::Fetch(r) => r,
            InputPart::Inline(_) => panic!("nothing inline: {parts:?}"),
        })
        .collect();
    assert_eq!(refs[1].url, route, "the very URL the job named above");
    assert!(refs.iter().all(|r| r.served_by_driver()), "{refs:?}");
}

#[test]
fn no_url_a_job_names_gets_the_timestamp_reserved_for_the_driver() {
    let (_dir, driver) = driver();
    assert_eq!(driver.url_timestamp("http://a.example/x", Some(0)), 1);
    assert_eq!(driver.url_timestamp("http://a.example/x", None), 1);
    assert_eq!(driver.url_timestamp("http://a.example/x", Some(5)), 5);
    assert!(driver.url_timestamp("http://b.example/y", None) > 1);
}

#[test]
fn a_file_given_as_a_plain_url_string_is_fetched_like_a_url_object() {
    let (_dir, driver) = driver();
    let (module, _) = driver.uploads.modules.put(EMPTY_MODULE).unwrap();
    let job = submit(
        &driver,
        json!({"module": module.to_string(), "inputs": [{"text": ""}], "files": {
            "plain": "https://data.example/words.txt",
            "object": {"url": "https://data.example/words.txt"},
        }}),
    )
    .unwrap();
    let [object, plain] = &job.def.files[..] else {
        panic!("{:?}", job.def.files);
    };
    assert_eq!(plain.name, "plain");
    assert_eq!(
        (&plain.url, plain.digest, plain.size, plain.timestamp_ms),
        (&object.url, object.digest, object.size, object.timestamp_ms)
    );
    assert_eq!(plain.url, "https://data.example/words.txt");
    assert!(!plain.served_by_driver(), "{plain:?}");
    // A plain string with another scheme is refused as a URL, not as an id.
    let (status, kind, message) = refused(
        &driver,
        json!({"module": module.to_string(), "inputs": [{"text": ""}],
               "files": {"f": "ftp://data.example/x"}}),
    );
    assert_eq!(
        (status, kind),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_spec")
    );
    assert!(
        message.contains("files.f: scheme `ftp` is not fetchable"),
        "{message}"
    );
    // And a string that is neither is still told to upload.
    let (_, kind, message) = refused(
        &driver,
        json!({"module": module.to_string(), "inputs": [{"text": ""}],
               "files": {"f": "words.txt"}}),
    );
    assert_eq!(kind, "invalid_spec");
    assert!(
        message.contains("is not a file id; upload the file"),
        "{message}"
    );
}

#[test]
fn an_escalation_stops_at_the_tenants_task_limits_and_caps_past_them_are_refused() {
    let (_dir, driver) = driver();
    let (digest, _) = driver.uploads.modules.put(EMPTY_MODULE).unwrap();
    let tenant = Ceiling {
        tenant: Some("b".into()),
        memory_mb: Some(64),
        timeout_ms: Some(60_000),
        ..Ceiling::default()
    };
    let spec = |escalate: serde_json::Value| {
        json!({"module": digest.to_string(), "inputs": [{"text": ""}],
               "resources": {"memory_mb": 16, "timeout_ms": 1_000},
               "retry": {"escalate": escalate}})
    };
    let caps = |job: NewJob| {
        let e = job.def.options.escalate.expect("escalates");
        (e.max_memory_mb, e.max_timeout_ms)
    };
    let asked = spec(json!({"memory": 16, "timeout": 16}));
    assert_eq!(
        caps(submit_as(&driver, asked.clone(), &tenant).unwrap()),
        (64, 60_000),
        "the caps left out are the tenant's limits"
    );
    assert_eq!(
        caps(submit(&driver, asked).unwrap()),
        (4096, 3_600_000),
        "the admin's are the cluster's"
    );
    let within = spec(json!({"memory": 2, "max_memory_mb": 32, "max_timeout_ms": 2_000}));
    assert_eq!(
        caps(submit_as(&driver, within, &tenant).unwrap()),
        (32, 2_000)
    );
    for (escalate, limit) in [
        (
            json!({"memory": 2, "max_memory_mb": 128}),
            "max_task_memory_mb is 64",
        ),
        (
            json!({"memory": 2, "max_memory_mb": 4096}),
            "max_task_memory_mb is 64",
        ),
        (
            json!({"timeout": 2, "max_timeout_ms": 60_001}),
            "max_task_timeout_ms is 60000",
        ),
    ] {
        let e = submit_as(&driver, spec(escalate.clone()), &tenant)
            .err()
            .expect("refused");
        assert_eq!(
            e.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{escalate}: {}",
            e.message
        );
        assert_eq!(e.kind(), "quota_exceeded");
        assert!(e.message.contains(limit), "{escalate}: {}", e.message);
    }
    // Past the cluster's bound it is the spec's mistake, whoever asks.
    let e = submit_as(
        &driver,
        spec(json!({"memory": 2, "max_memory_mb": 5000})),
        &tenant,
    );
    assert_eq!(
        e.err().expect("refused").status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
}

#[test]
fn a_deterministic_job_without_a_seed_gets_one_from_its_spec() {
    let (_dir, driver) = driver();
    let (digest, _) = driver.uploads.modules.put(EMPTY_MODULE).unwrap();
    let module = digest.to_string();
    let seed = |spec: &str| {
        let spec: serde_json::Value = serde_json::from_str(spec).unwrap();
        let job = submit(&driver, spec).unwrap();
        job.def.options.determinism.expect("deterministic").seed
    };
    let base = format!(
        r#"{{"module": "{module}", "deterministic": true, "args": ["a"], "inputs": [{{"text": "x"}}]}}"#
    );
    let first = seed(&base);
    assert_eq!(seed(&base), first, "the same spec, the same seed");
    assert!(first < 1 << 53, "a JSON number any client reads exactly");
    let reordered = format!(
        r#"{{"inputs": [{{"text": "x"}}], "args": ["a"], "deterministic": true, "module": "{module}"}}"#
    );
    assert_eq!(seed(&reordered), first, "whatever the order of its keys");
    let memoized = format!(
        r#"{{"module": "{module}", "deterministic": true, "memoize": true, "priority": 0, "args": ["a"], "inputs": [{{"text": "x"}}]}}"#
    );
    assert_eq!(
        seed(&memoized),
        first,
        "memoize and priority change no result"
    );
    let other = base.replace(r#""x""#, r#""y""#);
    assert_ne!(seed(&other), first, "another input, another seed");
    let given = base.replace(
        r#""deterministic": true"#,
        r#""deterministic": true, "seed": 7"#,
    );
    assert_eq!(seed(&given), 7, "a seed given is kept");
}

/// Tenants `a` and `b` on a driver that listens nowhere, `a` with a live job `a-live`:
/// the driver, and `a` and `b` as callers.
async fn two_tenants_and_a_live_job() -> (tempfile::TempDir, Arc<Driver>, Caller, Caller) {
    let (dir, driver) = driver();
    let entry = |name: &str| {
        format!(
            "[[tenant]]\nname = \"{name}\"\ntokens = [\"{}\"]\n",
            hash_token(name)
        )
    };
    let file = entry("a") + &entry("b");
    driver.set_tenants(Tenants::parse(&file, false).unwrap());
    let tenants = driver.tenants.get();
    let caller = |name: &str| Caller::Tenant(tenants.get(name).unwrap().clone());
    let (a, b) = (caller("a"), caller("b"));
    let mut job = crate::scheduler::tests::job("a-live", 1, 1);
    job.def.owner.tenant = Some("a".into());
    driver.submit(job).await.unwrap();
    (dir, driver, a, b)
}

/// What the gate answers `caller` for `GET path`, and the store reads of a job's owner
/// it took.
async fn through_the_gate(
    driver: &Arc<Driver>,
    caller: &Caller,
    path: &str,
) -> (Result<(), (StatusCode, &'static str, String)>, u64) {
    let reads = || driver.uploads.owner_reads.count.load(Ordering::Relaxed);
    let before = reads();
    let uri: Uri = path.parse().unwrap();
    let answer = gate(driver, caller, &Method::GET, &uri)
        .await
        .map_err(|e| (e.status(), e.kind(), e.message));
    (answer, reads() - before)
}

#[tokio::test]
async fn another_tenants_live_job_and_an_absent_one_take_the_same_reads_and_answers() {
    let (_dir, driver, a, b) = two_tenants_and_a_live_job().await;
    // The owner's own live job is answered from memory.
    assert_eq!(
        through_the_gate(&driver, &a, "/v1/jobs/a-live").await,
        (Ok(()), 0)
    );
    // To b, a's live job is as a job that does not exist: the same answer, and the
    // same one read of the store.
    let not_found = |id: &str| {
        let message = format!("no job {id}");
        (Err((StatusCode::NOT_FOUND, "job_not_found", message)), 1)
    };
    for (path, id) in [
        ("/v1/jobs/a-live", "a-live"),
        ("/v1/jobs/a-live/tasks/0/log", "a-live"),
        ("/v1/jobs/absent", "absent"),
        ("/v1/jobs/absent/tasks/0/log", "absent"),
    ] {
        assert_eq!(
            through_the_gate(&driver, &b, path).await,
            not_found(id),
            "{path}"
        );
    }
    let blocks = [
        through_the_gate(&driver, &b, "/v1/blocks/a-live/0-1-1").await,
        through_the_gate(&driver, &b, "/v1/blocks/absent/0-1-1").await,
    ];
    assert_eq!(blocks[0].1, blocks[1].1);
    assert_eq!(blocks[0].0.as_ref().unwrap_err().1, "block_not_found");
    assert_eq!(blocks[0].0.as_ref().unwrap_err().0, StatusCode::NOT_FOUND);

    // A store that cannot be read fails both alike: never 404 for one and 500 for the
    // other. The owner's own live job still answers from memory.
    driver
        .uploads
        .owner_reads
        .refuse
        .store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for path in ["/v1/jobs/a-live", "/v1/jobs/absent"] {
        let (answer, reads) = through_the_gate(&driver, &b, path).await;
        let (status, kind, _) = answer.unwrap_err();
        answers.push((status, kind, reads));
    }
    assert_eq!(
        answers,
        [(StatusCode::INTERNAL_SERVER_ERROR, "storage", 1); 2],
        "a's live job, then none"
    );
    assert_eq!(
        through_the_gate(&driver, &a, "/v1/jobs/a-live").await,
        (Ok(()), 0)
    );
}

#[tokio::test]
async fn a_job_named_in_a_spec_is_found_as_the_gate_finds_it() {
    let (_dir, driver, _a, b) = two_tenants_and_a_live_job().await;
    let catalog = TenantCatalog {
        driver: &driver,
        caller: &b,
    };
    let find = |id: &str| {
        catalog
            .job(&JobId(id.into()), |_| ())
            .map_err(|r| r.code.as_str())
    };
    assert_eq!((find("a-live"), find("absent")), (Ok(None), Ok(None)));
    driver
        .uploads
        .owner_reads
        .refuse
        .store(true, Ordering::Relaxed);
    assert_eq!(
        (find("a-live"), find("absent")),
        (Err("storage"), Err("storage")),
        "a store that cannot be read fails both alike"
    );
}
