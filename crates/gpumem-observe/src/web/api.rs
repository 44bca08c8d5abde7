//! The JSON API and the health check: `/api/v1/snapshot`, `/api/v1/history`, `/api/v1/oom`,
//! `/healthz`.

use super::WebState;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpumem::units::format_duration;
use serde::Deserialize;
use std::sync::Arc;

const JSON: &str = "application/json";

/// The latest snapshot, as it is (see `gpumem_wire::Snapshot` for the fields); serialised
/// once per sample.
pub(super) async fn snapshot(State(state): State<WebState>, request: HeaderMap) -> Response {
    let sample = state.latest();
    let render_from = Arc::clone(&sample);
    let body = state.bodies.snapshot.get(&sample, true, move || {
        serde_json::to_vec(&render_from.snapshot)
            .map_err(|error| format!("could not encode the snapshot: {error}"))
    });
    super::shared(body.await, &request, JSON, &[]).await
}

#[derive(Debug, Deserialize)]
pub(super) struct HistoryQuery {
    /// Only points taken after this Unix time: lets the chart fetch what is new.
    since: Option<f64>,
}

/// The flight recorder's latest records, newest first, and where they are written.
pub(super) async fn oom(State(state): State<WebState>) -> Response {
    #[derive(serde::Serialize)]
    struct Reply<'a> {
        dir: Option<&'a str>,
        records: Vec<&'a crate::flight::FlightRecord>,
    }
    let latest = state.flight.latest();
    Json(Reply {
        dir: state.flight.dir.as_deref(),
        records: latest.iter().map(AsRef::as_ref).collect(),
    })
    .into_response()
}

/// The whole ring (what the page asks for first) is serialised once per sample; a `since`
/// after the oldest point (the page's updates: a few points) per request.
pub(super) async fn history(
    State(state): State<WebState>,
    Query(query): Query<HistoryQuery>,
    request: HeaderMap,
) -> Response {
    let whole = match (query.since, state.history.oldest_timestamp()) {
        (None, _) | (_, None) => true,
        (Some(since), Some(oldest)) => since.is_nan() || since < oldest,
    };
    if !whole {
        return Json(state.history.reply_since(query.since)).into_response();
    }
    let sample = state.latest();
    let history = Arc::clone(&state.history);
    let body = state.bodies.history.get(&sample, true, move || {
        serde_json::to_vec(&history.reply_since(None))
            .map_err(|error| format!("could not encode the history: {error}"))
    });
    super::shared(body.await, &request, JSON, &[]).await
}

/// 200 "ok" while samples succeed and keep coming; 503 with the reason otherwise. A collector's
/// source that is down but optional (NVML on a host without it) keeps 200 and is listed: a
/// liveness probe must not restart what a restart cannot fix.
pub(super) async fn healthz(State(state): State<WebState>) -> Response {
    let sample = state.latest();
    let health = &sample.snapshot.health;
    if !health.latest_ok {
        let reason = health
            .last_error
            .as_deref()
            .unwrap_or("no sample has been taken yet");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("sampling failed: {reason}\n"),
        )
            .into_response();
    }
    if sample.is_stale(state.interval) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "sampling stalled: the latest sample is {} old (interval {})\n",
                format_duration(sample.taken_at.elapsed()),
                format_duration(state.interval)
            ),
        )
            .into_response();
    }
    // In-process nothing is collected: nothing degraded, no notes.
    let collected = sample.snapshot.collected();
    let degraded = collected.degraded();
    let notes = collected.notes();
    let mut body = String::from("ok");
    if !degraded.is_empty() {
        body.push_str(&format!(", degraded:\n{}", degraded.join("\n")));
    }
    if !notes.is_empty() {
        body.push_str(&format!("\nnote:\n{}", notes.join("\n")));
    }
    body.push('\n');
    (StatusCode::OK, body).into_response()
}
