//! Issue 48, case 1: connections that never send a byte cannot starve `/healthz`. A flood of
//! silent connections, opened again as the server closes them, used to fill every slot and the
//! reserve kept for probes; a probe then waited in the listen queue for the 10 s header
//! deadline and the chart's liveness probe (3 s timeout) restarted the agent. Every probe here
//! must be answered 200 within 1 s, with 1,100 silent connections held open, and with 200 under
//! `ulimit -n 256`. Loopback only; each test ends within about 30 s.

use crate::support::serve_args;
use crate::support::Running;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A probe's budget, connection included (the chart allows 3 s).
const PROBE_BUDGET: Duration = Duration::from_secs(1);
/// How long probes run once the flood is in place.
const PROBING: Duration = Duration::from_secs(8);

/// What each flooding connection sends before it goes quiet.
#[derive(Clone, Copy, Debug)]
enum Quiet {
    /// Nothing at all.
    Silent,
    /// Half a request's headers.
    HalfHeaders,
    /// A whole request (its answer read and dropped), then nothing: kept alive, idle.
    AfterOneRequest,
}

impl Quiet {
    fn opening(self) -> &'static [u8] {
        match self {
            Quiet::Silent => b"",
            Quiet::HalfHeaders => b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
            Quiet::AfterOneRequest => b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        }
    }
}

/// Holds `count` quiet connections to `addr` open, opening a new one whenever the server
/// closes one, until `stop`. Returns how many it opened in all.
fn hold_silent(
    addr: SocketAddr,
    count: usize,
    quiet: Quiet,
    stop: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
) -> usize {
    let mut open: Vec<TcpStream> = Vec::with_capacity(count);
    let mut opened = 0;
    let mut drain = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        // Open while reads would wait; an answer is read and dropped (the connection stays).
        open.retain_mut(|stream| loop {
            match stream.read(&mut drain) {
                Err(error) => break error.kind() == ErrorKind::WouldBlock,
                Ok(0) => break false,
                Ok(_) => continue,
            }
        });
        while open.len() < count && !stop.load(Ordering::Relaxed) {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(mut stream) => {
                    if stream.write_all(quiet.opening()).is_err() {
                        continue;
                    }
                    let _ = stream.set_nonblocking(true);
                    open.push(stream);
                    opened += 1;
                }
                Err(_) => break,
            }
        }
        held.store(open.len(), Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
    }
    opened
}

/// One `/healthz` probe: the status if a whole answer came within [`PROBE_BUDGET`].
fn probe(addr: SocketAddr) -> Result<u16, String> {
    let started = Instant::now();
    let mut stream =
        TcpStream::connect_timeout(&addr, PROBE_BUDGET).map_err(|e| format!("connect: {e}"))?;
    let left = |started: Instant| {
        PROBE_BUDGET
            .checked_sub(started.elapsed())
            .filter(|d| !d.is_zero())
    };
    stream
        .set_read_timeout(left(started))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(
            format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .map_err(|e| format!("send: {e}"))?;
    let mut reply = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let Some(budget) = left(started) else {
            return Err(format!("no whole answer within {PROBE_BUDGET:?}"));
        };
        stream
            .set_read_timeout(Some(budget))
            .map_err(|e| e.to_string())?;
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buffer[..n]),
            Err(e) => return Err(format!("read after {:?}: {e}", started.elapsed())),
        }
    }
    let text = String::from_utf8_lossy(&reply);
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))
}

/// Floods `server` with `silent` quiet connections, then probes it every 100 ms for
/// [`PROBING`]; every probe must be a 200 within the budget.
fn probes_pass_under_a_silent_flood(server: &Running, silent: usize, quiet: Quiet) {
    let addr = server.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(AtomicUsize::new(0));
    let holder = {
        let (stop, held) = (Arc::clone(&stop), Arc::clone(&held));
        std::thread::spawn(move || hold_silent(addr, silent, quiet, stop, held))
    };
    let filling = Instant::now();
    while held.load(Ordering::Relaxed) < silent * 9 / 10
        && filling.elapsed() < Duration::from_secs(15)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut failures = Vec::new();
    let mut probes = 0;
    let mut slowest = Duration::ZERO;
    let started = Instant::now();
    while started.elapsed() < PROBING {
        let at = Instant::now();
        probes += 1;
        match probe(addr) {
            Ok(200) => slowest = slowest.max(at.elapsed()),
            Ok(status) => failures.push(format!("{status}")),
            Err(error) => failures.push(error),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let held_at_end = held.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let opened = holder.join().expect("the holder thread");
    eprintln!(
        "{silent} {quiet:?} connections (held {held_at_end} at the end, {opened} opened in all): \
         {} of {probes} probes answered 200 within {PROBE_BUDGET:?}, slowest {slowest:?}",
        probes - failures.len()
    );
    assert!(
        held_at_end >= silent * 9 / 10,
        "the flood held only {held_at_end} connections"
    );
    assert!(
        failures.is_empty(),
        "{} of {probes} probes failed: {failures:?}",
        failures.len()
    );
}

#[test]
fn healthz_answers_every_probe_under_1100_silent_connections() {
    let server = Running::start(&serve_args("1s"));
    probes_pass_under_a_silent_flood(&server, 1_100, Quiet::Silent);
}

/// The close variants: half a request's headers, then nothing; a whole request, then an idle
/// kept-alive connection. Each used to hold its slot until the 10 s header deadline too.
#[test]
fn healthz_answers_every_probe_under_1100_stalled_or_idle_connections() {
    for quiet in [Quiet::HalfHeaders, Quiet::AfterOneRequest] {
        let server = Running::start(&serve_args("1s"));
        probes_pass_under_a_silent_flood(&server, 1_100, quiet);
    }
}

#[test]
fn healthz_answers_every_probe_under_200_silent_connections_and_256_descriptors() {
    // A shell that lowers the descriptor limit, then becomes gpumem (same pid, same pipes).
    let mut shell = std::process::Command::new("sh");
    shell
        .args([
            "-c",
            "ulimit -n 256 && exec \"$0\" \"$@\"",
            env!("CARGO_BIN_EXE_gpumem"),
        ])
        .args(serve_args("1s"))
        .env("GPUMEM_LOG", "warn");
    for (key, _) in std::env::vars() {
        if key.starts_with("GPUMEM_") && key != "GPUMEM_LOG" {
            shell.env_remove(key);
        }
    }
    let server = Running::start_command(shell, "serve");
    probes_pass_under_a_silent_flood(&server, 200, Quiet::Silent);
}
