//! Soak: `gpumem demo` (loopback, bounded by `--duration`) under a steady scrape load from this
//! process — `/metrics`, `/` and the JSON API at a fixed rate — while its resident memory,
//! open file descriptors and the scrape latency are sampled over time. Passes when there are
//! no errors and no growth trend. 30 s here (CI); `SOAK_SECONDS=1800 benches/soak.sh` runs the
//! long version (with `wrk` as a second load when `SOAK_WRK=1`) and prints the same figures.

use super::{gpumem, open_fds, rss_kib};
use crate::web::request;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Not counted: the model loads, the history ring and the caches fill.
const WARM_UP: Duration = Duration::from_secs(5);
const CLIENTS: u32 = 4;
/// Requests per second per client.
const RATE: u32 = 20;

fn seconds_from_env(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

struct Demo {
    child: Child,
    addr: SocketAddr,
    /// Lines the demo logged at error level, or a panic.
    troubles: mpsc::Receiver<String>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start_demo(duration: Duration) -> Demo {
    let mut child = gpumem()
        .args(["demo", "--backend", "sim", "--listen", "127.0.0.1:0"])
        .args(["--interval", "200ms", "--leak-age", "10s"])
        .args(["--duration", &format!("{}s", duration.as_secs())])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the demo starts");
    let stdout = child.stdout.take().expect("stdout");
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    // Drained all along (a full pipe would stall the demo); errors and panics are kept.
    let stderr = child.stderr.take().expect("stderr");
    let (troubles, reported) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("ERROR") || line.contains("panicked") {
                let _ = troubles.send(line);
            }
        }
    });
    let line = received
        .recv_timeout(Duration::from_secs(30))
        .expect("the demo prints its URL");
    let addr = line
        .strip_prefix("gpumem demo: open http://")
        .and_then(|rest| rest.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line: {line}"));
    Demo {
        child,
        addr,
        troubles: reported,
    }
}

/// One sample of the demo process.
#[derive(Clone, Copy, Debug)]
struct Probe {
    at: Duration,
    rss_kib: u64,
    fds: usize,
}

/// A request's latency, when it was sent.
struct Timed {
    at: Duration,
    latency: Duration,
}

fn median(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

fn percentile(latencies: &mut [Duration], p: f64) -> Duration {
    latencies.sort_unstable();
    let index = ((latencies.len() as f64 - 1.0) * p).round() as usize;
    latencies.get(index).copied().unwrap_or_default()
}

/// Least-squares slope of `(x, y)` points, in y per x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(num, den), (x, y)| {
        (num + (x - mx) * (y - my), den + (x - mx) * (x - mx))
    });
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

