//! Outbound HTTP from components, through `wasi:http` as a task's author reaches it:
//! the testkit guest built for wasm32-wasip2 (`flint_sdk::http`) against the loopback
//! server of these tests; and how a component is run here ([`Task`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use flint_protocol::{Digest, FailureKind, NetworkGrant};

use super::super::{NoNetwork, Replayer};
use super::*;

/// How far past its deadline or kill an attempt blocked in a request may end.
const PROMPT: Duration = Duration::from_millis(100);

/// The testkit guest as a command component, built once per test process where the
/// end-to-end tests build it (`tests/e2e/common/guests.rs`), so that they share it.
fn testkit() -> &'static [u8] {
    static WASM: OnceLock<Vec<u8>> = OnceLock::new();
    WASM.get_or_init(|| {
        let target_dir = target_dir().join("tmp/guests");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let output = Command::new(cargo)
            // The guests' own .cargo/config.toml is found from the working directory.
            .current_dir(root.join("guest-examples"))
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "-p",
                "testkit",
            ])
            .env("CARGO_TARGET_DIR", &target_dir)
            .env_remove("RUSTFLAGS")
            .output()
            .expect("running cargo for the testkit guest");
        assert!(
            output.status.success(),
            "building the testkit component failed (rustup target add wasm32-wasip2):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::read(target_dir.join("wasm32-wasip2/release/testkit.wasm")).unwrap()
    })
}

/// The workspace's target directory: this test binary is `<target>/<profile>/deps/*`.
pub(super) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

fn compile(wasm: &[u8], kind: EngineKind) -> (Sandbox, Compiled) {
    let sandbox = sandbox();
    let compiled =
        (sandbox.compile_for(wasm, kind)).unwrap_or_else(|f| panic!("{}: {}", f.kind, f.message));
    assert!(matches!(compiled, Compiled::Component(_)));
    (sandbox, compiled)
}

/// One run of a component: its arguments (after its name) and stdin.
pub(super) struct Task {
    pub(super) guest: fn() -> &'static [u8],
    args: Vec<String>,
    stdin: Vec<u8>,
    egress: Egress,
    timeout: Duration,
    kill: Arc<Kill>,
    kind: EngineKind,
}

impl Task {
    pub(super) fn new(args: &[&str], egress: Egress) -> Self {
        Task {
            guest: testkit,
            args: args.iter().map(|a| a.to_string()).collect(),
            stdin: Vec::new(),
            egress,
            timeout: Duration::from_secs(30),
            kill: Kill::new(),
            kind: EngineKind::Native,
        }
    }

    fn run_on(self, sandbox: &Sandbox, compiled: &Compiled) -> RunReport {
        let args: Vec<&str> = std::iter::once("guest")
            .chain(self.args.iter().map(String::as_str))
            .collect();
        sandbox.run(
            compiled,
            TaskRun {
                args: &args,
                env: &[],
                task: TaskEnv {
                    job: "job",
                    index: 0,
                    count: 1,
                    attempt: 1,
                },
                stdin: self.stdin,
                memory_bytes: 64 << 20,
                timeout: self.timeout,
                max_output_bytes: 1 << 20,
                max_log_bytes: 1 << 20,
                kill: self.kill,
                fuel: None,
                seed: matches!(self.kind, EngineKind::Deterministic).then_some([7; 32]),
                files_dir: None,
                result_target: None,
                egress: self.egress,
            },
        )
    }

    /// Runs the component to its end.
    pub(super) fn run(self) -> RunReport {
        let (sandbox, compiled) = compile((self.guest)(), self.kind);
        self.run_on(&sandbox, &compiled)
    }

    /// Runs it on a thread of its own, so that a guest that is never stopped fails the
    /// test instead of hanging it: the report, and when the run started and ended. The
    /// thread lives on, idle as an executor's task thread between tasks, until the
    /// returned sender is dropped: what its runtime has not dropped by then, it would
    /// not drop before its next task.
    fn run_watched(self) -> (RunReport, Instant, Instant, Sender<()>) {
        let wait = self.timeout + Duration::from_secs(10);
        let (done, report) = channel();
        let (release, released) = channel::<()>();
        std::thread::Builder::new()
            .stack_size(crate::sandbox::TASK_THREAD_STACK)
            .spawn(move || {
                let (sandbox, compiled) = compile((self.guest)(), self.kind);
                let started = Instant::now();
                let report = self.run_on(&sandbox, &compiled);
                let _ = done.send((report, started, Instant::now()));
                let _ = released.recv();
            })
            .unwrap();
        let (report, started, ended) =
            (report.recv_timeout(wait)).expect("the attempt never ended");
        (report, started, ended, release)
    }
}

