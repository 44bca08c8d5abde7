//! The sidecar under load, CI-sized (issue "Holding under load and hostile input"): `gpumem
//! serve` collecting 256 publishers of 64 tags each, while this process sends thousands of
//! concurrent `/metrics` scrapes, holds hundreds of slow readers (request `/metrics`, never
//! read) and probes `/healthz` throughout. Loopback only; every phase has a deadline and the
//! whole test ends within about a minute.
//!
//! It checks what must hold however busy the machine is: the sidecar's peak resident memory
//! (`VmHWM`) stays under the 128 MiB its manifest allows, every scrape is answered (a 503 from
//! the connection reserve is retried, as Prometheus would at its next scrape), every health
//! probe is answered 200, and the slow readers are dropped by the server. Timings are printed,
//! never asserted (docs/reliability.md has the figures).

use super::{open_fds, Scratch};
use crate::support::{memory_kib, serve_args, Running};
use gpumem_wire::unix_now;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PUBLISHERS: u32 = 256;
const TAGS: u32 = 64;
const POOLS: u32 = 4;
/// The sidecar manifest's memory limit.
const MEMORY_LIMIT_KIB: u64 = 128 * 1024;
/// The connection cap given to the sidecar: the slow readers take most of it, the scrapes the
/// rest, and the reserve answers `/healthz`.
const MAX_CONNECTIONS: usize = 512;
/// Everything must be over by then.
const DEADLINE: Duration = Duration::from_secs(60);

/// A published file of one device with `POOLS` pools and `TAGS` tags, fresh for 90 s (its
/// writer claims a 30 s interval), so no file needs rewriting during the test.
fn publisher(i: u32, t: f64) -> String {
    let tags: Vec<_> = (0..TAGS)
        .map(|k| {
            serde_json::json!({
                "tag": format!("publisher-{i:03}/request-{k:02}"),
                "live_bytes": (u64::from(k) + 1) << 20,
                "live_allocations": k + 1,
            })
        })
        .collect();
    let pools: Vec<_> = (0..POOLS)
        .map(|p| serde_json::json!({"pool": format!("p{p}"), "reserved_bytes": 64u64 << 20}))
        .collect();
    serde_json::json!({
        "format": "gpumem.publish",
        "version": 1,
        "pid": 3_000_000 + i,
        "process": format!("engine-{i:03}"),
        "timestamp_seconds": t,
        "interval_seconds": 30.0,
        "devices": [{"gpu": 0, "reserved_bytes": 256u64 << 20, "in_use_bytes": 200u64 << 20,
                     "tags": tags, "pools": pools}],
    })
    .to_string()
}

/// What one scrape ended with.
#[derive(Debug, Default)]
struct Scrape {
    ok: bool,
    /// 503s from the reserve before the 200.
    busy: u32,
    bytes: usize,
}

/// Scrapes `/metrics` until it gets a 200 or `until` passes; a 503 (the reserve) or a refused
/// connection is retried after a moment, as the next scrape would.
async fn scrape(addr: SocketAddr, gzip: bool, until: Instant) -> Scrape {
    let mut outcome = Scrape::default();
    let head = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{}\r\n",
        if gzip {
            "Accept-Encoding: gzip\r\n"
        } else {
            ""
        }
    );
    while Instant::now() < until {
        let attempt = async {
            let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
            stream.write_all(head.as_bytes()).await.ok()?;
            let mut reply = Vec::new();
            stream.read_to_end(&mut reply).await.ok()?;
            Some(reply)
        };
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, attempt).await {
            Ok(Some(reply)) if reply.starts_with(b"HTTP/1.1 200") => {
                outcome.ok = true;
                outcome.bytes = reply.len();
                return outcome;
            }
            Ok(Some(reply)) if reply.starts_with(b"HTTP/1.1 503") => outcome.busy += 1,
            Ok(_) => {}
            Err(_) => return outcome,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    outcome
}