/// `wrk` against `/metrics` for the whole run, as a second load from another process.
fn start_wrk(addr: SocketAddr, duration: Duration) -> Option<Child> {
    if std::env::var("SOAK_WRK").map_or(true, |v| v != "1") {
        return None;
    }
    Command::new("wrk")
        .args(["-t2", "-c16", &format!("-d{}s", duration.as_secs())])
        .arg(format!("http://{addr}/metrics"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()
}

#[test]
fn the_demo_holds_steady_under_scrape_load() {
    let measured = seconds_from_env("SOAK_SECONDS", 30);
    let total = WARM_UP + measured;
    let mut demo = start_demo(total + Duration::from_secs(3));
    let (addr, pid) = (demo.addr, demo.child.id());
    let wrk = start_wrk(addr, total);
    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let errors = AtomicU64::new(0);
    let (probes, timed) = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let (stop, errors) = (&stop, &errors);
                scope.spawn(move || {
                    let period = Duration::from_secs(1) / RATE;
                    let mut timed = Vec::new();
                    let mut next = Instant::now();
                    let mut i = client;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let path = match i % 5 {
                            0 | 2 => "/metrics",
                            1 | 3 => "/",
                            _ => "/api/v1/snapshot",
                        };
                        let sent = Instant::now();
                        match request(addr, "GET", path) {
                            Ok(reply) if reply.status == 200 && !reply.body.is_empty() => {}
                            Ok(reply) => {
                                eprintln!("soak: GET {path} -> {}", reply.status);
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(error) => {
                                eprintln!("soak: GET {path} failed: {error}");
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        timed.push(Timed {
                            at: sent - started,
                            latency: sent.elapsed(),
                        });
                        next += period;
                        std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    }
                    timed
                })
            })
            .collect();
        let mut probes = Vec::new();
        while started.elapsed() < total {
            if let (Some(rss_kib), Some(fds)) = (rss_kib(pid), open_fds(pid)) {
                probes.push(Probe {
                    at: started.elapsed(),
                    rss_kib,
                    fds,
                });
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        stop.store(true, Ordering::Relaxed);
        let timed: Vec<Timed> = clients
            .into_iter()
            .flat_map(|c| c.join().expect("a load client"))
            .collect();
        (probes, timed)
    });
    let wrk_summary = wrk.map(|child| {
        let out = child.wait_with_output().expect("wrk finishes");
        String::from_utf8_lossy(&out.stdout).into_owned()
    });

    let probes: Vec<Probe> = probes.into_iter().filter(|p| p.at >= WARM_UP).collect();
    let timed: Vec<&Timed> = timed.iter().filter(|t| t.at >= WARM_UP).collect();
    assert!(probes.len() >= 6, "too few probes: {}", probes.len());
    let third = probes.len() / 3;
    let (first, last) = (&probes[..third], &probes[probes.len() - third..]);
    let rss_first = median(&mut first.iter().map(|p| p.rss_kib).collect::<Vec<_>>());
    let rss_last = median(&mut last.iter().map(|p| p.rss_kib).collect::<Vec<_>>());
    let fds_first = first.iter().map(|p| p.fds).max().unwrap_or(0);
    let fds_last = last.iter().map(|p| p.fds).max().unwrap_or(0);
    let rss_points: Vec<(f64, f64)> = probes
        .iter()
        .map(|p| (p.at.as_secs_f64() / 60.0, p.rss_kib as f64))
        .collect();
    let rss_slope = slope(&rss_points);
    let split = WARM_UP + measured / 3;
    let tail_from = total - measured / 3;
    let mut early: Vec<Duration> = timed
        .iter()
        .filter(|t| t.at < split)
        .map(|t| t.latency)
        .collect();
    let mut late: Vec<Duration> = timed
        .iter()
        .filter(|t| t.at >= tail_from)
        .map(|t| t.latency)
        .collect();
    let mut all: Vec<Duration> = timed.iter().map(|t| t.latency).collect();
    let requests = all.len();
    let (p50, p99, max) = (
        percentile(&mut all, 0.5),
        percentile(&mut all, 0.99),
        percentile(&mut all, 1.0),
    );
    let (early_p99, late_p99) = (percentile(&mut early, 0.99), percentile(&mut late, 0.99));
    let errors = errors.load(Ordering::Relaxed);
    eprintln!(
        "soak: {}s measured, {requests} requests ({:.0}/s), {errors} errors; latency p50 {p50:.1?} \
         p99 {p99:.1?} max {max:.1?} (p99 first third {early_p99:.1?}, last third {late_p99:.1?}); \
         RSS {rss_first} -> {rss_last} KiB (slope {rss_slope:+.0} KiB/min); fds max {fds_first} -> {fds_last}",
        measured.as_secs(),
        requests as f64 / measured.as_secs_f64(),
    );
    // Long runs: one line per minute, for docs/reliability.md.
    if measured >= Duration::from_secs(120) {
        for minute in 0..measured.as_secs() / 60 {
            let from = WARM_UP + Duration::from_secs(minute * 60);
            let to = from + Duration::from_secs(60);
            let inside = |at: Duration| at >= from && at < to;
            let window: Vec<&Probe> = probes.iter().filter(|p| inside(p.at)).collect();
            let mut latencies: Vec<Duration> = timed
                .iter()
                .filter(|t| inside(t.at))
                .map(|t| t.latency)
                .collect();
            let rss = window.iter().map(|p| p.rss_kib).max().unwrap_or(0);
            let fds = window.iter().map(|p| p.fds).max().unwrap_or(0);
            eprintln!(
                "soak: minute {:>3}: RSS max {rss} KiB, fds max {fds}, {} requests, p99 {:.1?}",
                minute + 1,
                latencies.len(),
                percentile(&mut latencies, 0.99)
            );
        }
    }
    if let Some(summary) = &wrk_summary {
        eprintln!("soak: wrk /metrics:\n{summary}");
    }

    assert_eq!(errors, 0, "every scrape must succeed");
    assert!(requests as u64 >= measured.as_secs() * u64::from(CLIENTS * RATE) / 2);
    // Under wrk's thousands of requests a second, glibc's per-thread arenas keep growing with
    // the blocking pool's threads while the heap itself stays flat (docs/reliability.md), so
    // resident memory is judged at the steady load only.
    if wrk_summary.is_none() {
        assert!(
            rss_last <= rss_first + (rss_first / 5).max(8 * 1024),
            "resident memory grew from {rss_first} KiB to {rss_last} KiB"
        );
    }
    assert!(
        fds_last <= fds_first + 8,
        "open descriptors grew from {fds_first} to {fds_last}"
    );
    assert!(
        // Generous: in CI other tests share the two cores with the demo.
        late_p99 <= early_p99 * 3 + Duration::from_millis(200),
        "scrape latency grew: p99 {early_p99:?} early, {late_p99:?} late"
    );
    if let Some(summary) = wrk_summary {
        assert!(
            !summary.contains("Non-2xx") && !summary.contains("Socket errors"),
            "wrk saw errors:\n{summary}"
        );
    }
    // The demo ends on its own (its --duration) and cleanly, after all that.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = demo.child.try_wait().expect("wait for the demo") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not stop after its duration"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "the demo exited with {status}");
    let troubles: Vec<String> = demo.troubles.try_iter().collect();
    assert!(troubles.is_empty(), "the demo logged errors: {troubles:?}");
}
