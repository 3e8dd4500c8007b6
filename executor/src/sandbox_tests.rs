//! The sandbox's promises in-process, one attempt at a time: deadlines and kills reach a
//! guest wherever it is, exit codes are the guest's own, and the engine takes what the
//! module rules accept. Bounds on elapsed time are loose on purpose: they tell "stopped
//! at its deadline" from "ran its 8 s sleep to the end", not how fast the machine is.

use flint_module_rules::Limits;

use super::*;

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        slots: 2,
        max_memory_bytes: 64 << 20,
        fuel: false,
    })
    .unwrap()
}

fn compile(sandbox: &Sandbox, wat: &str) -> Compiled {
    let wasm = wat::parse_str(wat).unwrap();
    sandbox
        .compile(&wasm)
        .unwrap_or_else(|f| panic!("{}: {}", f.kind, f.message))
}

fn run(sandbox: &Sandbox, compiled: &Compiled, timeout: Duration, kill: Arc<Kill>) -> RunReport {
    sandbox.run(
        compiled,
        TaskRun {
            args: &["test"],
            env: &[],
            task: TaskEnv {
                job: "job",
                index: 0,
                count: 1,
                attempt: 1,
            },
            stdin: Vec::new(),
            memory_bytes: 64 << 20,
            timeout,
            max_output_bytes: 1 << 20,
            max_log_bytes: 1 << 20,
            kill,
            fuel: None,
            files_dir: None,
            result_target: None,
        },
    )
}

fn failure(report: &RunReport) -> &TaskFailure {
    report
        .outcome
        .as_ref()
        .expect_err("the attempt should fail")
}

/// A p1 command that sleeps `nanos` in `poll_oneoff` on one relative monotonic-clock
/// subscription.
fn sleeper(nanos: u64) -> String {
    format!(
        r#"(module
             (import "wasi_snapshot_preview1" "poll_oneoff"
               (func $poll (param i32 i32 i32 i32) (result i32)))
             (memory (export "memory") 1)
             (func (export "_start")
               ;; subscription at 0: userdata, tag 0 (clock), clock id 1 (monotonic),
               ;; timeout, precision 0, flags 0 (relative); the event goes at 64.
               (i32.store8 (i32.const 8) (i32.const 0))
               (i32.store (i32.const 16) (i32.const 1))
               (i64.store (i32.const 24) (i64.const {nanos}))
               (drop (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)))))"#,
        nanos = nanos as i64
    )
}

#[test]
fn a_guest_sleeping_in_poll_oneoff_ends_at_its_deadline() {
    let sandbox = sandbox();
    let compiled = compile(&sandbox, &sleeper(8_000_000_000));
    let started = Instant::now();
    let report = run(&sandbox, &compiled, Duration::from_millis(300), Kill::new());
    let elapsed = started.elapsed();
    let failure = failure(&report);
    assert_eq!(failure.kind, FailureKind::Timeout, "{}", failure.message);
    assert!(failure.message.contains("300 ms"), "{}", failure.message);
    assert!(
        elapsed < Duration::from_secs(4),
        "ran {elapsed:?} of an 8 s sleep"
    );
}

#[test]
fn a_guest_sleeping_forever_is_killed() {
    let sandbox = sandbox();
    let compiled = compile(&sandbox, &sleeper(u64::MAX));
    let kill = Kill::new();
    let killer = {
        let kill = kill.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            kill.kill();
        })
    };
    let started = Instant::now();
    let report = run(&sandbox, &compiled, Duration::from_secs(600), kill);
    killer.join().unwrap();
    assert_eq!(failure(&report).kind, FailureKind::Killed);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_short_sleep_within_the_deadline_just_returns() {
    let sandbox = sandbox();
    let compiled = compile(&sandbox, &sleeper(10_000_000));
    let report = run(&sandbox, &compiled, Duration::from_secs(30), Kill::new());
    assert!(report.outcome.is_ok(), "{:?}", report.outcome);
}

#[test]
fn a_compute_loop_still_ends_as_timeout_and_a_kill_before_the_start_as_killed() {
    let sandbox = sandbox();
    let compiled = compile(
        &sandbox,
        r#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#,
    );
    let report = run(&sandbox, &compiled, Duration::from_millis(100), Kill::new());
    assert_eq!(failure(&report).kind, FailureKind::Timeout);
    let kill = Kill::new();
    kill.kill();
    let report = run(&sandbox, &compiled, Duration::from_secs(30), kill);
    assert_eq!(failure(&report).kind, FailureKind::Killed);
}

