//! Modules into `flint_module_rules::check` and `check_limits`.
//! The properties: `flint_fuzz_checks::module_rules` (fuzz-checks/src/module_rules.rs).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flint_fuzz_checks::module_rules::check_input(data));
