//! Egress's allow lists and request policy: narrowing, `outside` against `admits`, IP
//! literals reached only when listed exactly, Host headers.
//! The properties: `flint_fuzz_checks::egress_policy` (fuzz-checks/src/egress_policy.rs).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flint_fuzz_checks::egress_policy::check_input(data));
