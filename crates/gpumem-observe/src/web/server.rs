//! The accept loop behind every HTTP endpoint: HTTP/1.1 connections with a deadline for each
//! request's headers, a deadline on a connection that moves no byte (`stall`), a cap on the
//! connections served at once with a few kept for `/healthz`, and a graceful stop.
//!
//! `axum::serve` sets no such deadline, so a client that connected and sent nothing, or
//! trickled a request forever, or left a keep-alive connection idle, held a task and a file
//! descriptor until it went away; enough of them exhaust the descriptors. Here the connection
//! closes when a request's headers (the first, or the next on a kept-alive connection) are not
//! complete within the deadline, and when the client stops reading a response.
//!
//! The cap: every connection costs a descriptor and a task with its buffers, so at most
//! `max_connections` are served at once, by default well below the process's descriptor limit
//! (`RLIMIT_NOFILE`) and what fits a collector's memory limit. A small reserve of them is kept
//! for the moment the rest are taken: a connection in the reserve is answered only for `/healthz`
//! (anything else gets 503 and a `Retry-After`), with short deadlines and no keep-alive, so a
//! liveness probe still gets its answer while scrapers flood the server. With the reserve full
//! too, a new connection takes the slot of the oldest connection with no request in flight
//! (`reclaim`: a flood of silent, stalled or idle connections cannot keep a probe out), and
//! when every connection has a request in flight, new ones wait in the kernel's listen queue,
//! which costs no descriptor.

use super::reclaim;
use super::stall::Stalling;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a client has to send a request's headers: ample for any real client and for
/// Prometheus, short enough that idle or stalled connections do not pile up.
pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may move no byte while it waits to read or write: a client that stops
/// reading its response is dropped after this (Prometheus's own scrape timeout is 10 s).
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The most one response may take to send once the server starts writing it, however steadily
/// the client reads (a minute: a 3 MB `/metrics` at 50 KiB/s).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// What the kernel may buffer for the server's unsent responses, all connections together:
/// each connection's send buffer is this divided by the connection cap (16 KiB to 256 KiB),
/// instead of the kernel's autotuning up to `tcp_wmem`'s 4 MiB. Linux counts twice the size
/// set (its bookkeeping), so the kernel memory bound is 2 x this (docs/reliability.md).
pub const SEND_BUFFERS_TOTAL: usize = 32 << 20;
const SEND_BUFFER_MIN: usize = 16 << 10;
const SEND_BUFFER_MAX: usize = 256 << 10;

/// Both deadlines for a connection in the reserve: a health probe sends its request at once,
/// but under a flood its packets may be dropped and resent (the listen queue overflows).
const RESERVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The listen queue: connections waiting to be accepted, which cost no descriptor. The
/// standard library's 128 overflowed under a burst of scrapes, and a dropped handshake or
/// request is resent only after a second or more (the kernel caps this at `somaxconn`).
const LISTEN_BACKLOG: i32 = 1024;
/// The default cap never exceeds this: at about 20 KiB of buffers and task per connection
/// (docs/reliability.md), 1,024 connections stay a small part of a 128 MiB limit.
pub const MAX_CONNECTIONS_CEILING: usize = 1024;
/// The fewest connections a cap may allow: one for requests, one in the reserve and some room.
pub const MIN_CONNECTIONS: usize = 4;

/// How long a connection accepted beyond the cap waits for the slot of the idle connection
/// it closed (its task only has to run once).
const RECLAIM_WAIT: Duration = Duration::from_secs(1);

/// The least time between two lines about the connection cap.
const CAP_LOG_GAP: Duration = Duration::from_secs(60);

/// After an accept error other than a connection reset (out of descriptors, say), wait this
/// long before accepting again rather than spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What the server allows each connection, and how many at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once, the `/healthz` reserve included (at least [`MIN_CONNECTIONS`]).
    pub max_connections: usize,
    /// How long a request's headers may take.
    pub header_timeout: Duration,
    /// How long a connection may move no byte while waiting to read or write.
    pub stall_timeout: Duration,
    /// How long one response may take to send once begun ([`RESPONSE_TIMEOUT`]).
    pub response_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: default_max_connections(),
            header_timeout: HEADER_READ_TIMEOUT,
            stall_timeout: STALL_TIMEOUT,
            response_timeout: RESPONSE_TIMEOUT,
        }
    }
}

