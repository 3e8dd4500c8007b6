//! Requests that do not end on their own: a server that never answers, against the
//! request's own timeout, the task's deadline and a kill; and which linker has which
//! `http_send` (each path's guest waiting for a real answer).

use flint_protocol::FailureKind;

use super::super::Errno;
use super::*;

/// How far past its deadline or kill an attempt blocked in a request may end.
const PROMPT: Duration = Duration::from_millis(100);

/// How long a watched attempt's thread stays idle after it: well past [`PROMPT`].
const IDLE_AFTER: Duration = Duration::from_secs(2);

#[test]
fn a_request_past_its_own_timeout_ms_is_timeout_and_the_guest_goes_on() {
    for path in PATHS {
        let origin = Origin::start(Reply::Hang);
        let head = format!(
            r#"{{"method":"GET","url":"{}","timeout_ms":100}}"#,
            origin.url("/slow")
        );
        let ops = [
            Op::Send {
                head,
                body: Vec::new(),
            },
            error(),
        ];
        let report = run_ops(&ops, path, granted(&origin, ROOMY));
        let message = Replies::of(&report).failed(Errno::Timeout);
        assert!(message.contains("timeout_ms 100"), "{path:?}: {message}");
        // Dropped at its timeout: the connection is closed.
        assert!(
            origin.closed().is_some(),
            "{path:?}: the server saw no close"
        );
    }
}

/// Runs `ops` on a thread of its own, so that a guest that is never stopped fails the
/// test instead of hanging it. The report, and when the run started and ended. The
/// thread then stays idle a while, as an executor's task thread does between tasks: its
/// exit would drop its runtime, closing what a stopped request left open on it however
/// the attempt ended, and hide a connection the attempt itself failed to close.
fn run_watched(
    ops: Vec<Op>,
    path: Path,
    egress: Egress,
    timeout: Duration,
    kill: Arc<Kill>,
) -> (RunReport, Instant, Instant) {
    let (done, report) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .stack_size(crate::sandbox::TASK_THREAD_STACK)
        .spawn(move || {
            let sandbox = sandbox();
            let compiled = compile(&sandbox, &ops, path);
            let started = Instant::now();
            let report = run(&sandbox, &compiled, path, egress, timeout, kill);
            let _ = done.send((report, started, Instant::now()));
            std::thread::sleep(IDLE_AFTER);
        })
        .unwrap();
    (report.recv_timeout(timeout + Duration::from_secs(10)))
        .unwrap_or_else(|_| panic!("{path:?}: the attempt never ended"))
}

#[test]
fn a_guest_blocked_in_a_request_times_out_at_its_deadline() {
    for path in PATHS {
        let origin = Origin::start(Reply::Hang);
        let ops = vec![get(&origin.url("/never"))];
        let timeout = Duration::from_millis(300);
        let egress = granted(&origin, ROOMY);
        let (report, started, ended) = run_watched(ops, path, egress, timeout, Kill::new());
        assert_within("the timeout", ended - started, timeout + PROMPT);
        let failure = report.outcome.as_ref().expect_err("it never got an answer");
        assert_eq!(
            failure.kind,
            FailureKind::Timeout,
            "{path:?}: {}",
            failure.message
        );
        assert!(
            failure.message.contains("(blocked in an outbound request)"),
            "{path:?}: {}",
            failure.message
        );
        assert_eq!(report.usage.egress_requests, 1);
        assert!(
            origin.closed().is_some(),
            "{path:?}: the server saw no close"
        );
    }
}

#[test]
fn a_guest_blocked_in_a_request_is_killed_at_once_and_its_connection_closed() {
    for path in PATHS {
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
        let ops = vec![get(&origin.url("/never"))];
        let egress = granted(&origin, ROOMY);
        let (report, _, ended) = run_watched(ops, path, egress, Duration::from_secs(30), kill);
        let killed_at = killer.join().unwrap();
        assert_within("ending after the kill", ended - killed_at, PROMPT);
        let failure = report.outcome.as_ref().expect_err("it was killed");
        assert_eq!(
            failure.kind,
            FailureKind::Killed,
            "{path:?}: {}",
            failure.message
        );
        assert!(
            failure.message.contains("(blocked in an outbound request)"),
            "{path:?}: {}",
            failure.message
        );
        let closed_at = (origin.closed()).unwrap_or_else(|| panic!("{path:?}: no close seen"));
        assert_within("the close after the kill", closed_at - killed_at, PROMPT);
    }
}

/// A synchronous `http_send` on the async path would start the task runtime inside
/// itself (a panic); an async one on a synchronous path cannot be called. Each path's
/// guest must get its answer.
#[test]
fn each_p1_linker_has_the_http_send_its_guests_can_call() {
    for path in [Path::Sync, Path::Waiting, Path::Deterministic] {
        let origin = Origin::answering(b"linked");
        let ops = [get(&origin.url("/")), take(0)];
        let report = run_ops(&ops, path, granted(&origin, ROOMY));
        let mut replies = Replies::of(&report);
        assert_eq!(replies.send().errno, 0, "{path:?}");
        let (errno, _, body) = replies.take(4096, 4096);
        assert_eq!((errno, &body[..6]), (0, &b"linked"[..]), "{path:?}");
    }
}

#[test]
fn a_module_importing_flint_links_on_every_path_without_a_grant() {
    for path in [Path::Sync, Path::Waiting, Path::Deterministic] {
        let ops = [get("http://127.0.0.1:1/"), error()];
        let report = run_ops(&ops, path, Egress::default());
        let message = Replies::of(&report).failed(Errno::Denied);
        assert!(message.contains("network.allow"), "{path:?}: {message}");
    }
}
