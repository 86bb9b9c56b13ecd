//! cargo-fuzz target: `fuzz_entry::index` (see tests/fuzz_entry/mod.rs).
#![no_main]

#[path = "../../tests/fuzz_entry/mod.rs"]
mod fuzz_entry;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_entry::index(data));
