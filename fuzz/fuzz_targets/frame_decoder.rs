//! Arbitrary bytes into the frame decoder, as a peer would send them.
//! The properties: `flint_fuzz_checks::frame_decoder` (fuzz-checks/src/frame_decoder.rs).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flint_fuzz_checks::frame_decoder::check_input(data));
