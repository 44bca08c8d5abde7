//! The HTTP side: an axum router over the latest sample and the history ring. Handlers read
//! snapshots only — never an allocator lock, never the driver — so a scrape cannot slow the
//! allocator down, and a stuck driver cannot hang a scrape.
//!
//! Routes: `/metrics`, `/` (status page), `/api/v1/snapshot`, `/api/v1/history`, `/api/v1/oom`
//! (the flight recorder's latest records), `/healthz`,
//! `/static/{file}`; anything else is 404, a known path with the wrong method is 405.

mod api;
mod assets;
mod cache;
mod compress;
pub(crate) mod format;
pub(crate) mod host;
pub mod metrics;
pub mod page;
mod reclaim;
pub mod runbook;
pub mod runtime;
mod server;
mod stall;

pub use server::{
    default_max_connections, listen, serve, serve_with, serve_with_header_timeout, ServerLimits,
    MAX_CONNECTIONS_CEILING, MIN_CONNECTIONS, RESPONSE_TIMEOUT, SEND_BUFFERS_TOTAL, STALL_TIMEOUT,
};

use crate::flight::FlightLog;
use crate::history::{History, Sample};
use askama::Template;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
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
    /// The large bodies, rendered once per sample and shared (`cache`).
    bodies: Arc<cache::Bodies>,
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
            bodies: Arc::default(),
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

async fn metrics_text(State(state): State<WebState>, request: HeaderMap) -> Response {
    let sample = state.latest();
    let fresh = !sample.is_stale(state.interval);
    let render_from = Arc::clone(&sample);
    let body = state.bodies.metrics.get(&sample, fresh, move || {
        metrics::render(&render_from.snapshot, fresh)
            .map(String::into_bytes)
            .map_err(|error| format!("could not encode the metrics: {error}"))
    });
    shared(body.await, &request, metrics::CONTENT_TYPE, &[]).await
}

async fn index(State(state): State<WebState>, request: HeaderMap) -> Response {
    let sample = state.latest();
    let fresh = !sample.is_stale(state.interval);
    let (render_from, runbook, flight) = (
        Arc::clone(&sample),
        Arc::clone(&state.runbook),
        Arc::clone(&state.flight),
    );
    let body = state.bodies.page.get(&sample, fresh, move || {
        let snapshot = &render_from.snapshot;
        page::IndexPage::new(snapshot, fresh)
            .with_hints(snapshot, fresh, &runbook)
            .with_oom_records(&flight.latest())
            .render()
            .map(String::into_bytes)
            .map_err(|error| format!("could not render the page: {error}"))
    });
    shared(
        body.await,
        &request,
        "text/html; charset=utf-8",
        &page_headers(),
    )
    .await
}

/// What the page's responses say besides their body: never cached (it is live), never framed
/// (clickjacking), never sniffed as another type, and scripts, styles and requests from this
/// server only (the bar widths are inline `style` attributes, hence `'unsafe-inline'` for
/// styles; no inline script runs).
pub(crate) fn page_headers() -> [(header::HeaderName, HeaderValue); 4] {
    [
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                 img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; \
                 frame-ancestors 'none'",
            ),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ]
}

/// A response with a shared body: its gzip form when the client takes gzip and the body is
/// worth compressing, else the plain bytes (both shared, neither copied).
pub(super) async fn shared(
    body: Result<Arc<cache::Body>, String>,
    request: &HeaderMap,
    content_type: &'static str,
    extra: &[(header::HeaderName, HeaderValue)],
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(message) => return internal_error(message),
    };
    let gzipped = match compress::wants_gzip(request) {
        true => body.gzip().await,
        false => None,
    };
    let mut response = match gzipped {
        Some(bytes) => {
            let mut response = axum::body::Body::from(bytes).into_response();
            compress::mark_gzip(response.headers_mut());
            response
        }
        None => axum::body::Body::from(body.plain.clone()).into_response(),
    };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    for (name, value) in extra {
        headers.insert(name.clone(), value.clone());
    }
    response
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
