//! Arbitrary bytes postcard-decoded as each record the driver's job store keeps.
//! The properties: `flint_fuzz_checks::job_record` (fuzz-checks/src/job_record.rs).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flint_fuzz_checks::job_record::check_input(data));
