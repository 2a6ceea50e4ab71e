//! Fuzz target: inflight::fuzz_entry::tokenizer_json (see src/fuzz_entry.rs).
//!
//! The tokenizers crate can panic inside its deserializers; inflight catches that panic
//! and refuses the file. libFuzzer's panic hook aborts on any panic, caught or not, so
//! this target puts back a silent hook: a panic that escapes still fails the run (the
//! harness aborts on it), a caught one does not.
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: {
        std::panic::set_hook(Box::new(|_| {}));
    },
    |data: &[u8]| inflight::fuzz_entry::tokenizer_json(data)
);
