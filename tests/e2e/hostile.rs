//! End to end: a hostile corpus of WAT modules (generated in families: loops, memory
//! bombs, recursion, floods, traps, exit codes, guests blocked in host calls, filesystem
//! escapes, unknown imports, malformed modules, modules over and within the engine's
//! limits) against a real 2-executor cluster. Each module has one expected outcome:
//! refused at upload (422 `invalid_module` naming the limit), a task ending with a named
//! kind (and exit code), or success. Every task ends within its timeout plus
//! [`GRACE`] of its start, deterministic failures are attempted once, no executor is
//! excluded or lost, every core comes back, and a healthy job still runs afterwards.
//!
//! Then the focused cases: guests asleep in a host call (preview 1 and preview 2) end at
//! their deadline, one asleep forever is killed and gives its core back, and modules the
//! engine cannot take are refused at upload without excluding anyone.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::common;
use crate::common::{DevCluster, guests, spec, wait_until};

/// The corpus's cluster: 2 executors of 3 cores (task slots, not CPUs: on 2 CPUs the
/// spinning guests share them, and their deadlines are wall-clock ones).
const EXECUTORS: u32 = 2;
const CORES: u32 = 3;
/// Resources of every corpus task unless its case says otherwise.
const TIMEOUT_MS: u64 = 1000;
const MEMORY_MB: u64 = 64;
const MAX_OUTPUT_BYTES: u64 = 1 << 20;
/// How far past its timeout a task may end: deadlines act within a 2 ms epoch tick; the
/// rest is the noise of a loaded 2-core machine.
const GRACE: Duration = Duration::from_millis(500);
/// How long one round of the corpus's jobs may take before the stragglers are reported.
const CORPUS_DEADLINE: Duration = Duration::from_secs(30);
/// The file the escape cases find at `/files/data.txt` (preopened as fd 3).
const DATA: &[u8] = b"flint data\n";
/// The log's last line once it passed the driver's 1 MiB cap.
const LOG_MARKER: &[u8] = b"\n[flint: log truncated at 1048576 bytes]\n";

/// WASI preview-1 functions a module may call; [`command`] imports those its text names.
const WASI: &[(&str, &str)] = &[
    ("fd_write", "(param i32 i32 i32 i32) (result i32)"),
    ("fd_read", "(param i32 i32 i32 i32) (result i32)"),
    ("proc_exit", "(param i32)"),
    ("poll_oneoff", "(param i32 i32 i32 i32) (result i32)"),
    ("sched_yield", "(result i32)"),
    ("random_get", "(param i32 i32) (result i32)"),
    ("clock_time_get", "(param i32 i64 i32) (result i32)"),
    ("args_sizes_get", "(param i32 i32) (result i32)"),
    ("environ_sizes_get", "(param i32 i32) (result i32)"),
    ("fd_fdstat_get", "(param i32 i32) (result i32)"),
    ("fd_prestat_get", "(param i32 i32) (result i32)"),
    (
        "path_open",
        "(param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)",
    ),
    ("path_symlink", "(param i32 i32 i32 i32 i32) (result i32)"),
    ("path_create_directory", "(param i32 i32 i32) (result i32)"),
    ("path_unlink_file", "(param i32 i32 i32) (result i32)"),
    (
        "path_rename",
        "(param i32 i32 i32 i32 i32 i32) (result i32)",
    ),
];

// ---------------------------------------------------------------------------------------
// WAT helpers

