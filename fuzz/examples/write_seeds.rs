//! Writes the seed corpora in `fuzz/corpus/<target>/`: a few small valid inputs per
//! target, built from the real types so they follow the protocol when it changes.
//! Run from `fuzz/` after a wire change: `cargo run --example write_seeds`.
//!
//! Each target's first input byte picks what the rest is (see the targets' docs); the
//! seeds begin with that byte.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::BytesMut;
use flint_protocol::api::{InputSpec, JobSpec, ResourcesSpec, ResultsRef, TaskSpec};
use flint_protocol::codec::FrameCodec;
use flint_protocol::messages::{ExecutorConfig, Heartbeat};
use flint_protocol::records::{
    AttemptOutcome, AttemptRecord, JobDef, JobEndRecord, JobRecord, TaskEndRecord, TaskInputRecord,
};
use flint_protocol::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

fn main() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut seeds = Seeds { corpus: &corpus };
    frames(&mut seeds);
    records(&mut seeds);
    job_specs(&mut seeds);
    urls(&mut seeds);
    egress(&mut seeds);
    modules(&mut seeds);
}

struct Seeds<'a> {
    corpus: &'a Path,
}

impl Seeds<'_> {
    fn write(&mut self, target: &str, name: &str, selector: u8, body: &[u8]) {
        let dir = self.corpus.join(target);
        std::fs::create_dir_all(&dir).expect("corpus dir");
        let mut bytes = vec![selector];
        bytes.extend_from_slice(body);
        std::fs::write(dir.join(name), bytes).expect("seed written");
    }
}

fn frame<T: Serialize + DeserializeOwned>(messages: &[T]) -> Vec<u8> {
    let codec = FrameCodec::<T, T>::default();
    let mut buf = BytesMut::new();
    for message in messages {
        codec.encode_frame(message, &mut buf).expect("seed encodes");
    }
    buf.to_vec()
}

fn template() -> JobTemplate {
    JobTemplate {
        key: 12,
        job: JobId("job-1".into()),
        task_count: 8,
        name: "wordcount".into(),
        module: ModuleRef {
            digest: Some(Digest::of(b"module")),
            url: "http://127.0.0.1:7070/v1/modules/sha256:00".into(),
            timestamp_ms: 1_700_000_000_000,
            size: Some(6),
        },
        files: vec![FileRef {
            name: "stopwords.txt".into(),
            digest: None,
            url: "https://example.com/stopwords.txt".into(),
            timestamp_ms: 1_700_000_000_000,
            size: None,
        }],
        args: vec!["--lower".into()],
        env: vec![("LANG".into(), "C".into())],
        resources: Resources {
            fuel: Some(1_000_000),
            ..Resources::default()
        },
    }
}

fn fetch_ref() -> FetchRef {
    FetchRef {
        url: "http://127.0.0.1:7070/v1/jobs/job-1/tasks/3/result".into(),
        timestamp_ms: FetchRef::DRIVER_MADE,
        digest: Some(Digest::of(b"y")),
    }
}

fn launch(input: TaskInput) -> TaskLaunch {
    TaskLaunch {
        job: 12,
        index: 3,
        attempt: 1,
        generation: 7,
        args: vec!["a".into()],
        env: vec![("SHARD".into(), "3".into())],
        input,
        resources: None,
        pins: None,
    }
}

fn task_end(outcome: Result<TaskResult, TaskFailure>) -> TaskEnd {
    TaskEnd {
        started_at_us: 1,
        finished_at_us: 2,
        outcome,
        log: b"log".to_vec(),
        log_truncated: false,
        usage: Default::default(),
        pins: None,
        memory_mb: None,
    }
}

fn failure() -> TaskFailure {
    TaskFailure {
        kind: FailureKind::Exit,
        message: "exited with 3".into(),
        exit_code: Some(3),
    }
}

fn block() -> TaskResult {
    TaskResult::Block(BlockRef {
        id: "job-1/2-1-7".into(),
        size: 64 << 20,
        digest: Digest::of(b"big"),
    })
}

