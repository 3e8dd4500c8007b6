//! What a deterministic attempt reads of its host, in-process: its files' stats and
//! listings, its variables' order, its floats. Two host directories with the same files,
//! made in other orders at other times (so other inodes, times and listing orders), must
//! give the same bytes; without determinism they do not.

use std::path::Path;
use std::time::Duration;

use super::super::files::{FILE_TIME_NS, inode};
use super::super::{EngineKind, Kill, RunReport, Sandbox, SandboxConfig, TaskEnv, TaskRun};
use flint_protocol::TaskResult;

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        slots: 1,
        max_memory_bytes: 64 << 20,
        fuel: false,
    })
    .unwrap()
}

/// Runs `wat` compiled for the engine it runs on: a deterministic one with a `seed`.
fn run(
    sandbox: &Sandbox,
    wat: &str,
    env: &[(&str, &str)],
    files: Option<&Path>,
    seed: Option<[u8; 32]>,
) -> Vec<u8> {
    let wasm = wat::parse_str(wat).unwrap();
    let compiled = (sandbox.compile_for(&wasm, EngineKind::of(seed.is_some())))
        .unwrap_or_else(|f| panic!("{}: {}", f.kind, f.message));
    let report: RunReport = sandbox.run(
        &compiled,
        TaskRun {
            args: &["test"],
            env,
            task: TaskEnv {
                job: "job",
                index: 0,
                count: 1,
                attempt: 1,
            },
            stdin: Vec::new(),
            memory_bytes: 64 << 20,
            timeout: Duration::from_secs(30),
            max_output_bytes: 1 << 20,
            max_log_bytes: 1 << 20,
            kill: Kill::new(),
            fuel: None,
            seed,
            files_dir: files,
            result_target: None,
            egress: Default::default(),
        },
    );
    match report.outcome {
        Ok(TaskResult::Inline(bytes)) => bytes,
        other => panic!("{other:?}: {}", String::from_utf8_lossy(&report.log)),
    }
}

/// Stats `/files` (fd 3), then `b.txt` in it by path, then lists it with a 512-byte
/// buffer, and writes the two 64-byte `filestat`s and the listing.
const STATS: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_filestat_get" (func $fstat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_filestat_get"
    (func $pstat (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_readdir"
    (func $readdir (param i32 i32 i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "b.txt")
  (func $ok (param i32) (if (local.get 0) (then unreachable)))
  (func (export "_start")
    (call $ok (call $fstat (i32.const 3) (i32.const 1024)))
    (call $ok (call $pstat (i32.const 3) (i32.const 0) (i32.const 16) (i32.const 5) (i32.const 1088)))
    (call $ok (call $readdir (i32.const 3) (i32.const 1152) (i32.const 512) (i64.const 0) (i32.const 8)))
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.add (i32.const 128) (i32.load (i32.const 8))))
    (call $ok (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 12)))))"#;

