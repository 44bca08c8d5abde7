//! The accept loop behind every HTTP endpoint: HTTP/1.1 connections with a deadline for each
//! request's headers, and a graceful stop.
//!
//! `axum::serve` sets no such deadline, so a client that connected and sent nothing, or
//! trickled a request forever, or left a keep-alive connection idle, held a task and a file
//! descriptor until it went away; enough of them exhaust the descriptors. Here the connection
//! closes when a request's headers (the first, or the next on a kept-alive connection) are not
//! complete within the deadline. Everything past the headers is the router's, as before.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::time::Duration;
use tokio::net::TcpListener;

/// How long a client has to send a request's headers: ample for any real client and for
/// Prometheus, short enough that idle or stalled connections do not pile up.
pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// After an accept error other than a connection reset (out of descriptors, say), wait this
/// long before accepting again rather than spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `shutdown` completes, then lets in-flight requests finish
/// (connections close after their current response).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with_header_timeout(listener, app, shutdown, HEADER_READ_TIMEOUT).await
}

/// [`serve`] with another header deadline (tests use a short one).
pub async fn serve_with_header_timeout(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    header_timeout: Duration,
) -> io::Result<()> {
    let connections = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    if !is_connection_error(&error) {
                        tracing::warn!("accepting a connection failed: {error}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small responses: send them at once rather than wait for more to coalesce.
        let _ = stream.set_nodelay(true);
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = connections.watch(connection);
        tokio::spawn(async move {
            // A client that vanishes or misses the deadline is not the server's error.
            let _ = connection.await;
        });
    }
    drop(listener);
    connections.shutdown().await;
    Ok(())
}

fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
