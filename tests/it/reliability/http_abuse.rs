//! HTTP abuse against the exporter, loopback only and bounded in time: unknown and hostile
//! paths (404, nothing outside the embedded assets served), wrong and unknown methods (405),
//! oversized headers and URLs, garbage on the wire, slow clients that trickle a request or
//! never read the reply, many connections at once, and a server out of file descriptors.
//! After each, the server still answers `/healthz`.

use super::{gpumem, open_fds};
use crate::web::{eventually, get, request, Fixture};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// How the server answered bytes written on a new connection.
#[derive(Debug, PartialEq)]
enum Answer {
    Status(u16),
    /// Closed the connection without a reply.
    Closed,
    /// Said nothing within the limit, connection still open (waiting for a request).
    Silent,
}

/// Writes `bytes` on a new connection and reads the reply for at most `limit`.
fn exchange(addr: SocketAddr, bytes: &[u8], limit: Duration) -> Answer {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return Answer::Closed;
    };
    let _ = stream.set_read_timeout(Some(limit));
    let _ = stream.set_write_timeout(Some(limit));
    // The server may answer and close before reading everything: a failed write is fine.
    let _ = stream.write_all(bytes);
    let mut reply = Vec::new();
    let silent = match stream.take(64 * 1024).read_to_end(&mut reply) {
        Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        Ok(_) => false,
    };
    let text = String::from_utf8_lossy(&reply);
    match text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
    {
        Some(status) => Answer::Status(status),
        None if silent => Answer::Silent,
        None => Answer::Closed,
    }
}

fn assert_healthy(addr: SocketAddr, after: &str) {
    let started = Instant::now();
    let reply = get(addr, "/healthz");
    assert_eq!(reply.status, 200, "/healthz after {after}: {}", reply.body);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "/healthz took {:?} after {after}",
        started.elapsed()
    );
}

#[test]
fn unknown_and_hostile_paths_are_404_and_serve_nothing_else() {
    let fixture = Fixture::start();
    let addr = fixture.addr();
    for path in [
        "/nope",
        "/metrics/",
        "//metrics",
        "/api/v2/snapshot",
        "/api/v1/snapshot/extra",
        "/static/",
        "/static/../Cargo.toml",
        "/static/..%2f..%2fCargo.toml",
        "/static/%2e%2e%2f%2e%2e%2fCargo.toml",
        "/static/%2e%2e/%2e%2e/etc/passwd",
        "/static/style.css%00.png",
        "/static/.%2e/src/lib.rs",
        "/%00",
        "/%ff%fe",
        "/..",
    ] {
        let reply = request(addr, "GET", path).expect("a reply");
        assert!(
            reply.status == 404 || reply.status == 400,
            "GET {path} -> {}",
            reply.status
        );
        for secret in ["[package]", "root:x:0", "pub mod "] {
            assert!(!reply.body.contains(secret), "GET {path} leaked a file");
        }
    }
    assert_healthy(addr, "hostile paths");
}

#[test]
fn wrong_and_unknown_methods_are_405() {
    let fixture = Fixture::start();
    let addr = fixture.addr();
    for path in [
        "/",
        "/metrics",
        "/healthz",
        "/api/v1/snapshot",
        "/api/v1/history",
        "/static/style.css",
    ] {
        for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW"] {
            let reply = request(addr, method, path).expect("a reply");
            assert_eq!(reply.status, 405, "{method} {path}");
        }
        let head = request(addr, "HEAD", path).expect("a reply");
        assert_eq!(head.status, 200, "HEAD {path}");
        assert!(head.body.is_empty(), "HEAD {path} has no body");
    }
    assert_healthy(addr, "wrong methods");
}

