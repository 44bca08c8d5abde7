//! Cases 6 and 7: one precedence rule for every command (defaults < file < environment <
//! flags given), the file's keys checked like the flags, misspelled variables named, and the
//! one-line contract at the default log level (no INFO line before the error, no colour codes).

use crate::reliability::{gpumem, gzip, Scratch};
use std::process::Output;

/// A one-second demo on the simulated device and a free port; cases add their flags.
const DEMO: [&str; 7] = [
    "demo",
    "--backend",
    "sim",
    "--duration",
    "1s",
    "--listen",
    "127.0.0.1:0",
];

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = gpumem();
    command.args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("gpumem runs")
}

/// Exit 2 and exactly one line on stderr, `gpumem: ...`, naming `needle`, no escape codes.
fn refused(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "more than one line: {stderr}");
    assert!(stderr.starts_with("gpumem: "), "{stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in: {stderr}");
    assert!(!stderr.contains('\u{1b}'), "colour codes: {stderr:?}");
}

fn config(dir: &Scratch, text: &str) -> String {
    dir.file("gpumem.toml", text.as_bytes())
        .display()
        .to_string()
}

#[test]
fn the_file_is_checked_against_the_devices_like_the_flags() {
    let dir = Scratch::new("precedence-devices");
    let bad_devices = config(&dir, "devices = [99]\n");
    for command in ["devices", "bench"] {
        refused(
            &run(
                &[command, "--backend", "sim", "--config", &bad_devices],
                &[],
            ),
            "device 99 does not exist",
        );
    }
    let reserve = dir.file("reserve.toml", b"[pressure]\nreserve = \"100GiB\"\n");
    refused(
        &run(
            &[
                "devices",
                "--backend",
                "sim",
                "--config",
                reserve.to_str().unwrap(),
            ],
            &[],
        ),
        "pressure.reserve",
    );
    let prealloc = dir.file("prealloc.toml", b"preallocate = \"200GiB\"\n");
    let trace = dir.file("t.trace", b"a 1 4096 0\nf 1\n");
    let prealloc = prealloc.to_str().unwrap();
    refused(
        &run(&[&DEMO[..], &["--config", prealloc]].concat(), &[]),
        "preallocate",
    );
    refused(
        &run(
            &[
                "replay",
                "--backend",
                "sim",
                "--config",
                prealloc,
                trace.to_str().unwrap(),
            ],
            &[],
        ),
        "preallocate",
    );
    // --devices given explicitly wins over the file.
    let out = run(
        &[
            "devices",
            "--backend",
            "sim",
            "--config",
            &bad_devices,
            "--devices",
            "0",
            "--json",
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_zero_leak_age_is_refused_from_the_file_and_the_flag_alike() {
    let dir = Scratch::new("precedence-leak");
    let zero = config(&dir, "leak_age = \"0s\"\n");
    refused(
        &run(&[&DEMO[..], &["--config", &zero]].concat(), &[]),
        "leak_age",
    );
    refused(
        &run(&[&DEMO[..], &["--leak-age", "0s"]].concat(), &[]),
        "leak-age",
    );
}

#[test]
fn flag_defaults_never_override_the_file() {
    let dir = Scratch::new("precedence-replay");
    let trace = dir.file("t.trace.gz", &gzip(b"a 1 4096 0\na 2 8192 0\nf 1\nf 2\n"));
    let trace = trace.to_str().unwrap();
    let direct = config(&dir, "strategy = \"direct\"\n");
    let strategy = |out: &Output| -> String {
        let line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        let json: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
        json["strategy"].as_str().unwrap_or("").to_string()
    };
    let base = ["replay", "--backend", "sim", "--json", trace];
    let from_file = run(&[&base[..], &["--config", &direct]].concat(), &[]);
    assert_eq!(strategy(&from_file), "direct", "the file's strategy");
    let env = run(
        &[&base[..], &["--config", &direct]].concat(),
        &[("GPUMEM_STRATEGY", "pooled")],
    );
    assert_eq!(strategy(&env), "pooled", "the environment over the file");
    let flag = run(
        &[&base[..], &["--config", &direct, "--strategy", "pooled"]].concat(),
        &[("GPUMEM_STRATEGY", "direct")],
    );
    assert_eq!(strategy(&flag), "pooled", "the flag over everything");
}

#[test]
fn every_command_reads_its_config_file() {
    let dir = Scratch::new("precedence-every");
    let broken = config(&dir, "turbo = true\n");
    for args in [
        &["devices"][..],
        &["estimate", "--model", "llama-7b"],
        &[
            "bench",
            "--allocators",
            "pool-hit",
            "--sizes",
            "4096",
            "--threads",
            "1",
        ],
    ] {
        refused(
            &run(
                &[args, &["--backend", "sim", "--config", &broken]].concat(),
                &[],
            ),
            "unknown key",
        );
    }
}

#[test]
fn misspelled_variables_are_named_with_the_nearest_known_one() {
    let out = run(
        &["devices", "--backend", "sim"],
        &[("GPUMEM_LEAKAGE", "5m")],
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("GPUMEM_LEAKAGE") && stderr.contains("did you mean GPUMEM_LEAK_AGE?"),
        "{stderr}"
    );
}

#[test]
fn bad_input_is_one_line_at_the_default_log_level() {
    refused(
        &run(&["devices", "--backend", "sim", "--devices", "7"], &[]),
        "device 7",
    );
    refused(
        &run(
            &[
                "estimate",
                "--backend",
                "sim",
                "--model",
                "llama-7b",
                "--devices",
                "3",
            ],
            &[],
        ),
        "device 3",
    );
}

#[test]
fn estimates_that_overflow_are_refused() {
    let max = i64::MAX.to_string();
    let out = run(
        &[
            "estimate",
            "--backend",
            "sim",
            "--hidden",
            "1048576",
            "--intermediate",
            "4194304",
            "--layers",
            "65536",
            "--vocab",
            "4194304",
            "--heads",
            "1024",
            "--kv-heads",
            "1024",
            "--max-seq",
            &max,
            "--batch",
            &max,
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("TiB"));
    assert!(
        stderr.starts_with("gpumem: ") && stderr.lines().count() == 1,
        "{stderr}"
    );
}

#[test]
fn a_trace_with_a_byte_order_mark_is_read() {
    let dir = Scratch::new("bom");
    let trace = dir.file("bom.trace", b"\xEF\xBB\xBFa 1 4096 0\nf 1\n");
    let out = run(
        &[
            "replay",
            "--backend",
            "sim",
            "--json",
            trace.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
