//! Hardening (issue 16), one module per case: the collector against files swapped under it
//! (`collect_races`), its memory budget and stale files (`collect_budget`), file writes that
//! cannot be redirected (`writes`), input limits and the one-line error contract
//! (`input_limits`, `precedence`), log lines (`logging`), and the HTTP side's Host and
//! cross-origin checks (`web`).

mod collect_budget;
mod collect_races;
mod flood;
mod input_limits;
mod logging;
mod precedence;
mod publisher_files;
mod slow_readers;
mod web;
mod writes;

use crate::support::{serve_args, Running};
use gpumem_wire::ReasonCount;
use std::path::Path;
use std::process::Stdio;

/// `gpumem serve` on the simulated device and a free port, collecting `dir` every `interval`,
/// its log going to `stderr`.
pub(super) fn collecting_sidecar(dir: &Path, interval: &str, stderr: Stdio) -> Running {
    let mut args = serve_args(interval);
    args.extend(["--collect-dir", dir.to_str().expect("a UTF-8 scratch path")]);
    Running::start_with_stderr(&args, stderr)
}

/// A valid published file for `pid`, taken at `timestamp`, with `devices` devices of `pools`
/// pools each.
pub(super) fn published(
    pid: u32,
    process: &str,
    timestamp: f64,
    devices: u32,
    pools: u32,
) -> String {
    let device = |gpu: u32| {
        serde_json::json!({
            "gpu": gpu,
            "reserved_bytes": 64u64 << 20,
            "pools": (0..pools)
                .map(|p| serde_json::json!({"pool": format!("p{p}"), "reserved_bytes": 1024}))
                .collect::<Vec<_>>(),
        })
    };
    serde_json::json!({
        "format": "gpumem.publish",
        "version": 1,
        "pid": pid,
        "process": process,
        "timestamp_seconds": timestamp,
        "interval_seconds": 1.0,
        "devices": (0..devices).map(device).collect::<Vec<_>>(),
    })
    .to_string()
}

pub(super) fn count(counts: &[ReasonCount], reason: &str) -> u64 {
    counts
        .iter()
        .find(|c| c.reason == reason)
        .map_or(0, |c| c.count)
}
