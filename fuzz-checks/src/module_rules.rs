//! Modules into `flint_module_rules::check` and `check_limits`, as uploads and fetched
//! modules reach them.
//!
//! Two shapes of input, by the first byte: the rest as raw bytes (whatever a client
//! uploads), or the rest as the seed of a `wasm-smith` module whose configuration is
//! drawn from the input too ([`flint_fuzz::smith_module`]: proposals Flint refuses as
//! well as those it runs, counts and sizes on both sides of the limits), so that both
//! accepted and refused modules come out. Properties:
//! - neither function panics, on any bytes;
//! - `check` accepting a module implies `check_limits` accepting it, with the same
//!   `Shape` (the executor runs `check_limits` alone before compiling);
//! - a module accepted under tighter limits is accepted under the defaults (the rules
//!   are monotone in their limits: raising one never refuses more).

use arbitrary::Unstructured;
use flint_module_rules::{Limit, Limits, check, check_limits};

/// One input, as the cargo-fuzz target and the corpus replay
/// (tests/e2e/fuzz_corpora.rs) give it: panics where a property fails.
pub fn check_input(data: &[u8]) {
    let Some((&shape, rest)) = data.split_first() else {
        return;
    };
    if shape % 2 == 0 {
        properties(rest);
    } else if let Ok(wasm) = crate::smith_module(&mut Unstructured::new(rest)) {
        properties(&wasm);
    }
}

fn properties(wasm: &[u8]) {
    let checked = check(wasm, &Limits::DEFAULT);
    let limited = check_limits(wasm, &Limits::DEFAULT);
    if let Ok(shape) = &checked {
        assert_eq!(
            limited.as_ref(),
            Ok(shape),
            "check accepted, check_limits did not"
        );
    }
    let tight = Limits {
        memories: 1,
        tables: 1,
        table_elements: 1_000,
        instances: 2,
        max_memory_bytes: 16 << 20,
        instance_bytes: 64 << 10,
    };
    // Validation does not depend on the limits, so only a valid module is walked again.
    if matches!(&checked, Err(r) if r.limit == Limit::Validation) {
        return;
    }
    if let Ok(shape) = check_limits(wasm, &tight) {
        assert_eq!(
            checked,
            Ok(shape),
            "accepted under tight limits, not the defaults"
        );
        assert!(shape.initial_memory_bytes <= tight.max_memory_bytes);
    }
}
