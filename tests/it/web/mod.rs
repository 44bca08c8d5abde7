//! The exporter's HTTP endpoints against a loopback port: the status page, `/metrics` (content
//! type, families and types), the JSON API, `/healthz` when sampling works and when it fails,
//! 404 and 405, static files, binding errors, shutdown, running inside a host runtime, and the
//! header deadline that closes idle connections.

mod deadline;
mod http;
mod tools;

pub(crate) use http::{eventually, get, request, request_raw, tool_available, value_of};

use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec};
use gpumem::units::{GIB, MIB};
use gpumem::{AllocOptions, DeviceBuffer, GraphPoolId, ManagerConfig, MemoryManager, Tag};
use gpumem_observe::exporter::ExporterError;
use gpumem_observe::{Exporter, ExporterHandle};
use http::samples;
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// An exporter over two small simulated devices with a few tagged allocations.
pub(super) struct Fixture {
    exporter: ExporterHandle,
    sim: Arc<SimBackend>,
    _buffers: Vec<DeviceBuffer>,
}

impl Fixture {
    pub(super) fn start() -> Fixture {
        let spec = SimDeviceSpec {
            total_bytes: 8 * GIB,
            ..SimDeviceSpec::default()
        };
        let sim = Arc::new(SimBackend::new(SimConfig {
            devices: vec![spec; 2],
            ..SimConfig::default()
        }));
        let manager = MemoryManager::new(sim.clone(), ManagerConfig::default()).expect("manager");
        let mut buffers = Vec::new();
        for (device, tag, size) in [
            (0, "weights", 512 * MIB),
            (0, "kv_cache", 64 * MIB),
            (1, "kv_cache", 4 * MIB),
        ] {
            let options = AllocOptions::tagged(Tag::new(tag));
            buffers.push(manager.alloc(device, size, &options).expect("alloc"));
        }
        buffers.push(
            manager
                .alloc(0, 4096, &AllocOptions::default())
                .expect("small alloc"),
        );
        // A CUDA graph's output: two 2 MiB pages held for the graph.
        let graph = AllocOptions::tagged(Tag::new("graph_output")).in_graph_pool(GraphPoolId(1));
        buffers.push(manager.alloc(0, 3 * MIB, &graph).expect("graph alloc"));
        let exporter = Exporter::builder()
            .manager(manager)
            .listen(([127, 0, 0, 1], 0))
            .interval(Duration::from_millis(100))
            .spawn()
            .expect("exporter starts");
        Fixture {
            exporter,
            sim,
            _buffers: buffers,
        }
    }

    pub(super) fn addr(&self) -> SocketAddr {
        self.exporter.local_addr()
    }
}

#[test]
fn the_status_page_shows_devices_pools_and_tags() {
    let fixture = Fixture::start();
    let reply = get(fixture.addr(), "/");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), "text/html; charset=utf-8");
    for expected in [
        "Simulated H100",
        "GPU 0",
        "GPU 1",
        "<table",
        "Pools",
        "kv_cache",
        "weights",
        "/static/chart.js",
        "/static/style.css",
        "CUDA graphs <small>1 pool, 4.00 MiB (3.00 MiB in use)",
    ] {
        assert!(reply.body.contains(expected), "the page lacks {expected:?}");
    }
    assert!(
        !reply.body.contains("cdn") && !reply.body.contains("https://"),
        "the page must work offline"
    );
}

