//! Fuzz target: the sidecar's reader of published snapshot files
//! (`gpumem_observe::collect::read::parse`), with the checks of `tests/it/reliability/fuzz_checks.rs`.
#![no_main]

#[allow(dead_code)]
#[path = "../../tests/it/reliability/alloc_model.rs"]
mod alloc_model;
#[allow(dead_code)]
#[path = "../../tests/it/reliability/fuzz_checks.rs"]
mod fuzz_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::published_file(data));
