//! `grafana/dashboard.json` read as data — its panels, their PromQL, its template variables and
//! how to fill them in — and its structure checked: the `${datasource}` variable on every panel
//! and query, an expression in every target, instance and GPU filters on every selector,
//! counters only under `rate()`/`increase()`, panels on the grid without overlap, and only metric
//! names that a running demo serves (the alert rules' as well).

use super::read_repo_file;
use serde_json::{json, Value};
use std::collections::BTreeSet;

pub(super) const DASHBOARD_FILE: &str = "grafana/dashboard.json";

/// Metrics only the sidecar (`gpumem serve`) publishes. A demo serves none of them, so the
/// end-to-end test checks that their queries are valid PromQL rather than that they return data.
pub(super) const SIDECAR_METRICS: &[&str] = &[
    "gpumem_process_used_bytes",
    "gpumem_collect_exited_processes",
];

pub(super) fn load() -> Value {
    serde_json::from_str(&read_repo_file(DASHBOARD_FILE))
        .unwrap_or_else(|e| panic!("{DASHBOARD_FILE} is not valid JSON: {e}"))
}

/// What every panel and query names as its data source: the template variable.
fn datasource() -> Value {
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

fn is_row(panel: &Value) -> bool {
    panel["type"] == "row"
}

/// One PromQL query of the dashboard, with its variables still in it.
pub(super) struct PanelQuery {
    pub panel: String,
    pub expr: String,
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

fn variables(dashboard: &Value) -> Vec<&Value> {
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
fn metric_uses(expr: &str) -> Vec<(usize, &str)> {
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
fn selector_labels<'a>(expr: &'a str, at: usize, name: &str) -> &'a str {
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

/// Metric families of a metrics text, and those of them labelled by `gpu`.
fn families(metrics: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut per_gpu = BTreeSet::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some(name) = line.split(['{', ' ']).next().filter(|n| !n.is_empty()) else {
            continue;
        };
        if line.contains("gpu=\"") {
            per_gpu.insert(name.to_string());
        }
        names.insert(name.to_string());
    }
    (names, per_gpu)
}

#[test]
fn the_dashboard_uses_its_variables_everywhere() {
    let dashboard = load();
    let text = read_repo_file(DASHBOARD_FILE);
    assert!(
        !text.contains("DS_PROMETHEUS") && dashboard.get("__inputs").is_none(),
        "file provisioning needs the ${{datasource}} variable, not an export's ${{DS_PROMETHEUS}}"
    );
    assert!(dashboard["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));

    let vars = variables(&dashboard);
    let var = |name: &str| {
        *vars
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no {name} variable"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    for name in ["instance", "gpu"] {
        assert_eq!(var(name)["type"], "query", "{name}");
        assert_eq!(var(name)["datasource"], datasource(), "{name}");
    }
    let names: Vec<String> = variable_queries(&dashboard)
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["instance", "gpu"]);

    let mut ids = BTreeSet::new();
    let mut boxes: Vec<(&str, [i64; 4])> = Vec::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or("?");
        let id = panel["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("{title}: no id"));
        assert!(ids.insert(id), "{title}: id {id} is taken");
        let grid = &panel["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| grid[k].as_i64().unwrap_or(-1));
        assert!(
            x >= 0 && y >= 0 && w > 0 && h > 0 && x + w <= 24,
            "{title}: off the grid"
        );
        for (other, [ox, oy, ow, oh]) in &boxes {
            let apart = x + w <= *ox || *ox + ow <= x || y + h <= *oy || *oy + oh <= y;
            assert!(apart, "{title} overlaps {other}");
        }
        boxes.push((title, [x, y, w, h]));
        if is_row(panel) {
            continue;
        }
        assert_eq!(panel["datasource"], datasource(), "{title}");
        assert!(
            panel["description"].as_str().is_some_and(|d| d.len() > 20),
            "{title}: say what the panel shows"
        );
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        assert!(!targets.is_empty(), "{title}: no queries");
        for target in targets {
            assert_eq!(target["datasource"], datasource(), "{title}");
            let expr = target["expr"].as_str().unwrap_or("");
            assert!(!expr.trim().is_empty(), "{title}: a target without expr");
            assert!(!expr.contains("[["), "{title}: old [[var]] syntax");
        }
    }
    assert!(boxes.len() >= 10, "expected the issue's panels");
}

#[test]
fn every_selector_filters_and_every_counter_is_rated() {
    for query in queries(&load()) {
        let expr = &query.expr;
        let uses = metric_uses(expr);
        assert!(!uses.is_empty(), "{}: reads no gpumem metric", query.panel);
        for (at, name) in uses {
            let after = &expr[at + name.len()..];
            let labels = selector_labels(expr, at, name);
            assert!(
                labels.contains("instance=~\"$instance\""),
                "{}: {name} should be filtered by $instance",
                query.panel
            );
            if name.ends_with("_total") {
                let before = expr[..at].trim_end();
                assert!(
                    before.ends_with("rate(") || before.ends_with("increase("),
                    "{}: the counter {name} needs rate() or increase()",
                    query.panel
                );
                assert!(
                    after.contains("[$__rate_interval]"),
                    "{}: rate {name} over $__rate_interval",
                    query.panel
                );
            }
        }
    }
}

#[test]
fn the_dashboard_and_the_alerts_use_only_metrics_the_demo_serves() {
    let (served, per_gpu) = families(&super::demo_metrics());
    let dashboard = load();
    let mut used = BTreeSet::new();
    for query in queries(&dashboard) {
        for (at, name) in metric_uses(&query.expr) {
            let sidecar = SIDECAR_METRICS.contains(&name);
            assert!(
                served.contains(name) || sidecar,
                "{}: the demo serves no {name}",
                query.panel
            );
            // Every sidecar family but the count of exited processes is per GPU.
            let sidecar_per_gpu = sidecar && name != "gpumem_collect_exited_processes";
            if per_gpu.contains(name) || sidecar_per_gpu {
                assert!(
                    selector_labels(&query.expr, at, name).contains("gpu=~\"$gpu\""),
                    "{}: {name} should be filtered by $gpu",
                    query.panel
                );
            }
            used.insert(name.to_string());
        }
    }
    for variable in variable_queries(&dashboard) {
        for name in metric_names(&variable.selector) {
            assert!(
                served.contains(&name),
                "variable {}: no {name}",
                variable.name
            );
        }
    }
    for rule in super::rules::alert_rules() {
        for name in metric_names(&rule.expr) {
            assert!(
                served.contains(&name),
                "{}: the demo serves no {name}",
                rule.name
            );
        }
    }
    // The panels, by the metrics they need.
    for needed in [
        "gpumem_device_memory_used_bytes",
        "gpumem_device_memory_free_bytes",
        "gpumem_pressure_level",
        "gpumem_pool_reserved_bytes",
        "gpumem_pool_in_use_bytes",
        "gpumem_pool_hits_total",
        "gpumem_pool_requests_total",
        "gpumem_pool_fragmentation_ratio",
        "gpumem_live_allocations",
        "gpumem_leak_suspect_allocations",
        "gpumem_oldest_allocation_age_seconds",
        "gpumem_ooms_total",
        "gpumem_oom_retries_total",
        "gpumem_cpu_fallbacks_total",
    ]
    .into_iter()
    .chain(SIDECAR_METRICS.iter().copied())
    {
        assert!(used.contains(needed), "no panel shows {needed}");
    }
}

#[test]
fn substitution_fills_every_form_and_refuses_unknown_variables() {
    let values = [("instance", "127.0.0.1:9400"), ("__rate_interval", "4s")];
    assert_eq!(
        substitute(
            "rate(x{instance=~\"$instance\"}[$__rate_interval]) ${instance:regex}",
            &values
        ),
        Ok("rate(x{instance=~\"127.0.0.1:9400\"}[4s]) 127.0.0.1:9400".to_string())
    );
    assert!(substitute("x{gpu=~\"$gpu\"}", &values).is_err_and(|e| e.contains("$gpu")));
    assert!(substitute("x{gpu=~\"${gpu\"}", &values).is_err());
}
