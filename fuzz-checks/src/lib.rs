//! What each fuzz target checks, as plain functions: `check_input(&[u8])` per target, a
//! panic where a property fails. Two harnesses drive them: the cargo-fuzz targets of
//! `fuzz/` (each one line, for long libFuzzer runs: `scripts/fuzz`), and the corpus
//! replay in the root workspace's tests (`tests/e2e/fuzz_corpora.rs`: every seed of
//! `fuzz/corpus/` and mutants of it, in an ordinary test build), so that the checks
//! run on every `./scripts/test` without an instrumented build of their own.
//!
//! What a check needs beyond protocol and module-rules is a feature (`fetch-cache`,
//! `driver`, `engine`), so that a fuzz build of the cheap targets never links the
//! driver or wasmtime; the root workspace's tests turn all of them on.

#[cfg(feature = "fetch-cache")]
pub mod egress_policy;
pub mod frame_decoder;
pub mod job_record;
pub mod job_spec;
pub mod module_rules;
#[cfg(feature = "engine")]
pub mod module_rules_vs_engine;
#[cfg(feature = "fetch-cache")]
pub mod url_policy;

use arbitrary::{Arbitrary, Result, Unstructured};

/// `(module (func (export "_start")))`: the exports wasm-smith is told to give a module
/// when it should look like a WASI command.
pub const START_EXPORT: &[u8] = &[
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
    0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type section: () -> ()
    0x03, 0x02, 0x01, 0x00, // function section: one function of type 0
    0x07, 0x0a, 0x01, 0x06, b'_', b's', b't', b'a', b'r', b't', 0x00, 0x00, // export
    0x0a, 0x04, 0x01, 0x02, 0x00, 0x0b, // code section: an empty body
];

/// A wasm-smith module under a configuration drawn from `u`: every proposal's switch
/// drawn (GC, exceptions, memory64 and threads, which Flint refuses, too), up to 8
/// memories and 12 tables, tables of up to 200,000 elements, so that modules fall on
/// both sides of [`flint_module_rules::Limits::DEFAULT`] (4, 8, 100,000); and half the
/// time a `_start: () -> ()` export, without which no core module is accepted.
pub fn smith_module(u: &mut Unstructured<'_>) -> Result<Vec<u8>> {
    let mut config = wasm_smith::Config::arbitrary(u)?;
    // Each proposal Flint refuses on in one module of eight, not one of two: with all
    // four at even odds nearly every module is refused for one, and the limits below
    // would seldom be reached.
    config.gc_enabled = u.ratio(1, 8)?;
    config.exceptions_enabled = u.ratio(1, 8)?;
    config.memory64_enabled = u.ratio(1, 8)?;
    config.threads_enabled = u.ratio(1, 8)?;
    let memories: u32 = u.int_in_range(0..=8)?;
    config.max_memories = memories as usize;
    config.min_memories = u.int_in_range(0..=memories)?;
    let tables: u32 = u.int_in_range(0..=12)?;
    config.max_tables = tables as usize;
    config.min_tables = u.int_in_range(0..=tables)?;
    config.max_table_elements = u.int_in_range(0..=200_000)?;
    // Small bodies: the rules read sections, not code, and the engine target compiles.
    config.max_instructions = config.max_instructions.min(200);
    config.max_funcs = config.max_funcs.min(200);
    // Several tables need reference types (wasm-smith's own rule, which
    // `Config::arbitrary` applied to its own maximum).
    if !config.reference_types_enabled {
        config.max_tables = config.max_tables.min(1);
        config.min_tables = config.min_tables.min(1);
    }
    if u.arbitrary()? {
        config.exports = Some(START_EXPORT.to_vec());
    }
    Ok(wasm_smith::Module::new(config, u)?.to_bytes())
}
