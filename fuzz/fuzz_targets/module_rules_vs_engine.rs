//! "Accepted by the rules" means "the engine will take it".
//! The properties: `flint_fuzz_checks::module_rules_vs_engine` (fuzz-checks/src/module_rules_vs_engine.rs).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flint_fuzz_checks::module_rules_vs_engine::check_input(data));
