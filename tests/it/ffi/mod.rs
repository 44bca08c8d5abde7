//! The C ABI (`crates/gpumem-capi`): called from Rust on a simulated device installed as its
//! manager (`abi`), its three declarations checked against each other (`declarations`), and
//! from Python through ctypes, without PyTorch (`python`: the package's own tests, from the
//! source tree and against its wheel installed where no cargo is; the wheel's tag and contents;
//! `pip install ./python`), hostile tags (`tags`), and children forked while threads are inside
//! the library (`fork`).

mod abi;
mod declarations;
mod fork;
mod publish_exit;
mod python;
mod tags;
mod torch_abi;
mod torch_gpu;

use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec};
use std::sync::Arc;

/// A simulated host of one device of `total_bytes`, for a manager installed behind the C ABI.
fn one_device(total_bytes: u64) -> Arc<SimBackend> {
    let spec = SimDeviceSpec {
        total_bytes,
        ..SimDeviceSpec::default()
    };
    Arc::new(SimBackend::new(SimConfig {
        devices: vec![spec],
        ..SimConfig::default()
    }))
}

/// Runs `test`, an ignored test of this binary, in a process of its own with the variable
/// `marker` set (the test does nothing without it), so that no other test's threads, locks or
/// allocations are in its process. It must pass and print a line containing `figures`, which is
/// passed on to this test's output.
fn run_alone(test: &str, marker: &str, figures: &str) {
    let output = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(marker, "1")
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The harness prints the line after "test ... ": find it anywhere in a line.
    let line = stdout
        .lines()
        .find_map(|line| line.find(figures).map(|at| &line[at..]));
    eprintln!("{}", line.unwrap_or("(no figures)"));
    assert!(line.is_some(), "{test} did not run:\n{stdout}\n{stderr}");
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{test} failed:\n{stdout}\n{stderr}"
    );
}