const DEVICE_FAMILIES: &[(&str, &str)] = &[
    ("gpumem_device_memory_total_bytes", "gauge"),
    ("gpumem_device_memory_free_bytes", "gauge"),
    ("gpumem_device_memory_used_bytes", "gauge"),
    ("gpumem_device_memory_used_by_others_bytes", "gauge"),
    ("gpumem_pressure_level", "gauge"),
    ("gpumem_pressure_state", "gauge"),
    ("gpumem_in_use_bytes", "gauge"),
    ("gpumem_reserved_bytes", "gauge"),
    ("gpumem_driver_allocs_total", "counter"),
    ("gpumem_driver_frees_total", "counter"),
    ("gpumem_ooms_total", "counter"),
    ("gpumem_oom_retries_total", "counter"),
    ("gpumem_cpu_fallbacks_total", "counter"),
    ("gpumem_host_fallback_bytes", "gauge"),
    ("gpumem_external_bytes", "gauge"),
    ("gpumem_external_buffers", "gauge"),
    ("gpumem_graph_pool_bytes", "gauge"),
    ("gpumem_graph_pools", "gauge"),
    ("gpumem_live_allocations", "gauge"),
    ("gpumem_live_bytes", "gauge"),
    ("gpumem_live_age_band_bytes", "gauge"),
    ("gpumem_leak_suspect_allocations", "gauge"),
    ("gpumem_leak_suspect_bytes", "gauge"),
    ("gpumem_oldest_allocation_age_seconds", "gauge"),
    ("gpumem_pool_reserved_bytes", "gauge"),
    ("gpumem_pool_in_use_bytes", "gauge"),
    ("gpumem_pool_requests_total", "counter"),
    ("gpumem_pool_hits_total", "counter"),
    ("gpumem_pool_fragmentation_ratio", "gauge"),
    ("gpumem_pool_largest_free_block_bytes", "gauge"),
];

const EXPORTER_FAMILIES: &[(&str, &str)] = &[
    ("gpumem_build_info", "gauge"),
    ("gpumem_up", "gauge"),
    ("gpumem_sample_duration_seconds", "gauge"),
    ("gpumem_last_sample_timestamp_seconds", "gauge"),
    ("gpumem_samples_total", "counter"),
    ("gpumem_sample_failures_total", "counter"),
];

#[test]
fn metrics_have_the_exact_content_type_and_every_family() {
    let fixture = Fixture::start();
    let reply = get(fixture.addr(), "/metrics");
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("content-type"),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let types: HashMap<&str, &str> = reply
        .body
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .collect();
    for (name, kind) in DEVICE_FAMILIES.iter().chain(EXPORTER_FAMILIES) {
        assert_eq!(types.get(name), Some(kind), "{name} should be a {kind}");
    }
    let series = samples(&reply.body);
    let graphs = |name| value_of(&reply.body, name, "gpu=\"0\"");
    assert_eq!(graphs("gpumem_graph_pool_bytes"), Some((4 * MIB) as f64));
    assert_eq!(graphs("gpumem_graph_pools"), Some(1.0));
    // The largest tags by name (10 unless --top-tags says otherwise), the rest as "other".
    let tags: std::collections::BTreeSet<&str> = series
        .iter()
        .filter(|(name, _, _)| name == "gpumem_tag_live_bytes")
        .filter_map(|(_, labels, _)| labels.split("tag=\"").nth(1)?.split('"').next())
        .collect();
    assert!(!tags.is_empty(), "no gpumem_tag_live_bytes series");
    assert!(
        tags.len() <= 11,
        "more tags than the top 10 and other: {tags:?}"
    );
    for (name, labels, _) in &series {
        assert!(types.contains_key(name.as_str()), "{name} has no TYPE line");
        let names: Vec<&str> = labels
            .split(',')
            .filter_map(|pair| pair.split_once('='))
            .map(|(n, _)| n)
            .collect();
        assert!(
            !names.iter().any(|n| ["id", "ptr"].contains(n)),
            "unbounded label on {name}: {labels}"
        );
        // Tags only on the tag families, where they are bounded (checked below).
        assert!(
            !names.contains(&"tag") || name.starts_with("gpumem_tag_"),
            "a tag label on {name}: {labels}"
        );
        if DEVICE_FAMILIES.iter().any(|(n, _)| n == name) {
            assert!(
                labels.contains("gpu=\"") && labels.contains("uuid=\"GPU-"),
                "{name}{{{labels}}}"
            );
        }
        if name.starts_with("gpumem_pool_") {
            assert!(labels.contains("pool=\""), "{name}{{{labels}}}");
        }
    }
    let text = &reply.body;
    assert_eq!(value_of(text, "gpumem_up", ""), Some(1.0));
    assert_eq!(
        value_of(text, "gpumem_live_allocations", "gpu=\"0\""),
        Some(4.0),
        "three buffers and a graph's output"
    );
    assert_eq!(
        value_of(text, "gpumem_live_allocations", "gpu=\"1\""),
        Some(1.0)
    );
    assert!(
        value_of(text, "gpumem_pool_requests_total", "pool=\"small\"").is_some_and(|v| v >= 1.0)
    );
    assert_eq!(
        value_of(
            text,
            "gpumem_pressure_state",
            "gpu=\"0\",uuid=\"GPU-5157a000-0000-4000-8000-000000000000\",state=\"low\""
        ),
        Some(1.0)
    );
    let states = series
        .iter()
        .filter(|(n, l, _)| n == "gpumem_pressure_state" && l.contains("gpu=\"1\""))
        .count();
    assert_eq!(states, 4, "one series per pressure level");
    assert!(text.contains(&format!(
        "gpumem_build_info{{version=\"{}\",backend=\"sim\"}} 1",
        env!("CARGO_PKG_VERSION")
    )));
}

