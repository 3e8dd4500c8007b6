//! Two things for the binaries of this package.
//!
//! 1. `flint`, the client, is linked at a fixed address (not position-independent) on
//!    glibc targets. A position-independent executable is relocated by the dynamic
//!    linker at every start: 24,000 relative relocations into 420 KB of
//!    `.data.rel.ro` for `flint`, a copy-on-write page fault per page written, a third
//!    of the faults of a client command. Linked at a fixed address they are resolved by
//!    the linker, once. `flint` runs no guest code: it reads arguments and the driver's
//!    answers, in safe Rust, and exits; its stack, heap and libraries are still placed
//!    at random. `flint-engine`, which runs untrusted wasm, stays position-independent
//!    with its whole address-space layout randomised. Not on musl: there rustc links a
//!    static-pie, whose start-up code (`rcrt1.o`) relocates itself and would not run
//!    linked with `-no-pie`.
//! 2. `FLINT_BUILD_ID`, a digest of every source the binaries are built from: `flint`
//!    hands it to the `flint-engine` it execs, which refuses to run for a `flint` of
//!    another build (a `cargo build --bin flint` that left an old engine beside it).

use std::hash::Hasher;
use std::path::Path;

/// What the binaries are built from: this package and the workspace's crates they link
/// (their sources, not their tests: a test edited elsewhere rebuilds nothing here).
const SOURCES: [&str; 14] = [
    "Cargo.toml",
    "Cargo.lock",
    "build.rs",
    "src",
    "protocol/Cargo.toml",
    "protocol/src",
    "module-rules/Cargo.toml",
    "module-rules/src",
    "fetch-cache/Cargo.toml",
    "fetch-cache/src",
    "executor/Cargo.toml",
    "executor/src",
    "driver/Cargo.toml",
    "driver/src",
];

fn main() {
    let gnu = std::env::var("CARGO_CFG_TARGET_ENV").is_ok_and(|env| env == "gnu");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if gnu && linux {
        println!("cargo:rustc-link-arg-bin=flint=-no-pie");
    }
    // SipHash with fixed keys: the same sources give the same id in every build.
    let mut digest = std::hash::DefaultHasher::new();
    for source in SOURCES {
        println!("cargo:rerun-if-changed={source}");
        hash_tree(Path::new(source), &mut digest);
    }
    println!("cargo:rustc-env=FLINT_BUILD_ID={:016x}", digest.finish());
}

/// Hashes the files under `path` (`.rs` and `.toml` files and the lock file), in a
/// stable order, with their paths.
fn hash_tree(path: &Path, digest: &mut impl Hasher) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        entries.sort();
        for entry in entries {
            hash_tree(&entry, digest);
        }
    } else if path
        .extension()
        .is_some_and(|ext| ext == "rs" || ext == "toml" || ext == "lock")
    {
        digest.write(path.to_string_lossy().as_bytes());
        digest.write(&std::fs::read(path).unwrap_or_default());
    }
}
