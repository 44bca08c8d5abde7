//! `promtool check metrics` on a `/metrics` body, for tests that judge what it says.

use std::io::Write;
use std::process::{Command, ExitStatus, Stdio};

/// Runs `promtool check metrics` with `body` on stdin: its exit status, and its stdout and
/// stderr together (empty when it has nothing to warn about).
pub(crate) fn promtool_check_metrics(body: &str) -> (ExitStatus, String) {
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
    (output.status, said)
}
