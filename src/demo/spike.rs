//! The demo's pressure spike: a switch that, while on, makes the workload push its devices to
//! critical pressure — so the pressure alert can be tried out on demand, by `--spike-at` or by
//! `POST /api/v1/demo/pressure-spike?seconds=N` (a route only the demo serves).

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a spike lasts unless asked otherwise: long enough for a `for: 15s` alert to fire.
pub(crate) const DEFAULT_SPIKE: Duration = Duration::from_secs(45);
const LONGEST_SPIKE: Duration = Duration::from_secs(3600);

/// Whether a spike is on; shared by the workload (reader) and the route (writer).
#[derive(Debug)]
pub(crate) struct PressureSpike {
    epoch: Instant,
    /// Milliseconds after `epoch` at which the current spike ends (0: none yet).
    until_ms: AtomicU64,
}

impl Default for PressureSpike {
    fn default() -> Self {
        PressureSpike {
            epoch: Instant::now(),
            until_ms: AtomicU64::new(0),
        }
    }
}

impl PressureSpike {
    /// Starts a spike lasting `length` from now (replacing any current one).
    pub(crate) fn trigger(&self, length: Duration) {
        let until = self.epoch.elapsed() + length;
        self.until_ms.store(until.as_millis() as u64, Relaxed);
        tracing::info!(
            "pressure spike for {}",
            gpumem::units::format_duration(length)
        );
    }

    pub(crate) fn is_on(&self) -> bool {
        (self.epoch.elapsed().as_millis() as u64) < self.until_ms.load(Relaxed)
    }
}

#[derive(Deserialize)]
struct SpikeQuery {
    seconds: Option<u64>,
}

/// `POST /api/v1/demo/pressure-spike[?seconds=N]`.
pub(super) fn routes(spike: Arc<PressureSpike>) -> Router {
    Router::new()
        .route("/api/v1/demo/pressure-spike", post(start_spike))
        .with_state(spike)
}

/// The header a state-changing request must carry (any value), unless its body is JSON. An
/// HTML form on another site can POST here but can set neither: a browser sends a custom
/// header or a JSON content type cross-origin only after a CORS preflight, which this server
/// never approves.
pub(super) const REQUEST_HEADER: &str = "x-gpumem-request";

fn from_a_script(headers: &HeaderMap) -> bool {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    json || headers.contains_key(REQUEST_HEADER)
}

async fn start_spike(
    State(spike): State<Arc<PressureSpike>>,
    Query(query): Query<SpikeQuery>,
    headers: HeaderMap,
) -> Response {
    if !from_a_script(&headers) {
        return (
            StatusCode::FORBIDDEN,
            "send the header X-Gpumem-Request: 1 (or a JSON body): a cross-site form cannot, \
             so it cannot start a spike\n",
        )
            .into_response();
    }
    let length = query.seconds.map_or(DEFAULT_SPIKE, Duration::from_secs);
    if length.is_zero() || length > LONGEST_SPIKE {
        return (
            StatusCode::BAD_REQUEST,
            format!(
                "seconds must be between 1 and {}\n",
                LONGEST_SPIKE.as_secs()
            ),
        )
            .into_response();
    }
    spike.trigger(length);
    (
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "spike_seconds": length.as_secs() })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spike_is_on_until_it_ends() {
        let spike = PressureSpike::default();
        assert!(!spike.is_on());
        spike.trigger(Duration::from_secs(60));
        assert!(spike.is_on());
        spike.trigger(Duration::ZERO);
        assert!(!spike.is_on());
    }
}