/// frame_decoder: selector 0 reads `DriverMessage`s, 1 `ExecutorMessage`s, 2 `Hello`,
/// 3 `HelloReply`; the high nibble is the chunk size (0: all at once).
fn frames(seeds: &mut Seeds<'_>) {
    let driver = [
        DriverMessage::ExecutorConfig(ExecutorConfig {
            app_id: "app".into(),
            heartbeat_interval_ms: 1000,
            max_log_bytes: 1 << 20,
            driver_http_url: "http://127.0.0.1:7070".into(),
            fetch_allow: vec!["s3://bucket".into()],
            block_store: "driver".into(),
            inline_result_bytes: 1 << 20,
            credentials_pushed: false,
        }),
        DriverMessage::RegisteredExecutor { generation: 7 },
        DriverMessage::DefineJob(Box::new(template())),
        DriverMessage::LaunchTask(Box::new(launch(TaskInput::Inline(b"hello".to_vec())))),
        DriverMessage::LaunchTask(Box::new(launch(TaskInput::Fetch(Box::new(fetch_ref()))))),
        DriverMessage::LaunchTask(Box::new(launch(TaskInput::Parts(vec![
            InputPart::Inline(b"{\"a\":1}".to_vec()),
            InputPart::Fetch(fetch_ref()),
        ])))),
        DriverMessage::KillTask {
            task: TaskId {
                job: JobId("job-1".into()),
                index: 1,
            },
            attempt: 2,
            reason: "job killed".into(),
        },
        DriverMessage::ForgetJob { key: 12 },
        DriverMessage::StopExecutor,
    ];
    seeds.write("frame_decoder", "driver-messages", 0x00, &frame(&driver));
    seeds.write(
        "frame_decoder",
        "driver-messages-in-3s",
        0x30,
        &frame(&driver),
    );
    seeds.write(
        "frame_decoder",
        "define-job",
        0x00,
        &frame(&[DriverMessage::DefineJob(Box::new(template()))]),
    );
    let status = |index, end| {
        ExecutorMessage::StatusUpdate {
            seq: u64::from(index) + 1,
            status: TaskStatus {
                task: TaskId {
                    job: JobId("job-1".into()),
                    index,
                },
                attempt: 1,
                generation: 7,
                end,
            },
        }
    };
    let executor = [
        ExecutorMessage::RetrieveConfig,
        ExecutorMessage::RegisterExecutor {
            executor_id: ExecutorId("exec-1".into()),
            hostname: "localhost".into(),
            cores: 2,
            app_id: Some("app".into()),
            pid: 42,
            meters_fuel: true,
            attempts: Vec::new(),
        },
        status(0, task_end(Ok(TaskResult::Inline(b"{\"a\":1}".to_vec())))),
        status(1, task_end(Err(failure()))),
        status(2, task_end(Ok(block()))),
        ExecutorMessage::Heartbeat(Heartbeat {
            running: 2,
            modules_compiled: 1,
            module_cache_hits: 10,
            fetch_hits: 3,
            fetch_misses: 1,
            compile_cache_hits: 4,
            task_cpu_us: 123_456,
            bytes_fetched: 5 << 20,
            result_bytes: 640,
            tasks_completed: 11,
            ..Heartbeat::default()
        }),
    ];
    seeds.write(
        "frame_decoder",
        "executor-messages",
        0x01,
        &frame(&executor),
    );
    seeds.write(
        "frame_decoder",
        "executor-messages-in-1s",
        0x11,
        &frame(&executor),
    );
    seeds.write(
        "frame_decoder",
        "hello",
        0x02,
        &frame(&[Hello::new(Some("secret".into()))]),
    );
    let replies = [
        HelloReply {
            version: PROTOCOL_VERSION,
            accepted: Ok(()),
        },
        HelloReply {
            version: PROTOCOL_VERSION,
            accepted: Err("version mismatch".into()),
        },
    ];
    seeds.write("frame_decoder", "hello-replies", 0x03, &frame(&replies));
}