#[test]
fn the_sidecar_holds_under_thousands_of_scrapes_and_slow_readers() {
    let started = Instant::now();
    let dir = Scratch::new("server-load");
    let t = unix_now();
    for i in 0..PUBLISHERS {
        dir.file(&format!("engine-{i:03}.json"), publisher(i, t).as_bytes());
    }
    let log = std::fs::File::create(dir.path().join("serve.log")).expect("a log file");
    let collect_dir = dir.path().to_str().expect("a UTF-8 scratch path");
    let max = MAX_CONNECTIONS.to_string();
    let mut args = serve_args("1s");
    args.extend(["--collect-dir", collect_dir, "--max-connections", &max]);
    let serve = Running::start_with_stderr(&args, log);
    let (addr, pid) = (serve.addr, serve.pid());
    let first = crate::web::get(addr, "/metrics");
    assert_eq!(first.status, 200);
    assert!(
        first.body.contains("engine-255"),
        "every publisher is collected"
    );

    // This process's own descriptors bound how many connections it can hold at once.
    let budget = super::http_abuse::soft_fd_limit().saturating_sub(256);
    let slow_count = (budget / 4).min(300);
    let concurrency = (budget - slow_count).min(2000);
    let scrapes = (concurrency * 2).max(1000);

    let stop = Arc::new(AtomicBool::new(false));
    let peak_hwm = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (stop, peak_hwm) = (Arc::clone(&stop), Arc::clone(&peak_hwm));
        std::thread::spawn(move || {
            let mut peak_fds = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Some((hwm, _)) = memory_kib(pid) {
                    peak_hwm.fetch_max(hwm, Ordering::Relaxed);
                }
                peak_fds = peak_fds.max(open_fds(pid).unwrap_or(0));
                std::thread::sleep(Duration::from_millis(100));
            }
            peak_fds
        })
    };
    let prober = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let (mut probes, mut failures, mut worst) = (0u32, Vec::new(), Duration::ZERO);
            let mut retried = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                // Generous, as a liveness probe's failure threshold is: a connection lost in
                // the flood (a handshake or request dropped by a full listen queue) is tried
                // again; the probe fails only without a 200 within 15 s.
                let mut last = String::new();
                let answered = loop {
                    match crate::web::request(addr, "GET", "/healthz") {
                        Ok(reply) if reply.status == 200 => break true,
                        Ok(reply) => last = format!("{}: {}", reply.status, reply.body),
                        Err(error) => last = error.to_string(),
                    }
                    if asked.elapsed() > Duration::from_secs(15) {
                        break false;
                    }
                    retried += 1;
                    std::thread::sleep(Duration::from_millis(100));
                };
                if !answered {
                    failures.push(last);
                }
                probes += 1;
                worst = worst.max(asked.elapsed());
                std::thread::sleep(Duration::from_millis(200));
            }
            (probes, failures, worst, retried)
        })
    };

    // Slow readers: each asks for /metrics and never reads a byte of the reply.
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let slow: Vec<TcpStream> = (0..slow_count)
        .filter_map(|_| {
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).ok()?;
            stream.write_all(request.as_bytes()).ok()?;
            Some(stream)
        })
        .collect();

    // The flood: `scrapes` scrapes, `concurrency` at once, seven in eight taking gzip as Prometheus does.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a client runtime");
    let until = started + DEADLINE - Duration::from_secs(15);
    let flood_started = Instant::now();
    let results: Vec<Scrape> = runtime.block_on(async {
        let gate = Arc::new(tokio::sync::Semaphore::new(concurrency));
        let tasks: Vec<_> = (0..scrapes)
            .map(|i| {
                let gate = Arc::clone(&gate);
                tokio::spawn(async move {
                    let _turn = gate.acquire_owned().await.ok();
                    scrape(addr, i % 8 != 0, until).await
                })
            })
            .collect();
        let mut results = Vec::with_capacity(tasks.len());
        for task in tasks {
            results.push(task.await.unwrap_or_default());
        }
        results
    });
    let flood = flood_started.elapsed();

    // The slow readers are dropped by the server (a write that moves nothing for 10 s, or the
    // header deadline once the reply fit the socket buffers): reading now reaches the end.
    let dropped = slow
        .into_iter()
        .filter(|stream| {
            let mut stream = stream;
            let _ = stream.set_read_timeout(Some(Duration::from_secs(15)));
            let mut sink = [0u8; 64 * 1024];
            loop {
                match std::io::Read::read(&mut stream, &mut sink) {
                    Ok(0) => return true,
                    Ok(_) => continue,
                    Err(error) => return error.kind() == std::io::ErrorKind::ConnectionReset,
                }
            }
        })
        .count();

    stop.store(true, Ordering::Relaxed);
    let peak_fds = watcher.join().expect("the watcher");
    let (probes, failures, worst, retried) = prober.join().expect("the prober");
    let (hwm, rss) = memory_kib(pid).unwrap_or_default();
    let hwm = hwm.max(peak_hwm.load(Ordering::Relaxed));
    let answered = results.iter().filter(|s| s.ok).count();
    let busy: u32 = results.iter().map(|s| s.busy).sum();
    let biggest = results.iter().map(|s| s.bytes).max().unwrap_or(0);
    eprintln!(
        "server load: {scrapes} scrapes ({concurrency} at once), {answered} answered 200 in \
         {flood:.1?} after {busy} 503s from the reserve; largest reply {biggest} bytes \
         (/metrics plain {} bytes); {slow_count} slow readers, {dropped} dropped by the server; \
         /healthz {probes} probes ({retried} attempts lost in the flood and retried), worst \
         {worst:.1?}; VmHWM {hwm} KiB, VmRSS {rss} KiB at the \
         end, at most {peak_fds} descriptors; {:.1?} in all",
        first.body.len(),
        started.elapsed()
    );
    assert!(failures.is_empty(), "/healthz failed: {failures:?}");
    assert!(probes > 0);
    assert_eq!(answered, scrapes, "every scrape answered in the end");
    assert_eq!(dropped, slow_count, "every slow reader dropped");
    assert!(
        hwm < MEMORY_LIMIT_KIB,
        "peak resident memory {hwm} KiB, over the sidecar's 128 MiB"
    );
    assert!(
        peak_fds <= MAX_CONNECTIONS + 64,
        "{peak_fds} descriptors open with a cap of {MAX_CONNECTIONS} connections"
    );
    drop(serve);
}
