//! Fuzz target: the allocator (a `MemoryManager` over simulated devices) driven by arbitrary
//! allocations, frees, trims and injected driver faults, checked after every step against the
//! model in `tests/it/reliability/alloc_model.rs`.
#![no_main]

#[allow(dead_code)]
#[path = "../../tests/it/reliability/alloc_model.rs"]
mod alloc_model;
#[allow(dead_code)]
#[path = "../../tests/it/reliability/fuzz_checks.rs"]
mod fuzz_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::allocator(data));
