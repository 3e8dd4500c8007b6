//! Arbitrary bytes as a `POST /v1/jobs` body, parsed as the driver parses it.
//! The properties: `flint_fuzz_checks::job_spec` (fuzz-checks/src/job_spec.rs).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flint_fuzz_checks::job_spec::check_input(data));