#[test]
fn oversized_headers_urls_and_garbage_are_refused() {
    let fixture = Fixture::start();
    let addr = fixture.addr();
    let limit = Duration::from_secs(5);
    let huge_header = format!(
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let many_headers = format!(
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n{}\r\n",
        (0..500)
            .map(|i| format!("X-{i}: {i}\r\n"))
            .collect::<String>()
    );
    let long_url = format!(
        "GET /{} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "a".repeat(100_000)
    );
    let long_query = format!(
        "GET /api/v1/history?since={} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "9".repeat(70_000)
    );
    // (what was sent, the statuses that may answer it, whether silence may too: a server
    // waits for a request line after blank lines, as RFC 9112 says it should)
    let cases: Vec<(&str, Vec<u8>, &[u16], bool)> =
        vec![
        ("a 1 MiB header", huge_header.into_bytes(), &[431, 400], false),
        ("500 headers", many_headers.into_bytes(), &[431, 400], false),
        ("a 100 kB URL", long_url.into_bytes(), &[414, 400, 431], false),
        ("a 70 kB query", long_query.into_bytes(), &[400, 414, 431], false),
        ("binary garbage", b"\x00\x01\x02garbage\xff\r\n\r\n".to_vec(), &[400], false),
        ("only blank lines", b"\r\n\r\n\r\n".to_vec(), &[400], true),
        ("HTTP/0.9", b"GET /metrics\r\n\r\n".to_vec(), &[400, 505], false),
        ("HTTP/3.0", b"GET /metrics HTTP/3.0\r\n\r\n".to_vec(), &[400, 505], false),
        (
            "a bad content length",
            b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n".to_vec(),
            &[400],
            false,
        ),
        (
            "two content lengths",
            b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
                .to_vec(),
            &[400],
            false,
        ),
    ];
    for (name, bytes, expected, may_wait) in cases {
        let started = Instant::now();
        let answer = exchange(addr, &bytes, limit);
        let fine = match answer {
            Answer::Status(status) => expected.contains(&status),
            Answer::Closed => true,
            Answer::Silent => may_wait,
        };
        assert!(
            fine,
            "{name}: got {answer:?}, expected one of {expected:?} or a closed connection"
        );
        assert!(
            started.elapsed() < limit + Duration::from_secs(1),
            "{name}: took {:?}",
            started.elapsed()
        );
        assert_healthy(addr, name);
    }
    // An HTTP/2 preface on a plain HTTP/1 port: answered or refused, never hung.
    let started = Instant::now();
    let _ = exchange(addr, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", limit);
    assert!(started.elapsed() < limit);
    assert_healthy(addr, "an HTTP/2 preface");
}

/// Clients that trickle a request a byte at a time, and clients that ask for a large reply and
/// never read it: everyone else is still served at once, and the slow ones are served too.
#[test]
fn slow_clients_do_not_hold_up_others() {
    let fixture = Fixture::start();
    let addr = fixture.addr();
    let request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let readers: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut stream = TcpStream::connect(addr).expect("connect");
            stream
                .write_all(b"GET /api/v1/history HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                .expect("send");
            stream
        })
        .collect();
    let trickled = std::thread::scope(|scope| {
        let tricklers: Vec<_> = (0..30)
            .map(|_| {
                scope.spawn(move || {
                    let mut stream = TcpStream::connect(addr).expect("connect");
                    stream
                        .set_read_timeout(Some(Duration::from_secs(10)))
                        .expect("timeout");
                    for byte in request {
                        stream.write_all(&[*byte]).expect("trickle a byte");
                        std::thread::sleep(Duration::from_millis(40));
                    }
                    let mut reply = String::new();
                    let _ = stream.read_to_string(&mut reply);
                    reply.starts_with("HTTP/1.1 200")
                })
            })
            .collect();
        // While ~3 s of trickling goes on, the fast path stays fast.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            assert_healthy(addr, "slow clients connected");
            assert_eq!(get(addr, "/metrics").status, 200);
            std::thread::sleep(Duration::from_millis(100));
        }
        tricklers
            .into_iter()
            .map(|t| t.join().unwrap_or(false))
            .filter(|answered| *answered)
            .count()
    });
    assert_eq!(trickled, 30, "every trickled request was answered");
    drop(readers);
    assert_healthy(addr, "slow readers went away");
}

/// The soft limit on open files of this process.
pub(super) fn soft_fd_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(1024)
}

/// `gpumem demo` in its own process (so its descriptors are its own to count), started
/// through `sh -c` so `limits` can set `ulimit`s first; killed when dropped.
struct Demo {
    child: Child,
    addr: SocketAddr,
}

impl Demo {
    fn start(limits: &str) -> Demo {
        let script = format!(
            "{limits} exec \"$0\" demo --backend sim --listen 127.0.0.1:0 --interval 200ms --duration 120s"
        );
        let binary = gpumem().get_program().to_owned();
        let mut command = std::process::Command::new("sh");
        command.arg("-c").arg(script).arg(binary);
        for (key, _) in std::env::vars() {
            if key.starts_with("GPUMEM_") {
                command.env_remove(key);
            }
        }
        let mut child = command
            .env("GPUMEM_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh runs");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the demo prints its URL");
        let addr = line
            .trim()
            .strip_prefix("gpumem demo: open http://")
            .and_then(|rest| rest.trim_end_matches('/').parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Demo { child, addr }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Hundreds of idle connections held open, and 32 clients requesting at once: every request is
/// answered, and once the idle connections close the server gives their descriptors back.
#[test]
fn many_connections_at_once_are_served() {
    let demo = Demo::start("");
    let (addr, pid) = (demo.addr, demo.child.id());
    assert!(eventually(Duration::from_secs(10), || {
        request(addr, "GET", "/healthz").is_ok_and(|r| r.status == 200)
    }));
    let before = open_fds(pid).expect("fd count");
    // The client ends live in this process, with other tests: stay well inside its limit.
    let idle = (soft_fd_limit() / 4).min(400);
    let held: Vec<TcpStream> = (0..idle)
        .map(|_| TcpStream::connect(addr).expect("connect an idle client"))
        .collect();
    let served = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..32)
            .map(|_| {
                scope.spawn(move || {
                    (0..10)
                        .filter(|i| {
                            let path = if i % 2 == 0 { "/metrics" } else { "/" };
                            request(addr, "GET", path).is_ok_and(|r| r.status == 200)
                        })
                        .count()
                })
            })
            .collect();
        clients
            .into_iter()
            .map(|c| c.join().expect("a client thread"))
            .sum::<usize>()
    });
    assert_eq!(
        served, 320,
        "every request answered with {idle} idle connections open"
    );
    let during = open_fds(pid).unwrap_or(0);
    assert!(
        during >= before + idle / 2,
        "the server holds the idle connections"
    );
    assert_healthy(addr, "many connections");
    drop(held);
    assert!(
        eventually(Duration::from_secs(10), || open_fds(pid)
            .is_some_and(|n| n <= before + 4)),
        "the server kept descriptors: {before} before, {during} during, {:?} after",
        open_fds(pid)
    );
}

/// A demo limited to 64 open files gets more connections than it can accept: it refuses or
/// delays them, keeps running, and serves again once they close.
#[test]
fn a_server_out_of_file_descriptors_recovers() {
    let mut demo = Demo::start("ulimit -n 64 &&");
    let addr = demo.addr;
    let hogs: Vec<TcpStream> = (0..120)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    assert!(demo.alive(), "the demo died");
    drop(hogs);
    let recovered = eventually(Duration::from_secs(15), || {
        request(addr, "GET", "/healthz").is_ok_and(|r| r.status == 200)
    });
    assert!(
        demo.alive(),
        "the demo died after running out of descriptors"
    );
    assert!(
        recovered,
        "the demo did not serve again once the connections closed"
    );
}
