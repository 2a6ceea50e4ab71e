//! Fuzz target: inflight::fuzz_entry::chat_template (see src/fuzz_entry.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| inflight::fuzz_entry::chat_template(data));
