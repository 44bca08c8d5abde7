//! gzip for responses that are worth it: the page, `/metrics`, the JSON API. An hour of history
//! is about 470 KiB of JSON per GPU and compresses about tenfold. Only when the client asks
//! (`Accept-Encoding: gzip`), only for text and JSON over 1 KiB; streamed bodies are not
//! touched (there are none here), and the work runs off the async workers. The bodies shared
//! between requests (`cache`) come already compressed and pass through untouched.

use super::cache::MIN_GZIP_BYTES;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::Write;

/// Bodies larger than this are sent as they are rather than buffered (none is near it).
const MAX_BYTES: usize = 64 << 20;

/// Whether the request accepts a gzip body (`gzip` or `*`, not refused with `q=0`).
pub(super) fn wants_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.trim().split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// `bytes` compressed (fast level: the body is made once per sample, but on the scrape's
/// path); `None` if the encoder fails.
pub(super) fn gzip_bytes(bytes: &[u8]) -> Option<Bytes> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(bytes.len() / 4), Compression::fast());
    encoder.write_all(bytes).ok()?;
    encoder.finish().ok().map(Bytes::from)
}

/// Marks `parts` as carrying a gzip body.
pub(super) fn mark_gzip(headers: &mut HeaderMap) {
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
}

pub(super) async fn gzip(request: Request, next: Next) -> Response {
    let wants_gzip = wants_gzip(request.headers());
    let response = next.run(request).await;
    if !wants_gzip || !compressible(&response) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BYTES).await else {
        // Only an error of the handler's own body gets here; nothing better to send.
        return Response::from_parts(parts, Body::empty());
    };
    if bytes.len() < MIN_GZIP_BYTES {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let compressed = tokio::task::spawn_blocking(move || gzip_bytes(&bytes).ok_or(bytes)).await;
    match compressed {
        Ok(Ok(gzipped)) => {
            mark_gzip(&mut parts.headers);
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
