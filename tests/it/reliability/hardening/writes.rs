//! Case 3: no write can be redirected. `replay --plot` refuses a target that is not a regular
//! file or is one of its inputs, and never follows a link planted at a temporary name; the
//! publisher's temporary names cannot be planted either.

use crate::reliability::{gpumem, gzip, Scratch};
use std::path::Path;
use std::process::Command;

const TRACE: &str = "a 1 1048576 0\na 2 4096 0\nf 1\nf 2\n";

fn replay_plot(trace: &Path, plot: &Path) -> std::process::Output {
    gpumem()
        .args(["replay", "--backend", "sim", "--plot"])
        .arg(plot)
        .arg(trace)
        .output()
        .expect("gpumem runs")
}

fn one_line_exit_2(out: &std::process::Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "stderr: {stderr}");
    assert!(stderr.contains(needle), "stderr: {stderr}");
}

/// `--plot in.gz in.gz` used to overwrite the trace with the chart.
#[test]
fn the_plot_never_overwrites_an_input() {
    let dir = Scratch::new("plot-input");
    let trace = dir.file("in.gz", &gzip(TRACE.as_bytes()));
    let before = std::fs::read(&trace).expect("read");
    let out = replay_plot(&trace, &trace);
    one_line_exit_2(&out, "input");
    assert_eq!(std::fs::read(&trace).expect("read"), before);
}

/// A FIFO, a device or a symlink at the plot's path is refused, not replaced (the old code
/// renamed an SVG over `/dev/null`).
#[test]
fn the_plot_never_replaces_a_special_file() {
    let dir = Scratch::new("plot-special");
    let trace = dir.file("t.trace", TRACE.as_bytes());
    let fifo = dir.path().join("chart.svg");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo")
        .success());
    one_line_exit_2(&replay_plot(&trace, &fifo), "FIFO");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo)
        .expect("still there")
        .file_type()
        .is_fifo());

    let victim = dir.file("victim.txt", b"keep me");
    let link = dir.path().join("link.svg");
    std::os::unix::fs::symlink(&victim, &link).expect("symlink");
    one_line_exit_2(&replay_plot(&trace, &link), "symbolic link");
    assert_eq!(std::fs::read(&victim).expect("read"), b"keep me");
}

/// A symlink planted at the old fixed temporary name (`PATH.tmp`) is never written through.
#[test]
fn a_planted_temporary_is_never_followed() {
    let dir = Scratch::new("plot-planted");
    let trace = dir.file("t.trace", TRACE.as_bytes());
    let victim = dir.file("victim.txt", b"keep me");
    let plot = dir.path().join("chart.svg");
    std::os::unix::fs::symlink(&victim, dir.path().join("chart.svg.tmp")).expect("symlink");
    let out = gpumem()
        .args(["replay", "--backend", "sim", "--plot"])
        .arg(&plot)
        .arg(&trace)
        .output()
        .expect("gpumem runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&victim).expect("read"), b"keep me");
    assert!(std::fs::read_to_string(&plot)
        .expect("the chart")
        .contains("<svg"));
}

/// The publisher's temporary names are unpredictable and created exclusively: links planted
/// at every name the old scheme (`.NAME.PID.N.tmp`) would use are never written through.
#[test]
fn the_publisher_never_writes_through_a_planted_link() {
    use gpumem::backend::sim::{SimBackend, SimConfig};
    let dir = Scratch::new("publish-planted");
    let victim = dir.file("victim.txt", b"keep me");
    let pid = std::process::id();
    let name = gpumem_observe::publish::file_name(pid);
    for n in 0..64 {
        let planted = dir.path().join(format!(".{name}.{pid}.{n}.tmp"));
        std::os::unix::fs::symlink(&victim, planted).expect("symlink");
    }
    let backend = std::sync::Arc::new(SimBackend::new(SimConfig::default()));
    let manager = gpumem::MemoryManager::new(backend, Default::default()).expect("manager");
    let publisher = gpumem_observe::publish::Publisher::builder()
        .manager(manager)
        .dir(dir.path())
        .interval(Duration::from_millis(100))
        .spawn()
        .expect("publisher");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        dir.path().join(&name).exists(),
        "the publisher wrote its file"
    );
    publisher.shutdown();
    assert_eq!(std::fs::read(&victim).expect("read"), b"keep me");
}

use std::time::Duration;

/// Two traces of one name (`a/x.trace`, `b/x.trace`) used to write one chart over the other:
/// each gets its own file.
#[test]
fn two_traces_of_one_name_get_a_chart_each() {
    let dir = Scratch::new("plot-names");
    for sub in ["a", "b"] {
        std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
    }
    let first = dir.file("a/x.trace", TRACE.as_bytes());
    let second = dir.file("b/x.trace", b"a 1 8388608 0\nf 1\n");
    let plot = dir.path().join("chart.svg");
    let out = gpumem()
        .args(["replay", "--backend", "sim", "--json", "--plot"])
        .arg(&plot)
        .args([&first, &second])
        .output()
        .expect("gpumem runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let charts = ["chart-x.svg", "chart-x-2.svg"].map(|name| dir.path().join(name));
    for chart in &charts {
        assert!(chart.is_file(), "{} missing", chart.display());
    }
    let (a, b) = (std::fs::read(&charts[0]), std::fs::read(&charts[1]));
    assert_ne!(a.expect("read"), b.expect("read"), "the same chart twice");
}
