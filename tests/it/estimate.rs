//! `gpumem estimate` as a user runs it: the breakdown, fits and does-not-fit on simulated
//! devices, JSON, `GPUMEM_*` variables, and one-line errors with exit code 2 for bad input.

use crate::support::{stderr, stdout};
use std::process::Output;

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
    let mut command = crate::support::gpumem(args);
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the gpumem binary runs")
}

fn gpumem(args: &[&str]) -> Output {
    gpumem_with_env(args, &[])
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

#[test]
fn llama_70b_on_two_simulated_devices_gives_a_split() {
    let args = [
        "estimate",
        "--model",
        "llama-70b",
        "--backend",
        "sim",
        "--sim-devices",
        "2",
    ];
    let text = success_text(&args);
    for needle in [
        "split across 2 devices (the model fits on none alone)",
        "tensor-parallel fits",
        "pipeline-parallel fits",
        "0-39",
        "40-79",
        "does not fit on one device; split across 2 devices",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let v = json(&gpumem(&[&args[..], &["--json"]].concat()));
    assert!(v["recommended_device"].is_null());
    let split = &v["split"];
    assert_eq!(split["devices"], serde_json::json!([0, 1]));
    let tp = &split["tensor_parallel"];
    assert_eq!(tp["fits"], true);
    let whole_weights = v["estimate"]["weights_bytes"].as_u64().unwrap();
    for share in tp["shares"].as_array().unwrap() {
        let weights = share["weights_bytes"].as_u64().unwrap();
        assert!(weights > whole_weights / 2 && weights < whole_weights / 2 + (8 << 20));
        assert!(share["total_bytes"].as_u64() <= share["usable_bytes"].as_u64());
    }
    let pp = split["pipeline_parallel"]["shares"].as_array().unwrap();
    assert_eq!(pp[0]["layers"], serde_json::json!([0, 40]));
    assert_eq!(pp[1]["device"], 1);
    // Three 48 GiB devices: 64 heads do not divide by 3, so only the pipeline split is possible.
    let three = ["--sim-devices", "3", "--sim-memory", "48GiB", "--json"];
    let v = json(&gpumem(&[&args[..5], &three].concat()));
    assert_eq!(v["split"]["tensor_parallel"]["fits"], false);
    assert!(v["split"]["tensor_parallel"]["error"]
        .as_str()
        .unwrap()
        .contains("heads (64) divisible by 3"));
    assert_eq!(v["split"]["pipeline_parallel"]["fits"], true);
    // One device: nothing to split, the old answer.
    let v = json(&gpumem(&[&LLAMA_70B_ON_24_GIB[..], &["--json"]].concat()));
    assert!(v["split"].is_null());
}

#[test]
fn the_workspace_is_printed_with_bytes_batch_and_why() {
    let text = success_text(&["estimate", "--model", "llama-7b", "--backend", "sim"]);
    assert!(
        text.contains(
            "workspace    GPU 0: 36.25 MiB (38010880 bytes) for batch 512 of the 4096x11008 \
             16-bit layer: the cap for devices of 60 GiB and more"
        ),
        "{text}"
    );
    // Llama-2-7B's workspace with int4 weights on a simulated device of `memory`.
    let int4_on = |memory: &str, extra: &[&str]| {
        let base = [
            "estimate",
            "--model",
            "llama-7b",
            "--dtype",
            "int4",
            "--backend",
            "sim",
        ];
        json(&gpumem(
            &[&base[..], &["--sim-memory", memory, "--json"], extra].concat(),
        ))
    };
    // 16 GiB with a batch of 4: the 10-20 GiB class caps it at 128.
    let v = int4_on("16GiB", &["--batch", "4"]);
    let ws = &v["devices"][0]["workspace"];
    assert_eq!(ws["batch"], 128);
    assert_eq!(ws["cap"], 128);
    assert_eq!(ws["workspace_bytes"], 4096 * 11008 * 2 + 128 * 74_240);
    assert!(ws["reason"].as_str().unwrap().contains("10 to 20 GiB"));
    // A 7.06 GiB device leaves 147 MiB after weights and KV cache: after the 86 MiB dequant
    // buffer, 60 % of it holds 16 rows, so memory, not the class (64), limits the batch.
    let v = int4_on("7577693998", &[]);
    let ws = &v["devices"][0]["workspace"];
    assert_eq!(ws["batch"], 16, "{ws}");
    assert_eq!(ws["cap"], 64, "{ws}");
    assert_eq!(v["devices"][0]["linear_batch"], ws["batch"]);
    assert!(
        ws["reason"]
            .as_str()
            .unwrap()
            .contains("would not fit in 60 %"),
        "{ws}"
    );
    assert!(ws["workspace_bytes"].as_u64() <= ws["budget_bytes"].as_u64());
}

#[test]
fn bitnet_ternary_types_are_accepted_at_their_real_bits() {
    let weights = |dtype: &str| {
        let v = json(&gpumem(&[
            "estimate",
            "--model",
            "llama3-8b",
            "--dtype",
            dtype,
            "--backend",
            "sim",
            "--json",
        ]));
        assert_eq!(v["workload"]["weights"], dtype.replace('_', ""));
        v["estimate"]["weights_bytes"].as_u64().unwrap()
    };
    let (i2s, tl1, tl2, int4) = (
        weights("i2s"),
        weights("tl1"),
        weights("tl2"),
        weights("int4"),
    );
    assert_eq!(i2s, tl1, "both 2 bits per weight");
    assert_eq!(weights("i2_s"), i2s, "bitnet.cpp's own spelling");
    assert!(
        tl2 < i2s && i2s < int4,
        "tl2 {tl2} < i2s {i2s} < int4 {int4}"
    );
    // Llama 3 8B: 6.98 G linear weights; 2 bits versus 5/3 bits is 1/3 bit per weight.
    let linear: u64 = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336);
    assert!((i2s - tl2).abs_diff(linear / 24) <= 1);
    assert_usage_error(
        &[
            "estimate",
            "--model",
            "llama-7b",
            "--kv-dtype",
            "tl2",
            "--backend",
            "sim",
        ],
        "kv-dtype tl2 is a ternary weight layout",
    );
}

/// Every `gpumem estimate` example in docs/workspace.md: "From `gpumem estimate ...`:" and the
/// text block after it, whose every line the command must print today.
#[test]
fn the_examples_in_the_workspace_doc_are_what_the_build_prints() {
    let doc = include_str!("../../docs/workspace.md");
    let mut checked = 0;
    for (at, _) in doc.match_indices("`gpumem estimate ") {
        let command = &doc[at + 1..];
        let command = &command[..command.find('`').expect("closing backtick")];
        let after = &doc[at..];
        let Some(block) = after.strip_prefix(&format!("`{command}`:\n\n```text\n")) else {
            continue;
        };
        let block = &block[..block.find("```").expect("end of block")];
        let args: Vec<&str> = command.split_whitespace().skip(1).collect();
        let printed = success_text(&args);
        for line in block.lines() {
            assert!(
                printed.contains(line),
                "{command} no longer prints {line:?}:\n{printed}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 2, "both examples were found");
}
