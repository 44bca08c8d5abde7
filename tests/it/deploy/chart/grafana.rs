//! The files under grafana/ in the chart: the PrometheusRule (alerts and recording rules) and the
//! dashboard ConfigMap equal to them, and the packaged chart carrying them byte for byte.

use crate::deploy::{documents, helm_tool, python_tools, read, render, repo, CHART};
use serde_json::{json, Value};

#[test]
fn the_prometheus_rule_and_the_dashboard_are_the_files_under_grafana() {
    if !python_tools() {
        return;
    }
    let chart = render(json!({}));
    // The alerts' groups, then the recording rules' (which the dashboards of fleets read).
    let mut groups = Vec::new();
    for file in ["grafana/alerts.yml", "grafana/recording.yml"] {
        let rules = documents(&read(file), file);
        groups.extend(
            rules[0]["groups"]
                .as_array()
                .expect("groups")
                .iter()
                .cloned(),
        );
    }
    let rule = chart.one("PrometheusRule");
    assert_eq!(
        rule["spec"]["groups"],
        Value::Array(groups),
        "the PrometheusRule's groups differ from grafana/alerts.yml and grafana/recording.yml"
    );
    assert!(chart
        .manifest
        .contains("record: namespace_pod:gpumem_process_used_bytes:sum"));
    // Inserted, not evaluated: Prometheus's own templates reach it as written.
    assert!(chart.manifest.contains("{{ $labels.gpu }}"));

    let map = chart.one("ConfigMap");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value = serde_json::from_str(map["data"]["gpumem.json"].as_str().expect("data"))
        .expect("the ConfigMap's dashboard is JSON");
    let dashboard: Value =
        serde_json::from_str(&read("grafana/dashboard.json")).expect("dashboard.json");
    assert_eq!(
        shipped, dashboard,
        "the dashboard ConfigMap differs from grafana/dashboard.json"
    );

    // Turned off, they are gone.
    let without =
        render(json!({"prometheusRule": {"enabled": false}, "dashboard": {"enabled": false}}));
    assert!(
        without.of_kind("PrometheusRule").is_empty() && without.of_kind("ConfigMap").is_empty()
    );
}

/// `helm package` (what a chart repository serves) carries the files under grafana/ that the
/// chart links to, byte for byte, not the links.
#[test]
fn the_packaged_chart_carries_the_grafana_files() {
    if !python_tools() {
        return;
    }
    let answer = helm_tool(&json!({"op": "package", "chart": repo(CHART)}));
    assert!(answer["error"].is_null(), "{}", answer["error"]);
    for (inside, source) in [
        ("gpumem/files/alerts.yml", "grafana/alerts.yml"),
        ("gpumem/files/recording.yml", "grafana/recording.yml"),
        ("gpumem/files/dashboard.json", "grafana/dashboard.json"),
    ] {
        assert_eq!(
            answer["files"][inside].as_str(),
            Some(read(source).as_str()),
            "{inside} in the package is not {source}"
        );
    }
}
