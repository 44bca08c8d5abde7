//! The fuzz targets' checks over every committed input: the minimised corpus in
//! `fuzz/corpus/<target>/` and the crash reproducers in `fuzz/regressions/<target>/` (each a
//! bug the fuzzer found, fixed since). Runs in CI without cargo-fuzz or a nightly compiler.

use super::fuzz_checks;
use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for kind in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(kind).join(target)) else {
            continue;
        };
        files.extend(entries.filter_map(Result::ok).map(|e| e.path()));
    }
    files.sort();
    files
}

fn run_all(target: &str, check: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        files.len() >= 5,
        "fuzz/corpus/{target} should hold the committed corpus ({} files found)",
        files.len()
    );
    for path in files {
        let data = std::fs::read(&path).expect("read a corpus file");
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "{} fails its check", path.display());
    }
}

#[test]
fn the_trace_corpus_and_reproducers_pass() {
    run_all("trace_parser", fuzz_checks::trace);
}

#[test]
fn the_config_corpus_and_reproducers_pass() {
    run_all("config_parser", fuzz_checks::config);
}

#[test]
fn the_allocator_corpus_and_reproducers_pass() {
    run_all("allocator", fuzz_checks::allocator);
}

#[test]
fn the_published_file_corpus_and_reproducers_pass() {
    run_all("published_file", fuzz_checks::published_file);
}
