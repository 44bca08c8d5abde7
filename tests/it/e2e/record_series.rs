//! Turns what a real Prometheus scraped from `gpumem demo --scenario alerts` into a promtool
//! rule-test file: the series the alert rules read, every `step` from the start of the run, as
//! `input_series` (a series that went away, as a stopped exporter's do, goes `stale` as
//! Prometheus marks it), and for each alert the set Prometheus had firing when it first fired,
//! as the expectation a little after that time. `alert_scenario` writes it when asked; the
//! result is `grafana/tests/demo-scenario.yml`, which the promtool tests of `rules` run.

use super::prometheus::Prometheus;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The families the alert rules read (`up` included: Prometheus writes it for each target).
const READ_BY_RULES: [&str; 6] = [
    "up",
    "gpumem_up",
    "gpumem_pressure_level",
    "gpumem_leak_suspect_bytes",
    "gpumem_pool_fragmentation_ratio",
    "gpumem_ooms_total",
];

/// One alert as Prometheus first had it firing: its labels and annotations, and when (seconds
/// after the start of the recording).
pub(super) struct Fired {
    pub name: String,
    pub after_seconds: u64,
    /// Every alert of that name firing then.
    pub alerts: Vec<Value>,
}

/// `series{labels}` as promtool reads it, labels sorted, without `__name__`.
fn series_name(metric: &Value) -> String {
    let labels: BTreeMap<&str, &str> = metric
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != "__name__")
        .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
        .collect();
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).expect("a string")))
        .collect();
    format!(
        "{}{{{}}}",
        metric["__name__"].as_str().unwrap_or(""),
        inner.join(",")
    )
}

/// The values of one series at `points` steps, in promtool's notation: runs of one value as
/// `vxN`, a value missing right after one present as `stale`, other gaps as `_xN`.
fn values_text(values: &BTreeMap<u64, String>, points: u64) -> String {
    let tokens: Vec<String> = (0..points)
        .map(|i| match values.get(&i) {
            Some(v) => v.clone(),
            None if i > 0 && values.contains_key(&(i - 1)) => "stale".to_string(),
            None => "_".to_string(),
        })
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let mut run = 1;
        while i + run < tokens.len() && tokens[i + run] == tokens[i] {
            run += 1;
        }
        out.push(match (tokens[i].as_str(), run) {
            (_, 1) => tokens[i].clone(),
            ("_", n) => format!("_x{n}"),
            ("stale", _) => unreachable!("a stale marker follows a value"),
            (v, n) => format!("{v}x{}", n - 1),
        });
        i += run;
    }
    out.join(" ")
}

/// The promtool test file: recorded series from `start` (Unix seconds) every `step` seconds for
/// `points` steps, and what fired.
pub(super) fn test_file(
    prometheus: &Prometheus,
    start: f64,
    step: u64,
    points: u64,
    fired: &[Fired],
    header: &str,
) -> String {
    let end = start + (step * (points - 1)) as f64;
    let mut out = String::new();
    for line in header.lines() {
        let _ = writeln!(out, "# {line}");
    }
    let _ = writeln!(
        out,
        "rule_files:\n  - ../alerts.yml\nevaluation_interval: {step}s\ntests:"
    );
    let _ = writeln!(out, "  - interval: {step}s\n    input_series:");
    for family in READ_BY_RULES {
        let series = prometheus
            .query_range(family, start, end, step as f64)
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        for s in series {
            let values: BTreeMap<u64, String> = s["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|point| {
                    let at = point[0].as_f64()?;
                    let index = ((at - start) / step as f64).round() as u64;
                    Some((index, point[1].as_str()?.to_string()))
                })
                .collect();
            let _ = writeln!(
                out,
                "      - series: '{}'\n        values: '{}'",
                series_name(&s["metric"]),
                values_text(&values, points)
            );
        }
    }
    let _ = writeln!(out, "    alert_rule_test:");
    for alert in fired {
        // Quiet at the start: nothing has been true long enough.
        let _ = writeln!(
            out,
            "      - eval_time: 0s\n        alertname: {}\n        exp_alerts: []",
            alert.name
        );
    }
    for alert in fired {
        // The next evaluation after Prometheus had it firing.
        let at = (alert.after_seconds / step + 1) * step;
        let _ = writeln!(
            out,
            "      - eval_time: {at}s\n        alertname: {}\n        exp_alerts:",
            alert.name
        );
        for one in &alert.alerts {
            let _ = writeln!(out, "          - exp_labels:");
            write_map(&mut out, &one["labels"], &["alertname"]);
            let _ = writeln!(out, "            exp_annotations:");
            write_map(&mut out, &one["annotations"], &[]);
        }
    }
    out
}

fn write_map(out: &mut String, map: &Value, skip: &[&str]) {
    for (k, v) in map.as_object().into_iter().flatten() {
        if skip.contains(&k.as_str()) {
            continue;
        }
        let text = serde_json::to_string(v.as_str().unwrap_or("")).expect("a string");
        let _ = writeln!(out, "              {k}: {text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_run_together_and_gaps_go_stale() {
        let values: BTreeMap<u64, String> = [(0, "1"), (1, "1"), (2, "1"), (5, "2")]
            .into_iter()
            .map(|(i, v)| (i, v.to_string()))
            .collect();
        assert_eq!(values_text(&values, 7), "1x2 stale _ 2 stale");
        assert_eq!(values_text(&BTreeMap::new(), 3), "_x3");
        let metric = serde_json::json!({"__name__": "up", "job": "gpumem", "instance": "a:1"});
        assert_eq!(series_name(&metric), r#"up{instance="a:1",job="gpumem"}"#);
    }
}
