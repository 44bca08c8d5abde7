//! Grafana and Prometheus, end to end: the alert rules under `promtool` (syntax, unit tests,
//! labels, annotations, runbook sections), the dashboard's structure against the metrics a running
//! demo serves, a real Prometheus scraping `gpumem demo` with the rules loaded (every
//! dashboard query returns data; a forced pressure spike fires the pressure alerts), and one
//! scraping a node agent as the chart's ServiceMonitor does (every panel and variable has data
//! for a pod; a container restart shows as an exited process).

mod alert_scenario;
mod blind;
mod dashboard;
mod dashboard_checks;
mod engine;
mod node_agent;
mod oom;
mod panels;
mod pictures;
mod prometheus;
mod record_series;
mod rules;
mod service_monitor;

use std::path::{Path, PathBuf};

/// A file of this repository (`grafana/alerts.yml`, ...).
fn repo_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read_repo_file(relative: &str) -> String {
    let path = repo_file(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The `/metrics` text of a running `gpumem demo`, once it has every family (pools and tags
/// included).
fn demo_metrics() -> String {
    let demo = crate::support::Running::sim_demo("60s");
    let mut text = String::new();
    // The first sample may not have every family yet (timestamps, pools): wait for them.
    let ready = crate::web::eventually(std::time::Duration::from_secs(20), || {
        text = crate::web::get(demo.addr, "/metrics").body;
        text.contains("\ngpumem_pool_hits_total{")
            && text.contains("\ngpumem_last_sample_timestamp_seconds ")
            && text.contains("\ngpumem_tag_live_bytes{")
    });
    assert!(
        ready,
        "the demo's /metrics never had its pool families:\n{text}"
    );
    text
}
