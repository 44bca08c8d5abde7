//! What users of the designs gpumem grew from expect to find, in the shape they know it:
//! `reset_stats()`, a startup line per device, buffers allocated elsewhere counted by
//! `track_external`, and a workspace that shrinks and grows with pressure.

use crate::allocator::small_sim;
use crate::support::gpumem;
use crate::web::{eventually, get, value_of};
use gpumem::manager::MemoryConfig;
use gpumem::units::{GIB, MIB};
use gpumem::{AllocOptions, MemoryManager};

/// Runs `gpumem demo ARGS` on a simulated device to its end; returns what it logged at info.
fn demo_log(args: &[&str]) -> String {
    let mut command = vec!["demo", "--backend", "sim", "--listen", "127.0.0.1:0"];
    command.extend_from_slice(args);
    let out = gpumem(&command)
        .env("GPUMEM_LOG", "info")
        .output()
        .expect("gpumem runs");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn reset_stats_zeroes_counts_and_peaks_but_keeps_what_is_held() {
    let m = MemoryManager::new(small_sim(8 * GIB), MemoryConfig::default()).unwrap();
    let held = m.alloc(0, 64 * MIB, &AllocOptions::default()).unwrap();
    drop(m.alloc(0, 256 * MIB, &AllocOptions::default()).unwrap());
    let _ = m.alloc(0, 100 * GIB, &AllocOptions::default());
    let before = m.device_stats(0).unwrap();
    assert_eq!(before.counters.allocations, 2);
    assert!(before.counters.peak_requested_bytes >= 320 * MIB);
    m.reset_stats();
    let after = m.device_stats(0).unwrap();
    let c = &after.counters;
    assert_eq!(
        (
            c.allocations,
            c.frees,
            c.requests,
            c.hits,
            c.driver_allocs,
            c.driver_frees
        ),
        (0, 0, 0, 0, 0, 0)
    );
    assert_eq!(after.ooms, 0);
    assert_eq!(
        c.live_allocations, 1,
        "live buffers are state, not statistics"
    );
    assert_eq!(c.requested_bytes, 64 * MIB);
    assert_eq!(c.peak_requested_bytes, 64 * MIB, "peaks restart from now");
    assert_eq!(c.reserved_bytes, before.counters.reserved_bytes);
    drop(held);
    drop(m.alloc(0, MIB, &AllocOptions::default()).unwrap());
    let c = m.device_stats(0).unwrap().counters;
    assert_eq!((c.allocations, c.frees, c.requests), (1, 2, 1));
}

#[test]
fn each_device_gets_a_startup_line_with_total_usable_and_free() {
    let log = demo_log(&[
        "--sim-devices",
        "2",
        "--sim-memory",
        "24GiB",
        "--duration",
        "1s",
    ]);
    for device in 0..2 {
        let line = format!(
            "managing GPU {device} (Simulated H100): 24.00 GiB total, 22.00 GiB usable, \
             24.00 GiB free; pools capped at 21.60 GiB"
        );
        assert_eq!(log.matches(&line).count(), 1, "{line:?} in\n{log}");
    }
}

#[test]
fn outside_buffers_and_backtraces_show_in_json_metrics_and_the_page() {
    let config = MemoryConfig {
        capture_backtraces: true,
        ..MemoryConfig::default()
    };
    let m = MemoryManager::new(small_sim(8 * GIB), config).unwrap();
    let tag = AllocOptions::tagged(gpumem::Tag::new("kv_cache"));
    let buffer = m.alloc(0, 3 * MIB, &tag).unwrap();
    m.track_external(0, 0x7f00_0000_0000, 256 * MIB, "nccl")
        .unwrap();
    m.track_external(0, 0x7f00_1000_0000, 64 * MIB, "cublas_workspace")
        .unwrap();
    m.track_external(0, 0x7f00_2000_0000, 64 * MIB, "nccl")
        .unwrap();
    let exporter = gpumem_observe::Exporter::builder()
        .manager(m.clone())
        .listen(([127, 0, 0, 1], 0))
        .interval(std::time::Duration::from_millis(100))
        .spawn()
        .expect("exporter starts");
    let addr = exporter.local_addr();

    let snapshot: serde_json::Value =
        serde_json::from_str(&get(addr, "/api/v1/snapshot").body).expect("JSON");
    let device = &snapshot["devices"][0];
    assert_eq!(device["external"]["count"], 3);
    assert_eq!(device["external"]["bytes"], 384 * MIB);
    assert_eq!(device["external"]["by_tag"][0]["tag"], "nccl");
    assert_eq!(device["external"]["by_tag"][0]["bytes"], 320 * MIB);
    assert_eq!(
        device["stats"]["reserved_bytes"],
        4 * MIB,
        "outside buffers are not pool memory"
    );
    let oldest = &device["oldest_allocations"][0];
    assert_eq!(oldest["id"], buffer.id());
    assert_eq!(oldest["tag"], "kv_cache");
    let thread = std::thread::current()
        .name()
        .unwrap_or_default()
        .to_string();
    assert_eq!(oldest["thread"], thread.as_str());
    let trace = oldest["backtrace"].as_str().expect("a backtrace");
    assert!(
        !trace.trim_start().starts_with("0: std::backtrace"),
        "starts at the caller: {trace}"
    );
    assert!(trace.lines().count() >= 1);

    let metrics = get(addr, "/metrics").body;
    assert_eq!(
        value_of(&metrics, "gpumem_external_bytes", "gpu=\"0\""),
        Some((384 * MIB) as f64)
    );
    assert_eq!(
        value_of(&metrics, "gpumem_external_buffers", "gpu=\"0\""),
        Some(3.0)
    );

    let page = get(addr, "/").body;
    for needle in [
        "Outside buffers",
        "3 buffers, 384.00 MiB",
        "cublas_workspace",
        &format!("{:#x}", buffer.id()),
        "where allocated",
        &format!("thread {thread}"),
    ] {
        assert!(page.contains(needle), "the page lacks {needle:?}");
    }

    m.untrack_external(0, 0x7f00_0000_0000).unwrap();
    assert!(eventually(std::time::Duration::from_secs(5), || {
        let metrics = get(addr, "/metrics").body;
        value_of(&metrics, "gpumem_external_bytes", "gpu=\"0\"") == Some((128 * MIB) as f64)
    }));
    drop(buffer);
}

#[test]
fn the_demo_workspace_shrinks_at_a_pressure_spike_and_says_so() {
    let log = demo_log(&[
        "--sim-memory",
        "16GiB",
        "--interval",
        "200ms",
        "--spike-at",
        "1s",
        "--duration",
        "5s",
    ]);
    assert!(
        log.contains("workspace on GPU 0: batch 128 (95.06 MiB) for a 4096x11008 int4 layer"),
        "{log}"
    );
    assert!(
        log.contains(
            "workspace on GPU 0: batch 128 -> 1 (95.06 MiB -> 86.07 MiB) at critical pressure"
        ),
        "{log}"
    );
}