#[test]
fn the_json_api_has_the_snapshot_and_history() {
    let fixture = Fixture::start();
    let reply = get(fixture.addr(), "/api/v1/snapshot");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), "application/json");
    let snapshot: Value = serde_json::from_str(&reply.body).expect("snapshot JSON");
    let device = &snapshot["devices"][0];
    assert_eq!(device["name"], "Simulated H100");
    assert_eq!(device["memory"]["total_bytes"], 8 * GIB);
    assert!(device["uuid"]
        .as_str()
        .is_some_and(|u| u.starts_with("GPU-")));
    assert_eq!(device["live"]["count"], 4);
    assert_eq!(device["graphs"]["pools"], 1);
    assert_eq!(device["graphs"]["reserved_bytes"], 4 * MIB);
    assert_eq!(device["graphs"]["in_use_bytes"], 3 * MIB);
    assert_eq!(device["pressure"]["level"], "low");
    assert!(device["pools"].as_array().is_some_and(|p| p.len() >= 2));
    assert!(device["by_tag"]
        .as_array()
        .is_some_and(|t| t.iter().any(|g| g["tag"] == "kv_cache")));
    assert!(device["oldest_allocations"].is_array() && device["leak_suspects"].is_array());
    assert_eq!(snapshot["health"]["latest_ok"], true);
    assert!(snapshot["timestamp_seconds"]
        .as_f64()
        .is_some_and(|t| t > 1.0e9));

    assert!(eventually(Duration::from_secs(5), || {
        let history: Value = serde_json::from_str(&get(fixture.addr(), "/api/v1/history").body)
            .expect("history JSON");
        history["points"].as_array().is_some_and(|p| !p.is_empty())
            && history["points"][0]["devices"][0]["in_use_bytes"]
                .as_u64()
                .is_some_and(|b| b > 0)
            && history["step_seconds"] == 1.0
    }));
    let future: Value =
        serde_json::from_str(&get(fixture.addr(), "/api/v1/history?since=9e12").body)
            .expect("JSON");
    assert_eq!(future["points"].as_array().map(Vec::len), Some(0));
    assert_eq!(
        get(fixture.addr(), "/api/v1/history?since=yesterday").status,
        400
    );
}

