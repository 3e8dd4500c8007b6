use std::collections::BTreeMap;

use super::*;
use crate::ids::JobId;

#[test]
fn state_names_are_the_json_names() {
    fn json<T: Serialize>(v: T) -> String {
        serde_json::to_value(v)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }
    for s in JobState::ALL {
        assert_eq!(s.as_str(), json(s));
    }
    for s in TaskState::ALL {
        assert_eq!(s.as_str(), json(s));
    }
    for s in ExecutorState::ALL {
        assert_eq!(s.as_str(), json(s));
    }
}

#[test]
fn job_spec_reads_the_documented_shape() {
    let spec: JobSpec = serde_json::from_str(
        r#"{"name":"wc","module":"sha256:00","args":["--top","10"],"env":{"LANG":"C"},
            "inputs":[{"text":"a b"},{"base64":"YQ=="}],
            "resources":{"cores":2,"timeout_ms":1000},"max_failures":2}"#,
    )
    .unwrap();
    assert_eq!(
        spec.inputs.unwrap(),
        vec![
            InputSpec::Text("a b".into()),
            InputSpec::Base64("YQ==".into())
        ]
    );
    assert_eq!(spec.resources.cores, Some(2));
    assert_eq!(spec.resources.memory_mb, None);
}

#[test]
fn job_spec_names_unknown_fields() {
    let err = serde_json::from_str::<JobSpec>(r#"{"module":"m","colour":"red"}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `colour`"), "{err}");
    let err = serde_json::from_str::<JobSpec>(r#"{"module":"m","inputs":[{"txt":"a"}]}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `txt`"), "{err}");
}

#[test]
fn inputs_of_every_kind_read_and_write_their_documented_shape() {
    let json = r#"[{"text":"a"},{"base64":"YQ=="},{"url":"http://h/x","sha256":"ab"},
        {"url":"http://h/y"},{"result":{"job":"job-1","task":3}},
        {"results":{"job":"job-1"}},{"results":{"job":"job-2","tasks":[2,0,2]}}]"#;
    let inputs: Vec<InputSpec> = serde_json::from_str(json).unwrap();
    assert_eq!(
        inputs[2],
        InputSpec::Url {
            url: "http://h/x".into(),
            sha256: Some("ab".into())
        }
    );
    assert_eq!(
        inputs[4],
        InputSpec::Result(ResultRef {
            job: JobId("job-1".into()),
            task: 3
        })
    );
    assert_eq!(
        inputs[5],
        InputSpec::Results(ResultsRef {
            job: JobId("job-1".into()),
            tasks: None
        })
    );
    assert_eq!(
        inputs[6],
        InputSpec::Results(ResultsRef {
            job: JobId("job-2".into()),
            tasks: Some(vec![2, 0, 2])
        })
    );
    let back: Vec<InputSpec> =
        serde_json::from_str(&serde_json::to_string(&inputs).unwrap()).unwrap();
    assert_eq!(back, inputs);
    for bad in [
        r#"{"text":"a","url":"u"}"#,
        r#"{}"#,
        r#"{"text":"a","sha256":"x"}"#,
        r#"{"result":{"job":"j","task":0},"results":{"job":"j"}}"#,
    ] {
        let err = serde_json::from_str::<InputSpec>(bad)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`text`") || err.contains("`url`"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn files_are_ids_or_urls() {
    let files: BTreeMap<String, FileSpec> =
        serde_json::from_str(r#"{"a":"sha256:00","b":{"url":"http://h/b","timestamp_ms":5}}"#)
            .unwrap();
    assert_eq!(files["a"], FileSpec::Id("sha256:00".into()));
    assert!(matches!(&files["b"], FileSpec::Url(u) if u.timestamp_ms == Some(5)));
}
