//! "Accepted by the rules" means "the engine will take it": modules that
//! `flint_module_rules::check` accepts, compiled and linked by the executor's own
//! sandbox.
//!
//! Inputs as in `module_rules` (raw bytes, or a wasm-smith module). The sandbox is the
//! executor's (`Sandbox::new`, one slot, 64 MiB of memory, no fuel), and the limits are
//! the ones the executor checks a module against before compiling it (the defaults,
//! with its memory limit). Property: an accepted module compiles and links, or fails
//! with a kind that is the module's fault (`invalid_module`, `unknown_import`, ...), never
//! `host_error`: a host error is retried and counted against the executor, so a module
//! that causes one excludes every executor it reaches.
//!
//! The first module to fail for each cause is printed, so a run shows what accepted
//! modules the engine still refuses.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use arbitrary::Unstructured;
use flint_executor::sandbox::{Sandbox, SandboxConfig};
use flint_module_rules::{Limits, check};
use flint_protocol::FailureKind;

fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        Sandbox::new(SandboxConfig {
            slots: 1,
            max_memory_bytes: 64 << 20,
            fuel: false,
        })
        .expect("the executor's engine builds")
    })
}

/// One input, as the cargo-fuzz target and the corpus replay
/// (tests/e2e/fuzz_corpora.rs) give it: panics where a property fails.
pub fn check_input(data: &[u8]) {
    let Some((&shape, rest)) = data.split_first() else {
        return;
    };
    if shape % 2 == 0 {
        compile_if_accepted(rest);
    } else if let Ok(wasm) = crate::smith_module(&mut Unstructured::new(rest)) {
        compile_if_accepted(&wasm);
    }
}

fn compile_if_accepted(wasm: &[u8]) {
    let sandbox = sandbox();
    let limits = Limits {
        max_memory_bytes: sandbox.max_memory_bytes() as u64,
        ..Limits::DEFAULT
    };
    if check(wasm, &limits).is_err() {
        return;
    }
    let Err(failure) = sandbox.compile(wasm) else {
        return;
    };
    assert_ne!(
        failure.kind,
        FailureKind::HostError,
        "accepted by the module rules, a host error at the engine: {}",
        failure.message
    );
    static SEEN: Mutex<Option<HashSet<FailureKind>>> = Mutex::new(None);
    let mut seen = SEEN.lock().expect("no panic while holding it");
    if seen.get_or_insert_default().insert(failure.kind) {
        eprintln!(
            "first accepted module failing as {}: {}",
            failure.kind, failure.message
        );
    }
}