/// job_record: selector 0 `JobRecord`, 1 a task-end batch, 2 `JobEndRecord`, 3 `JobDef`,
/// 4 `TaskInputRecord`, 5 `TaskEndRecord`, 6 a finished job's attempts.
fn records(seeds: &mut Seeds<'_>) {
    let template = template();
    let def = JobDef {
        id: template.job.clone(),
        name: template.name.clone(),
        module: template.module.clone(),
        files: template.files.clone(),
        args: template.args.clone(),
        env: template.env.clone(),
        resources: template.resources,
        max_failures: 4,
        max_result_bytes: 16 << 30,
        created_at_ms: 1_700_000_000_000,
        // Not in a `JobDef`'s encoding (side tables hold them): no seed bytes to give.
        options: Default::default(),
        owner: Default::default(),
        network: None,
    };
    let input = |input| TaskInputRecord {
        input,
        args: vec!["x".into()],
        env: vec![("K".into(), "V".into())],
    };
    let job = JobRecord {
        def: def.clone(),
        tasks: vec![
            input(TaskInput::Inline(b"a b".to_vec())),
            input(TaskInput::Fetch(Box::new(fetch_ref()))),
            input(TaskInput::Parts(vec![InputPart::Fetch(fetch_ref())])),
        ],
    };
    let end = |result, failure, state| TaskEndRecord {
        state,
        attempts: 1,
        executor: Some(ExecutorId("exec-1".into())),
        failure,
        started_at_us: Some(1),
        finished_at_us: Some(2),
        result,
        log: b"log".to_vec(),
    };
    let ok = end(
        Some(TaskResult::Inline(b"{}".to_vec())),
        None,
        api::TaskState::Succeeded,
    );
    let failed = end(None, Some(failure()), api::TaskState::Failed);
    let batch = vec![
        (JobId("job-1".into()), 0u32, ok.clone()),
        (JobId("job-1".into()), 1, failed),
        (
            JobId("job-1".into()),
            2,
            end(Some(block()), None, api::TaskState::Succeeded),
        ),
    ];
    let job_end = JobEndRecord {
        state: api::JobState::Failed,
        finished_at_ms: 1_700_000_000_001,
        error: Some(("exit".into(), "task 1 exited with 3".into())),
    };
    seeds.write("job_record", "job", 0, &bytes(&job));
    seeds.write("job_record", "task-ends", 1, &bytes(&batch));
    seeds.write("job_record", "job-end", 2, &bytes(&job_end));
    seeds.write("job_record", "job-def", 3, &bytes(&def));
    seeds.write("job_record", "task-input", 4, &bytes(&job.tasks[2]));
    seeds.write("job_record", "task-end", 5, &bytes(&ok));
    attempts(seeds);
}

fn bytes<T: Serialize>(record: &T) -> Vec<u8> {
    postcard::to_stdvec(record).expect("record encodes")
}

/// job_record's selector 6: a finished job's attempts (`job_attempts.v3`), one with its
/// outbound requests counted and its responses pinned.
fn attempts(seeds: &mut Seeds<'_>) {
    let attempt = |task, attempt, outcome: Option<AttemptOutcome>, speculative| AttemptRecord {
        task,
        attempt,
        executor: flint_protocol::ExecutorId("exec-1".into()),
        start_us: 1_764_547_200_000_000,
        end_us: outcome.map(|_| 1_764_547_200_250_000),
        outcome,
        speculative,
        memory_mb: 128 * attempt,
        timeout_ms: 30_000,
        usage: outcome.map(|_| Usage {
            fuel: Some(1_000),
            cpu_us: 2_000,
            wall_us: 2_500,
            peak_memory_bytes: 1 << 20,
            input_bytes: 3,
            output_bytes: 2,
            fetched_bytes: 6,
            egress_requests: 2,
            egress_bytes_sent: 180,
            egress_bytes_received: 4_096,
        }),
        pins: (task == 0).then(|| Pins {
            module: Digest::of(b"module"),
            files: vec![Digest::of(b"stopwords")],
            input: Digest::of(b"a b"),
            egress: vec![EgressPin {
                method: "POST".into(),
                url: "https://api.example.com/v1/embed".into(),
                request_sha256: Digest::of(b"request"),
                status: 200,
                response: Digest::of(b"response"),
                offset: 0,
                len: 4_096,
            }],
            egress_tape: Some(BlockRef {
                id: "job-1/0-1-7.egress".into(),
                size: 4_096,
                digest: Digest::of(b"tape"),
            }),
        }),
    };
    let attempts = vec![
        attempt(0, 1, Some(AttemptOutcome::Succeeded), false),
        attempt(1, 1, Some(AttemptOutcome::Lost), false),
        attempt(
            1,
            2,
            Some(AttemptOutcome::Failed(flint_protocol::FailureKind::Timeout)),
            false,
        ),
        attempt(1, 3, None, true),
    ];
    seeds.write("job_record", "attempts", 6, &bytes(&attempts));
}

