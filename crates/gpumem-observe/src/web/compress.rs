//! gzip for responses that are worth it: the page, `/metrics`, the JSON API. An hour of history
//! is about 470 KiB of JSON per GPU and compresses about tenfold. Only when the client asks
//! (`Accept-Encoding: gzip`), only for text and JSON over 1 KiB; streamed bodies are not
//! touched (there are none here), and the work runs off the async workers.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::Write;

/// Bodies smaller than this are sent as they are: gzip would save little and cost a header.
const MIN_BYTES: usize = 1024;
/// Bodies larger than this are sent as they are rather than buffered (none is near it).
const MAX_BYTES: usize = 64 << 20;

pub(super) async fn gzip(request: Request, next: Next) -> Response {
    let wants_gzip = request
        .headers()
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.trim().split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        });
    let response = next.run(request).await;
    if !wants_gzip || !compressible(&response) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BYTES).await else {
        // Only an error of the handler's own body gets here; nothing better to send.
        return Response::from_parts(parts, Body::empty());
    };
    if bytes.len() < MIN_BYTES {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let compressed = tokio::task::spawn_blocking(move || {
        let mut encoder = GzEncoder::new(Vec::with_capacity(bytes.len() / 4), Compression::fast());
        encoder
            .write_all(&bytes)
            .and_then(|()| encoder.finish())
            .map_err(|_| bytes)
    })
    .await;
    match compressed {
        Ok(Ok(gzipped)) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            parts
                .headers
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            parts
                .headers
                .append(header::VARY, HeaderValue::from_static("accept-encoding"));
            Response::from_parts(parts, Body::from(gzipped))
        }
        Ok(Err(plain)) => Response::from_parts(parts, Body::from(plain)),
        Err(_) => Response::from_parts(parts, Body::empty()),
    }
}

fn compressible(response: &Response) -> bool {
    if response.headers().contains_key(header::CONTENT_ENCODING) {
        return false;
    }
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| {
            t.starts_with("text/") || t.starts_with("application/json") || t.contains("javascript")
        })
}
