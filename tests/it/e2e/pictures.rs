//! The pictures of docs/kubernetes.md, made by hand (an ignored test: CI never writes into the
//! repository): the node agent's story of `node_agent` told slower — vLLM's KV cache filling, the GPU going
//! critical, allocations refused, the container OOM-killed and restarted — then the agent's own
//! page in headless Chromium (`docs/images/node-agent-page.png`) and the dashboard drawn from its
//! own queries on that Prometheus by `docs/tools/render_dashboard.py` (no Grafana here),
//! screenshot the same way (`docs/images/dashboard-by-pod.png`). Run:
//! `cargo test --release --test it -- --ignored e2e::pictures` (about two minutes).

use super::node_agent::{Node, RATE_INTERVAL};
use super::repo_file;
use crate::sidecar::node_agent::agent::{GIB, NODE};
use crate::sidecar::TempDir;
use crate::support::{target_dir, Chromium};
use serde_json::json;
use std::time::Duration;

/// Each PNG must stay small enough for a README.
const MAX_PNG: usize = 400_000;

/// Opens `url` in a fresh tab, waits until `ready` (a script) is true, and returns a PNG of the
/// whole page.
fn screenshot(url: &str, ready: &str) -> Vec<u8> {
    let mut browser = Chromium::start();
    let mut page = browser.page();
    page.call("Page.enable", json!({}));
    page.call("Page.navigate", json!({ "url": url }));
    let loaded = crate::web::eventually(Duration::from_secs(30), || {
        page.evaluate(ready) == json!(true)
    });
    assert!(loaded, "{url} never became ready: {:?}", page.errors());
    page.screenshot(true)
}

/// Writes `png` to `relative` in the repository once it is a PNG of at most [`MAX_PNG`]; a copy
/// goes to the build's target directory first, to look at when it is not.
fn save(png: &[u8], relative: &str) {
    let name = relative.rsplit('/').next().unwrap_or(relative);
    std::fs::write(target_dir().join(name), png).expect("write a copy");
    assert!(png.starts_with(b"\x89PNG"), "{relative} is not a PNG");
    assert!(
        png.len() < MAX_PNG,
        "{relative} is {} KiB (at most {} KiB)",
        png.len() >> 10,
        MAX_PNG >> 10
    );
    let path = repo_file(relative);
    std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
    // Replaced whole or not at all: a full disk leaves the committed picture as it was.
    gpumem::safe_fs::write_atomically(&path, png, &Default::default()).expect("write the picture");
    eprintln!("{relative}: {} KiB", png.len() >> 10);
}

/// Moves vLLM's holding from `from` to `to` GiB in steps of a second.
fn ramp(node: &Node, from: u64, to: u64, seconds: u64, restarted: bool) {
    for step in 1..=seconds {
        let gib = from as f64 + (to as f64 - from as f64) * step as f64 / seconds as f64;
        let bytes = (gib * GIB as f64) as u64;
        if restarted {
            node.restarted_vllm_holds(bytes);
        } else {
            node.vllm_holds(bytes);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
#[ignore = "writes the README's pictures into docs/images; run by hand"]
fn pictures() {
    let start = gpumem_wire::unix_now();
    // The page shows where snapshots are collected from: a plain name, not a test's.
    let collect = TempDir::at(&std::env::temp_dir().join("gpumem"));
    let mut node = Node::start(30 * GIB, collect);
    // The KV cache fills, then grows past what the GPU has: critical, and refusals.
    ramp(&node, 30, 44, 30, false);
    ramp(&node, 44, 63, 16, false);
    for _ in 0..3 {
        node.vllm_refuses();
        std::thread::sleep(Duration::from_secs(2));
    }
    // OOM-killed, restarted, loading its weights again.
    node.restart_vllm(GIB);
    ramp(&node, 1, 20, 24, true);
    std::thread::sleep(Duration::from_secs(2));
    let end = gpumem_wire::unix_now();

    // The page's chart has drawn twice: the history is on it.
    let page = screenshot(
        &format!("http://{}/", node.agent.addr),
        "(window.gpumemPageUpdates || 0) >= 2",
    );
    save(&page, "docs/images/node-agent-page.png");

    // The dashboard with both namespaces picked and every pod of them (All), so the picture
    // shows who holds the GPU; the test checks the same queries for one pod. (Namespace All
    // would add the process outside pods.)
    let html = target_dir().join("dashboard-by-pod.html");
    let prometheus = format!("http://{}", node.prometheus.addr());
    let vars = [
        format!("instance={NODE}"),
        "gpu=0".to_string(),
        "namespace=(ml|serving)".to_string(),
        "pod=.*".to_string(),
        format!("__rate_interval={RATE_INTERVAL}"),
    ];
    let mut command = std::process::Command::new("python3");
    command
        .arg(repo_file("docs/tools/render_dashboard.py"))
        .args(["--prometheus", &prometheus])
        .args(["--start", &start.to_string(), "--end", &end.to_string()])
        .args(["--html", html.to_str().expect("utf-8")]);
    for var in &vars {
        command.args(["--var", var]);
    }
    let rendered = command.output().expect("python3 runs");
    assert!(
        rendered.status.success(),
        "render_dashboard.py: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let url = format!("file://{}", html.display());
    let board = screenshot(&url, "document.readyState === 'complete'");
    save(&board, "docs/images/dashboard-by-pod.png");
}