/// job_spec: the README's job, and one of every input kind and field.
fn job_specs(seeds: &mut Seeds<'_>) {
    let readme = br#"{"name": "wordcount", "module": "sha256:9f2c00000000000000000000000000000000000000000000000000000000000a",
  "inputs": [{"text": "a b a"}, {"base64": "eCB5"}]}"#;
    // The selector byte is part of the JSON here: the target takes the whole input.
    std::fs::create_dir_all(seeds.corpus.join("job_spec")).expect("corpus dir");
    std::fs::write(seeds.corpus.join("job_spec/readme"), readme).expect("seed written");
    let full = JobSpec {
        name: Some("reduce".into()),
        module: "https://example.com/task.wasm".into(),
        module_sha256: Some("ab".repeat(32)),
        module_timestamp_ms: Some(5),
        files: BTreeMap::from([
            ("a.txt".into(), "sha256:00".into()),
            (
                "b.txt".into(),
                api::FileSpec::Url(api::UrlFileSpec {
                    url: "http://h/b".into(),
                    sha256: None,
                    timestamp_ms: Some(5),
                }),
            ),
        ]),
        args: vec!["--top".into(), "10".into()],
        env: BTreeMap::from([("LANG".into(), "C".into())]),
        inputs: None,
        tasks: Some(vec![
            TaskSpec {
                input: Some(InputSpec::Url {
                    url: "http://h/x".into(),
                    sha256: Some("ab".into()),
                }),
                args: vec!["x".into()],
                env: BTreeMap::from([("K".into(), "V".into())]),
            },
            TaskSpec {
                input: Some(InputSpec::Results(ResultsRef {
                    job: JobId("job-2".into()),
                    tasks: Some(vec![2, 0, 2]),
                })),
                ..TaskSpec::default()
            },
            TaskSpec {
                input: Some(InputSpec::Result(api::ResultRef {
                    job: JobId("job-1".into()),
                    task: 3,
                })),
                ..TaskSpec::default()
            },
        ]),
        resources: ResourcesSpec {
            cores: Some(2),
            memory_mb: Some(64),
            timeout_ms: Some(1000),
            max_output_bytes: Some(1 << 20),
            fuel: Some(1_000_000),
        },
        max_failures: Some(2),
        max_result_bytes: Some(1 << 30),
    };
    let json = serde_json::to_vec_pretty(&full).expect("spec serializes");
    std::fs::write(seeds.corpus.join("job_spec/every-field"), json).expect("seed written");
}

/// url_policy: selector 0 an IPv4 address (4 bytes), 1 an IPv6 address (16 bytes), 2 an
/// address in a block every table forbids, 3 text (a URL, an allow list).
fn urls(seeds: &mut Seeds<'_>) {
    seeds.write("url_policy", "v4-public", 0, &[93, 184, 216, 34]);
    seeds.write("url_policy", "v4-loopback", 0, &[127, 0, 0, 1]);
    seeds.write(
        "url_policy",
        "v6-nat64",
        1,
        &0x0064_ff9b_0000_0000_0000_0000_0808_0808_u128.to_be_bytes(),
    );
    seeds.write("url_policy", "anchor", 2, &[0xff; 16]);
    for (name, text) in [
        ("url-mapped", "http://[::ffff:127.0.0.1]:8080/input"),
        ("url-public", "https://93.184.216.34/task.wasm"),
        ("url-nat64", "http://[64:ff9b::7f00:1]/"),
        (
            "allow-list",
            " http://127.0.0.1:8000 ,https://example.com/,,s3://bucket,http://[fe80::1]:1/p",
        ),
    ] {
        seeds.write("url_policy", name, 3, text.as_bytes());
    }
}

