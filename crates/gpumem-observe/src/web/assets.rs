//! `/static/...`: the stylesheet, the chart script and the icon, compiled into the binary so the
//! page needs no files on disk and nothing from the network. The files live in the repository's
//! top-level `static/` (and the page's template in `templates/`); this crate's `static` and
//! `templates` are links to them, which packaging (the Python sdist) turns into copies.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// Name, content type and bytes of each embedded file.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/static/style.css")),
    ),
    (
        "chart.js",
        "text/javascript; charset=utf-8",
        include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/static/chart.js")),
    ),
    (
        "live.js",
        "text/javascript; charset=utf-8",
        include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/static/live.js")),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/static/favicon.svg")),
    ),
];

pub(super) async fn serve(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(file, _, _)| *file == name) {
        Some((_, content_type, bytes)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                // Short: the files change with the binary, and an upgrade should show at once.
                (header::CACHE_CONTROL, "public, max-age=300"),
            ],
            *bytes,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no such file: /static/{name}\n"),
        )
            .into_response(),
    }
}