impl ServerLimits {
    /// Of `max_connections`, how many are kept for `/healthz`.
    pub fn reserved(&self) -> usize {
        (self.max_connections / 16).clamp(1, 16)
    }

    /// Each connection's send buffer: [`SEND_BUFFERS_TOTAL`] shared by the cap.
    pub fn send_buffer_bytes(&self) -> usize {
        (SEND_BUFFERS_TOTAL / self.max_connections.max(MIN_CONNECTIONS))
            .clamp(SEND_BUFFER_MIN, SEND_BUFFER_MAX)
    }
}

/// The cap derived from this process's descriptor limit: the soft `RLIMIT_NOFILE` less room for
/// everything else the process opens (libraries, the collect directory's files, `/proc`,
/// NVML: 32 plus an eighth), at most [`MAX_CONNECTIONS_CEILING`].
pub fn default_max_connections() -> usize {
    let limit = open_files_limit().unwrap_or(1024);
    let headroom = 32 + limit / 8;
    limit
        .saturating_sub(headroom)
        .clamp(MIN_CONNECTIONS, MAX_CONNECTIONS_CEILING)
}

/// The soft limit on open files, from `/proc/self/limits` (no system call needed); `None` where
/// it cannot be read.
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    match soft {
        "unlimited" => Some(usize::MAX),
        number => number.parse().ok(),
    }
}

/// A non-blocking listener on `addr` with a listen queue of 1,024 (address reuse as
/// the standard library sets it, so a restart does not wait out old connections).
pub fn listen(addr: std::net::SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Serves `app` on `listener` until `shutdown` completes, then lets in-flight requests finish
/// (connections close after their current response).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with(listener, app, shutdown, ServerLimits::default()).await
}

/// [`serve`] with another header deadline (tests use a short one).
pub async fn serve_with_header_timeout(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    header_timeout: Duration,
) -> io::Result<()> {
    let limits = ServerLimits {
        header_timeout,
        ..ServerLimits::default()
    };
    serve_with(listener, app, shutdown, limits).await
}

/// [`serve`] with the given limits.
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ServerLimits,
) -> io::Result<()> {
    let max = limits.max_connections.max(MIN_CONNECTIONS);
    let reserved = limits.reserved();
    let send_buffer = limits.send_buffer_bytes();
    let general = Arc::new(Semaphore::new(max - reserved));
    let reserve = Arc::new(Semaphore::new(reserved));
    let health_only = app.clone().layer(axum::middleware::from_fn(health_only));
    let connections = GracefulShutdown::new();
    let idle = reclaim::Tracker::default();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut at_cap = false;
    let mut last_cap_log: Option<std::time::Instant> = None;
    loop {
        // Room first: with every slot taken by connections with a request in flight, new ones
        // wait in the listen queue. Only this loop takes permits, so room seen here is still
        // there after the accept. While some connection is idle (silent, halfway through its
        // headers, or kept alive between requests), the loop accepts anyway: the new
        // connection takes the oldest idle one's slot (`reclaim`).
        let room = async {
            tokio::select! {
                permit = general.acquire() => drop(permit),
                permit = reserve.acquire() => drop(permit),
            }
        };
        let may_reclaim = idle.idle() > 0;
        tokio::select! {
            () = room => {}
            () = std::future::ready(()), if may_reclaim => {}
            () = &mut shutdown => break,
        }
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
        let Some((permit, in_reserve)) = take_slot(&general, &reserve, &idle).await else {
            continue;
        };
        // Logged at most once a minute: a flood of idle connections moves a new connection
        // in and out of the reserve many times a second.
        if in_reserve != at_cap {
            at_cap = in_reserve;
            if last_cap_log.is_none_or(|at| at.elapsed() >= CAP_LOG_GAP) {
                last_cap_log = Some(std::time::Instant::now());
                if at_cap {
                    tracing::warn!(
                        "{} connections open, the most allowed (--max-connections): new ones \
                         get /healthz only, or the slot of an idle one, until some close",
                        max - reserved
                    );
                } else {
                    tracing::info!("below the connection cap again");
                }
            }
        }
        // Small responses: send them at once rather than wait for more to coalesce.
        let _ = stream.set_nodelay(true);
        // A fixed send buffer: what slow readers make the kernel hold stays within
        // SEND_BUFFERS_TOTAL (x2) for all connections together.
        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(send_buffer);
        let (service, header_timeout, stall_timeout, response_timeout) = if in_reserve {
            let short = RESERVE_TIMEOUT;
            (health_only.clone(), short, short, short)
        } else {
            let app = app.clone();
            (
                app,
                limits.header_timeout,
                limits.stall_timeout,
                limits.response_timeout,
            )
        };
        let slot = idle.register(max);
        let io = Stalling::new(stream, stall_timeout).with_response_limit(response_timeout);
        let io = TokioIo::new(io);
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .keep_alive(!in_reserve)
            .serve_connection(
                io,
                reclaim::Tracked::new(TowerToHyperService::new(service), Arc::clone(&slot)),
            );
        let connection = connections.watch(connection);
        tokio::spawn(async move {
            // A client that vanishes or misses a deadline is not the server's error; one chosen
            // to give its slot up is dropped, which closes it.
            tokio::select! {
                _ = connection => {}
                () = slot.reclaimed() => {}
            }
            slot.finished();
            drop(permit);
        });
    }
    drop(listener);
    connections.shutdown().await;
    Ok(())
}

