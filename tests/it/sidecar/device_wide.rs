//! Device-wide figures behind a sidecar — CUDA graph pools and memory allocated outside gpumem:
//! a library process that exports and publishes at once shows the same `gpumem_graph_*` and
//! `gpumem_external_*` series on its own `/metrics` and, labelled with its process and pid, on
//! `gpumem serve`'s; a file from an older writer without those fields is still collected, just
//! without their series.

use super::{now, published, serve, TempDir};
use crate::web::{eventually, get, value_of};
use gpumem::backend::sim::{SimBackend, SimConfig};
use gpumem::units::MIB;
use gpumem::{AllocOptions, GraphPoolId, ManagerConfig, MemoryManager, Tag};
use gpumem_observe::publish::Publisher;
use gpumem_observe::Exporter;
use std::sync::Arc;
use std::time::Duration;

const FAMILIES: [&str; 4] = [
    "gpumem_graph_pool_bytes",
    "gpumem_graph_pools",
    "gpumem_external_bytes",
    "gpumem_external_buffers",
];

/// The labels and value of `family`'s first series in `metrics`, as written (`gpu="0",uuid="…"`
/// and `4194304`).
fn series(metrics: &str, family: &str) -> Option<(String, String)> {
    let line = metrics
        .lines()
        .find(|l| l.starts_with(&format!("{family}{{")))?;
    let (labels, value) = line[family.len() + 1..].split_once("} ")?;
    Some((labels.to_string(), value.to_string()))
}

#[test]
fn graph_pools_and_outside_memory_reach_the_sidecar_with_the_processs_own_values() {
    let dir = TempDir::new("device-wide");
    let sim = Arc::new(SimBackend::new(SimConfig::default()));
    let manager = MemoryManager::new(sim, ManagerConfig::default()).expect("manager");
    // Two graphs' outputs in two pools: 3 MiB maps two 2 MiB pages, 1 MiB one.
    let held: Vec<_> = [(GraphPoolId(1), 3 * MIB), (GraphPoolId(2), MIB)]
        .into_iter()
        .map(|(pool, size)| {
            let options = AllocOptions::tagged(Tag::new("graph_output")).in_graph_pool(pool);
            manager.alloc(0, size, &options).expect("graph alloc")
        })
        .collect();
    // A buffer the engine allocated itself (an NCCL or cuBLAS workspace, say).
    manager
        .track_external(0, 0x7e00_0000_0000, 96 * MIB, "nccl")
        .expect("tracked");
    let exporter = Exporter::builder()
        .manager(manager.clone())
        .listen(([127, 0, 0, 1], 0))
        .interval(Duration::from_millis(100))
        .spawn()
        .expect("exporter starts");
    let publisher = Publisher::builder()
        .manager(manager)
        .dir(dir.path())
        .interval(Duration::from_millis(100))
        .process_name("engine")
        .spawn()
        .expect("publishes");
    let sidecar = serve(&dir, &["--backend", "sim"]);

    let own_pools = || {
        value_of(
            &get(exporter.local_addr(), "/metrics").body,
            "gpumem_graph_pools",
            "gpu=\"0\"",
        )
    };
    assert!(
        eventually(Duration::from_secs(10), || own_pools() == Some(2.0)),
        "the process's own exporter never counted both graph pools"
    );
    let process = format!("process=\"engine\",pid=\"{}\"", std::process::id());
    assert!(
        eventually(Duration::from_secs(10), || value_of(
            &get(sidecar.addr, "/metrics").body,
            "gpumem_collect_processes",
            ""
        ) == Some(1.0)),
        "the sidecar never collected the process"
    );
    let own = get(exporter.local_addr(), "/metrics").body;
    let collected = get(sidecar.addr, "/metrics").body;
    for family in FAMILIES {
        let (labels, value) =
            series(&own, family).unwrap_or_else(|| panic!("{family} missing:\n{own}"));
        let expected = format!("{family}{{{process},{labels}}} {value}");
        assert!(
            collected.lines().any(|l| l == expected),
            "the sidecar should publish {expected}:\n{collected}"
        );
    }
    assert_eq!(
        series(&own, "gpumem_graph_pool_bytes").map(|(_, v)| v),
        Some((6 * MIB).to_string()),
        "three 2 MiB pages held for the two graphs"
    );
    assert_eq!(
        series(&own, "gpumem_external_bytes").map(|(_, v)| v),
        Some((96 * MIB).to_string()),
        "the outside buffer"
    );
    // The status page's row for the process says the same.
    assert_eq!(
        graphs_cell(&get(sidecar.addr, "/").body, "engine").as_deref(),
        Some("2 pools, 6.00 MiB")
    );

    // An older writer's file, without those fields: still collected, without their series.
    publisher.shutdown();
    drop(held);
    std::fs::write(
        dir.join("older.json"),
        published(std::process::id(), "older", now() + 5.0),
    )
    .expect("write");
    let older_collected = || {
        value_of(
            &get(sidecar.addr, "/metrics").body,
            "gpumem_reserved_bytes",
            "process=\"older\"",
        )
        .is_some()
    };
    assert!(
        eventually(Duration::from_secs(10), older_collected),
        "a file without those fields should still be read"
    );
    let metrics = get(sidecar.addr, "/metrics").body;
    for family in FAMILIES {
        assert_eq!(
            value_of(&metrics, family, "process=\"older\""),
            None,
            "{family}: a field the writer left out is not exported"
        );
    }
    assert_eq!(
        graphs_cell(&get(sidecar.addr, "/").body, "older").as_deref(),
        Some("–")
    );
}

/// The CUDA graphs cell of `process`'s row in the sidecar's processes table.
fn graphs_cell(page: &str, process: &str) -> Option<String> {
    let row = page.lines().find(|l| {
        l.contains("<tr class=\"process\"") && l.contains(&format!("<td>{process}</td>"))
    })?;
    let cell = row.split("<td class=\"num opt graphs\">").nth(1)?;
    Some(cell.split("</td>").next()?.to_string())
}
