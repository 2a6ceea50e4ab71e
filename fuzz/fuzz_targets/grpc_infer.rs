//! Fuzz target: inflight::fuzz_entry::grpc_infer (see src/fuzz_entry.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| inflight::fuzz_entry::grpc_infer(data));
