//! The chart's ServiceMonitor as a Prometheus scrape job, so the node agent's end-to-end test
//! scrapes as a cluster's Prometheus would: the ServiceMonitor of the chart's default rendering
//! (`docker/k8s/node-agent/gpumem.yaml`, which the deploy tests keep equal to what Helm renders)
//! read field by field — `honorLabels`, `relabelings`, `metricRelabelings` — and the target
//! labels the Prometheus Operator gives an endpoint of the agent's pod before those relabelings
//! run, set as static labels on the one target (no Kubernetes service discovery here).

use super::read_repo_file;
use crate::deploy::documents;
use serde_json::{json, Map, Value};
use std::net::SocketAddr;

/// The chart rendered with its default values.
const RENDERED: &str = "docker/k8s/node-agent/gpumem.yaml";

/// The scrape job for the agent at `target`, running in pod `agent_pod` (namespace, name) on
/// node `node`.
pub(super) fn scrape_job(target: SocketAddr, agent_pod: (&str, &str), node: &str) -> Value {
    let objects = documents(&read_repo_file(RENDERED), RENDERED);
    let monitor = objects
        .iter()
        .find(|o| o["kind"] == "ServiceMonitor")
        .unwrap_or_else(|| panic!("{RENDERED} has no ServiceMonitor"));
    let service = monitor["metadata"]["name"].as_str().expect("its name");
    let endpoint = &monitor["spec"]["endpoints"][0];
    // The operator's own target labels, from service discovery (its promcfg.go): the service,
    // the pod and its container, the port's name, the job named after the service.
    let mut labels = Map::new();
    for (label, value) in [
        ("namespace", agent_pod.0),
        ("service", service),
        ("pod", agent_pod.1),
        ("container", "gpumem"),
        ("endpoint", endpoint["port"].as_str().expect("a port name")),
        ("job", service),
        ("__meta_kubernetes_pod_node_name", node),
        ("__meta_kubernetes_namespace", agent_pod.0),
        ("__meta_kubernetes_pod_name", agent_pod.1),
    ] {
        labels.insert(label.to_string(), json!(value));
    }
    json!({
        "job_name": format!("serviceMonitor/{}/{service}/0", agent_pod.0),
        "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
        "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
        "static_configs": [{"targets": [target.to_string()], "labels": labels}],
        "relabel_configs": relabel_configs(&endpoint["relabelings"]),
        "metric_relabel_configs": relabel_configs(&endpoint["metricRelabelings"]),
    })
}

/// The operator's relabel fields (camelCase) as Prometheus spells them.
fn relabel_configs(relabelings: &Value) -> Vec<Value> {
    relabelings
        .as_array()
        .into_iter()
        .flatten()
        .map(|rule| {
            let fields = rule.as_object().expect("a relabeling is a map");
            let config: Map<String, Value> = fields
                .iter()
                .map(|(key, value)| {
                    let key = match key.as_str() {
                        "sourceLabels" => "source_labels",
                        "targetLabel" => "target_label",
                        "action" | "regex" | "replacement" | "separator" | "modulus" => key,
                        other => panic!("a relabeling field this test does not know: {other}"),
                    };
                    (key.to_string(), value.clone())
                })
                .collect();
            Value::Object(config)
        })
        .collect()
}
