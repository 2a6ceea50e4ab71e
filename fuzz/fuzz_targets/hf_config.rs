//! Fuzz target: inflight::fuzz_entry::hf_config (see src/fuzz_entry.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| inflight::fuzz_entry::hf_config(data));