#[test]
fn healthz_reports_failed_sampling_and_recovers() {
    let fixture = Fixture::start();
    let addr = fixture.addr();
    let health = get(addr, "/healthz");
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));

    fixture.sim.faults().set_fail_mem_info(true);
    assert!(
        eventually(Duration::from_secs(5), || get(addr, "/healthz").status
            == 503),
        "healthz should turn 503 when mem_info fails"
    );
    let failed = get(addr, "/healthz");
    assert!(
        failed.body.contains("could not read free memory"),
        "{}",
        failed.body
    );
    assert!(failed.body.contains("mem_info failed"), "{}", failed.body);
    let metrics = get(addr, "/metrics");
    assert_eq!(
        metrics.status, 200,
        "metrics keep working while sampling fails"
    );
    assert_eq!(value_of(&metrics.body, "gpumem_up", ""), Some(0.0));
    assert!(value_of(&metrics.body, "gpumem_sample_failures_total", "").is_some_and(|v| v >= 1.0));
    assert!(
        value_of(&metrics.body, "gpumem_live_allocations", "gpu=\"0\"").is_some(),
        "pool data is still there"
    );
    assert!(get(addr, "/").body.contains("sampling failed"));

    fixture.sim.faults().set_fail_mem_info(false);
    assert!(eventually(Duration::from_secs(5), || get(addr, "/healthz")
        .status
        == 200));
}

#[test]
fn unknown_paths_are_404_and_wrong_methods_405() {
    let fixture = Fixture::start();
    let addr = fixture.addr();
    let missing = get(addr, "/nope");
    assert_eq!(missing.status, 404);
    assert!(missing.body.contains("/nope"));
    assert_eq!(get(addr, "/static/missing.css").status, 404);
    for path in ["/metrics", "/", "/healthz", "/api/v1/snapshot"] {
        let reply = request(addr, "POST", path).expect("request");
        assert_eq!(reply.status, 405, "POST {path}");
    }
    assert_eq!(
        request(addr, "DELETE", "/api/v1/history")
            .expect("request")
            .status,
        405
    );
    assert_eq!(
        get(addr, "/api/v1/demo/pressure-spike").status,
        404,
        "demo routes only in the demo"
    );
}

#[test]
fn static_files_are_embedded() {
    let fixture = Fixture::start();
    for (path, content_type) in [
        ("/static/style.css", "text/css; charset=utf-8"),
        ("/static/chart.js", "text/javascript; charset=utf-8"),
        ("/static/favicon.svg", "image/svg+xml"),
    ] {
        let reply = get(fixture.addr(), path);
        assert_eq!(reply.status, 200, "{path}");
        assert_eq!(reply.header("content-type"), content_type, "{path}");
        assert!(reply.body.len() > 100, "{path}");
    }
}

#[test]
fn a_taken_port_is_an_error_not_a_panic() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let manager = MemoryManager::new(
        Arc::new(SimBackend::new(SimConfig::default())),
        ManagerConfig::default(),
    )
    .expect("manager");
    match Exporter::builder().manager(manager).listen(addr).spawn() {
        Err(ExporterError::Bind { addr: failed, .. }) => assert_eq!(failed, addr),
        Err(other) => panic!("expected a bind error, got {other}"),
        Ok(_) => panic!("binding a taken port succeeded"),
    }
    assert!(matches!(
        Exporter::builder().spawn(),
        Err(ExporterError::NoManagers)
    ));
}

#[test]
fn shutdown_stops_serving() {
    let fixture = Fixture::start();
    let addr = fixture.addr();
    assert_eq!(get(addr, "/healthz").status, 200);
    fixture.exporter.shutdown();
    assert!(
        request(addr, "GET", "/healthz").is_err(),
        "still serving after shutdown"
    );
}

#[test]
fn embeds_in_a_host_tokio_runtime() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let manager = MemoryManager::new(
            Arc::new(SimBackend::new(SimConfig::default())),
            ManagerConfig::default(),
        )
        .expect("manager");
        let exporter = Exporter::builder()
            .manager(manager)
            .listen(([127, 0, 0, 1], 0))
            .spawn()
            .expect("exporter");
        let addr = exporter.local_addr();
        let reply = tokio::task::spawn_blocking(move || get(addr, "/healthz"))
            .await
            .expect("join");
        assert_eq!(reply.status, 200);
        exporter.shutdown_and_wait().await;
        let after =
            tokio::task::spawn_blocking(move || request(addr, "GET", "/healthz").is_err()).await;
        assert!(
            after.expect("join"),
            "still serving after shutdown_and_wait"
        );
    });
}
