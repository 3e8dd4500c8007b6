//! The fetch cache's address table and allow-list parser.
//! The properties: `flint_fuzz_checks::url_policy` (fuzz-checks/src/url_policy.rs).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flint_fuzz_checks::url_policy::check_input(data));
