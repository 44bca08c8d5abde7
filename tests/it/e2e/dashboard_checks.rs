//! `grafana/dashboard.json`'s structure checked: the `${datasource}` variable on every panel,
//! query and annotation, an expression in every target, instance and GPU filters on every
//! selector, namespace and pod filters (and groupings) on every per-pod one, legends by pod,
//! counters only under `rate()`/`increase()`, panels on the grid without overlap, and only metric
//! names that a running demo serves (the alert rules' as well).

use super::dashboard::{
    all_queries, annotation_queries, datasource, device_wide, is_row, load, metric_names,
    metric_uses, panels, selector_labels, substitute, variable_queries, variables, DASHBOARD_FILE,
    PER_EXPORTER, SIDECAR_METRICS,
};
use super::read_repo_file;
use std::collections::BTreeSet;

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
    for name in ["instance", "gpu", "namespace", "pod"] {
        assert_eq!(var(name)["type"], "query", "{name}");
        assert_eq!(var(name)["datasource"], datasource(), "{name}");
    }
    // Under "All", namespace and pod must also pass series that have no such label (a device's,
    // an in-process exporter's): Grafana's default All is a list of the values found, which
    // would not.
    for name in ["namespace", "pod"] {
        assert_eq!(var(name)["multi"], true, "{name}");
        assert_eq!(var(name)["includeAll"], true, "{name}");
        assert_eq!(var(name)["allValue"], ".*", "{name}");
    }
    let names: Vec<String> = variable_queries(&dashboard)
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["instance", "gpu", "namespace", "pod"]);
    for annotation in dashboard["annotations"]["list"]
        .as_array()
        .expect("annotations")
    {
        let name = annotation["name"].as_str().unwrap_or("?");
        assert_eq!(annotation["datasource"], datasource(), "annotation {name}");
        assert_eq!(annotation["enable"], true, "annotation {name}");
    }

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
    for query in all_queries(&load()) {
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
    for query in all_queries(&dashboard) {
        for (at, name) in metric_uses(&query.expr) {
            let sidecar = SIDECAR_METRICS.contains(&name);
            assert!(
                served.contains(name) || sidecar,
                "{}: the demo serves no {name}",
                query.panel
            );
            // Every sidecar family but the counts of exited processes is per GPU.
            let sidecar_per_gpu = sidecar && !PER_EXPORTER.contains(&name);
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
    // A variable may also read a sidecar family (namespace and pod come from NVML's processes
    // on a node agent), but at least one family it reads must be the demo's, so that the
    // end-to-end test can fill it in.
    for variable in variable_queries(&dashboard) {
        let names = metric_names(&variable.selector);
        for name in &names {
            assert!(
                served.contains(name) || SIDECAR_METRICS.contains(&name.as_str()),
                "variable {}: no {name}",
                variable.name
            );
        }
        assert!(
            names.iter().any(|name| served.contains(name)),
            "variable {}: the demo serves none of {names:?}",
            variable.name
        );
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

/// The series a pod's processes make keep their `namespace` and `pod` through every per-pod
/// query: filtered by the variables, kept by every aggregation, shown in the legend instead of
/// the scrape address; the device-wide ones are left alone; one panel says who holds the GPU.
#[test]
fn per_pod_queries_keep_namespace_and_pod() {
    let dashboard = load();
    let mut per_pod = 0;
    for query in all_queries(&dashboard) {
        let expr = &query.expr;
        for (at, name) in metric_uses(expr) {
            let labels = selector_labels(expr, at, name);
            let filtered = ["namespace=~\"$namespace\"", "pod=~\"$pod\""]
                .iter()
                .all(|m| labels.contains(m));
            if device_wide(name) {
                assert!(
                    !labels.contains("$pod"),
                    "{}: {name} belongs to no pod, so a pod filter empties it",
                    query.panel
                );
                continue;
            }
            assert!(
                filtered,
                "{}: {name} should be filtered by $namespace and $pod",
                query.panel
            );
            per_pod += 1;
        }
        if metric_uses(expr).iter().all(|(_, name)| device_wide(name)) {
            continue;
        }
        for (at, _) in expr.match_indices(" by (") {
            let grouping = expr[at + 5..].split(')').next().unwrap_or("");
            let labels: Vec<&str> = grouping.split(',').map(str::trim).collect();
            assert!(
                labels.contains(&"namespace") && labels.contains(&"pod"),
                "{}: `by ({grouping})` drops namespace or pod",
                query.panel
            );
        }
    }
    assert!(per_pod >= 20, "only {per_pod} per-pod selectors");

    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or("");
            if metric_uses(expr).iter().all(|(_, name)| device_wide(name)) {
                continue;
            }
            let legend = target["legendFormat"].as_str().unwrap_or("");
            assert!(
                legend.contains("{{namespace}}/{{pod}}") && !legend.contains("{{instance}}"),
                "{title}: the legend should name the pod, not the scrape address: {legend}"
            );
        }
    }

    let who = panels(&dashboard)
        .into_iter()
        .find(|p| p["title"] == "Who holds the GPU")
        .expect("a \"Who holds the GPU\" panel");
    let expr = who["targets"][0]["expr"].as_str().unwrap_or("");
    assert!(
        expr.starts_with("sum by (namespace, pod, ") && expr.contains("gpumem_process_used_bytes{"),
        "who holds the GPU: {expr}"
    );
    let marked: Vec<String> = annotation_queries(&dashboard)
        .into_iter()
        .flat_map(|q| metric_names(&q.expr))
        .collect();
    for needed in ["gpumem_ooms_total", "gpumem_pressure_level"] {
        assert!(
            marked.iter().any(|m| m == needed),
            "no annotation marks {needed}"
        );
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