/// The same three files, made in `order`, a moment apart.
fn files(order: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in order {
        std::fs::write(dir.path().join(name), name.repeat(3)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    dir
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// The listing's (d_next, d_ino, d_type, name) in order.
fn entries(mut bytes: &[u8]) -> Vec<(u64, u64, u8, String)> {
    let mut entries = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_le_bytes(bytes[16..20].try_into().unwrap()) as usize;
        let name = String::from_utf8(bytes[24..24 + len].to_vec()).unwrap();
        entries.push((u64_at(bytes, 0), u64_at(bytes, 8), bytes[20], name));
        bytes = &bytes[24 + len..];
    }
    entries
}

#[test]
fn two_host_copies_made_in_other_orders_give_the_same_stats_and_listing() {
    let sandbox = sandbox();
    let (one, two) = (
        files(&["c.txt", "a.txt", "b.txt"]),
        files(&["a.txt", "b.txt", "c.txt"]),
    );
    let seed = Some([1; 32]);
    let read = run(&sandbox, STATS, &[], Some(one.path()), seed);
    assert_eq!(read, run(&sandbox, STATS, &[], Some(two.path()), seed));
    assert_ne!(
        run(&sandbox, STATS, &[], Some(one.path()), None),
        run(&sandbox, STATS, &[], Some(two.path()), None),
        "without determinism the host's inodes show"
    );

    let (dir, file) = (&read[..64], &read[64..128]);
    for (stat, path, kind, size) in [(dir, "/files", 3, 0), (file, "/files/b.txt", 4, 15)] {
        assert_eq!(u64_at(stat, 0), 1, "device");
        assert_eq!(u64_at(stat, 8), inode(path).0, "{path}'s inode");
        assert_eq!(stat[16], kind);
        assert_eq!(u64_at(stat, 24), 1, "links");
        assert_eq!(u64_at(stat, 32), size);
        for time in [40, 48, 56] {
            assert_eq!(u64_at(stat, time), FILE_TIME_NS, "2000-01-01");
        }
    }
    let listed = entries(&read[128..]);
    let names: Vec<&str> = listed.iter().map(|e| e.3.as_str()).collect();
    assert_eq!(names, [".", "..", "a.txt", "b.txt", "c.txt"]);
    for (at, (next, ino, kind, name)) in listed.iter().enumerate() {
        assert_eq!(*next, at as u64 + 1);
        let path = match name.as_str() {
            "." | ".." => "/files".to_owned(),
            name => format!("/files/{name}"),
        };
        assert_eq!((*ino, *kind), (inode(&path).0, if at < 2 { 3 } else { 4 }));
    }
}

/// Writes its environ, NUL-separated, as `environ_get` gives it.
const ENVIRON: &str = r#"(module
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $sizes (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (drop (call $sizes (i32.const 0) (i32.const 4)))
    (drop (call $get (i32.const 1024) (i32.const 4096)))
    (i32.store (i32.const 16) (i32.const 4096))
    (i32.store (i32.const 20) (i32.load (i32.const 4)))
    (drop (call $write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)))))"#;

#[test]
fn a_deterministic_environ_is_one_value_per_name_sorted_and_the_tasks_wins() {
    let sandbox = sandbox();
    // The job's variables, then the task's: as the runner passes them.
    let env = [("Z", "job"), ("A", "job"), ("A", "task")];
    let environ = run(&sandbox, ENVIRON, &env, None, Some([1; 32]));
    assert_eq!(
        String::from_utf8(environ).unwrap(),
        "A=task\0FLINT_TASK_COUNT=1\0FLINT_TASK_INDEX=0\0Z=job\0"
    );
    // What `flint replay` passes (its bundle's map): the same environ.
    let replayed = [("A", "task"), ("Z", "job")];
    assert_eq!(
        run(&sandbox, ENVIRON, &env, None, Some([1; 32])),
        run(&sandbox, ENVIRON, &replayed, None, Some([1; 32]))
    );
}

/// Writes the bits of f32 0/0, of f64 (a signalling NaN with payload 1) + 1, and the
/// four lanes of `i32x4.relaxed_trunc_f32x4_s` of (NaN, 3e9, -3e9, 1.5). The operands
/// come from memory, so that no compiler folds them.
const FLOATS: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 208) "\01\00\00\00\00\00\f0\7f")
  (data (i32.const 224) "\00\00\c0\7f\5e\d0\32\4f\5e\d0\32\cf\00\00\c0\3f")
  (func (export "_start")
    (f32.store (i32.const 64) (f32.div (f32.load (i32.const 200)) (f32.load (i32.const 200))))
    (f64.store (i32.const 68) (f64.add (f64.load (i32.const 208)) (f64.const 1)))
    (v128.store (i32.const 76) (i32x4.relaxed_trunc_f32x4_s (v128.load (i32.const 224))))
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 28))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

#[test]
fn a_deterministic_guests_nans_are_canonical_and_relaxed_simd_is_the_deterministic_lowering() {
    let sandbox = sandbox();
    let bits = run(&sandbox, FLOATS, &[], None, Some([1; 32]));
    let word = |at: usize| u32::from_le_bytes(bits[at..at + 4].try_into().unwrap());
    assert_eq!(word(0), 0x7fc0_0000, "f32 0/0: the canonical NaN");
    assert_eq!(
        u64_at(&bits, 4),
        0x7ff8_0000_0000_0000,
        "f64 NaN + 1: canonical"
    );
    // The deterministic lowering is `i32x4.trunc_sat_f32x4_s`: NaN to 0, saturating.
    let lanes: Vec<u32> = (0..4).map(|i| word(12 + 4 * i)).collect();
    assert_eq!(lanes, [0, i32::MAX as u32, i32::MIN as u32, 1]);
}