/// A slot for a connection just accepted: a free one (general first), else the oldest idle
/// connection's, once it has closed. `None` when neither comes in time: the new connection is
/// dropped.
async fn take_slot(
    general: &Arc<Semaphore>,
    reserve: &Arc<Semaphore>,
    idle: &reclaim::Tracker,
) -> Option<(OwnedSemaphorePermit, bool)> {
    let free = |general: &Arc<Semaphore>, reserve: &Arc<Semaphore>| match Arc::clone(general)
        .try_acquire_owned()
    {
        Ok(permit) => Some((permit, false)),
        Err(_) => Arc::clone(reserve)
            .try_acquire_owned()
            .ok()
            .map(|p| (p, true)),
    };
    if let Some(slot) = free(general, reserve) {
        return Some(slot);
    }
    // No idle connection left (it sent a request since the loop looked): wait for a slot as
    // the listen queue would have, a while.
    let wait = match idle.reclaim_oldest_idle() {
        true => RECLAIM_WAIT,
        false => STALL_TIMEOUT,
    };
    let freed = async {
        tokio::select! {
            permit = Arc::clone(general).acquire_owned() => permit.ok().map(|p| (p, false)),
            permit = Arc::clone(reserve).acquire_owned() => permit.ok().map(|p| (p, true)),
        }
    };
    tokio::time::timeout(wait, freed).await.ok().flatten()
}

/// The reserve's router: `/healthz` as usual, anything else 503.
async fn health_only(request: Request, next: Next) -> Response {
    if request.uri().path() == "/healthz" {
        return next.run(request).await;
    }
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        "busy: every connection is taken (--max-connections); try again shortly\n",
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_binds_reports_a_taken_port_and_queues_connections() {
        let listener = listen(([127, 0, 0, 1], 0).into()).expect("a free port");
        let addr = listener.local_addr().expect("bound");
        assert!(listen(addr).is_err(), "the port is taken");
        // More connections than the standard library's queue of 128 complete their handshake
        // without an accept (where the kernel allows a longer queue at all).
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|n| n.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if somaxconn >= 256 {
            let waiting: Vec<_> = (0..200)
                .map(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)))
                .collect();
            assert!(waiting.iter().all(Result::is_ok));
        }
    }

    #[test]
    fn the_default_cap_stays_below_the_descriptor_limit() {
        let cap = default_max_connections();
        assert!((MIN_CONNECTIONS..=MAX_CONNECTIONS_CEILING).contains(&cap));
        if let Some(limit) = open_files_limit() {
            assert!(cap < limit || limit <= MIN_CONNECTIONS, "{cap} of {limit}");
        }
        let limits = ServerLimits {
            max_connections: 4,
            ..ServerLimits::default()
        };
        assert_eq!(limits.reserved(), 1);
        let limits = ServerLimits {
            max_connections: 1024,
            ..ServerLimits::default()
        };
        assert_eq!(limits.reserved(), 16);
    }
}
