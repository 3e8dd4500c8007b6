//! The submit path's checks, driven through `accept` and its helpers on a driver that
//! listens nowhere: what a job may give its guests, and which refs the executors may
//! fetch with the cluster secret ([`ModuleRef::served_by_driver`] and its kin).

use axum::http::StatusCode;
use flint_protocol::api::{InputSpec, ResultRef, ResultsRef, TaskState};
use flint_protocol::{BlockRef, Digest, FetchRef, InputPart, JobId, TaskInput, TaskResult};
use serde_json::json;

use super::error::{ApiError, ApiResult};
use crate::admission::inputs::InputBudget;
use crate::admission::{accept, decode_input, parse_job_spec};
use crate::scheduler::{NewJob, set_state};
use crate::service::Driver;
use crate::service::tests::{EMPTY_MODULE, driver};

fn submit(driver: &Driver, spec: serde_json::Value) -> ApiResult<NewJob> {
    Ok(accept(
        driver,
        parse_job_spec(spec.to_string().as_bytes())?,
    )?)
}

fn refused(driver: &Driver, spec: serde_json::Value) -> (StatusCode, &'static str, String) {
    let e: ApiError = submit(driver, spec).err().expect("refused");
    (e.status, e.kind, e.message)
}

#[test]
fn args_and_env_guests_cannot_be_given_are_refused_at_submit_naming_where() {
    let (_dir, driver) = driver();
    let (digest, _) = driver.modules.put(EMPTY_MODULE).unwrap();
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
    let (digest, _) = driver.modules.put(EMPTY_MODULE).unwrap();
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
    let (module, _) = driver.modules.put(EMPTY_MODULE).unwrap();
    let (file, _) = driver.files.put(b"data").unwrap();
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
    let (module, _) = driver.modules.put(EMPTY_MODULE).unwrap();
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
