//! The HTTP side: an axum router over the latest sample and the history ring. Handlers read
//! snapshots only — never an allocator lock, never the driver — so a scrape cannot slow the
//! allocator down, and a stuck driver cannot hang a scrape.
//!
//! Routes: `/metrics`, `/` (status page), `/api/v1/snapshot`, `/api/v1/history`, `/api/v1/oom`
//! (the flight recorder's latest records), `/healthz`,
//! `/static/{file}`; anything else is 404, a known path with the wrong method is 405.

mod api;
mod assets;
mod compress;
pub(crate) mod format;
pub(crate) mod host;
pub mod metrics;
pub mod page;
pub mod runbook;
pub mod runtime;
mod server;

pub use server::{serve, serve_with_header_timeout};

use crate::flight::FlightLog;
use crate::history::{History, Sample};
use askama::Template;
use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What every handler reads: the latest sample and the history.
#[derive(Clone)]
pub struct WebState {
    latest: watch::Receiver<Arc<Sample>>,
    history: Arc<History>,
    interval: Duration,
    /// The OOM flight recorder's latest records (`/api/v1/oom`, the page).
    flight: Arc<FlightLog>,
    /// Where the page's hints link to: the runbook, `/runbook` unless configured.
    runbook: Arc<str>,
}

/// The runbook every gpumem serves itself (docs/runbook.md).
pub const DEFAULT_RUNBOOK: &str = "/runbook";

impl WebState {
    pub fn new(
        latest: watch::Receiver<Arc<Sample>>,
        history: Arc<History>,
        interval: Duration,
    ) -> Self {
        WebState {
            latest,
            history,
            interval,
            flight: Arc::default(),
            runbook: Arc::from(DEFAULT_RUNBOOK),
        }
    }

    /// Links the page's hints to this runbook URL instead of `/runbook`.
    pub fn with_runbook(mut self, url: &str) -> Self {
        self.runbook = Arc::from(url.trim_end_matches('#'));
        self
    }

    /// Serves the records of this flight recorder.
    pub fn with_flight(mut self, flight: Arc<FlightLog>) -> Self {
        self.flight = flight;
        self
    }

    /// The latest sample; cloning the `Arc` releases the channel's lock at once.
    fn latest(&self) -> Arc<Sample> {
        Arc::clone(&self.latest.borrow())
    }
}

/// The exporter's routes, plus `extra` ones (the demo adds its own), answering only requests
/// whose `Host` is allowed (see `host`).
pub fn router(state: WebState, extra: Option<Router>, hosts: host::AllowedHosts) -> Router {
    let app = Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics_text))
        .route("/api/v1/snapshot", get(api::snapshot))
        .route("/api/v1/history", get(api::history))
        .route("/api/v1/oom", get(api::oom))
        .route("/healthz", get(api::healthz))
        .route("/runbook", get(runbook::serve))
        .route("/static/{file}", get(assets::serve))
        .with_state(state);
    let app = match extra {
        Some(extra) => app.merge(extra),
        None => app,
    };
    app.fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            hosts,
            host::check_host,
        ))
        .layer(axum::middleware::from_fn(compress::gzip))
}

async fn metrics_text(State(state): State<WebState>) -> Response {
    let sample = state.latest();
    let fresh = !sample.is_stale(state.interval);
    // Encoding is CPU work proportional to devices and pools: keep it off the async workers.
    let rendered =
        tokio::task::spawn_blocking(move || metrics::render(&sample.snapshot, fresh)).await;
    match rendered {
        Ok(Ok(text)) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Ok(Err(error)) => internal_error(format!("could not encode the metrics: {error}")),
        Err(error) => internal_error(format!("rendering the metrics failed: {error}")),
    }
}

async fn index(State(state): State<WebState>) -> Response {
    let sample = state.latest();
    let fresh = !sample.is_stale(state.interval);
    let page = page::IndexPage::new(&sample.snapshot, fresh)
        .with_hints(&sample.snapshot, fresh, &state.runbook)
        .with_oom_records(&state.flight.latest());
    match page.render() {
        Ok(html) => ([(header::CACHE_CONTROL, "no-store")], Html(html)).into_response(),
        Err(error) => internal_error(format!("could not render the page: {error}")),
    }
}

async fn not_found(uri: Uri) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!(
            "not found: {}\nendpoints: / /metrics /api/v1/snapshot /api/v1/history /api/v1/oom /healthz /runbook\n",
            uri.path()
        ),
    )
        .into_response()
}

fn internal_error(message: String) -> Response {
    tracing::error!("{message}");
    (StatusCode::INTERNAL_SERVER_ERROR, format!("{message}\n")).into_response()
}
