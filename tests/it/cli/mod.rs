//! The binary as a user runs it: exit codes, one-line errors, no panics. One module per
//! subcommand or topic; the helpers they share (running the binary, scratch directories, trace
//! files) are here.

mod bench;
mod devices;
mod flags;
mod replay;
mod sweep;

use crate::support::stderr;
use std::process::Output;

fn gpumem(args: &[&str]) -> Output {
    crate::support::gpumem(args)
        .output()
        .expect("the gpumem binary runs")
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "gpumem-cli-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_trace(dir: &std::path::Path, name: &str, body: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// `gpumem replay --backend sim --json FLAG OUTPUT TRACE`, which must succeed: its report.
fn replay_json_on_sim(
    flag: &str,
    output: &std::path::Path,
    trace: &std::path::Path,
) -> serde_json::Value {
    let out = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--json",
        flag,
        output.to_str().unwrap(),
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}
