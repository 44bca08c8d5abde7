//! `grafana/dashboard.json` read as data — its panels, their PromQL, its annotations, its template
//! variables and how to fill them in, the metric names and label matchers of an expression —
//! for the tests that check its structure (`dashboard_checks`) and ask it of a live Prometheus
//! (`panels`).

use super::read_repo_file;
use serde_json::{json, Value};
use std::collections::BTreeSet;

pub(super) const DASHBOARD_FILE: &str = "grafana/dashboard.json";

/// Metrics only the sidecar or node agent (`gpumem serve`) publishes. A demo serves none of
/// them, so the demo's end-to-end test checks that their queries are valid PromQL, and the node
/// agent's (`node_agent`) that they return data.
pub(super) const SIDECAR_METRICS: &[&str] = &[
    "gpumem_process_used_bytes",
    "gpumem_collect_exited_processes",
    "gpumem_exited_gpu_processes",
];

/// The sidecar families counted per exporter rather than per GPU: the exited processes.
pub(super) const PER_EXPORTER: &[&str] = &[
    "gpumem_collect_exited_processes",
    "gpumem_exited_gpu_processes",
];

pub(super) fn load() -> Value {
    serde_json::from_str(&read_repo_file(DASHBOARD_FILE))
        .unwrap_or_else(|e| panic!("{DASHBOARD_FILE} is not valid JSON: {e}"))
}

/// What every panel and query names as its data source: the template variable.
pub(super) fn datasource() -> Value {
    json!({ "type": "prometheus", "uid": "${datasource}" })
}

/// Every panel, those nested in collapsed rows included.
pub(super) fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        all.push(panel);
        all.extend(panel["panels"].as_array().into_iter().flatten());
    }
    all
}

pub(super) fn is_row(panel: &Value) -> bool {
    panel["type"] == "row"
}

/// One PromQL query of the dashboard, with its variables still in it.
pub(super) struct PanelQuery {
    pub panel: String,
    pub expr: String,
}

/// The annotation queries (out-of-memory refusals, critical pressure), each named
/// "annotation NAME": checked like panel queries, but they return data only while what they
/// mark happens.
pub(super) fn annotation_queries(dashboard: &Value) -> Vec<PanelQuery> {
    dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["datasource"]["type"] == "prometheus")
        .map(|a| PanelQuery {
            panel: format!("annotation {}", a["name"].as_str().unwrap_or("?")),
            expr: a["expr"].as_str().unwrap_or("").to_string(),
        })
        .collect()
}

/// The panels' queries and the annotations'.
pub(super) fn all_queries(dashboard: &Value) -> Vec<PanelQuery> {
    let mut all = queries(dashboard);
    all.extend(annotation_queries(dashboard));
    all
}

/// Families about a device or an exporter as a whole, which belong to no pod: their panels are
/// not filtered by namespace or pod (on a node agent they carry neither).
const DEVICE_WIDE: &[&str] = &[
    "gpumem_device_memory_",
    "gpumem_pressure_",
    "gpumem_up",
    "gpumem_collect_",
    "gpumem_exited_gpu_processes",
    "gpumem_build_info",
];

pub(super) fn device_wide(name: &str) -> bool {
    DEVICE_WIDE.iter().any(|prefix| name.starts_with(prefix))
}

pub(super) fn queries(dashboard: &Value) -> Vec<PanelQuery> {
    panels(dashboard)
        .into_iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or("?").to_string();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |target| PanelQuery {
                    panel: title.clone(),
                    expr: target["expr"].as_str().unwrap_or("").to_string(),
                })
        })
        .collect()
}

/// A query variable `label_values(SELECTOR, LABEL)`: its name, selector and label.
pub(super) struct VariableQuery {
    pub name: String,
    pub selector: String,
    pub label: String,
}

pub(super) fn variable_queries(dashboard: &Value) -> Vec<VariableQuery> {
    variables(dashboard)
        .into_iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let name = v["name"].as_str().unwrap_or("?").to_string();
            let query = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap_or_else(|| panic!("variable {name} has no query"));
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap_or_else(|| {
                    panic!("variable {name}: expected label_values(...), got {query}")
                });
            let (selector, label) = inner
                .rsplit_once(',')
                .unwrap_or_else(|| panic!("variable {name}: label_values needs a selector"));
            VariableQuery {
                name,
                selector: selector.trim().to_string(),
                label: label.trim().to_string(),
            }
        })
        .collect()
}

pub(super) fn variables(dashboard: &Value) -> Vec<&Value> {
    dashboard["templating"]["list"]
        .as_array()
        .map(|list| list.iter().collect())
        .unwrap_or_default()
}

/// `text` with each `$name`, `${name}` or `${name:format}` replaced by its value; an error names
/// a variable it was not given, so a new variable cannot slip past the end-to-end test.
pub(super) fn substitute(text: &str, values: &[(&str, &str)]) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, length) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced
                    .find('}')
                    .ok_or_else(|| format!("unclosed ${{ in {text}"))?;
                let name = braced[..end].split(':').next().unwrap_or("");
                (name, end + 2)
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        let value = values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("no value for the variable ${name} in {text}"))?;
        out.push_str(value);
        rest = &after[length..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The gpumem metric names an expression uses, with where each one starts.
pub(super) fn metric_uses(expr: &str) -> Vec<(usize, &str)> {
    let bytes = expr.as_bytes();
    expr.match_indices("gpumem_")
        .filter(|(at, _)| {
            *at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_')
        })
        .map(|(at, _)| {
            let end = expr[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(expr.len(), |e| at + e);
            (at, &expr[at..end])
        })
        .collect()
}

/// The label matchers right after a metric name (`{...}`), or "" when it has none.
pub(super) fn selector_labels<'a>(expr: &'a str, at: usize, name: &str) -> &'a str {
    expr[at + name.len()..]
        .strip_prefix('{')
        .and_then(|l| l.split_once('}'))
        .map_or("", |(l, _)| l)
}

pub(super) fn metric_names(expr: &str) -> BTreeSet<String> {
    metric_uses(expr)
        .into_iter()
        .map(|(_, name)| name.to_string())
        .collect()
}

/// Whether a query reads a metric only the sidecar publishes, or only the series of collected
/// processes (selected by `process!=""`).
pub(super) fn uses_sidecar_metrics(expr: &str) -> bool {
    expr.contains("process!=\"\"")
        || metric_names(expr)
            .iter()
            .any(|name| SIDECAR_METRICS.contains(&name.as_str()))
}
