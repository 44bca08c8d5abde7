//! A sidecar without NVML is blind to the device, and says so — but still reports pressure,
//! from each publisher's own reading of its device (`device_memory` in the publish format):
//! `gpumem_pressure_*` exist, a rise to critical leaves a flight record, the page's header is
//! not the green "sampling ok", and `/healthz` says it is blind while answering 200 (a
//! liveness probe must not restart what a restart cannot fix). Told its pod by the downward
//! API, the sidecar names it on the page, in the API, and in the records of the processes that
//! publish into it (they run in its pod).

use super::{now, serve, TempDir};
use crate::web::{eventually, get, value_of};
use std::time::Duration;

const UUID: &str = "GPU-00000000-1111-2222-3333-444444444444";

/// A publisher's file whose device is `free` bytes short of full, by its own reading.
fn publishing(dir: &TempDir, free: u64, level: Option<u8>, ooms: u64) {
    let memory = match level {
        Some(level) => serde_json::json!({"total_bytes": 80u64 << 30, "free_bytes": free,
                                          "pressure_level": level, "pressure_used_ratio": 0.991}),
        None => serde_json::json!({"total_bytes": 80u64 << 30, "free_bytes": free}),
    };
    let file = serde_json::json!({
        "format": "gpumem.publish", "version": 1, "pid": std::process::id(),
        "process": "engine", "timestamp_seconds": now(), "interval_seconds": 30.0,
        "devices": [{"gpu": 0, "uuid": UUID, "reserved_bytes": 70u64 << 30,
                     "ooms_total": ooms, "device_memory": memory}]});
    gpumem::safe_fs::write_atomically(
        &dir.path().join("engine.json"),
        file.to_string().as_bytes(),
        &Default::default(),
    )
    .expect("publish");
}

#[test]
fn without_nvml_pressure_comes_from_the_publishers_and_health_says_blind() {
    let dir = TempDir::new("blind");
    publishing(&dir, 40 << 30, None, 0);
    let sidecar = serve(
        &dir,
        &[
            "--nvml-library",
            "libm.so.6",
            "--pod-name",
            "vllm-0",
            "--pod-namespace",
            "serving",
        ],
    );
    let gpu = format!("gpu=\"0\",uuid=\"{UUID}\"");
    // Half full by the publisher's reading, but its pools hold 70 GiB: used is raised to that.
    assert!(
        eventually(Duration::from_secs(10), || value_of(
            &get(sidecar.addr, "/metrics").body,
            "gpumem_pressure_level",
            &gpu
        )
        .is_some()),
        "no pressure without NVML:\n{}",
        get(sidecar.addr, "/metrics").body
    );
    let metrics = get(sidecar.addr, "/metrics").body;
    assert_eq!(
        value_of(&metrics, "gpumem_up", "source=\"nvml\""),
        Some(0.0)
    );
    assert!(metrics.contains("backend=\"published\""), "{metrics}");
    assert_eq!(
        value_of(&metrics, "gpumem_device_memory_used_bytes", &gpu),
        Some((70u64 << 30) as f64)
    );

    // The publisher says critical, by its own thresholds: the sidecar reports its level.
    publishing(&dir, 1 << 30, Some(3), 2);
    assert!(
        eventually(Duration::from_secs(10), || value_of(
            &get(sidecar.addr, "/metrics").body,
            "gpumem_pressure_level",
            &gpu
        ) == Some(3.0)),
        "the publisher's critical level never showed"
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            get(sidecar.addr, "/api/v1/oom")
                .body
                .contains("\"trigger\":\"critical_pressure\"")
        }),
        "no flight record of the rise to critical"
    );
    let health = get(sidecar.addr, "/healthz");
    assert_eq!(health.status, 200);
    assert!(
        health
            .body
            .starts_with("ok, degraded:\nblind to the device: no nvml reading"),
        "{}",
        health.body
    );
    let page = get(sidecar.addr, "/").body;
    assert!(
        page.contains("class=\"health warn\"") && page.contains("blind to the device"),
        "the header should not be green:\n{page}"
    );
    assert!(!page.contains(">sampling ok<"), "{page}");
    assert!(
        page.contains("serving/vllm-0"),
        "the page names the sidecar's pod"
    );

    // The engine's OOMs: its record names the pod it runs in, the sidecar's.
    assert!(
        eventually(Duration::from_secs(10), || {
            get(sidecar.addr, "/api/v1/oom")
                .body
                .contains("\"trigger\":\"oom\"")
        }),
        "no OOM record"
    );
    let records: serde_json::Value =
        serde_json::from_str(&get(sidecar.addr, "/api/v1/oom").body).expect("JSON");
    let oom = records["records"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["trigger"] == "oom"))
        .expect("an OOM record");
    assert_eq!(oom["process"]["pod"]["pod"], "vllm-0", "{oom}");
    assert_eq!(oom["recorded_in"]["namespace"], "serving", "{oom}");
    let summary = oom["summary"].as_str().unwrap_or("");
    assert!(summary.contains("pod serving/vllm-0"), "{summary}");
    let snapshot: serde_json::Value =
        serde_json::from_str(&get(sidecar.addr, "/api/v1/snapshot").body).expect("JSON");
    assert_eq!(snapshot["sidecar"]["this_pod"]["pod"], "vllm-0");
}
