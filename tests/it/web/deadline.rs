//! The server's deadlines: connections that send no request, or go quiet after one, are closed
//! once the header deadline passes, while a client that sends its request is served; one that
//! stops reading its response is dropped at the stall deadline.

use gpumem_observe::web::serve_with_header_timeout;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_millis(500);

/// Waits for the server to close `stream`; returns how long that took.
fn time_until_closed(stream: &mut TcpStream) -> Duration {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return started.elapsed(),
            Ok(_) => continue,
            Err(error) if error.kind() == ErrorKind::ConnectionReset => return started.elapsed(),
            Err(error) => panic!("the server did not close the connection: {error}"),
        }
    }
}

fn get_root(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
        .unwrap();
    let mut reply = [0u8; 512];
    let read = stream.read(&mut reply).unwrap();
    String::from_utf8_lossy(&reply[..read]).into_owned()
}

#[test]
fn idle_and_stalled_connections_are_closed_at_the_header_deadline() {
    let runtime = gpumem_observe::web::runtime::build("deadline-test").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "served" }));
    let server = runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let shutdown = async move {
            let _ = stopped.await;
        };
        serve_with_header_timeout(listener, app, shutdown, DEADLINE).await
    });

    // Connects and says nothing.
    let mut silent = TcpStream::connect(addr).unwrap();
    // Starts a request and stalls half-way through its headers.
    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled.write_all(b"GET / HTTP/1.1\r\nhost: te").unwrap();
    // Is served, then keeps the connection open without a second request.
    let mut kept_alive = TcpStream::connect(addr).unwrap();
    assert!(get_root(&mut kept_alive).contains("served"));

    for (what, stream) in [
        ("silent", &mut silent),
        ("stalled", &mut stalled),
        ("kept alive", &mut kept_alive),
    ] {
        let waited = time_until_closed(stream);
        assert!(
            waited < DEADLINE * 6,
            "the {what} connection stayed open {waited:?}"
        );
    }
    // The server itself carries on.
    let mut fresh = TcpStream::connect(addr).unwrap();
    assert!(get_root(&mut fresh).contains("served"));

    stop.send(()).unwrap();
    runtime.block_on(server).unwrap().unwrap();
}

/// A client that asks for a large body and never reads it: once the socket buffers are full
/// the server's writes wait, and after the stall deadline it drops the connection, body and
/// all (it used to wait for as long as the client kept the connection open).
#[test]
fn a_client_that_never_reads_is_dropped_at_the_stall_deadline() {
    use gpumem_observe::web::{serve_with, ServerLimits};
    const BODY: usize = 64 << 20;
    let runtime = gpumem_observe::web::runtime::build("stall-test").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let body = axum::body::Bytes::from(vec![b'x'; BODY]);
    let app = axum::Router::new().route("/big", axum::routing::get(move || async move { body }));
    let limits = ServerLimits {
        max_connections: 16,
        header_timeout: DEADLINE,
        stall_timeout: DEADLINE,
        ..ServerLimits::default()
    };
    let server = runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let shutdown = async move {
            let _ = stopped.await;
        };
        serve_with(listener, app, shutdown, limits).await
    });

    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /big HTTP/1.1\r\nhost: test\r\n\r\n")
        .unwrap();
    // Read nothing for several deadlines, then everything there is.
    std::thread::sleep(DEADLINE * 6);
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut received = 0usize;
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => received += n,
            Err(error) if error.kind() == ErrorKind::ConnectionReset => break,
            Err(error) => panic!("the server neither sent nor closed: {error}"),
        }
    }
    assert!(
        received < BODY,
        "the whole body arrived ({received} bytes): the stalled connection was kept"
    );
    // The server itself carries on.
    let mut fresh = TcpStream::connect(addr).unwrap();
    fresh
        .write_all(b"GET /nope HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    let _ = fresh.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 404"), "{reply:.100}");

    stop.send(()).unwrap();
    runtime.block_on(server).unwrap().unwrap();
}
