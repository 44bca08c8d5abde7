//! Flags and `GPUMEM_*` variables: bad values exit 2, variables set flags, the first log line
//! names the backend, and the Python package's variables draw no warning.

use super::{gpumem, stderr};
use std::process::Command;

#[test]
fn bad_flag_values_exit_2() {
    for args in [
        &["devices", "--backend", "tpu"][..],
        &["devices", "--sim-memory", "lots"],
        &["devices", "--sim-memory", "-4G"],
        &["devices", "--sim-devices", "0"],
        &["devices", "--devices", "zero"],
        &["replay"],
        &["replay", "--strategy", "magic", "x.trace"],
        &["devices", "--sim-gpu-lag", "0"],
        &["devices", "--sim-gpu-lag", "deep"],
    ] {
        let out = gpumem(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{args:?}");
    }
}

#[test]
fn env_variables_set_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["devices", "--json"])
        .env("GPUMEM_BACKEND", "sim")
        .env("GPUMEM_SIM_MEMORY", "24GiB")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["total_memory_bytes"], 24u64 << 30);
}

#[test]
fn first_log_line_says_which_backend_and_why() {
    // `auto` is gpumem's choice, so it is announced at the default level; a backend the user
    // named is not news (it is logged at debug).
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["devices", "--backend", "auto"])
        .env("GPUMEM_LOG", "info")
        .output()
        .unwrap();
    let err = stderr(&out);
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.contains("backend cuda: auto picked")
            || first.contains("backend sim: auto fell back"),
        "{err}"
    );
}

/// Every `GPUMEM_*` variable the Python package reads, as its sources name them.
fn python_package_variables() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/gpumem");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("python/gpumem") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "py") {
            let text = std::fs::read_to_string(&path).expect("a Python source");
            for (at, _) in text.match_indices("GPUMEM_") {
                let name: String = text[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect();
                if name.len() > "GPUMEM_".len() && !name.ends_with('_') {
                    names.push(name);
                }
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_python_packages_variables_draw_no_unknown_variable_warning() {
    // Set for PyTorch, they stay in the environment of every gpumem command run beside it.
    let names = python_package_variables();
    assert!(
        names.iter().any(|n| n == "GPUMEM_LIBRARY"),
        "found in the package: {names:?}"
    );
    let mut command = crate::support::gpumem(&["devices", "--backend", "sim"]);
    for name in &names {
        command.env(name, "0");
    }
    let output = command.output().expect("the gpumem binary runs");
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        !stderr(&output).contains("not a gpumem variable"),
        "{}",
        stderr(&output)
    );
}
