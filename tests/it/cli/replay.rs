//! `gpumem replay` of one trace: its JSON report and plot, simulated driver costs, a malformed
//! trace, the miss log (`--misses`) and repeated replays (`--repeat`).

use super::{gpumem, replay_json_on_sim, stderr, tempdir, write_trace};

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
        "gpu_waits",
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

/// `GPUMEM_PLACE_ON_MAPPED_PAGES` reaches the pools: on a CNN serving trace whose layout
/// changes every batch, misses that only moved idle pages become hits, and the report says
/// which placement ran.
#[test]
fn placing_on_mapped_pages_turns_misses_into_hits_and_is_reported() {
    let trace =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/traces/cnn_serve.trace.gz");
    let replay = |placed: &str| {
        let out = crate::support::gpumem(&[
            "replay",
            "--backend",
            "sim",
            "--json",
            trace.to_str().unwrap(),
        ])
        .env("GPUMEM_PLACE_ON_MAPPED_PAGES", placed)
        .output()
        .expect("gpumem runs");
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let (fit, placed) = (replay("false"), replay("true"));
    assert_eq!(fit["place_on_mapped_pages"], false);
    assert_eq!(placed["place_on_mapped_pages"], true);
    let misses = |v: &serde_json::Value| v["misses"].as_u64().unwrap();
    assert!(
        misses(&placed) * 3 < misses(&fit) * 2,
        "{} -> {}",
        misses(&fit),
        misses(&placed)
    );
    assert_eq!(placed["ooms"], 0);
}

#[test]
fn a_gpu_kept_behind_shows_the_waits_and_lending_in_stream_order_cuts_them() {
    let trace =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/traces/vae_decode.trace.gz");
    let replay = |pace: &[&str], reuse: &str| {
        let mut args = vec![
            "replay",
            "--backend",
            "sim",
            "--json",
            trace.to_str().unwrap(),
        ];
        args.extend_from_slice(pace);
        let out = crate::support::gpumem(&args)
            .env("GPUMEM_STREAM_ORDERED_REUSE", reuse)
            .output()
            .expect("gpumem runs");
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let waits = |v: &serde_json::Value| v["gpu_waits"].as_u64().unwrap();
    // A GPU that keeps up passes a fence at once, so fewer pages need a wait at all.
    let keeps_up = replay(&[], "false");
    let (waiting, lending) = (
        replay(&["--sim-gpu-behind"], "false"),
        replay(&["--sim-gpu-behind"], "true"),
    );
    assert!(waits(&keeps_up) < waits(&waiting), "{keeps_up} {waiting}");
    assert!(
        waits(&lending) * 4 < waits(&waiting) * 3,
        "lending its own stream's busy pages waits less: {} -> {}",
        waits(&waiting),
        waits(&lending)
    );
    // A GPU a few fences behind replays the trace through, its misses still waiting for the
    // newest fences (the lag's own rule is `backend_contract`'s; what lending holds on it varies
    // from run to run, docs/allocator.md).
    let waiting_lagged = replay(&["--sim-gpu-lag", "4"], "false");
    assert!(waits(&waiting_lagged) > 0, "{waiting_lagged}");
    assert_eq!(waiting_lagged["ooms"], 0);
}
