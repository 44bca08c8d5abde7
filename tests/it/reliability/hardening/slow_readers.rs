//! Issue 48, case 2: slow but moving readers cannot pin the host's kernel memory. 300 readers
//! each taking 512 bytes a second of a 3 MB `/metrics` never trip the stall rule (bytes keep
//! moving); each connection's send buffer used to grow to the kernel's autotuning limit
//! (4 MiB), and together they pushed the host's TCP memory past its pressure mark. Now each
//! connection's send buffer is a share of `web::SEND_BUFFERS_TOTAL`, and a response has a
//! whole-response deadline (`web::RESPONSE_TIMEOUT`, checked by the `stall` unit tests). This
//! test measures what the kernel holds for the server's side of those connections (the send
//! queues in `/proc/net/tcp`) and the server's resident memory. Loopback only; about 30 s.

use super::super::Scratch;
use crate::support::serve_args;
use crate::support::Running;
use crate::web::request;
use gpumem_wire::unix_now;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const READERS: usize = 300;
/// What each reader takes per second.
const RATE: usize = 512;

/// A publisher of one device with 16 pools and 64 tags, fresh for 90 s.
fn publisher(i: u32) -> String {
    let tags: Vec<_> = (0..64)
        .map(|k| {
            serde_json::json!({"tag": format!("publisher-{i:03}/request-{k:02}"),
            "live_bytes": (k + 1) << 20, "live_allocations": k + 1})
        })
        .collect();
    let pools: Vec<_> = (0..16)
        .map(|p| {
            serde_json::json!({"pool": format!("pool_{p}"), "reserved_bytes": 64u64 << 20,
            "in_use_bytes": 32u64 << 20, "requests_total": 1000, "hits_total": 900})
        })
        .collect();
    serde_json::json!({
        "format": "gpumem.publish", "version": 1, "pid": 3_000_000 + i,
        "process": format!("engine-{i:03}"), "timestamp_seconds": unix_now(),
        "interval_seconds": 30.0,
        "devices": [{"gpu": 0, "reserved_bytes": 256u64 << 20, "in_use_bytes": 200u64 << 20,
                     "tags": tags, "pools": pools}],
    })
    .to_string()
}

/// Bytes queued in the kernel on the server's side of its connections: the send queues of
/// the sockets whose local port is `port` (`/proc/net/tcp`, `tcp6`).
fn server_send_queues(port: u16) -> u64 {
    let mut total = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(queues)) = (fields.get(1), fields.get(4)) else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port != Some(port) {
                continue;
            }
            if let Some((tx, _)) = queues.split_once(':') {
                total += u64::from_str_radix(tx, 16).unwrap_or(0);
            }
        }
    }
    total
}

fn rss_kib(pid: u32) -> u64 {
    super::super::rss_kib(pid).unwrap_or(0)
}

#[test]
fn slow_readers_of_a_3_mb_metrics_hold_a_bounded_share_of_kernel_memory() {
    let dir = Scratch::new("slow-readers");
    for i in 0..256 {
        dir.file(&format!("engine-{i:03}.json"), publisher(i).as_bytes());
    }
    let mut args = serve_args("1s");
    args.extend([
        "--collect-dir",
        dir.path().to_str().expect("utf-8"),
        // 256 x 232 series: past the default budget, for a 3 MB /metrics.
        "--collect-max-series",
        "80000",
    ]);
    let server = Running::start(&args);
    let (addr, pid) = (server.addr, server.pid());
    let started = Instant::now();
    let mut size = 0;
    while started.elapsed() < Duration::from_secs(20) {
        size = request(addr, "GET", "/metrics").map_or(0, |r| r.body.len());
        if size > 2_900_000 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(size > 2_900_000, "/metrics is only {size} bytes");
    let mut readers: Vec<TcpStream> = (0..READERS)
        .filter_map(|_| {
            let mut stream = TcpStream::connect(addr).ok()?;
            stream
                .write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
                .ok()?;
            stream.set_nonblocking(true).ok()?;
            Some(stream)
        })
        .collect();
    assert_eq!(readers.len(), READERS);
    let (mut most_queued, mut most_rss, mut received) = (0u64, 0u64, 0usize);
    let reading = Instant::now();
    let mut buffer = [0u8; RATE];
    while reading.elapsed() < Duration::from_secs(12) {
        for stream in &mut readers {
            match stream.read(&mut buffer) {
                Ok(n) => received += n,
                Err(error) if error.kind() == ErrorKind::WouldBlock => {}
                Err(_) => {}
            }
        }
        most_queued = most_queued.max(server_send_queues(addr.port()));
        most_rss = most_rss.max(rss_kib(pid));
        std::thread::sleep(Duration::from_secs(1));
    }
    let bound = 2 * gpumem_observe::web::SEND_BUFFERS_TOTAL as u64;
    eprintln!(
        "{READERS} readers at {RATE} B/s of a {size}-byte /metrics: the server's send queues \
         held at most {:.1} MiB (bound {} MiB), resident at most {:.1} MiB, {received} bytes read",
        most_queued as f64 / (1u64 << 20) as f64,
        bound >> 20,
        most_rss as f64 / 1024.0
    );
    assert!(most_queued <= bound, "{most_queued} bytes queued");
    assert!(most_rss <= 128 * 1024, "{most_rss} KiB resident");
    assert_eq!(
        request(addr, "GET", "/healthz").map(|r| r.status).ok(),
        Some(200)
    );
}
