//! The exporter checked by an outside tool: `promtool check metrics` on `/metrics`, skipped when
//! promtool is missing, unless CI=true. (The status page in headless Chromium is `browser.rs`; a
//! real Prometheus scraping the demo is `e2e`.)

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