/// egress_policy: selector 0 text (method, URL, Host header, operator, tenant or `-`, job:
/// one a line), 1 (+ 3k) an IP literal in spelling k % 5, listed by the operator when
/// k / 5 is even, 2 a URL and a Host header (a line each).
fn egress(seeds: &mut Seeds<'_>) {
    for (name, text) in [
        (
            "three-layers",
            "GET\nhttps://a.example.org:8443/v1?q=1\n\nhttps://*.example.org:8443,http://127.0.0.1:8080\nhttps://*.example.org:8443\nhttps://a.example.org:8443",
        ),
        (
            "no-tenant",
            "POST\nhttp://127.0.0.1:8080/hook\n127.0.0.1:8080\nhttp://127.0.0.1:8080\n-\nhttp://127.0.0.1:8080",
        ),
        (
            "egress-off",
            "GET\nhttp://0x7f.1:9/\n\n\n-\nhttp://127.0.0.1:9",
        ),
        (
            "host-mismatch",
            "GET\nhttp://api.test/\nevil.test\nhttp://api.test\nhttp://api.test\nhttp://api.test",
        ),
        (
            "narrower-wildcard",
            "GET\nhttps://x.b.example.org/\n\nhttps://*.example.org\nhttps://*.b.example.org,https://example.org\nhttps://*.b.example.org",
        ),
    ] {
        seeds.write("egress_policy", name, 0, text.as_bytes());
    }
    for (name, selector, body) in [
        ("v4-loopback-listed", 1, &[127, 0, 0, 1][..]),
        ("hex-loopback-unlisted", 1 + 3 * 7, &[127, 0, 0, 1]),
        ("mapped-metadata", 1 + 3 * 3, &[169, 254, 169, 254]),
        ("host-default-port", 2, b"http://api.test/\napi.test:80"),
        ("host-v6", 2, b"http://[::1]:8080/\n[::1]:8080"),
    ] {
        seeds.write("egress_policy", name, selector, body);
    }
}

/// module_rules (and module_rules_vs_engine): selector 0 raw wasm, 1 a wasm-smith seed.
fn modules(seeds: &mut Seeds<'_>) {
    const START: &str = r#"(func (export "_start"))"#;
    let wasi = r#"(module
        (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 8) "hi\n")
        (func (export "_start")
            (i32.store (i32.const 0) (i32.const 8))
            (i32.store (i32.const 4) (i32.const 3))
            (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))))"#;
    let cases = [
        ("start", format!("(module {START})")),
        ("wasi-hello", wasi.to_owned()),
        (
            "at-the-limits",
            format!(
                "(module (memory 2) (memory 1) (memory 1) (memory 1) (table 100000 funcref) \
                 {} {START})",
                "(table 1 funcref) ".repeat(7)
            ),
        ),
        (
            "five-memories",
            format!("(module {} {START})", "(memory 1) ".repeat(5)),
        ),
        (
            "big-table",
            format!("(module (table 100001 funcref) {START})"),
        ),
        ("memory64", format!("(module (memory i64 1) {START})")),
        (
            "shared-memory",
            format!("(module (memory 1 1 shared) {START})"),
        ),
        (
            "start-with-param",
            r#"(module (func (export "_start") (param i32)))"#.to_owned(),
        ),
        (
            "component",
            format!("(component (core module {START}) (core module (memory 1) {START}))"),
        ),
    ];
    for (name, text) in cases {
        let wasm = wat::parse_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        seeds.write("module_rules", name, 0, &wasm);
    }
    seeds.write("module_rules", "smith", 1, &[0x5a; 64]);
}