/// A preview-1 command: the WASI imports its text names, `items` (functions, tables,
/// data, a start function; a 1-page memory exported as `memory` unless they declare
/// one), and `_start` running `body` with locals `$i`, `$n` (i32) and `$x` (i64).
fn command(items: &str, body: &str) -> String {
    let text = format!("{items} {body}");
    let mut module = String::from("(module");
    for (name, ty) in WASI {
        if text.contains(&format!("${name} ")) || text.contains(&format!("${name})")) {
            module +=
                &format!(r#" (import "wasi_snapshot_preview1" "{name}" (func ${name} {ty}))"#);
        }
    }
    module += " ";
    module += items;
    if !items.contains("(memory") {
        module += r#" (memory (export "memory") 1)"#;
    }
    module += &format!(
        r#" (func (export "_start") (local $i i32) (local $n i32) (local $x i64) {body}))"#
    );
    module
}

/// `body` again and again, for ever.
fn forever(body: &str) -> String {
    format!("(loop $forever {body} (br $forever))")
}

/// Traps unless `call` (an errno) is 0.
fn check_ok(call: &str) -> String {
    format!("(if {call} (then unreachable))")
}

/// Traps if `call` (an errno) is 0: what it tried must have been refused.
fn deny(call: &str) -> String {
    format!("(if (i32.eqz {call}) (then unreachable))")
}

/// One `fd_write` of `len` bytes at `ptr` (the iovec at 0, the count at 8).
fn write(fd: u32, ptr: u32, len: u32) -> String {
    write_expr(fd, ptr, &format!("(i32.const {len})"))
}

/// One `fd_write` of as many bytes at `ptr` as `len` (an i32 expression) says.
fn write_expr(fd: u32, ptr: u32, len: &str) -> String {
    format!(
        "(i32.store (i32.const 0) (i32.const {ptr})) (i32.store (i32.const 4) {len}) \
         (drop (call $fd_write (i32.const {fd}) (i32.const 0) (i32.const 1) (i32.const 8)))"
    )
}

/// Writes `total` bytes to `fd` in writes of up to 65,520 bytes, counting what each
/// write took; traps on an errno.
fn write_all(fd: u32, total: u32) -> String {
    format!(
        "(local.set $n (i32.const {total}))
         (loop $all
           (i32.store (i32.const 0) (i32.const 16))
           (i32.store (i32.const 4)
             (select (local.get $n) (i32.const 65520) (i32.lt_u (local.get $n) (i32.const 65520))))
           {}
           (local.set $n (i32.sub (local.get $n) (i32.load (i32.const 8))))
           (br_if $all (local.get $n)))",
        check_ok(&format!(
            "(call $fd_write (i32.const {fd}) (i32.const 0) (i32.const 1) (i32.const 8))"
        ))
    )
}

fn exit(code: u32) -> String {
    format!("(call $proc_exit (i32.const {code}))")
}

const MONOTONIC: u32 = 1;
const REALTIME: u32 = 0;
const ABSTIME: u32 = 1;
const SECOND_NS: u64 = 1_000_000_000;

/// `poll_oneoff` on clock subscriptions `(clock, timeout ns, flags)`, laid out from 1024
/// (48 bytes each; the events from 8192, their count at 12288); leaves the errno.
fn poll(subscriptions: &[(u32, u64, u32)]) -> String {
    let mut text = String::new();
    for (i, (clock, timeout, flags)) in subscriptions.iter().enumerate() {
        let at = 1024 + 48 * i;
        text += &format!(
            "(i64.store (i32.const {at}) (i64.const {i})) \
             (i32.store (i32.const {}) (i32.const {clock})) \
             (i64.store (i32.const {}) (i64.const {})) \
             (i32.store16 (i32.const {}) (i32.const {flags})) ",
            at + 16,
            at + 24,
            *timeout as i64,
            at + 40
        );
    }
    text + &format!(
        "(call $poll_oneoff (i32.const 1024) (i32.const 8192) (i32.const {}) (i32.const 12288))",
        subscriptions.len()
    )
}

/// Sleeps in `poll_oneoff`; should the sleep ever end (it must not, before the task's
/// deadline), spins. A refused subscription traps instead, so that a bad layout here can
/// never pass for a deadline kept.
fn sleeper(subscriptions: &[(u32, u64, u32)]) -> String {
    command(
        "",
        &format!("{} {}", check_ok(&poll(subscriptions)), forever("")),
    )
}

fn data(at: u32, bytes: &str) -> String {
    format!(r#"(data (i32.const {at}) "{bytes}")"#)
}

/// `path_open` of the path at 256 (`len` bytes) from `fd`; the new fd goes to 512.
fn path_open(fd: u32, len: usize, oflags: u32, rights: u64) -> String {
    format!(
        "(call $path_open (i32.const {fd}) (i32.const 1) (i32.const 256) (i32.const {len}) \
         (i32.const {oflags}) (i64.const {rights}) (i64.const {rights}) (i32.const 0) (i32.const 512))"
    )
}

const O_CREAT: u32 = 1;
const O_DIRECTORY: u32 = 2;
const O_TRUNC: u32 = 8;
const RIGHT_READ: u64 = 1 << 1;
const RIGHT_WRITE: u64 = 1 << 6;

/// An exported memory of one page, then `n - 1` more (`$m1`, ...).
fn memories(n: usize) -> String {
    let mut text = String::from(r#"(memory (export "memory") 1)"#);
    for i in 1..n {
        text += &format!(" (memory $m{i} 1)");
    }
    text
}

/// `n` one-element tables (`$t0`, ...), each holding the no-op `$f` of type `$v`.
fn tables(n: usize) -> String {
    let mut text = String::from("(type $v (func)) (func $f)");
    for i in 0..n {
        text += &format!(" (table $t{i} 1 funcref) (elem (table $t{i}) (i32.const 0) func $f)");
    }
    text
}

// ---------------------------------------------------------------------------------------
// The corpus

#[derive(Clone, Debug)]
enum Expect {
    /// `PUT /v1/modules` answers 422 `invalid_module` with a message holding each of
    /// these space-separated words (case-insensitive; `a|b` is either).
    Refused(&'static str),
    /// The task fails with this kind.
    Fails(&'static str),
    /// `proc_exit(code)`: the task fails as `exit` with that code, or succeeds for 0.
    Exit(i32),
    Succeeds,
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expect::Refused(words) => write!(f, "refused at upload [{words}]"),
            Expect::Fails(kind) => write!(f, "fails {kind}"),
            Expect::Exit(0) | Expect::Succeeds => write!(f, "succeeds"),
            Expect::Exit(code) => write!(f, "exit {code}"),
        }
    }
}

struct Case {
    name: String,
    wasm: Vec<u8>,
    expect: Expect,
    /// Over the corpus defaults.
    resources: Value,
    /// Mounts [`DATA`] at `/files/data.txt`.
    files: bool,
    input: &'static str,
    result: Option<Vec<u8>>,
    log_truncated: bool,
}

impl Case {
    fn wat(name: impl Into<String>, text: &str, expect: Expect) -> Case {
        let name = name.into();
        let wasm = wat::parse_str(text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        Case::bytes(name, wasm, expect)
    }

    fn bytes(name: impl Into<String>, wasm: Vec<u8>, expect: Expect) -> Case {
        Case {
            name: name.into(),
            wasm,
            expect,
            resources: json!({}),
            files: false,
            input: "",
            result: None,
            log_truncated: false,
        }
    }

    fn with(mut self, resources: Value) -> Case {
        self.resources = resources;
        self
    }

    fn with_files(mut self) -> Case {
        self.files = true;
        self
    }

    fn input(mut self, input: &'static str) -> Case {
        self.input = input;
        self
    }

    fn result(mut self, bytes: &[u8]) -> Case {
        self.result = Some(bytes.to_vec());
        self
    }

    fn truncated_log(mut self) -> Case {
        self.log_truncated = true;
        self
    }

    fn resources(&self) -> Value {
        let mut resources = json!({
            "timeout_ms": TIMEOUT_MS, "memory_mb": MEMORY_MB, "max_output_bytes": MAX_OUTPUT_BYTES,
        });
        for (key, value) in self.resources.as_object().unwrap() {
            resources[key] = value.clone();
        }
        resources
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.resources()["timeout_ms"].as_u64().unwrap())
    }
}

fn plain() -> Vec<Case> {
    let ok = |name: &str, items: &str, body: &str| {
        Case::wat(
            format!("ok-{name}"),
            &command(items, body),
            Expect::Succeeds,
        )
    };
    vec![
        ok("noop", "", ""),
        ok("hello", &data(16, "hello"), &write(1, 16, 5)).result(b"hello"),
        ok(
            "echo",
            "",
            &format!(
                "(i32.store (i32.const 0) (i32.const 16)) (i32.store (i32.const 4) (i32.const 4096)) \
                 {} {}",
                check_ok("(call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8))"),
                write_expr(1, 16, "(i32.load (i32.const 8))")
            ),
        )
        .input("hostile input")
        .result(b"hostile input"),
        ok(
            "recursion-1000-deep",
            "(func $deep (param i32) (if (local.get 0) (then (call $deep (i32.sub (local.get 0) (i32.const 1))))))",
            "(call $deep (i32.const 1000))",
        ),
        ok(
            "a-loop-of-10-million-iterations",
            "",
            "(loop $l (local.set $i (i32.add (local.get $i) (i32.const 1))) \
             (br_if $l (i32.lt_u (local.get $i) (i32.const 10000000))))",
        ),
        ok(
            "a-1mib-data-segment",
            &format!(
                r#"(memory (export "memory") 17) {}"#,
                data(0, &"a".repeat(1 << 20))
            ),
            "",
        ),
        ok(
            "1000-data-segments",
            &(0..1000).map(|i| data(i * 64, "segment")).collect::<String>(),
            "",
        ),
    ]
}

fn loops() -> Vec<Case> {
    let t = |name: &str, items: &str, body: &str| {
        Case::wat(
            format!("loop-{name}"),
            &command(items, body),
            Expect::Fails("timeout"),
        )
    };
    let big = r#"(memory (export "memory") 1000)"#;
    vec![
        t("br", "", "(loop $l (br $l))"),
        t(
            "br_if-always-taken",
            "",
            "(loop $l (local.set $i (i32.add (local.get $i) (i32.const 1))) \
             (br_if $l (i32.ge_u (local.get $i) (i32.const 0))))",
        ),
        t(
            "nested",
            "",
            "(loop $a (loop $b (br_if $b (i32.eqz (local.get $i)))) (br $a))",
        ),
        t(
            "br_table",
            "",
            "(loop $l (block $b (br_table $b $l (local.get $i))) (br $l))",
        ),
        t(
            "if-else",
            "",
            &forever(
                "(if (local.get $i) (then (local.set $n (i32.const 1))) (else (local.set $n (i32.const 2))))",
            ),
        ),
        t(
            "in-the-start-function",
            "(func $s (loop $l (br $l))) (start $s)",
            "",
        ),
        t(
            "after-a-62mib-memory.fill",
            big,
            "(memory.fill (i32.const 0) (i32.const 7) (i32.const 65536000)) (loop $l (br $l))",
        ),
        t(
            "of-62mib-memory.fills",
            big,
            &forever("(memory.fill (i32.const 0) (local.get $i) (i32.const 65536000))"),
        ),
        t(
            "of-calls",
            "(global $g (mut i32) (i32.const 0)) \
             (func $step (global.set $g (i32.add (global.get $g) (i32.const 1))))",
            &forever("(call $step)"),
        ),
        t(
            "of-call_indirect",
            "(type $v (func)) (table 1 funcref) (elem (i32.const 0) $nop) (func $nop)",
            &forever("(call_indirect (type $v) (i32.const 0))"),
        ),
        t("of-tail-calls", "(func $t (return_call $t))", "(call $t)"),
        t(
            "of-mutual-tail-calls",
            "(func $a (return_call $b)) (func $b (return_call $a))",
            "(call $a)",
        ),
        t(
            "of-float-math",
            "",
            &forever(
                "(local.set $x (i64.reinterpret_f64 (f64.sqrt (f64.add \
                 (f64.reinterpret_i64 (local.get $x)) (f64.const 1.5)))))",
            ),
        ),
        t(
            "of-loads-and-stores",
            "",
            &forever(
                "(i32.store (local.get $n) (i32.add (i32.load (local.get $n)) (i32.const 1))) \
                 (local.set $n (i32.and (i32.add (local.get $n) (i32.const 4)) (i32.const 65532)))",
            ),
        ),
        t(
            "of-memory.grow-0",
            "",
            &forever("(drop (memory.grow (i32.const 0)))"),
        ),
        t(
            "below-1000-frames",
            "(func $deep (param i32) (if (local.get 0) \
             (then (call $deep (i32.sub (local.get 0) (i32.const 1)))) (else (loop $l (br $l)))))",
            "(call $deep (i32.const 1000))",
        ),
        t(
            "of-clock_time_get",
            "",
            &forever("(drop (call $clock_time_get (i32.const 1) (i64.const 0) (i32.const 16)))"),
        ),
        t(
            "of-args_sizes_get",
            "",
            &forever("(drop (call $args_sizes_get (i32.const 16) (i32.const 20)))"),
        ),
        t(
            "of-environ_sizes_get",
            "",
            &forever("(drop (call $environ_sizes_get (i32.const 16) (i32.const 20)))"),
        ),
        t(
            "of-fd_fdstat_get",
            "",
            &forever("(drop (call $fd_fdstat_get (i32.const 1) (i32.const 16)))"),
        ),
        t(
            "of-fd_prestat_get-on-fd-3",
            "",
            &forever("(drop (call $fd_prestat_get (i32.const 3) (i32.const 16)))"),
        ),
        t("of-empty-stdout-writes", "", &forever(&write(1, 16, 0))),
        t("of-stderr-writes", "", &forever(&write(2, 16, 65520))),
    ]
}

fn memory() -> Vec<Case> {
    let m = |name: &str, items: &str, body: &str, expect| {
        Case::wat(format!("memory-{name}"), &command(items, body), expect)
    };
    let limit = || Expect::Fails("memory_limit");
    let initial = |pages: u32| format!(r#"(memory (export "memory") {pages})"#);
    vec![
        m(
            "grow-1-page-forever",
            "",
            &forever("(drop (memory.grow (i32.const 1)))"),
            limit(),
        ),
        m(
            "grow-16-pages-and-touch-forever",
            "",
            &forever(
                "(local.set $n (memory.grow (i32.const 16))) \
                 (i32.store (i32.mul (local.get $n) (i32.const 65536)) (i32.const 1))",
            ),
            limit(),
        ),
        m(
            "grow-until-it-fails",
            "",
            "(loop $l (br_if $l (i32.ge_s (memory.grow (i32.const 8)) (i32.const 0))))",
            limit(),
        ),
        m(
            "grow-to-one-page-over",
            "",
            "(drop (memory.grow (i32.const 1024)))",
            limit(),
        ),
        m(
            "grow-by-65536-pages",
            "",
            "(drop (memory.grow (i32.const 65536)))",
            limit(),
        ),
        m(
            "grow-past-the-limit-within-its-maximum",
            r#"(memory (export "memory") 1000 1100)"#,
            "(drop (memory.grow (i32.const 100)))",
            limit(),
        ),
        m(
            "grow-to-exactly-the-limit",
            "",
            "(if (i32.lt_s (memory.grow (i32.const 1023)) (i32.const 0)) (then unreachable)) \
             (i32.store (i32.const 67108860) (i32.const 1))",
            Expect::Succeeds,
        ),
        m("initial-1025-pages", &initial(1025), "", limit()),
        m("initial-16384-pages", &initial(16384), "", limit()),
        m("initial-30000-pages", &initial(30000), "", limit()),
        m("initial-65536-pages", &initial(65536), "", limit()),
        m(
            "initial-1024-pages",
            &initial(1024),
            "(i32.store (i32.const 67108860) (i32.const 1))",
            Expect::Succeeds,
        ),
        m(
            "a-data-segment-in-2000-pages",
            &format!("{} {}", initial(2000), data(100_000_000, "x")),
            "",
            limit(),
        ),
    ]
}

fn recursion() -> Vec<Case> {
    let r = |name: &str, items: &str, body: &str| {
        Case::wat(
            format!("recursion-{name}"),
            &command(items, body),
            Expect::Fails("stack_overflow"),
        )
    };
    let table = "(type $v (func)) (table 2 funcref)";
    let many_locals: String = (0..64).map(|i| format!(" (local $l{i} i64)")).collect();
    vec![
        r("direct", "(func $f (call $f))", "(call $f)"),
        r(
            "mutual",
            "(func $a (call $b)) (func $b (call $a))",
            "(call $a)",
        ),
        r(
            "three-way",
            "(func $a (call $b)) (func $b (call $c)) (func $c (call $a))",
            "(call $a)",
        ),
        r(
            "through-call_indirect",
            &format!(
                "{table} (elem (i32.const 0) $f) (func $f (call_indirect (type $v) (i32.const 0)))"
            ),
            "(call $f)",
        ),
        r(
            "alternating-call_indirect",
            &format!(
                "{table} (elem (i32.const 0) $f $g) \
                 (func $f (call_indirect (type $v) (i32.const 1))) \
                 (func $g (call_indirect (type $v) (i32.const 0)))"
            ),
            "(call $f)",
        ),
        r(
            "with-big-frames",
            &format!(
                "(func $f (param $p i64) (result i64){many_locals} \
                 (local.set $l63 (i64.add (local.get $p) (i64.const 1))) \
                 (i64.add (call $f (local.get $l63)) (local.get $l0)))"
            ),
            "(drop (call $f (i64.const 0)))",
        ),
        r(
            "non-tail-with-a-result",
            "(func $f (param i32) (result i32) \
             (i32.add (i32.const 1) (call $f (i32.add (local.get 0) (i32.const 1)))))",
            "(drop (call $f (i32.const 0)))",
        ),
        r(
            "in-the-start-function",
            "(func $f (call $f)) (func $s (call $f)) (start $s)",
            "",
        ),
        r(
            "inside-a-loop",
            "(func $f (loop $l (call $f) (br $l)))",
            "(call $f)",
        ),
        r(
            "with-float-params",
            "(func $f (param f64 f64) (call $f (f64.add (local.get 0) (local.get 1)) (local.get 0)))",
            "(call $f (f64.const 1) (f64.const 2))",
        ),
    ]
}

fn floods() -> Vec<Case> {
    let f = |name: &str, items: &str, body: &str, expect| {
        Case::wat(format!("flood-{name}"), &command(items, body), expect)
    };
    let limit = || Expect::Fails("output_limit");
    let iovecs = "(loop $fill \
         (i32.store (i32.add (i32.const 1024) (i32.shl (local.get $i) (i32.const 3))) (i32.const 16)) \
         (i32.store (i32.add (i32.const 1028) (i32.shl (local.get $i) (i32.const 3))) (i32.const 65520)) \
         (local.set $i (i32.add (local.get $i) (i32.const 1))) \
         (br_if $fill (i32.lt_u (local.get $i) (i32.const 1024))))";
    vec![
        f(
            "stdout-64kib-writes-forever",
            "",
            &forever(&write(1, 16, 65520)),
            limit(),
        ),
        f(
            "stdout-one-60mib-write",
            r#"(memory (export "memory") 1000)"#,
            &write(1, 16, 60 << 20),
            limit(),
        ),
        f(
            "stdout-1024-iovecs-per-write-forever",
            "",
            &format!(
                "{iovecs} {}",
                forever(
                    "(drop (call $fd_write (i32.const 1) (i32.const 1024) (i32.const 1024) (i32.const 8)))"
                )
            ),
            limit(),
        ),
        f(
            "stdout-a-byte-at-a-time",
            "",
            &forever(&write(1, 16, 1)),
            limit(),
        )
        .with(json!({"max_output_bytes": 4096})),
        f(
            "stdout-one-byte-over-the-cap",
            "",
            &write_all(1, (MAX_OUTPUT_BYTES + 1) as u32),
            limit(),
        ),
        f(
            "stdout-exactly-the-cap",
            "",
            &write_all(1, MAX_OUTPUT_BYTES as u32),
            Expect::Succeeds,
        )
        .result(&vec![0; MAX_OUTPUT_BYTES as usize]),
        f(
            "stdout-and-stderr-alternating-forever",
            "",
            &forever(&format!("{} {}", write(1, 16, 65520), write(2, 16, 65520))),
            limit(),
        ),
        f(
            "stderr-8mib-then-success",
            "",
            &write_all(2, 8 << 20),
            Expect::Succeeds,
        )
        .truncated_log(),
        f(
            "stderr-one-32mib-write",
            r#"(memory (export "memory") 600)"#,
            &write(2, 16, 32 << 20),
            Expect::Succeeds,
        )
        .truncated_log(),
    ]
}

fn traps() -> Vec<Case> {
    let t = |name: &str, items: &str, body: &str| {
        Case::wat(
            format!("trap-{name}"),
            &command(items, body),
            Expect::Fails("trap"),
        )
    };
    let table = "(type $v (func)) (type $ii (func (param i32) (result i32))) \
                 (table $t 2 funcref) (elem (i32.const 0) $f) (func $f)";
    let zero = "(local.get $i)";
    let nan = "(f32.div (f32.convert_i32_s (local.get $i)) (f32.convert_i32_s (local.get $i)))";
    vec![
        t("unreachable", "", "unreachable"),
        t(
            "unreachable-in-the-start-function",
            "(func $s unreachable) (start $s)",
            "",
        ),
        t(
            "i32.div_s-by-zero",
            "",
            &format!("(drop (i32.div_s (i32.const 1) {zero}))"),
        ),
        t(
            "i32.div_u-by-zero",
            "",
            &format!("(drop (i32.div_u (i32.const 1) {zero}))"),
        ),
        t(
            "i32.rem_s-by-zero",
            "",
            &format!("(drop (i32.rem_s (i32.const 1) {zero}))"),
        ),
        t(
            "i32.rem_u-by-zero",
            "",
            &format!("(drop (i32.rem_u (i32.const 1) {zero}))"),
        ),
        t(
            "i64.div_s-by-zero",
            "",
            "(drop (i64.div_s (i64.const 1) (local.get $x)))",
        ),
        t(
            "i64.rem_u-by-zero",
            "",
            "(drop (i64.rem_u (i64.const 1) (local.get $x)))",
        ),
        t(
            "i32.div_s-overflow",
            "",
            "(drop (i32.div_s (i32.const -2147483648) (i32.sub (local.get $i) (i32.const 1))))",
        ),
        t(
            "i64.div_s-overflow",
            "",
            "(drop (i64.div_s (i64.const -9223372036854775808) (i64.sub (local.get $x) (i64.const 1))))",
        ),
        t(
            "i32.trunc_f32_s-of-nan",
            "",
            &format!("(drop (i32.trunc_f32_s {nan}))"),
        ),
        t(
            "i32.trunc_f64_s-of-1e10",
            "",
            "(drop (i32.trunc_f64_s (f64.add (f64.const 1e10) (f64.convert_i32_s (local.get $i)))))",
        ),
        t(
            "i64.trunc_f64_u-of-minus-1",
            "",
            "(drop (i64.trunc_f64_u (f64.sub (f64.convert_i32_s (local.get $i)) (f64.const 1))))",
        ),
        t(
            "i32.trunc_f32_u-of-infinity",
            "",
            "(drop (i32.trunc_f32_u (f32.div (f32.const 1) (f32.convert_i32_s (local.get $i)))))",
        ),
        t(
            "load-past-the-end",
            "",
            "(drop (i32.load (i32.const 65536)))",
        ),
        t(
            "i64.load-straddling-the-end",
            "",
            "(drop (i64.load (i32.const 65532)))",
        ),
        t(
            "load-at-a-4gib-offset",
            "",
            "(drop (i32.load offset=4294967295 (local.get $i)))",
        ),
        t(
            "store-past-the-end",
            "",
            "(i32.store (i32.const 65536) (i32.const 1))",
        ),
        t(
            "store-at-minus-4",
            "",
            "(i32.store (i32.const -4) (i32.const 1))",
        ),
        t(
            "memory.fill-past-the-end",
            "",
            "(memory.fill (i32.const 65000) (i32.const 0) (i32.const 1000))",
        ),
        t(
            "memory.copy-past-the-end",
            "",
            "(memory.copy (i32.const 0) (i32.const 65000) (i32.const 1000))",
        ),
        t(
            "call_indirect-with-the-wrong-signature",
            table,
            "(drop (call_indirect (type $ii) (i32.const 1) (i32.const 0)))",
        ),
        t(
            "call_indirect-of-a-null-entry",
            table,
            "(call_indirect (type $v) (i32.const 1))",
        ),
        t(
            "call_indirect-past-the-table",
            table,
            "(call_indirect (type $v) (i32.const 5))",
        ),
        t(
            "table.get-past-the-table",
            table,
            "(drop (table.get $t (i32.const 5)))",
        ),
        t("a-data-segment-past-the-memory", &data(65535, "ab"), ""),
        t(
            "an-element-segment-past-the-table",
            "(table 1 funcref) (elem (i32.const 1) $f) (func $f)",
            "",
        ),
        t(
            "after-writing-a-result",
            &data(16, "partial"),
            &format!("{} unreachable", write(1, 16, 7)),
        ),
        t(
            "after-1000-frames",
            "(func $deep (param i32) (if (local.get 0) \
             (then (call $deep (i32.sub (local.get 0) (i32.const 1)))) (else unreachable)))",
            "(call $deep (i32.const 1000))",
        ),
        t(
            "after-a-4mib-stderr-flood",
            "",
            &format!("{} unreachable", write_all(2, 4 << 20)),
        ),
    ]
}

fn exits() -> Vec<Case> {
    let mut cases: Vec<Case> = [0, 1, 2, 42, 125, 126, 127, 128, 200, 255]
        .into_iter()
        .map(|code| {
            Case::wat(
                format!("exit-{code}"),
                &command("", &exit(code)),
                Expect::Exit(code as i32),
            )
        })
        .collect();
    cases.extend([
        Case::wat(
            "exit-0-after-a-result",
            &command(&data(16, "ok"), &format!("{} {}", write(1, 16, 2), exit(0))),
            Expect::Exit(0),
        )
        .result(b"ok"),
        Case::wat(
            "exit-3-after-a-result",
            &command(&data(16, "ok"), &format!("{} {}", write(1, 16, 2), exit(3))),
            Expect::Exit(3),
        ),
        Case::wat(
            "exit-7-from-the-start-function",
            &command(&format!("(func $s {}) (start $s)", exit(7)), ""),
            Expect::Exit(7),
        ),
        Case::wat(
            "exit-42-from-1000-frames-deep",
            &command(
                &format!(
                    "(func $deep (param i32) (if (local.get 0) \
                     (then (call $deep (i32.sub (local.get 0) (i32.const 1)))) (else {})))",
                    exit(42)
                ),
                "(call $deep (i32.const 1000))",
            ),
            Expect::Exit(42),
        ),
        Case::wat(
            "exit-255-after-a-stderr-flood",
            &command("", &format!("{} {}", write_all(2, 4 << 20), exit(255))),
            Expect::Exit(255),
        ),
    ]);
    cases
}

/// Filesystem escapes: each module traps if what it tried was allowed, and succeeds if
/// it was refused. Most run with the job's files mounted (`/files`, fd 3).
fn escapes() -> Vec<Case> {
    let denied = |name: &str, paths: &str, call: String| {
        Case::wat(
            format!("escape-{name}"),
            &command(paths, &deny(&call)),
            Expect::Succeeds,
        )
        .with_files()
    };
    let open = |name: &str, fd: u32, path: &str, oflags: u32, rights: u64| {
        denied(
            name,
            &data(256, path),
            path_open(fd, path.len(), oflags, rights),
        )
    };
    let two = |a: &str, b: &str| format!("{} {}", data(256, a), data(384, b));
    let mut cases = vec![
        open("open-../../etc/passwd", 3, "../../etc/passwd", 0, RIGHT_READ),
        open("open-/etc/passwd", 3, "/etc/passwd", 0, RIGHT_READ),
        open("open-/proc/self/environ", 3, "/proc/self/environ", 0, RIGHT_READ),
        open("open-..-as-a-directory", 3, "..", O_DIRECTORY, RIGHT_READ),
        open("open-through-the-input-file", 3, "data.txt/../../etc/passwd", 0, RIGHT_READ),
        open("open-../files/data.txt", 3, "../files/data.txt", 0, RIGHT_READ),
        open("open-on-fd-4", 4, "etc/passwd", 0, RIGHT_READ),
        open("open-on-stdin", 0, "etc/passwd", 0, RIGHT_READ),
        open("create-a-file", 3, "new.txt", O_CREAT, RIGHT_WRITE),
        open("truncate-the-input", 3, "data.txt", O_TRUNC, RIGHT_WRITE),
        Case::wat(
            "escape-write-to-the-input",
            &command(
                &data(256, "data.txt"),
                &format!(
                    "(if (i32.eqz {}) (then {} \
                     (if (i32.eqz (call $fd_write (i32.load (i32.const 512)) (i32.const 0) (i32.const 1) (i32.const 8))) \
                       (then unreachable))))",
                    path_open(3, 8, 0, RIGHT_READ | RIGHT_WRITE),
                    "(i32.store (i32.const 0) (i32.const 256)) (i32.store (i32.const 4) (i32.const 5))"
                ),
            ),
            Expect::Succeeds,
        )
        .with_files(),
        denied(
            "symlink-to-/etc/passwd",
            &two("/etc/passwd", "link"),
            "(call $path_symlink (i32.const 256) (i32.const 11) (i32.const 3) (i32.const 384) (i32.const 4))".into(),
        ),
        denied(
            "make-a-directory",
            &data(256, "d"),
            "(call $path_create_directory (i32.const 3) (i32.const 256) (i32.const 1))".into(),
        ),
        denied(
            "unlink-the-input",
            &data(256, "data.txt"),
            "(call $path_unlink_file (i32.const 3) (i32.const 256) (i32.const 8))".into(),
        ),
        denied(
            "rename-the-input-out",
            &two("data.txt", "../../tmp/flint-escape"),
            "(call $path_rename (i32.const 3) (i32.const 256) (i32.const 8) (i32.const 3) (i32.const 384) (i32.const 22))".into(),
        ),
    ];
    // Without files there is no preopen at all.
    let mut bare = denied(
        "open-on-fd-3-without-files",
        &data(256, "etc/passwd"),
        path_open(3, 10, 0, RIGHT_READ),
    );
    bare.files = false;
    let mut no_prestat = denied(
        "fd_prestat_get-3-without-files",
        "",
        "(call $fd_prestat_get (i32.const 3) (i32.const 16))".into(),
    );
    no_prestat.files = false;
    cases.extend([bare, no_prestat]);
    // The controls: fd 3 is the mount, and the file in it can be read.
    cases.push(
        Case::wat(
            "escape-control-fd_prestat_get-3-with-files",
            &command(
                "",
                &check_ok("(call $fd_prestat_get (i32.const 3) (i32.const 16))"),
            ),
            Expect::Succeeds,
        )
        .with_files(),
    );
    cases.push(
        Case::wat(
            "escape-control-read-/files/data.txt",
            &command(
                &data(256, "data.txt"),
                &format!(
                    "{} (i32.store (i32.const 0) (i32.const 1024)) (i32.store (i32.const 4) (i32.const 4096)) \
                     {} (i32.store (i32.const 4) (i32.load (i32.const 8))) \
                     {}",
                    check_ok(&path_open(3, 8, 0, RIGHT_READ)),
                    check_ok("(call $fd_read (i32.load (i32.const 512)) (i32.const 0) (i32.const 1) (i32.const 8))"),
                    check_ok("(call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 12))"),
                ),
            ),
            Expect::Succeeds,
        )
        .with_files()
        .result(DATA),
    );
    cases
}

fn imports() -> Vec<Case> {
    let u = |name: &str, import: &str| {
        Case::wat(
            format!("import-{name}"),
            &format!(r#"(module {import} (memory (export "memory") 1) (func (export "_start")))"#),
            Expect::Fails("unknown_import"),
        )
    };
    vec![
        u(
            "env-launch_missiles",
            r#"(import "env" "launch_missiles" (func))"#,
        ),
        u(
            "wasi-no_such_function",
            r#"(import "wasi_snapshot_preview1" "no_such_function" (func))"#,
        ),
        u(
            "wasi-sock_open",
            r#"(import "wasi_snapshot_preview1" "sock_open" (func (param i32 i32 i32) (result i32)))"#,
        ),
        u(
            "wasi-fd_write-with-the-wrong-signature",
            r#"(import "wasi_snapshot_preview1" "fd_write" (func (param i32)))"#,
        ),
        u(
            "wasi-proc_exit-returning-an-i32",
            r#"(import "wasi_snapshot_preview1" "proc_exit" (func (param i32) (result i32)))"#,
        ),
        u(
            "wasi_unstable-fd_write",
            r#"(import "wasi_unstable" "fd_write" (func (param i32 i32 i32 i32) (result i32)))"#,
        ),
        u(
            "a-preview-2-interface-in-a-core-module",
            r#"(import "wasi:cli/environment@0.2.0" "get-arguments" (func (param i32)))"#,
        ),
        u("env-global", r#"(import "env" "g" (global i32))"#),
        u("env-table", r#"(import "env" "t" (table 1 funcref))"#),
        Case::wat(
            "import-env-memory",
            r#"(module (import "env" "memory" (memory 1)) (export "memory" (memory 0)) (func (export "_start")))"#,
            Expect::Fails("unknown_import"),
        ),
    ]
}

/// Bytes that are not a valid module, refused at upload.
fn invalid() -> Vec<Case> {
    let noop = wat::parse_str(command("", "")).unwrap();
    let bad = |name: &str, wasm: &[u8], words: &'static str| {
        Case::bytes(
            format!("invalid-{name}"),
            wasm.to_vec(),
            Expect::Refused(words),
        )
    };
    let bad_wat =
        |name: &str, text: &str| Case::wat(format!("invalid-{name}"), text, Expect::Refused(""));
    let v1 = |rest: &[u8]| [&b"\0asm\x01\0\0\0"[..], rest].concat();
    vec![
        bad("text", b"#!/bin/sh\necho not wasm\n", "magic"),
        bad(
            "wat-source",
            b"(module (func (export \"_start\")))",
            "magic",
        ),
        bad("an-empty-body", b"", "magic"),
        bad("a-truncated-magic", b"\0as", "magic"),
        bad("magic-without-a-version", b"\0asm", ""),
        bad("version-2", b"\0asm\x02\0\0\0", ""),
        bad("an-unknown-section-id", &v1(b"\x7f\x00"), ""),
        bad("a-section-longer-than-the-module", &v1(b"\x01\x7f\x00"), ""),
        bad("half-a-module", &noop[..noop.len() / 2], ""),
        bad(
            "an-unknown-opcode",
            &v1(b"\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\
                  \x07\x0a\x01\x06_start\x00\x00\x0a\x05\x01\x03\x00\xff\x0b"),
            "",
        ),
        bad_wat(
            "a-type-mismatch",
            r#"(module (memory (export "memory") 1) (func (export "_start") (i32.const 1)))"#,
        ),
        bad_wat(
            "duplicate-export-names",
            r#"(module (memory (export "memory") 1) (func (export "_start")) (func (export "_start")))"#,
        ),
        bad_wat(
            "a-call-to-a-missing-function",
            r#"(module (memory (export "memory") 1) (func (export "_start") (call 99)))"#,
        ),
        bad_wat(
            "an-export-of-a-missing-function",
            r#"(module (memory (export "memory") 1) (export "_start" (func 9)))"#,
        ),
        bad_wat(
            "a-memory-minimum-above-its-maximum",
            r#"(module (memory (export "memory") 2 1) (func (export "_start")))"#,
        ),
        bad_wat(
            "a-memory-of-65537-pages",
            r#"(module (memory (export "memory") 65537) (func (export "_start")))"#,
        ),
    ]
}

/// Valid modules the engine will not take, with the words their refusal must hold.
fn over_limits() -> Vec<(&'static str, String, &'static str)> {
    const ELEMENTS: &str = "table 100000|100,000|100_000";
    const THREADS: &str = "atomic|thread|shared";
    let bare = |items: &str| format!(r#"(module {items} (func (export "_start")))"#);
    vec![
        ("5-memories", command(&memories(5), ""), "memor 4"),
        ("16-memories", command(&memories(16), ""), "memor 4"),
        ("9-tables", command(&tables(9), ""), "table 8"),
        ("a-10000000-element-table", command("(table 10000000 funcref)", ""), ELEMENTS),
        ("a-100001-element-table", command("(table 100001 funcref)", ""), ELEMENTS),
        (
            // Reference types beyond funcref need wasmtime's GC support, which Flint's
            // engine is built without.
            "an-externref-table",
            command("(table 1 externref)", ""),
            "gc|externref|reference",
        ),
        (
            "memory64",
            bare(r#"(memory (export "memory") i64 1)"#),
            "memory64|64-bit|i64",
        ),
        (
            "shared-memory",
            bare(r#"(memory (export "memory") 1 1 shared)"#),
            "shared|thread",
        ),
        (
            "i32.atomic.load",
            command("", "(drop (i32.atomic.load (i32.const 0)))"),
            THREADS,
        ),
        (
            "i32.atomic.rmw.add",
            command("", "(drop (i32.atomic.rmw.add (i32.const 0) (i32.const 1)))"),
            THREADS,
        ),
        ("atomic.fence", command("", "atomic.fence"), THREADS),
        (
            "_start-taking-an-i32",
            r#"(module (memory (export "memory") 1) (func (export "_start") (param i32)))"#.into(),
            "_start",
        ),
        (
            "_start-returning-an-i32",
            r#"(module (memory (export "memory") 1) (func (export "_start") (result i32) (i32.const 0)))"#
                .into(),
            "_start",
        ),
        (
            "no-_start",
            r#"(module (memory (export "memory") 1))"#.into(),
            "_start",
        ),
        (
            "main-instead-of-_start",
            r#"(module (memory (export "memory") 1) (func (export "main")))"#.into(),
            "_start",
        ),
        ("the-empty-module", "(module)".into(), "_start"),
        (
            "_start-is-a-global",
            r#"(module (memory (export "memory") 1) (global (export "_start") i32 (i32.const 0)))"#
                .into(),
            "_start",
        ),
        (
            "_start-is-a-memory",
            r#"(module (memory (export "_start") 1))"#.into(),
            "_start",
        ),
        (
            "_start-is-a-table",
            r#"(module (memory (export "memory") 1) (table (export "_start") 1 funcref))"#.into(),
            "_start",
        ),
    ]
}

/// Within or at the engine's documented limits (4 memories, 8 tables, 100,000 table
/// elements): these must run.
fn within_limits() -> Vec<Case> {
    let ok = |name: &str, items: &str, body: &str| {
        Case::wat(
            format!("within-{name}"),
            &command(items, body),
            Expect::Succeeds,
        )
    };
    vec![
        ok(
            "2-memories",
            &memories(2),
            "(i32.store $m1 (i32.const 0) (i32.const 1))",
        ),
        ok(
            "4-memories",
            &memories(4),
            "(i32.store $m3 (i32.const 0) (i32.const 1))",
        ),
        ok(
            "2-tables",
            &tables(2),
            "(call_indirect $t1 (type $v) (i32.const 0))",
        ),
        ok(
            "8-tables",
            &tables(8),
            "(call_indirect $t7 (type $v) (i32.const 0))",
        ),
        ok(
            "2-memories-and-2-tables",
            &format!("{} {}", memories(2), tables(2)),
            "(i32.store $m1 (i32.const 0) (i32.const 1)) (call_indirect $t1 (type $v) (i32.const 0))",
        ),
        ok(
            "a-100000-element-table",
            "(type $v (func)) (table 100000 funcref) (elem (i32.const 99999) $f) (func $f)",
            "(call_indirect (type $v) (i32.const 99999))",
        ),
    ]
}

/// Guests blocked in host calls: each must end at its deadline as `timeout`. Those
/// that block longest come last, so that on an executor that cannot interrupt a host
/// call they hold their cores after everything else has run.
fn blocking() -> Vec<Case> {
    let b = |name: &str, text: String| {
        Case::wat(format!("blocked-{name}"), &text, Expect::Fails("timeout"))
    };
    let control = |name: &str, subs: &[(u32, u64, u32)]| {
        Case::wat(
            format!("blocked-control-{name}"),
            &command("", &check_ok(&poll(subs))),
            Expect::Succeeds,
        )
    };
    let ms10 = SECOND_NS / 100;
    let stdin =
        "(i32.store (i32.const 0) (i32.const 16)) (i32.store (i32.const 4) (i32.const 4096))";
    let hundred = vec![(MONOTONIC, 8 * SECOND_NS, 0); 100];
    vec![
        control("poll_oneoff-10ms-returns", &[(MONOTONIC, ms10, 0)]),
        control(
            "poll_oneoff-two-clocks-10ms-return",
            &[(MONOTONIC, ms10, 0), (REALTIME, ms10, 0)],
        ),
        control("poll_oneoff-abstime-0-returns", &[(MONOTONIC, 0, ABSTIME)]),
        b(
            "sched_yield-forever",
            command("", &forever("(drop (call $sched_yield))")),
        ),
        // 4 MiB, the most one call may ask for (a bigger one is a host call that no
        // deadline could cut short: it traps instead).
        b(
            "random_get-4mib-forever",
            command(
                r#"(memory (export "memory") 1024)"#,
                &forever("(drop (call $random_get (i32.const 0) (i32.const 4194304)))"),
            ),
        ),
        Case::wat(
            "blocked-random_get-64mib-traps".to_owned(),
            &command(
                r#"(memory (export "memory") 1024)"#,
                "(drop (call $random_get (i32.const 0) (i32.const 67108864)))",
            ),
            Expect::Fails("trap"),
        ),
        b(
            "random_get-1-byte-forever",
            command(
                "",
                &forever("(drop (call $random_get (i32.const 16) (i32.const 1)))"),
            ),
        ),
        b(
            "fd_read-stdin-after-eof-forever",
            command(
                "",
                &forever(&format!(
                    "{stdin} (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))"
                )),
            ),
        ),
        b(
            "poll_oneoff-1ms-forever",
            command(
                "",
                &forever(&check_ok(&poll(&[(MONOTONIC, SECOND_NS / 1000, 0)]))),
            ),
        ),
        b(
            "poll_oneoff-no-subscriptions-forever",
            command(
                "",
                &forever(
                    "(drop (call $poll_oneoff (i32.const 1024) (i32.const 8192) (i32.const 0) (i32.const 12288)))",
                ),
            ),
        ),
        b(
            "poll_oneoff-monotonic-8s",
            sleeper(&[(MONOTONIC, 8 * SECOND_NS, 0)]),
        ),
        b(
            "poll_oneoff-realtime-8s",
            sleeper(&[(REALTIME, 8 * SECOND_NS, 0)]),
        ),
        b(
            "poll_oneoff-two-clocks-8s-and-9s",
            sleeper(&[(MONOTONIC, 8 * SECOND_NS, 0), (REALTIME, 9 * SECOND_NS, 0)]),
        ),
        b("poll_oneoff-100-clocks-of-8s", sleeper(&hundred)),
        b(
            "poll_oneoff-monotonic-2^64-1ns",
            sleeper(&[(MONOTONIC, u64::MAX, 0)]),
        ),
        b(
            "poll_oneoff-monotonic-abstime-2^64-1ns",
            sleeper(&[(MONOTONIC, u64::MAX, ABSTIME)]),
        ),
        b(
            "poll_oneoff-realtime-abstime-2^64-1ns",
            sleeper(&[(REALTIME, u64::MAX, ABSTIME)]),
        ),
    ]
}

/// Every module, in the order they are submitted.
fn corpus() -> Vec<Case> {
    let mut cases = invalid();
    cases.extend(over_limits().into_iter().map(|(name, text, words)| {
        Case::wat(format!("over-{name}"), &text, Expect::Refused(words))
    }));
    for family in [
        plain(),
        loops(),
        memory(),
        recursion(),
        floods(),
        traps(),
        exits(),
        escapes(),
        imports(),
        within_limits(),
        blocking(),
    ] {
        cases.extend(family);
    }
    cases
}

// ---------------------------------------------------------------------------------------
// Driving the cluster

fn only_task(cluster: &DevCluster, id: &str) -> Value {
    let (status, body) = cluster.get(&format!("/v1/jobs/{id}/tasks"));
    assert_eq!(status, 200, "{body}");
    body["items"][0].clone()
}

/// The guest's run time on the executor's clock.
fn elapsed(task: &Value) -> Option<Duration> {
    let at = |field: &str| humantime::parse_rfc3339(task[field].as_str()?).ok();
    at("finished_at")?.duration_since(at("started_at")?).ok()
}

fn describe(task: &Value) -> String {
    format!(
        "{} {} exit_code={} attempts={} in {}: {}",
        task["state"].as_str().unwrap_or("?"),
        task["error"]["kind"].as_str().unwrap_or("-"),
        task["exit_code"],
        task["attempts"],
        elapsed(task).map_or("?".into(), |d| format!("{:.3} s", d.as_secs_f64())),
        one_line(task["error"]["message"].as_str().unwrap_or("")),
    )
}

/// A message on one line, cut to 240 characters.
fn one_line(message: &str) -> String {
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(240) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line,
    }
}

/// Whether `message` names every space-separated word (case-insensitive; `a|b` is
/// either).
fn names_all(message: &str, words: &str) -> bool {
    let message = message.to_lowercase();
    words.split_whitespace().all(|word| {
        word.split('|')
            .any(|alternative| message.contains(&alternative.to_lowercase()))
    })
}

/// Checks an upload refused as `invalid_module` naming `words`; returns what is wrong.
fn refusal_problem(status: u16, body: &Value, words: &str) -> Option<String> {
    let message = body["error"]["message"].as_str().unwrap_or("");
    if status == 422 && body["error"]["kind"] == "invalid_module" && names_all(message, words) {
        None
    } else {
        Some(format!(
            "upload answered {status} {body}, expected 422 invalid_module naming [{words}]"
        ))
    }
}

/// What is wrong with how `case`'s task ended.
fn task_problems(cluster: &DevCluster, case: &Case, job: &str, task: &Value) -> Vec<String> {
    if task["started_at"].is_null() {
        return vec![format!("never ran: {}", task["error"]["message"])];
    }
    let mut problems = Vec::new();
    let (state, kind) = (task["state"].as_str(), task["error"]["kind"].as_str());
    match &case.expect {
        Expect::Succeeds | Expect::Exit(0) if state != Some("succeeded") => {
            problems.push("expected success".into())
        }
        Expect::Exit(code)
            if *code != 0 && (kind != Some("exit") || task["exit_code"] != *code) =>
        {
            problems.push(format!("expected exit with exit_code {code}"))
        }
        Expect::Fails(want) if state != Some("failed") || kind != Some(*want) => {
            problems.push(format!("expected to fail as {want}"))
        }
        Expect::Refused(_) => problems.push("ran, though it should have been refused".into()),
        _ => {}
    }
    if !matches!(case.expect, Expect::Refused(_)) && task["attempts"] != 1 {
        problems.push("attempted more than once".into());
    }
    match elapsed(task) {
        Some(took) if took > case.timeout() + GRACE => problems.push(format!(
            "ran {:.3} s, past its {} ms timeout + {} ms",
            took.as_secs_f64(),
            case.timeout().as_millis(),
            GRACE.as_millis()
        )),
        None => problems.push("no start and end times".into()),
        _ => {}
    }
    if let Some(want) = &case.result
        && state == Some("succeeded")
    {
        let (_, got) = cluster.get_bytes(&format!("/v1/jobs/{job}/tasks/0/result"));
        if &got != want {
            problems.push(format!(
                "result of {} bytes, expected {}: {:?}",
                got.len(),
                want.len(),
                String::from_utf8_lossy(&got[..got.len().min(64)])
            ));
        }
    }
    if case.log_truncated {
        let (_, log) = cluster.get_bytes(&format!("/v1/jobs/{job}/tasks/0/log"));
        if !log.ends_with(LOG_MARKER) || log.len() != (1 << 20) + LOG_MARKER.len() {
            problems.push(format!(
                "log of {} bytes without the truncation marker",
                log.len()
            ));
        }
    }
    problems
}

/// Checks what must hold of a cluster after hostile work: the executors of `before`
/// alive with the same pids and registrations, every core free again (within
/// `within`), and nobody excluded. Returns what is wrong.
fn cluster_problems(cluster: &DevCluster, before: &[Value], within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut after = cluster.executors();
    while Instant::now() < deadline && after.iter().any(|e| e["free_cores"] != e["cores"]) {
        std::thread::sleep(Duration::from_millis(25));
        after = cluster.executors();
    }
    let mut problems = Vec::new();
    if after.len() != before.len() {
        problems.push(format!(
            "{} executors before, {} after",
            before.len(),
            after.len()
        ));
    }
    for b in before {
        let Some(a) = after.iter().find(|a| a["id"] == b["id"]) else {
            problems.push(format!("executor {} is gone", b["id"]));
            continue;
        };
        let pid = a["pid"].as_u64().unwrap_or(0) as u32;
        if a["state"] != "alive" || !common::process_exists(pid) {
            problems.push(format!("executor {} is not alive: {a}", a["id"]));
        }
        if (&a["pid"], &a["generation"]) != (&b["pid"], &b["generation"]) {
            problems.push(format!(
                "executor {} restarted or re-registered: {b} -> {a}",
                a["id"]
            ));
        }
        if a["free_cores"] != a["cores"] {
            problems.push(format!(
                "executor {} has {} of {} cores free {} s later",
                a["id"],
                a["free_cores"],
                a["cores"],
                within.as_secs()
            ));
        }
        if !a["excluded_for_ms"].is_null() {
            problems.push(format!(
                "executor {} is excluded for {} ms",
                a["id"], a["excluded_for_ms"]
            ));
        }
        if a["recent_task_failures"] != 0 {
            problems.push(format!(
                "executor {} counts {} host failures towards an exclusion",
                a["id"], a["recent_task_failures"]
            ));
        }
    }
    problems
}

/// A job that must run on a cluster that came through: writes `healthy`.
fn healthy_job_problem(cluster: &DevCluster) -> Option<String> {
    let module = cluster.upload_wat(&command(&data(16, "healthy"), &write(1, 16, 7)));
    let id = cluster.submit(&spec(&module, &[], &[""]));
    let job = cluster.wait_for_end(&id, Instant::now() + Duration::from_secs(30));
    if job["state"] != "succeeded" {
        return Some(format!("the healthy job did not succeed: {job}"));
    }
    let (_, result) = cluster.get_bytes(&format!("/v1/jobs/{id}/tasks/0/result"));
    (result != b"healthy").then(|| format!("the healthy job wrote {result:?}"))
}

// ---------------------------------------------------------------------------------------
// The tests

#[test]
fn the_corpus_holds_over_100_distinct_modules() {
    let corpus = corpus();
    let mut seen = HashSet::new();
    for case in &corpus {
        assert!(
            seen.insert(&case.wasm),
            "{} repeats an earlier module",
            case.name
        );
    }
    let names: HashSet<_> = corpus.iter().map(|c| &c.name).collect();
    assert_eq!(names.len(), corpus.len(), "case names repeat");
    eprintln!("{} distinct modules", corpus.len());
    assert!(corpus.len() >= 100, "only {} modules", corpus.len());
}

/// Per case: the uploaded module (if the driver took it), what was seen, what is wrong.
struct Row {
    module: Option<Value>,
    observed: String,
    problems: Vec<String>,
}

/// Runs in the second round: modules that should have been refused but were taken, and
/// those at the engine's limits. An engine that cannot take them may fail them as the
/// host's fault, and the exclusions that follow would hide every row after them.
fn runs_late(case: &Case) -> bool {
    matches!(case.expect, Expect::Refused(_)) || case.name.starts_with("within-")
}

#[test]
fn a_hostile_corpus_ends_as_expected_and_leaves_the_cluster_whole() {
    let started = Instant::now();
    let corpus = corpus();
    let cluster = DevCluster::start(EXECUTORS, CORES);
    let before = cluster.executors();
    let data_file = cluster.upload_file(DATA.to_vec());
    let mut rows: Vec<Row> = corpus
        .iter()
        .map(|case| {
            let (status, body) = cluster.put_module_bytes(case.wasm.clone());
            let mut problems = Vec::new();
            if let Expect::Refused(words) = &case.expect {
                problems.extend(refusal_problem(status, &body, words));
            } else if status != 201 {
                problems.push(format!("upload answered {status}: {body}"));
            }
            Row {
                module: (status == 201).then(|| body["id"].clone()),
                observed: format!("upload {status} {}", body["error"]["message"]),
                problems,
            }
        })
        .collect();
    for late in [false, true] {
        let mut round: Vec<usize> = (0..corpus.len())
            .filter(|&i| rows[i].module.is_some() && runs_late(&corpus[i]) == late)
            .collect();
        // The modules that must run before those that should never have been taken.
        round.sort_by_key(|&i| matches!(corpus[i].expect, Expect::Refused(_)));
        let jobs: Vec<(usize, String)> = round
            .into_iter()
            .map(|i| {
                let case = &corpus[i];
                let mut job = json!({
                    "name": case.name,
                    "module": rows[i].module,
                    "inputs": [{"text": case.input}],
                    "resources": case.resources(),
                });
                if case.files {
                    job["files"] = json!({"data.txt": data_file});
                }
                if late {
                    // A host failure here is a finding, not something to retry.
                    job["max_failures"] = json!(1);
                }
                (i, cluster.submit(&job))
            })
            .collect();
        let deadline = Instant::now() + CORPUS_DEADLINE;
        for (i, id) in jobs {
            let (case, row) = (&corpus[i], &mut rows[i]);
            let job = cluster.wait_for_end(&id, deadline);
            let task = only_task(&cluster, &id);
            row.observed = match case.expect {
                // What the executors made of a module that should never have reached them.
                Expect::Refused(_) => format!("{}; then ran: {}", row.observed, describe(&task)),
                _ => describe(&task),
            };
            if common::is_final(&job) {
                row.problems
                    .extend(task_problems(&cluster, case, &id, &task));
            } else {
                row.problems.push(format!(
                    "did not end within {} s",
                    CORPUS_DEADLINE.as_secs()
                ));
            }
        }
    }

    let mut failures = Vec::new();
    eprintln!("{} modules:", corpus.len());
    for (case, row) in corpus.iter().zip(&rows) {
        let verdict = if row.problems.is_empty() {
            "ok  "
        } else {
            "FAIL"
        };
        let expected = case.expect.to_string();
        eprintln!(
            "{verdict} {:<52} {expected:<36} {}",
            case.name, row.observed
        );
        if !row.problems.is_empty() {
            failures.push(format!(
                "{}: {} (observed: {})",
                case.name,
                row.problems.join("; "),
                row.observed
            ));
        }
    }
    failures.extend(cluster_problems(&cluster, &before, Duration::from_secs(5)));
    failures.extend(healthy_job_problem(&cluster));
    eprintln!("corpus done in {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "{} failures over {} modules:\n{}",
        failures.len(),
        corpus.len(),
        failures.join("\n")
    );
}

/// Runs `module` once with `args` and `resources`; the only task, once its job ended
/// (or 30 s passed).
fn run_one(cluster: &DevCluster, module: &str, args: &[&str], resources: Value) -> Value {
    let mut job = spec(module, args, &[""]);
    job["resources"] = resources;
    let id = cluster.submit(&job);
    let job = cluster.wait_for_end(&id, Instant::now() + Duration::from_secs(30));
    assert!(common::is_final(&job), "the job did not end: {job}");
    only_task(cluster, &id)
}

/// A sleeper with a 1 s timeout ended as `timeout`, once, within 1.5 s, and the
/// cluster is whole.
fn assert_ended_at_its_deadline(cluster: &DevCluster, before: &[Value], task: &Value) {
    let took = elapsed(task).expect("start and end times");
    eprintln!(
        "the sleeper ended after {:.3} s: {}",
        took.as_secs_f64(),
        describe(task)
    );
    assert_eq!(task["state"], "failed", "{task}");
    assert_eq!(task["error"]["kind"], "timeout", "{task}");
    assert_eq!(task["attempts"], 1, "{task}");
    assert!(
        took < Duration::from_millis(1500),
        "a 1000 ms timeout ended after {took:?}: {task}"
    );
    let problems = cluster_problems(cluster, before, Duration::from_secs(2));
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn a_p1_guest_sleeping_in_poll_oneoff_ends_at_its_deadline() {
    let cluster = DevCluster::start(2, 1);
    let before = cluster.executors();
    let module = cluster.upload_wat(&sleeper(&[(MONOTONIC, 8 * SECOND_NS, 0)]));
    let task = run_one(&cluster, &module, &[], json!({"timeout_ms": 1000}));
    assert_ended_at_its_deadline(&cluster, &before, &task);
}

#[test]
fn a_p2_component_sleeping_on_a_monotonic_clock_ends_at_its_deadline() {
    let cluster = DevCluster::start(2, 1);
    let before = cluster.executors();
    // testkit's `sleep` is std::thread::sleep: on wasm32-wasip2, a
    // wasi:clocks/monotonic-clock subscription it blocks on.
    let module = cluster.upload(&guests().testkit_component);
    let task = run_one(
        &cluster,
        &module,
        &["sleep", "8000"],
        json!({"timeout_ms": 1000}),
    );
    assert_ended_at_its_deadline(&cluster, &before, &task);
}

#[test]
fn a_task_sleeping_forever_is_killed_within_100ms_and_frees_its_core() {
    let cluster = DevCluster::start(2, 1);
    let before = cluster.executors();
    let module = cluster.upload_wat(&sleeper(&[(MONOTONIC, u64::MAX, 0)]));
    let mut job = spec(&module, &[], &[""]);
    job["resources"] = json!({"timeout_ms": 60_000});
    let id = cluster.submit(&job);
    wait_until(Duration::from_secs(30), "the sleeper to run", || {
        only_task(&cluster, &id)["state"] == "running"
    });
    // Long enough to be asleep in poll_oneoff, not merely instantiated.
    std::thread::sleep(Duration::from_millis(300));
    let killed_at = SystemTime::now();
    let (status, view) = cluster.post_raw(&format!("/v1/jobs/{id}/kill"), "");
    let answered = Instant::now();
    assert_eq!(status, 202, "{view}");
    let mut cores_back = None;
    while answered.elapsed() < Duration::from_secs(10) {
        if cluster
            .executors()
            .iter()
            .all(|e| e["free_cores"] == e["cores"])
        {
            cores_back = Some(answered.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let task = only_task(&cluster, &id);
    let stopped = humantime::parse_rfc3339(task["finished_at"].as_str().unwrap_or("")).ok();
    let guest_stop = stopped.and_then(|s| s.duration_since(killed_at).ok());
    eprintln!(
        "kill answered -> every core free: {cores_back:?}; kill sent -> guest stopped (executor clock): {guest_stop:?}; task: {}",
        describe(&task)
    );
    let cores_back =
        cores_back.expect("the sleeper's core did not come back within 10 s of the kill");
    assert!(
        cores_back < Duration::from_secs(1),
        "cores back after {cores_back:?}"
    );
    let job = cluster.get(&format!("/v1/jobs/{id}")).1;
    assert_eq!(job["state"], "killed", "{job}");
    assert_eq!(task["state"], "killed", "{task}");
    assert_eq!(task["error"]["kind"], "killed", "{task}");
    assert_eq!(task["attempts"], 1, "{task}");
    let mut problems = cluster_problems(&cluster, &before, Duration::from_secs(1));
    problems.extend(healthy_job_problem(&cluster));
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn modules_the_engine_cannot_take_are_refused_at_upload_and_exclude_no_one() {
    let cluster = DevCluster::start(2, 1);
    let before = cluster.executors();
    let mut problems = Vec::new();
    for case in within_limits()
        .into_iter()
        .filter(|c| ["within-2-memories", "within-2-tables"].contains(&c.name.as_str()))
    {
        let (status, body) = cluster.put_module_bytes(case.wasm);
        if status != 201 {
            problems.push(format!("{}: upload answered {status}: {body}", case.name));
            continue;
        }
        let task = run_one(&cluster, body["id"].as_str().unwrap(), &[], json!({}));
        if task["state"] != "succeeded" {
            problems.push(format!("{}: {}", case.name, describe(&task)));
        }
    }
    let refused = [
        "5-memories",
        "9-tables",
        "memory64",
        "a-10000000-element-table",
        "shared-memory",
    ];
    for (name, text, words) in over_limits()
        .into_iter()
        .filter(|(n, ..)| refused.contains(n))
    {
        let (status, body) = cluster.put_module_bytes(wat::parse_str(&text).unwrap());
        if let Some(problem) = refusal_problem(status, &body, words) {
            problems.push(format!("{name}: {problem}"));
        }
        if status == 201 {
            // Taken: see what the executors make of it, twice over, retried as the host's
            // failures are, which is what an exclusion counts.
            for _ in 0..2 {
                let job = spec(body["id"].as_str().unwrap(), &[], &[""]);
                let id = cluster.submit(&job);
                cluster.wait_for_end(&id, Instant::now() + Duration::from_secs(30));
                problems.push(format!(
                    "{name}: then ran: {}",
                    describe(&only_task(&cluster, &id))
                ));
            }
        }
    }
    problems.extend(cluster_problems(&cluster, &before, Duration::from_secs(2)));
    assert!(problems.is_empty(), "{problems:#?}");
}
