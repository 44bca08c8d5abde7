//! Fuzz target: `gpumem_replay::trace::parse_trace` on arbitrary bytes, with the checks of
//! `tests/it/reliability/fuzz_checks.rs` (never panics, accepted traces are well formed,
//! rejected ones get one short line).
#![no_main]

#[allow(dead_code)]
#[path = "../../tests/it/reliability/alloc_model.rs"]
mod alloc_model;
#[allow(dead_code)]
#[path = "../../tests/it/reliability/fuzz_checks.rs"]
mod fuzz_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::trace(data));