#[test]
fn random_bytes_in_a_loop_end_at_the_deadline() {
    let sandbox = sandbox();
    // The most random bytes a call may have, forever; one more traps.
    let compiled = compile(
        &sandbox,
        r#"(module
             (import "wasi_snapshot_preview1" "random_get"
               (func $random (param i32 i32) (result i32)))
             (memory (export "memory") 600)
             (func (export "_start")
               (loop (drop (call $random (i32.const 0) (i32.const 4194304))) (br 0))))"#,
    );
    let started = Instant::now();
    let report = run(&sandbox, &compiled, Duration::from_millis(300), Kill::new());
    assert_eq!(failure(&report).kind, FailureKind::Timeout);
    assert!(started.elapsed() < Duration::from_secs(4));
    let over = compile(
        &sandbox,
        r#"(module
             (import "wasi_snapshot_preview1" "random_get"
               (func $random (param i32 i32) (result i32)))
             (memory (export "memory") 600)
             (func (export "_start") (drop (call $random (i32.const 0) (i32.const 4194305)))))"#,
    );
    let report = run(&sandbox, &over, Duration::from_secs(30), Kill::new());
    let failure = failure(&report);
    assert_eq!(failure.kind, FailureKind::Trap, "{}", failure.message);
}

#[test]
fn every_exit_code_is_the_guests_own() {
    let sandbox = sandbox();
    for code in [0, 1, 42, 125, 126, 127, 128, 200, 255] {
        let compiled = compile(
            &sandbox,
            &format!(
                r#"(module
                     (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
                     (memory (export "memory") 1)
                     (func (export "_start") (call $exit (i32.const {code}))))"#
            ),
        );
        let report = run(&sandbox, &compiled, Duration::from_secs(30), Kill::new());
        match code {
            0 => assert!(report.outcome.is_ok(), "{:?}", report.outcome),
            _ => {
                let failure = failure(&report);
                assert_eq!(
                    failure.kind,
                    FailureKind::Exit,
                    "{code}: {}",
                    failure.message
                );
                assert_eq!(failure.exit_code, Some(code));
            }
        }
    }
}

#[test]
fn the_engine_takes_what_the_module_rules_accept() {
    let sandbox = sandbox();
    let module = r#"(module
        (memory (export "memory") 1) (memory 1) (memory 1) (memory 1)
        (table 100000 funcref) (table 1 funcref) (table 1 funcref) (table 1 funcref)
        (table 1 funcref) (table 1 funcref) (table 1 funcref) (table 1 funcref)
        (func (export "_start") (drop (i32.load 3 (i32.const 0)))))"#;
    let wasm = wat::parse_str(module).unwrap();
    flint_module_rules::check(&wasm, &Limits::DEFAULT).unwrap();
    let compiled = compile(&sandbox, module);
    let report = run(&sandbox, &compiled, Duration::from_secs(30), Kill::new());
    assert!(report.outcome.is_ok(), "{:?}", report.outcome);
}

#[test]
fn the_engine_refuses_the_proposals_the_rules_leave_out() {
    let sandbox = sandbox();
    for module in [
        r#"(module (memory i64 1) (func (export "_start")))"#,
        r#"(module (memory 1 1 shared) (func (export "_start")))"#,
    ] {
        let wasm = wat::parse_str(module).unwrap();
        assert!(flint_module_rules::check(&wasm, &Limits::DEFAULT).is_err());
        let failure = sandbox.compile(&wasm).map(drop).unwrap_err();
        assert_eq!(failure.kind, FailureKind::InvalidModule, "{module}");
    }
}

#[test]
fn the_memory_limit_holds_for_all_of_a_tasks_memories_together() {
    let sandbox = sandbox();
    // Two memories of 40 MiB each, under a 64 MiB limit that each alone would meet.
    let compiled = compile(
        &sandbox,
        r#"(module (memory (export "memory") 640) (memory 640) (func (export "_start")))"#,
    );
    let report = run(&sandbox, &compiled, Duration::from_secs(30), Kill::new());
    assert_eq!(failure(&report).kind, FailureKind::MemoryLimit);
    // Growing the second past what the first leaves is refused too.
    let compiled = compile(
        &sandbox,
        r#"(module (memory (export "memory") 640) (memory 1)
             (func (export "_start") (drop (memory.grow 1 (i32.const 500)))))"#,
    );
    let report = run(&sandbox, &compiled, Duration::from_secs(30), Kill::new());
    assert_eq!(failure(&report).kind, FailureKind::MemoryLimit);
}

#[test]
fn a_guest_that_could_wait_but_computes_ends_at_its_deadline_and_at_a_kill() {
    // It imports poll_oneoff, so it runs on the async path, but it never calls it: the
    // epoch must still stop it there.
    let sandbox = sandbox();
    let compiled = compile(
        &sandbox,
        r#"(module
             (import "wasi_snapshot_preview1" "poll_oneoff"
               (func $poll (param i32 i32 i32 i32) (result i32)))
             (memory (export "memory") 1)
             (func (export "_start") (loop (br 0))))"#,
    );
    assert!(matches!(compiled, Compiled::WaitingModule(_)));
    let report = run(&sandbox, &compiled, Duration::from_millis(100), Kill::new());
    assert_eq!(failure(&report).kind, FailureKind::Timeout);
    let kill = Kill::new();
    let killer = {
        let kill = kill.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            kill.kill();
        })
    };
    let report = run(&sandbox, &compiled, Duration::from_secs(600), kill);
    killer.join().unwrap();
    assert_eq!(failure(&report).kind, FailureKind::Killed);
}