/// What the guest wrote, as text.
pub(super) fn stdout(report: &RunReport) -> String {
    match &report.outcome {
        Ok(TaskResult::Inline(bytes)) => String::from_utf8(bytes.clone()).unwrap(),
        other => panic!("{other:?}: {}", String::from_utf8_lossy(&report.log)),
    }
}

#[test]
fn a_component_gets_and_posts_through_wasi_http_and_its_bytes_are_counted() {
    let origin = Origin::answering(b"hello");
    let url = origin.url("/greeting?x=1");
    let report = Task::new(&["http-get", &url], granted(&origin, ROOMY)).run();
    let out = stdout(&report);
    assert!(out.starts_with("status=200 bytes=5 sha256="), "{out}");
    assert!(out.ends_with("\nhello"), "{out}");
    let seen = origin.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].target.as_str()),
        ("GET", "/greeting?x=1")
    );
    // As for a module: sent, the method and URL (a GET has no headers); received, the
    // server's three headers' names and values, and the body.
    let usage = &report.usage;
    assert_eq!(usage.egress_requests, 1);
    assert_eq!(usage.egress_bytes_sent, ("GET".len() + url.len()) as u64);
    let received = "content-length5connectionclosex-testyeshello".len() as u64;
    assert_eq!(usage.egress_bytes_received, received);
    assert_eq!(report.egress_denied.count, 0);

    let url = origin.url("/in");
    let mut post = Task::new(&["http-post", &url], granted(&origin, ROOMY));
    post.stdin = b"the payload".to_vec();
    let report = post.run();
    assert!(stdout(&report).starts_with("status=200 "));
    let seen = origin.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), &seen[0].body[..]),
        ("POST", &b"the payload"[..])
    );
    // The SDK gives a body its length.
    let sent = "POST".len() + url.len() + "content-length11".len() + "the payload".len();
    assert_eq!(report.usage.egress_bytes_sent, sent as u64);
}

#[test]
fn without_a_grant_a_components_request_is_denied_naming_network_allow() {
    let origin = Origin::answering(b"no");
    let url = origin.url("/");
    for (why, names) in [
        (NoNetwork::Job, &["network.allow"][..]),
        (
            NoNetwork::JobAndExecutor,
            &["network.allow", "--egress-allow"],
        ),
    ] {
        let report = Task::new(&["http-get", &url], Egress::Off(why)).run();
        // The guest is told the code; the attempt's denials say why, as a module's do.
        assert_eq!(
            stdout(&report),
            format!("error: Denied: GET {url}: HttpRequestDenied\n")
        );
        let [message] = &report.egress_denied.first[..] else {
            panic!("{:?}", report.egress_denied)
        };
        assert!(message.starts_with(&format!("GET {url}: ")), "{message}");
        for name in names {
            assert!(message.contains(name), "{message:?} should name {name}");
        }
        assert_eq!(report.egress_denied.count, 1);
        assert_eq!(report.usage.egress_requests, 0);
    }
    assert!(origin.requests().is_empty());
}

#[test]
fn a_components_request_beyond_the_operators_list_or_to_an_unlisted_address_is_denied() {
    let origin = Origin::answering(b"no");
    let url = origin.url("/");
    let egress = live(&["http://127.0.0.1:1".into()], &[origin.origin()], ROOMY);
    let report = Task::new(&["http-get", &url], egress).run();
    assert!(stdout(&report).contains("HttpRequestDenied"));
    assert!(report.egress_denied.first[0].contains("--egress-allow"));
    // A name listed by the operator and the job that resolves to an address the
    // operator did not list exactly: refused at connect.
    let by_name = format!("http://localhost:{}", origin.port);
    let listed = std::slice::from_ref(&by_name);
    let url = format!("{by_name}/");
    let report = Task::new(&["http-get", &url], live(listed, listed, ROOMY)).run();
    assert_eq!(
        stdout(&report),
        format!("error: Denied: GET {url}: DestinationIpProhibited\n")
    );
    assert!(report.egress_denied.first[0].contains("loopback"));
    assert_eq!(report.usage.egress_requests, 0);
    assert!(origin.requests().is_empty());
}

