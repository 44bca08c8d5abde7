//! The exporter checked by outside tools: `promtool check metrics` on `/metrics`, and the
//! status page in headless Chromium. Each is skipped when its tool is missing, unless CI=true.

use super::http::{get, tool_available};
use super::Fixture;
use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn promtool_accepts_the_metrics() {
    if !tool_available("promtool") {
        return;
    }
    let fixture = Fixture::start();
    let body = get(fixture.addr(), "/metrics").body;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write");
    let output = child.wait_with_output().expect("promtool finishes");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool check metrics failed: {said}"
    );
    assert!(said.trim().is_empty(), "promtool warned: {said}");
}

/// The page in a real browser: the chart script runs without errors and the page renders.
#[test]
fn the_page_renders_in_headless_chromium() {
    if !tool_available("chromium") {
        return;
    }
    let fixture = Fixture::start();
    let dir = std::env::temp_dir().join(format!("gpumem-chromium-{}", std::process::id()));
    let screenshot = dir.join("page.png");
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
        ])
        .args([
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--screenshot={}", screenshot.display()))
        .args(["--window-size=1280,1000", "--virtual-time-budget=3000"])
        .arg(format!("http://{}/", fixture.addr()))
        .output()
        .expect("chromium runs");
    let log = String::from_utf8_lossy(&output.stderr);
    let size = std::fs::metadata(&screenshot).map_or(0, |m| m.len());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.status.success(), "chromium failed: {log}");
    assert!(size > 10_000, "the screenshot looks empty ({size} bytes)");
    let script_errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") && l.contains("Uncaught"))
        .collect();
    assert!(
        script_errors.is_empty(),
        "the page's script failed: {script_errors:?}"
    );
}
