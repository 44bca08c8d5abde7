//! `gpumem estimate` as a user runs it: the breakdown, fits and does-not-fit on simulated
//! devices, JSON, `GPUMEM_*` variables, and one-line errors with exit code 2 for bad input.

use std::process::{Command, Output};

/// An estimate that does not fit: Llama 2 70B on a 24 GiB simulated device.
const LLAMA_70B_ON_24_GIB: [&str; 7] = [
    "estimate",
    "--model",
    "llama-70b",
    "--backend",
    "sim",
    "--sim-memory",
    "24GiB",
];

fn gpumem_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpumem"));
    command.args(args).env("GPUMEM_LOG", "warn");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the gpumem binary runs")
}

fn gpumem(args: &[&str]) -> Output {
    gpumem_with_env(args, &[])
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "{}", stderr(output));
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON object")
}

/// The human-readable output of a run that must exit 0.
fn success_text(args: &[&str]) -> String {
    let out = gpumem(args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out)
}

/// The line of the device table for GPU 0.
fn gpu_0_row(text: &str) -> &str {
    text.lines()
        .find(|l| l.starts_with("0 "))
        .expect("a row for GPU 0")
}

/// Bad input: exit 2, nothing on stdout, one line on stderr containing `needle`.
fn assert_usage_error(args: &[&str], needle: &str) {
    let out = gpumem(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    assert!(out.stdout.is_empty(), "{args:?}: {}", stdout(&out));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err}");
}