#[test]
fn a_component_blocked_in_a_request_is_killed_at_once_and_its_connection_closed() {
    let origin = Arc::new(Origin::start(Reply::Hang));
    let kill = Kill::new();
    let killer = {
        let (origin, kill) = (origin.clone(), kill.clone());
        std::thread::spawn(move || {
            origin.next_request();
            let killed_at = Instant::now();
            kill.kill();
            killed_at
        })
    };
    let url = origin.url("/never");
    let mut task = Task::new(&["http-get", &url], granted(&origin, ROOMY));
    task.kill = kill;
    let (report, _, ended, _idle) = task.run_watched();
    let killed_at = killer.join().unwrap();
    assert_within("ending after the kill", ended - killed_at, PROMPT);
    let failure = report.outcome.as_ref().expect_err("it was killed");
    assert_eq!(failure.kind, FailureKind::Killed, "{}", failure.message);
    assert_eq!(failure.message, "killed (blocked in an outbound request)");
    assert_eq!(report.usage.egress_requests, 1);
    let closed_at = origin
        .closed()
        .expect("the server saw its connection closed");
    assert_within("the close after the kill", closed_at - killed_at, PROMPT);
}

#[test]
fn a_component_blocked_in_a_request_times_out_at_its_deadline_and_its_connection_closes() {
    let origin = Origin::start(Reply::Hang);
    let url = origin.url("/never");
    let timeout = Duration::from_millis(300);
    let mut task = Task::new(&["http-get", &url], granted(&origin, ROOMY));
    task.timeout = timeout;
    let (report, started, ended, _idle) = task.run_watched();
    assert_within("the timeout", ended - started, timeout + PROMPT);
    let failure = report.outcome.as_ref().expect_err("it never got an answer");
    assert_eq!(failure.kind, FailureKind::Timeout, "{}", failure.message);
    assert!(
        failure.message.contains("(blocked in an outbound request)"),
        "{}",
        failure.message
    );
    let closed_at = origin
        .closed()
        .expect("the server saw its connection closed");
    assert_within(
        "the close after the deadline",
        closed_at - started,
        timeout + PROMPT,
    );
}

#[test]
fn max_concurrent_counts_a_components_requests_in_flight() {
    // Never answered, the first two stay in flight however the guest's calls and the
    // runtime interleave: the third, sent before any is taken, is refused.
    let origin = Origin::start(Reply::Hang);
    let limits = EgressLimits {
        max_concurrent: 2,
        ..ROOMY
    };
    let url = origin.url("/");
    let mut par = Task::new(&["http-par", &url, "3"], granted(&origin, limits));
    par.timeout = Duration::from_secs(1);
    let report = par.run();
    let failure = report
        .outcome
        .as_ref()
        .expect_err("it waits past its deadline");
    assert_eq!(failure.kind, FailureKind::Timeout, "{}", failure.message);
    assert_eq!(report.usage.egress_requests, 2);
    origin.next_request();
    origin.next_request();
    assert!(origin.requests().is_empty(), "the third never left");
    // One after the other, each request leaves flight before the next.
    let origin = Origin::answering(b"ok");
    let url = origin.url("/");
    let report = Task::new(&["http-n", &url, "3"], granted(&origin, limits)).run();
    assert_eq!(stdout(&report).lines().count(), 3);
    assert_eq!(report.usage.egress_requests, 3);
}

#[test]
fn max_requests_stops_a_component_at_its_number() {
    let origin = Origin::answering(b"ok");
    let limits = EgressLimits {
        max_requests: 2,
        ..ROOMY
    };
    let url = origin.url("/");
    let report = Task::new(&["http-n", &url, "3"], granted(&origin, limits)).run();
    assert!(report.outcome.is_err(), "http-n fails at the refused third");
    assert_eq!(report.usage.egress_requests, 2);
    assert_eq!(origin.requests().len(), 2);
}

