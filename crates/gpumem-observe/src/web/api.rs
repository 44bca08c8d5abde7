//! The JSON API and the health check: `/api/v1/snapshot`, `/api/v1/history`, `/api/v1/oom`,
//! `/healthz`.

use super::WebState;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpumem::units::format_duration;
use serde::Deserialize;

/// The latest snapshot, as it is (see `gpumem::snapshot::Snapshot` for the fields).
pub(super) async fn snapshot(State(state): State<WebState>) -> Response {
    let sample = state.latest();
    Json(&sample.snapshot).into_response()
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

pub(super) async fn history(
    State(state): State<WebState>,
    Query(query): Query<HistoryQuery>,
) -> Response {
    Json(state.history.reply_since(query.since)).into_response()
}

/// 200 "ok" while samples succeed and keep coming; 503 with the reason otherwise. A sidecar
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
    let sidecar = sample.snapshot.sidecar.as_ref();
    let degraded = sidecar.map(|s| s.degraded()).unwrap_or_default();
    let notes = sidecar.map(|s| s.notes()).unwrap_or_default();
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
