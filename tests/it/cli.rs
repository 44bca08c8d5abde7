//! The binary as a user runs it: exit codes, one-line errors, no panics.

use std::process::{Command, Output};

fn gpumem(args: &[&str]) -> Output {
    crate::support::gpumem(args)
        .output()
        .expect("the gpumem binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn devices_lists_the_simulated_device() {
    let out = gpumem(&["devices", "--backend", "sim"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Simulated H100 (simulated)"), "{text}");
    assert!(text.contains("80.00 GiB"), "{text}");
}

#[test]
fn devices_json_is_an_array_of_devices() {
    let out = gpumem(&[
        "devices",
        "--backend",
        "sim",
        "--sim-devices",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = json.as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1]["index"], 1);
    assert_eq!(devices[0]["simulated"], true);
    assert!(devices[0]["uuid"].as_str().unwrap().starts_with("GPU-"));
    assert_eq!(devices[0]["free_bytes"], devices[0]["total_memory_bytes"]);
}

#[test]
fn a_missing_device_exits_2_naming_those_that_exist() {
    let out = gpumem(&["devices", "--backend", "sim", "--devices", "7"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("device 7 does not exist (device 0 exists)"),
        "{err}"
    );
}

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

fn write_trace(dir: &std::path::Path, name: &str, body: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// `gpumem replay --backend sim --json FLAG OUTPUT TRACE`, which must succeed: its report.
fn replay_json_on_sim(
    flag: &str,
    output: &std::path::Path,
    trace: &std::path::Path,
) -> serde_json::Value {
    let out = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--json",
        flag,
        output.to_str().unwrap(),
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn replay_reports_the_promised_json_fields() {
    let dir = tempdir();
    let trace = write_trace(
        &dir,
        "tiny.trace",
        "# {\"name\": \"tiny\"}\na 1 1000 0\na 2 3000000 0\nf 1\na 3 500 0\nf 2\nf 3\n",
    );
    let plot = dir.join("tiny.svg");
    let report = replay_json_on_sim("--plot", &plot, &trace);
    for field in [
        "trace",
        "events",
        "peak_requested_bytes",
        "peak_reserved_bytes",
        "reserved_over_peak",
        "driver_allocs",
        "driver_frees",
        "pool_hit_ratio",
        "ns_per_op",
    ] {
        assert!(report.get(field).is_some(), "missing {field}: {report}");
    }
    for field in [
        "misses",
        "miss_p50_ns",
        "miss_p99_ns",
        "pages_created",
        "pages_reused",
        "pages_released",
        "idle_pages_kept",
        "idle_per_mille",
    ] {
        assert!(report.get(field).is_some(), "missing {field}: {report}");
    }
    assert_eq!(report["trace"], "tiny");
    assert_eq!(report["events"], 6);
    assert_eq!(report["peak_requested_bytes"], 3_001_000);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{svg:.80}"
    );
}

#[test]
fn the_simulated_driver_can_cost_what_an_h100_took() {
    let dir = tempdir();
    let trace = write_trace(
        &dir,
        "grow.trace",
        "# {\"name\": \"grow\"}\na 1 5000000 0\na 2 9000000 0\nf 1\nf 2\n",
    );
    let replay = |costs: &str| {
        let out = gpumem(&[
            "replay",
            "--backend",
            "sim",
            "--sim-driver-costs",
            costs,
            "--json",
            trace.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    // Each miss creates, maps and grants access to a chunk: 42.6 µs at least, spent on the
    // allocating thread (a lower bound, which spinning guarantees; no upper bound is asserted).
    let h100 = replay("h100");
    assert!(h100["miss_p50_ns"].as_u64() >= Some(40_000), "{h100}");
    let free = replay("free");
    assert_eq!(free["misses"], h100["misses"], "the same work, only slower");
    let out = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--sim-driver-costs",
        "a100",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--sim-driver-costs"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn replay_sweeps_the_cache_settings_and_refuses_the_driver_pool_on_sim() {
    let dir = tempdir();
    let trace = steps_trace(&dir);
    let out = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--sweep",
        "--json",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(rows.len(), 30, "3 chunk sizes x 5 x 2 cache settings");
    assert!(rows
        .iter()
        .all(|r| r["trace"] == "steps" && r["misses"].as_u64() > Some(0)));
    let settings: std::collections::HashSet<_> = rows
        .iter()
        .map(|r| {
            (
                r["idle_pages_kept"].as_u64(),
                r["idle_per_mille"].as_u64(),
                r["max_chunk_bytes"].as_u64(),
            )
        })
        .collect();
    assert_eq!(settings.len(), 30);
    // Repeated, the rounds alternate the settings and the table says it shows medians; the
    // simulated device has no driver pool, and the table says so instead of naming a winner.
    let table = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--sweep",
        "--repeat",
        "2",
        trace.to_str().unwrap(),
    ]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.contains("RES/PEAK") && text.contains("(default)"),
        "{text}"
    );
    assert!(text.contains("medians of 2 alternated replays"), "{text}");
    assert!(
        text.contains("has no driver pool to compare with"),
        "{text}"
    );

    let out = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--strategy",
        "driver-pool",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("needs the CUDA backend"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_malformed_trace_exits_2_with_the_line_and_writes_no_plot() {
    let dir = tempdir();
    let trace = write_trace(&dir, "bad.trace", "a 1 100 0\nx 2\n");
    let plot = dir.join("bad.svg");
    let out = gpumem(&[
        "replay",
        "--plot",
        plot.to_str().unwrap(),
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("line 2") && err.contains("unknown op"),
        "{err}"
    );
    assert!(!plot.exists());
    assert!(out.stdout.is_empty());
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "gpumem-cli-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn replay_logs_each_miss_as_a_json_line() {
    let dir = tempdir();
    // Two misses: the first allocation maps a page, the 5 MB one three more; the rest reuse them.
    let trace = write_trace(
        &dir,
        "two.trace",
        "a 1 1000 0\na 2 5000000 0\nf 1\na 3 500 0\nf 2\nf 3\n",
    );
    let log = dir.join("misses.jsonl");
    let report = replay_json_on_sim("--misses", &log, &trace);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len() as u64, report["misses"].as_u64().unwrap());
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["trace"], "two");
    assert_eq!(lines[1]["allocation"], 2);
    assert_eq!(lines[1]["size"], 5_000_000);
    let pages: u64 = lines
        .iter()
        .map(|l| l["pages_created"].as_u64().unwrap() + l["pages_reused"].as_u64().unwrap())
        .sum();
    assert_eq!(pages, report["pages_created"].as_u64().unwrap());
    for field in ["ptr", "chunks_unmapped", "in_use_bytes", "reserved_bytes"] {
        assert!(lines[1].get(field).is_some(), "missing {field}");
    }
}

#[test]
fn replay_misses_refuses_a_sweep_or_a_shared_file_and_writes_nothing() {
    let dir = tempdir();
    let trace = write_trace(&dir, "t.trace", "a 1 1000 0\nf 1\n");
    let log = dir.join("misses.jsonl");
    let out = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--sweep",
        "--misses",
        log.to_str().unwrap(),
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--misses"), "{}", stderr(&out));
    assert!(!log.exists());
    // Nor one file named twice: the plot would replace the log or the log the plot.
    let out = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--misses",
        log.to_str().unwrap(),
        "--plot",
        log.to_str().unwrap(),
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("both name"), "{}", stderr(&out));
    assert!(!log.exists());
}

#[test]
fn replay_repeat_reports_the_median_replay_and_every_figure() {
    let dir = tempdir();
    let trace = write_trace(
        &dir,
        "t.trace",
        "a 1 1000 0\na 2 3000000 0\nf 1\nf 2\na 3 5000000 0\nf 3\n",
    );
    let trace = trace.to_str().unwrap();
    let out = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--json",
        "--repeat",
        "3",
        trace,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut runs: Vec<f64> = report["ns_per_op_runs"]
        .as_array()
        .expect("ns_per_op_runs")
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(runs.len(), 3);
    runs.sort_by(f64::total_cmp);
    assert_eq!(report["ns_per_op"].as_f64(), Some(runs[1]));
    // One replay reports no runs, and how much of its time went to driver calls (every one
    // of its three allocations maps pages); a repeat beside a miss log is refused.
    let out = gpumem(&["replay", "--backend", "sim", "--json", trace]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report.get("ns_per_op_runs").is_none(), "{report}");
    let in_driver = report["driver_ns_per_op"]
        .as_f64()
        .expect("driver_ns_per_op");
    assert!(in_driver > 0.0, "{report}");
    assert!(
        in_driver <= report["ns_per_op"].as_f64().unwrap(),
        "{report}"
    );
    for extra in [&["--misses", "m.jsonl"][..], &["--repeat", "0"][..]] {
        let mut args = vec!["replay", "--backend", "sim", "--repeat", "2", trace];
        args.extend_from_slice(extra);
        let out = gpumem(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("--repeat"), "{}", stderr(&out));
    }
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

#[test]
fn bench_on_sim_skips_the_drivers_pool_by_name() {
    let out = gpumem(&[
        "bench",
        "--backend",
        "sim",
        "--sizes",
        "64KiB",
        "--threads",
        "1",
        "--iterations",
        "50",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    for name in ["driver-async", "driver-async-miss"] {
        assert!(
            err.contains(&format!("skipping {name} (needs the CUDA backend)")),
            "{err}"
        );
    }
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("pool-miss-cold"), "{table}");
}

/// On a GPU: the driver pool trimmed after every free grows again on every allocation, which
/// costs driver time a cached allocation does not; gpumem's cold miss is beside it.
#[test]
fn bench_times_the_driver_pools_own_miss_on_a_gpu() {
    if crate::support::cuda_backend().is_none() {
        return;
    }
    let out = gpumem(&[
        "bench",
        "--backend",
        "cuda",
        "--allocators",
        "driver-async,driver-async-miss,pool-miss-cold",
        "--sizes",
        "1MiB",
        "--threads",
        "1",
        "--seconds",
        "0.3",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cases: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let median = |name: &str| {
        let case = cases.iter().find(|c| c["allocator"] == name);
        case.and_then(|c| c["median_ns"].as_f64())
            .unwrap_or_else(|| panic!("no {name} in {cases:?}"))
    };
    assert!(
        median("driver-async-miss") > 2.0 * median("driver-async"),
        "{cases:?}"
    );
    assert!(median("pool-miss-cold") > 0.0, "{cases:?}");
}

/// On a GPU: a sweep replays the driver's own pool beside every setting and ends each trace
/// with its figures and a verdict (a setting that beats it on both axes, or the closest).
#[test]
fn a_sweep_on_a_gpu_compares_every_setting_with_the_driver_pool() {
    if crate::support::cuda_backend().is_none() {
        return;
    }
    let dir = tempdir();
    let trace = steps_trace(&dir);
    let out = gpumem(&[
        "replay",
        "--backend",
        "cuda",
        "--sweep",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("driver pool (cuMemAllocAsync): "), "{text}");
    assert!(
        text.contains("beats the driver pool on both: GPUMEM_MAX_CHUNK_BYTES=")
            || text.contains("no setting beats the driver pool on both")
            || text.contains("no setting holds as little memory"),
        "{text}"
    );
    let json = gpumem(&[
        "replay",
        "--backend",
        "cuda",
        "--sweep",
        "--json",
        trace.to_str().unwrap(),
    ]);
    let strategies: Vec<String> = String::from_utf8_lossy(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["strategy"].to_string())
        .collect();
    assert_eq!(strategies.len(), 31, "30 settings and the driver pool");
    assert!(
        strategies.iter().any(|s| s.contains("driver")),
        "{strategies:?}"
    );
}

/// A three-allocation trace named "steps" whose every allocation misses on a fresh pool: what
/// the sweep tests replay under each setting.
fn steps_trace(dir: &std::path::Path) -> std::path::PathBuf {
    write_trace(
        dir,
        "steps.trace",
        "# {\"name\": \"steps\"}\na 1 5000000 0\nf 1\na 2 9000000 0\na 3 700 0\nf 2\nf 3\n",
    )
}