#[test]
fn llama_7b_fits_on_the_80_gib_simulated_device() {
    let text = success_text(&["estimate", "--model", "llama-7b", "--backend", "sim"]);
    for needle in [
        "llama-7b (Llama 2 7B)",
        "parameters   6.74 B",
        "weights",
        "12.55 GiB",
        "(2147483648 bytes)",
        "activations",
        "total",
        "recommended: GPU 0 (Simulated H100)",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let row = gpu_0_row(&text);
    assert!(row.contains(" yes "), "{row}");
}

#[test]
fn llama_70b_does_not_fit_on_24_gib_and_says_so() {
    let text = success_text(&LLAMA_70B_ON_24_GIB);
    assert!(text.contains("does not fit"), "{text}");
    assert!(
        text.contains("GPU 0 (Simulated H100) has 24.00 GiB free"),
        "{text}"
    );
    assert!(!text.contains("recommended"), "{text}");
    let row = gpu_0_row(&text);
    assert!(row.contains(" no "), "{row}");
}

#[test]
fn unknown_presets_exit_2_listing_the_known_ones() {
    assert_usage_error(
        &["estimate", "--model", "nope", "--backend", "sim"],
        "unknown model preset 'nope' (known: llama-7b, llama-13b, llama-70b, llama3-8b, \
         llama3-70b, mistral-7b)",
    );
}

#[test]
fn json_carries_the_breakdown_and_the_recommendation() {
    let out = gpumem(&[
        "estimate",
        "--model",
        "llama-7b",
        "--backend",
        "sim",
        "--json",
    ]);
    let v = json(&out);
    assert_eq!(v["model"], "llama-7b");
    assert_eq!(v["estimate"]["parameters"], 6_738_415_616_u64);
    assert_eq!(v["estimate"]["weights_bytes"], 13_476_831_232_u64);
    assert_eq!(v["estimate"]["kv_cache_bytes"], 2_147_483_648_u64);
    assert_eq!(v["workload"]["max_seq"], 4096);
    assert_eq!(v["workload"]["batch"], 1);
    assert_eq!(v["devices"][0]["fits"], true);
    assert_eq!(v["devices"][0]["max_batch"], 28);
    assert_eq!(v["devices"][0]["linear_batch"], 512);
    assert_eq!(v["recommended_device"]["index"], 0);

    let out = gpumem(&[&LLAMA_70B_ON_24_GIB[..], &["--json"]].concat());
    let v = json(&out);
    assert!(v["recommended_device"].is_null());
    assert_eq!(v["devices"][0]["fits"], false);
    assert_eq!(v["devices"][0]["max_batch"], 0);
}

#[test]
fn every_flag_reads_its_gpumem_variable() {
    let env = [
        ("GPUMEM_HIDDEN", "4096"),
        ("GPUMEM_INTERMEDIATE", "14336"),
        ("GPUMEM_LAYERS", "32"),
        ("GPUMEM_VOCAB", "32000"),
        ("GPUMEM_HEADS", "32"),
        ("GPUMEM_KV_HEADS", "8"),
        ("GPUMEM_MAX_SEQ", "8192"),
        ("GPUMEM_BATCH", "2"),
        ("GPUMEM_DTYPE", "int4"),
        ("GPUMEM_KV_DTYPE", "int8"),
        ("GPUMEM_JSON", "true"),
        ("GPUMEM_BACKEND", "sim"),
    ];
    let v = json(&gpumem_with_env(&["estimate"], &env));
    assert!(v["model"].is_null(), "a custom shape");
    assert_eq!(
        v["estimate"]["parameters"], 7_241_732_096_u64,
        "Mistral 7B's shape"
    );
    assert_eq!(v["workload"]["weights"], "int4");
    assert_eq!(v["workload"]["kv_cache"], "int8");
    // 2 * 32 layers * 8 heads * 128 * 8192 tokens * 2 sequences * 1 byte = 1 GiB.
    assert_eq!(v["estimate"]["kv_cache_bytes"], 1_u64 << 30);
    let v = json(&gpumem_with_env(
        &["estimate", "--backend", "sim", "--json"],
        &[("GPUMEM_MODEL", "llama3-8b")],
    ));
    assert_eq!(v["model"], "llama3-8b");
    assert_eq!(v["estimate"]["parameters"], 8_030_261_248_u64);
}

#[test]
fn the_device_with_the_most_room_is_recommended_among_those_selected() {
    let args = [
        "estimate",
        "--model",
        "mistral-7b",
        "--backend",
        "sim",
        "--sim-devices",
        "3",
        "--json",
    ];
    let v = json(&gpumem(&args));
    assert_eq!(v["devices"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        v["recommended_device"]["index"], 0,
        "ties go to the lowest index"
    );
    let mut only_two = args.to_vec();
    only_two.extend(["--devices", "2"]);
    let v = json(&gpumem(&only_two));
    assert_eq!(v["devices"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["recommended_device"]["index"], 2);
}

#[test]
fn preset_values_can_be_overridden_by_flags() {
    let v = json(&gpumem(&[
        "estimate",
        "--model",
        "llama-7b",
        "--kv-heads",
        "8",
        "--backend",
        "sim",
        "--json",
    ]));
    assert_eq!(v["shape"]["kv_heads"], 8);
    assert_eq!(v["estimate"]["kv_cache_bytes"], 512_u64 << 20);
}

#[test]
fn invalid_shapes_exit_2_with_one_line() {
    let shape_error = |flags: &[&str], needle: &str| {
        let mut args = vec!["estimate"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--backend", "sim"]);
        assert_usage_error(&args, needle);
    };
    // One bad value on top of a preset.
    for (flag, value, needle) in [
        ("--layers", "0", "--layers: must be at least 1 (got 0)"),
        ("--layers", "-3", "--layers: must be at least 1 (got -3)"),
        ("--heads", "30", "heads (30) must divide hidden (4096)"),
        ("--kv-heads", "5", "kv-heads (5) must divide heads (32)"),
        ("--batch", "0", "--batch: must be at least 1"),
        ("--max-seq", "-1", "--max-seq: must be at least 1"),
    ] {
        shape_error(&["--model", "llama-7b", flag, value], needle);
    }
    // A custom shape with flags missing.
    shape_error(
        &["--hidden", "4096", "--layers", "32"],
        "missing --intermediate, --vocab, --heads, --kv-heads",
    );
}
