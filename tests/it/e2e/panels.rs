//! `grafana/dashboard.json` asked of a live Prometheus as Grafana asks it, for the end-to-end
//! tests of the demo and the node agent: every panel's query with the variables filled in (which
//! return no data, and which series they return), and each template variable's values through
//! the label values API that Grafana's `label_values(SELECTOR, LABEL)` calls.

use super::dashboard::{self, PanelQuery};
use super::prometheus::Prometheus;
use crate::web::eventually;
use serde_json::Value;
use std::time::Duration;

/// What the tests fill the variables in with, as Grafana would for the pod picked at the top.
pub(super) type Values<'a> = [(&'a str, &'a str)];

/// The dashboard's panel queries, each with its variables filled in from `values`.
pub(super) fn filled_queries(board: &Value, values: &Values) -> Vec<(PanelQuery, String)> {
    dashboard::queries(board)
        .into_iter()
        .map(|query| {
            let promql = dashboard::substitute(&query.expr, values)
                .unwrap_or_else(|e| panic!("{}: {e}", query.panel));
            (query, promql)
        })
        .collect()
}

/// The panel queries that return no data within `limit` (one line each: panel, query, why),
/// and how many were asked. Queries `parse_only` picks need only be valid PromQL (families the
/// exporter under test cannot have). A query may need one more scrape or rule evaluation, so
/// each is asked again until all answer or the time is up.
pub(super) fn queries_without_data(
    prometheus: &Prometheus,
    board: &Value,
    values: &Values,
    limit: Duration,
    parse_only: impl Fn(&PanelQuery) -> bool,
) -> (usize, Vec<String>) {
    let mut empty = Vec::new();
    let mut waiting = Vec::new();
    for (query, promql) in filled_queries(board, values) {
        if !parse_only(&query) {
            waiting.push((query.panel, promql));
        } else if let Err(why) = prometheus.query(&promql) {
            empty.push(format!("{}: {promql}: {why}", query.panel));
        }
    }
    let asked = waiting.len();
    eventually(limit, || {
        waiting.retain(|(_, promql)| !prometheus.query(promql).is_ok_and(|r| !r.is_empty()));
        waiting.is_empty()
    });
    for (panel, promql) in waiting {
        let why = prometheus.query(&promql).err().unwrap_or("no data".into());
        empty.push(format!("{panel}: {promql}: {why}"));
    }
    (asked, empty)
}

/// The values Grafana would list for the variable `name`, the variables before it filled in
/// from `values`: its selector and label asked of the label values API over the last hour.
pub(super) fn variable_values(
    prometheus: &Prometheus,
    board: &Value,
    name: &str,
    values: &Values,
) -> Result<Vec<String>, String> {
    let variable = dashboard::variable_queries(board)
        .into_iter()
        .find(|v| v.name == name)
        .ok_or_else(|| format!("no variable {name}"))?;
    let selector = dashboard::substitute(&variable.selector, values)?;
    prometheus.label_values(&selector, &variable.label)
}

/// Every variable the dashboard asks Prometheus for, with the values it lists now.
/// Fails naming every query in `empty` (what `queries_without_data` found) and every variable
/// of the dashboard whose query lists nothing.
pub(super) fn assert_all_have_data(
    prometheus: &Prometheus,
    board: &Value,
    values: &Values,
    mut empty: Vec<String>,
) {
    for (name, listed) in all_variable_values(prometheus, board, values) {
        if !listed.as_ref().is_ok_and(|v| !v.is_empty()) {
            empty.push(format!("variable {name}: {listed:?}"));
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}",
        empty.join("\n")
    );
}

pub(super) fn all_variable_values(
    prometheus: &Prometheus,
    board: &Value,
    values: &Values,
) -> Vec<(String, Result<Vec<String>, String>)> {
    dashboard::variable_queries(board)
        .into_iter()
        .map(|v| {
            let listed = variable_values(prometheus, board, &v.name, values);
            (v.name, listed)
        })
        .collect()
}
