//! What each fuzz target checks on one input. The targets in `fuzz/fuzz_targets/` include this
//! file (and `alloc_model.rs`) with `#[path]`, and `corpus.rs` runs the same checks over every
//! committed corpus file and crash reproducer, so what the fuzzer found stays fixed in CI.
//! Each check panics, naming the property, when the input breaks one.

use super::alloc_model;
use gpumem::manager::{load_config, parse_config_str, ConfigSources};
use gpumem_observe::collect::read::parse as parse_published;
use gpumem_observe::collect::REJECTION_REASONS;
use gpumem_replay::trace::{parse_trace, TraceEvent};

/// Longest error message a bad input may produce: errors quote the input, but only a little.
const MAX_ERROR_LEN: usize = 600;

/// The trace parser: never panics; a trace it accepts is well formed (dense slots, frees of
/// live allocations only, sizes in range, the peak it reports is the real one); a trace it
/// rejects gets a short one-line error.
pub(super) fn trace(data: &[u8]) {
    match parse_trace("fuzz", data) {
        Ok(trace) => {
            assert!(!trace.events.is_empty(), "an accepted trace has events");
            let mut live: Vec<Option<u64>> = vec![None; trace.slots];
            let mut next_slot = 0u32;
            let (mut requested, mut peak) = (0u64, 0u64);
            for event in &trace.events {
                match *event {
                    TraceEvent::Alloc { slot, size, .. } => {
                        assert_eq!(slot, next_slot, "slots are dense, in order of appearance");
                        next_slot += 1;
                        assert!((1..=1 << 40).contains(&size), "size {size} out of range");
                        live[slot as usize] = Some(size);
                        requested += size;
                        peak = peak.max(requested);
                    }
                    TraceEvent::Free { slot } => {
                        let size = live
                            .get_mut(slot as usize)
                            .and_then(Option::take)
                            .expect("a free refers to a live allocation");
                        requested -= size;
                    }
                }
            }
            assert_eq!(next_slot as usize, trace.slots, "every slot is used");
            assert_eq!(trace.peak_requested_bytes, peak, "the reported peak");
        }
        Err(error) => one_short_line(&error.to_string()),
    }
}

fn one_short_line(message: &str) {
    assert!(!message.contains('\n'), "a multi-line error: {message:?}");
    assert!(
        message.len() <= MAX_ERROR_LEN,
        "an error of {} bytes: {:.200}...",
        message.len(),
        message
    );
}

/// The configuration parser, from a TOML text or from `GPUMEM_*` variables (first byte picks
/// which): never panics, and whatever it accepts passes validation.
pub(super) fn config(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let loaded = if mode % 2 == 0 {
        parse_config_str(&text)
    } else {
        // One variable per line, `KEY=value`; bare keys get the prefix.
        let env = text
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| {
                let key = if key.starts_with("GPUMEM_") || key.starts_with("CUDA_") {
                    key.to_string()
                } else {
                    format!("GPUMEM_{}", key.to_ascii_uppercase())
                };
                (key, value.to_string())
            })
            .collect();
        load_config(&ConfigSources { file: None, env })
    };
    if let Ok(config) = loaded {
        if let Err(error) = config.validate() {
            panic!("an accepted configuration fails validation: {error}");
        }
    }
}

/// The allocator: arbitrary operations and faults against the model in `alloc_model`.
pub(super) fn allocator(data: &[u8]) {
    if let Err(broken) = alloc_model::run(data) {
        panic!("{broken}");
    }
}

/// The sidecar's reader of published snapshot files (`gpumem serve --collect-dir`): never
/// panics; a rejection has one of the fixed metric reasons; a file it accepts, written back
/// out, reads back the same (validation is stable, the process name stays clean) — floats to
/// within a few units in the last place, as serde_json's default float parsing is not exact
/// (found by the fuzzer: `fuzz/regressions/published_file/`).
pub(super) fn published_file(data: &[u8]) {
    match parse_published(data) {
        Ok(file) => {
            let bytes = serde_json::to_vec(&file).expect("an accepted file serialises");
            let again = parse_published(&bytes)
                .unwrap_or_else(|e| panic!("an accepted file, written back, is rejected: {e}"));
            let (first, second) = (
                serde_json::to_value(&file).expect("to JSON"),
                serde_json::to_value(&again).expect("to JSON"),
            );
            assert!(
                same_json(&first, &second),
                "reading a file twice changes it:\n{first}\n{second}"
            );
        }
        Err(rejection) => assert!(
            REJECTION_REASONS.contains(&rejection.reason()),
            "unknown rejection reason {}",
            rejection.reason()
        ),
    }
}

/// Equal JSON, numbers compared as floats to a relative 1e-12.
fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}
