//! The sandbox's promises in-process, one attempt at a time: deadlines and kills reach a
//! guest wherever it is, exit codes are the guest's own, and the engine takes what the
//! module rules accept. Bounds on elapsed time are loose on purpose: they tell "stopped
//! at its deadline" from "ran its 8 s sleep to the end", not how fast the machine is.

use std::time::Instant;

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
    compile_for(sandbox, wat, EngineKind::Native)
}

/// For the engine deterministic (seeded) tasks run on.
fn compile_for(sandbox: &Sandbox, wat: &str, kind: EngineKind) -> Compiled {
    let wasm = wat::parse_str(wat).unwrap();
    (sandbox.compile_for(&wasm, kind)).unwrap_or_else(|f| panic!("{}: {}", f.kind, f.message))
}

fn run(sandbox: &Sandbox, compiled: &Compiled, timeout: Duration, kill: Arc<Kill>) -> RunReport {
    run_with_seed(sandbox, compiled, timeout, kill, None)
}

fn run_with_seed(
    sandbox: &Sandbox,
    compiled: &Compiled,
    timeout: Duration,
    kill: Arc<Kill>,
    seed: Option<[u8; 32]>,
) -> RunReport {
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
            seed,
            files_dir: None,
            result_target: None,
            egress: Egress::default(),
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
pub(crate) fn sleeper(nanos: u64) -> String {
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

/// A p1 command that grows its 1-page memory by `grow` pages, then writes "abc" to
/// stdout, then counts down from `loops` in a loop.
fn grower(grow: u32, loops: u32) -> String {
    format!(
        r#"(module
             (import "wasi_snapshot_preview1" "fd_write"
               (func $write (param i32 i32 i32 i32) (result i32)))
             (memory (export "memory") 1)
             (func (export "_start") (local $n i32)
               (drop (memory.grow (i32.const {grow})))
               ;; "abc" at 100, its iovec at 0, the count written at 8.
               (i32.store8 (i32.const 100) (i32.const 97))
               (i32.store8 (i32.const 101) (i32.const 98))
               (i32.store8 (i32.const 102) (i32.const 99))
               (i32.store (i32.const 0) (i32.const 100))
               (i32.store (i32.const 4) (i32.const 3))
               (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
               (local.set $n (i32.const {loops}))
               (block $done
                 (loop $again
                   (br_if $done (i32.eqz (local.get $n)))
                   (local.set $n (i32.sub (local.get $n) (i32.const 1)))
                   (br $again)))))"#
    )
}

#[test]
fn usage_counts_the_memory_held_the_output_written_and_the_time_taken() {
    let sandbox = sandbox();
    let compiled = compile(&sandbox, &grower(99, 10));
    let report = run(&sandbox, &compiled, Duration::from_secs(10), Kill::new());
    assert!(report.outcome.is_ok(), "{:?}", report.outcome);
    let usage = report.usage;
    // 1 page at instantiation and 99 grown: exactly 100 pages of 64 KiB.
    assert_eq!(usage.peak_memory_bytes, 100 * 65_536);
    assert_eq!(usage.output_bytes, 3);
    assert!(usage.wall_us > 0);
    assert_eq!(usage.fuel, None, "this engine meters no fuel");
}

#[test]
fn a_guest_stopped_at_its_memory_limit_is_counted_at_what_it_held() {
    let sandbox = sandbox();
    // 64 MiB is 1,024 pages: growing by 2,000 is refused and traps (trap_on_grow_failure).
    let compiled = compile(&sandbox, &grower(2_000, 0));
    let report = run(&sandbox, &compiled, Duration::from_secs(10), Kill::new());
    assert_eq!(failure(&report).kind, FailureKind::MemoryLimit);
    assert_eq!(report.usage.peak_memory_bytes, 65_536);
    assert_eq!(report.usage.output_bytes, 0);
}

#[test]
fn fuel_is_counted_where_metered_and_the_same_for_the_same_work() {
    let metered = Sandbox::new(SandboxConfig {
        slots: 2,
        max_memory_bytes: 64 << 20,
        fuel: true,
    })
    .unwrap();
    let fuel = |loops| {
        let compiled = compile(&metered, &grower(0, loops));
        let report = run(&metered, &compiled, Duration::from_secs(10), Kill::new());
        assert!(report.outcome.is_ok(), "{:?}", report.outcome);
        report.usage.fuel.expect("metered")
    };
    let (small, again, large) = (fuel(1_000), fuel(1_000), fuel(101_000));
    assert_eq!(small, again, "the same work costs the same fuel");
    // Each turn of the loop is a handful of instructions: 100,000 more turns cost at
    // least 100,000 more fuel.
    assert!(large - small >= 100_000, "{small} then {large}");
}

/// The probe of deterministic mode: 40 bytes of clocks, random bytes and the monotonic
/// clock after a 2 s sleep in `poll_oneoff` (shared with tests/e2e/determinism.rs).
const CLOCKS_AND_RANDOM: &str = include_str!("../../tests/wat/clocks_and_random.wat");

fn run_seeded(sandbox: &Sandbox, compiled: &Compiled, seed: Option<[u8; 32]>) -> Vec<u8> {
    let report = run_with_seed(
        sandbox,
        compiled,
        Duration::from_secs(30),
        Kill::new(),
        seed,
    );
    match report.outcome {
        Ok(TaskResult::Inline(bytes)) => bytes,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_seeded_guest_reads_the_same_clocks_and_random_bytes_every_run_and_sleeps_in_no_time() {
    let sandbox = sandbox();
    let compiled = compile_for(&sandbox, CLOCKS_AND_RANDOM, EngineKind::Deterministic);
    let began = Instant::now();
    let first = run_seeded(&sandbox, &compiled, Some([1; 32]));
    assert!(
        began.elapsed() < Duration::from_millis(1_500),
        "a virtual 2 s sleep waited {:?}",
        began.elapsed()
    );
    let u64_at =
        |bytes: &[u8], at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    assert_eq!(
        u64_at(&first, 0),
        EPOCH.as_nanos() as u64,
        "the wall clock starts at 2000"
    );
    assert_eq!(u64_at(&first, 8), 0, "the monotonic clock at 0");
    assert_eq!(
        u64_at(&first, 32),
        2_000_000_000,
        "moved by exactly the sleep"
    );
    assert_eq!(run_seeded(&sandbox, &compiled, Some([1; 32])), first);
    let other = run_seeded(&sandbox, &compiled, Some([2; 32]));
    assert_eq!(
        other[..16],
        first[..16],
        "the clocks do not depend on the seed"
    );
    assert_ne!(other[16..32], first[16..32], "the random bytes do");
    // Unseeded: the host's clocks and entropy, different every run.
    let compiled = compile(&sandbox, CLOCKS_AND_RANDOM);
    let host = run_seeded(&sandbox, &compiled, None);
    assert_ne!(host[..8], first[..8]);
    assert_ne!(run_seeded(&sandbox, &compiled, None)[16..32], host[16..32]);
    // A module compiled for one engine does not run on the other.
    let report = run_with_seed(
        &sandbox,
        &compiled,
        Duration::from_secs(30),
        Kill::new(),
        Some([1; 32]),
    );
    assert_eq!(failure(&report).kind, FailureKind::HostError);
}

/// A deterministic guest's `poll_oneoff` with hostile arguments: subscriptions past the
/// end of memory, none at all, an event buffer past the end. It answers with an errno
/// (EFAULT 21, EINVAL 28), as WASI's does; nothing traps, nothing reads out of bounds.
#[test]
fn a_seeded_guests_poll_oneoff_refuses_bad_pointers_and_counts_with_an_errno() {
    let sandbox = sandbox();
    let compiled = compile_for(
        &sandbox,
        r#"(module
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    ;; subscriptions that run past the end of the one page
    (i32.store8 (i32.const 1000) (call $poll (i32.const 65530) (i32.const 0) (i32.const 1) (i32.const 128)))
    ;; none at all
    (i32.store8 (i32.const 1001) (call $poll (i32.const 0) (i32.const 64) (i32.const 0) (i32.const 128)))
    ;; a count so large that its bytes overflow 32 bits
    (i32.store8 (i32.const 1002) (call $poll (i32.const 0) (i32.const 64) (i32.const -1) (i32.const 128)))
    ;; events past the end
    (i32.store8 (i32.const 1003) (call $poll (i32.const 0) (i32.const 65535) (i32.const 1) (i32.const 128)))
    (i32.store (i32.const 200) (i32.const 1000))
    (i32.store (i32.const 204) (i32.const 4))
    (drop (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 208)))))"#,
        EngineKind::Deterministic,
    );
    assert_eq!(
        run_seeded(&sandbox, &compiled, Some([3; 32])),
        [21, 28, 21, 21]
    );
}

/// A deterministic guest that sleeps forever: each sleep returns at once, so it spins,
/// and its deadline stops it like any guest that computes.
#[test]
fn a_seeded_guest_sleeping_forever_ends_at_its_deadline() {
    let sandbox = sandbox();
    let compiled = compile_for(
        &sandbox,
        r#"(module
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const 1000000000))
    (loop $again
      (drop (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)))
      (br $again))))"#,
        EngineKind::Deterministic,
    );
    let began = Instant::now();
    let report = run_with_seed(
        &sandbox,
        &compiled,
        Duration::from_millis(200),
        Kill::new(),
        Some([4; 32]),
    );
    assert_eq!(failure(&report).kind, FailureKind::Timeout);
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
}
