//! Log lines as their reader needs them: no colour codes when `NO_COLOR` is set, even on a
//! terminal (`init_logging` used to set colour twice, the second time ignoring `NO_COLOR`), and
//! one JSON object per line with `--log-format json` (`GPUMEM_LOG_FORMAT`).

use crate::reliability::gpumem;
use std::process::Command;

/// `gpumem devices --backend sim` at debug level (it logs which backend at debug) on a pseudo-terminal (util-linux `script`), with
/// `extra` in its environment; everything it wrote, or `None` without `script`.
fn on_a_terminal(extra: &str) -> Option<String> {
    let binary = gpumem().get_program().to_string_lossy().into_owned();
    let line = format!("env -u NO_COLOR GPUMEM_LOG=debug {extra} '{binary}' devices --backend sim");
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn no_color_turns_colour_off_on_a_terminal() {
    let Some(coloured) = on_a_terminal("") else {
        eprintln!("skipping: util-linux `script` is not installed");
        return;
    };
    assert!(
        coloured.contains("\u{1b}["),
        "a terminal gets colour: {coloured:?}"
    );
    let plain = on_a_terminal("NO_COLOR=1").expect("script ran before");
    assert!(
        !plain.contains("\u{1b}["),
        "NO_COLOR still coloured: {plain:?}"
    );
    assert!(plain.contains("DEBUG"), "{plain:?}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    for (flag, variable) in [(Some("json"), None), (None, Some("json"))] {
        let mut command = gpumem();
        command.args(["devices", "--backend", "sim"]);
        command.env("GPUMEM_LOG", "debug");
        if let Some(format) = flag {
            command.args(["--log-format", format]);
        }
        if let Some(format) = variable {
            command.env("GPUMEM_LOG_FORMAT", format);
        }
        let out = command.output().expect("gpumem runs");
        assert!(out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(!lines.is_empty(), "no log line at debug level");
        for line in lines {
            let event: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            assert!(event["level"].is_string(), "{line}");
            assert!(event["fields"]["message"].is_string(), "{line}");
        }
    }
}