#[test]
fn max_bytes_stops_a_components_response_and_its_request_body() {
    let origin = Origin::answering(&[b'x'; 1000]);
    let limits = EgressLimits {
        max_bytes: 500,
        ..ROOMY
    };
    let url = origin.url("/big");
    let report = Task::new(&["http-get", &url], granted(&origin, limits)).run();
    assert_eq!(
        stdout(&report),
        format!("error: Limit: GET {url}: HttpResponseBodySize(None)\n")
    );
    assert!(report.usage.egress_bytes_sent + report.usage.egress_bytes_received <= 500);
    assert_eq!(origin.requests().len(), 1);
    // A body past what is left after the head is never sent.
    let url = origin.url("/in");
    let mut post = Task::new(&["http-post", &url], granted(&origin, limits));
    post.stdin = vec![b'y'; 1000];
    let report = post.run();
    let room = 500 - ("POST".len() + url.len() + "content-length1000".len());
    assert_eq!(
        stdout(&report),
        format!("error: Limit: POST {url}: HttpRequestBodySize(Some({room}))\n")
    );
    assert!(origin.requests().is_empty());
}

/// Requests in flight at once share what is left of `max_bytes`: each alone would
/// fit, together they do not.
#[test]
fn max_bytes_holds_for_a_components_requests_in_flight_together() {
    let origin = Origin::answering(&[b'x'; 400]);
    let limits = EgressLimits {
        max_bytes: 1000,
        ..ROOMY
    };
    let url = origin.url("/");
    let report = Task::new(&["http-par", &url, "3"], granted(&origin, limits)).run();
    let failure = report.outcome.as_ref().expect_err("the third was cut");
    assert_eq!(failure.kind, FailureKind::Exit, "{}", failure.message);
    let usage = &report.usage;
    assert_eq!(usage.egress_requests, 3);
    assert!(
        usage.egress_bytes_sent + usage.egress_bytes_received <= 1000,
        "{usage:?}"
    );
}

#[test]
fn a_deterministic_components_requests_are_recorded_and_replayed_without_the_network() {
    let origin = Origin::answering(b"recorded");
    let url = origin.url("/r");
    let mut post = Task::new(&["http-post", &url], granted(&origin, ROOMY));
    (post.kind, post.stdin) = (EngineKind::Deterministic, b"in".to_vec());
    let recorded = post.run();
    let out = stdout(&recorded);
    assert!(out.ends_with("\nrecorded"), "{out}");
    let tape = (recorded.egress_tape).expect("a deterministic attempt's requests are recorded");
    let [pin] = &tape.pins[..] else {
        panic!("{:?}", tape.pins)
    };
    assert_eq!(
        (pin.method.as_str(), pin.url.as_str(), pin.status),
        ("POST", url.as_str(), 200)
    );
    assert_eq!(pin.request_sha256, Digest::of(b"in"));
    assert_eq!(origin.requests().len(), 1);
    let grant = NetworkGrant {
        allow: vec![origin.origin()],
        tenant_allow: None,
        max_requests: ROOMY.max_requests,
        max_bytes: ROOMY.max_bytes,
        max_concurrent: ROOMY.max_concurrent,
    };
    let replayer = Replayer::new(&grant, tape.pins, Some(&tape.bytes)).unwrap();
    let mut replay = Task::new(&["http-post", &url], Egress::Replay(replayer));
    (replay.kind, replay.stdin) = (EngineKind::Deterministic, b"in".to_vec());
    let replayed = replay.run();
    assert_eq!(stdout(&replayed), out);
    assert_eq!(
        replayed.usage.egress_bytes_sent,
        recorded.usage.egress_bytes_sent
    );
    assert!(origin.requests().is_empty(), "the replay reached no server");
}

/// CVE-2024-32980 (Spin): a Host header naming another host than the URL's. wasi-http
/// forbids the header, and nothing adds one, so the authority judged is the one sent.
#[test]
fn a_components_host_header_is_refused_before_anything_is_sent() {
    let origin = Origin::answering(b"no");
    let url = origin.url("/");
    let args = ["http-req", "GET", &url, "host:metadata.internal"];
    let report = Task::new(&args, granted(&origin, ROOMY)).run();
    let out = stdout(&report);
    assert!(
        out.starts_with(&format!("error: Denied: GET {url}: ")),
        "{out}"
    );
    assert!(out.contains("forbids"), "{out}");
    assert_eq!(report.usage.egress_requests, 0);
    assert!(origin.requests().is_empty());
}
