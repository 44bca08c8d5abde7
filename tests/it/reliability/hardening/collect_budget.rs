//! Cases 2 and 4: what a collect directory can cost the sidecar is bounded (series and bytes,
//! counted and noted on /healthz when hit), stale files never hide a live engine, and a
//! snapshot from the future is refused instead of never going stale.

use super::{count, published};
use crate::reliability::{rss_kib, Scratch};
use crate::web::get;
use gpumem_observe::collect::{
    series_of, CollectDir, CollectSettings, DEFAULT_MAX_SERIES, SERIES_PER_DEVICE, SERIES_PER_POOL,
};
use gpumem_wire::unix_now;
use std::time::{Duration, SystemTime};

fn collector(dir: &Scratch) -> CollectDir {
    CollectDir::new(CollectSettings::new(dir.path(), Duration::from_secs(1)))
}

/// Files of 64 devices x 16 pools each (the most a file may hold) add up to the default budget
/// and no further: the rest are skipped and counted, and the status says so.
#[test]
fn collected_series_stay_within_the_default_budget() {
    let dir = Scratch::new("budget");
    let t = unix_now();
    for i in 0..8u32 {
        let text = published(std::process::id(), &format!("big{i}"), t, 64, 16);
        dir.file(&format!("big-{i}.json"), text.as_bytes());
    }
    let collected = collector(&dir).scan_at(t + 0.1);
    let series: u64 = collected
        .processes
        .iter()
        .map(|p| {
            1 + SERIES_PER_DEVICE * p.devices.len() as u64
                + SERIES_PER_POOL * p.devices.iter().map(|d| d.pools.len() as u64).sum::<u64>()
        })
        .sum();
    assert!(!collected.processes.is_empty(), "some files fit the budget");
    assert!(
        series <= DEFAULT_MAX_SERIES,
        "{series} series exported; the budget is {DEFAULT_MAX_SERIES}"
    );
    let skipped = count(&collected.status.rejected, "over_budget");
    assert_eq!(skipped as usize + collected.processes.len(), 8);
    assert_eq!(collected.status.budget_exceeded_total, 1);
    let note = collected.status.over_budget.expect("a note for /healthz");
    assert!(note.contains("--collect-max-series"), "{note}");
    let file =
        gpumem_observe::collect::read_file(&dir.path().join("big-0.json"), 4 << 20).expect("valid");
    assert_eq!(
        series_of(&file),
        1 + SERIES_PER_DEVICE * 64 + SERIES_PER_POOL * 64 * 16
    );
}

/// `gpumem serve` over a directory of maximal files: /metrics stays a few megabytes (it was
/// 148 MB for 36 such files), the budget counter moves, /healthz says what was skipped, and
/// resident memory stays well under the shipped manifest's 128 Mi limit.
#[test]
fn a_full_collect_directory_cannot_blow_up_the_sidecar() {
    let dir = Scratch::new("budget-serve");
    let t = unix_now() + 20.0;
    for i in 0..12u32 {
        let text = published(std::process::id(), &format!("big{i}"), t, 64, 16);
        dir.file(&format!("big-{i}.json"), text.as_bytes());
    }
    let sidecar = super::collecting_sidecar(dir.path(), "1s", std::process::Stdio::inherit());
    let mut peak_kib = 0;
    for _ in 0..3 {
        let metrics = get(sidecar.addr, "/metrics");
        assert_eq!(metrics.status, 200);
        assert!(
            metrics.body.len() < 16 << 20,
            "/metrics is {} bytes",
            metrics.body.len()
        );
        let exceeded = metrics
            .body
            .lines()
            .find_map(|l| l.strip_prefix("gpumem_collect_budget_exceeded_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .expect("gpumem_collect_budget_exceeded_total");
        assert!(exceeded >= 1.0);
        peak_kib = peak_kib.max(rss_kib(sidecar.pid()).unwrap_or(0));
    }
    let health = get(sidecar.addr, "/healthz");
    assert_eq!(health.status, 200);
    assert!(health.body.contains("over its budget"), "{}", health.body);
    assert!(peak_kib < 100 * 1024, "resident memory {peak_kib} KiB");
}

fn set_modified(path: &std::path::Path, when: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(when))
        .expect("set the modification time");
}

/// 300 files of engines that stopped `age_seconds` ago (published and last modified then), named
/// to sort before a live engine's file: the processes the collector exports of that directory,
/// and how many files it refused as too many.
fn dead_engines_beside_a_live_one(label: &str, age_seconds: u64) -> (Vec<String>, u64) {
    let dir = Scratch::new(label);
    let t = unix_now();
    let then = SystemTime::now() - Duration::from_secs(age_seconds);
    for i in 0..300u32 {
        let path = dir.file(
            &format!("a-{i:03}.json"),
            published(4_000_000 + i, "dead", t - age_seconds as f64, 1, 1).as_bytes(),
        );
        set_modified(&path, then);
    }
    dir.file(
        "zz-live.json",
        published(std::process::id(), "live", t, 1, 1).as_bytes(),
    );
    let collected = collector(&dir).scan_at(t + 0.1);
    let too_many = count(&collected.status.rejected, "too_many_files");
    let names = collected.processes.into_iter().map(|p| p.process).collect();
    (names, too_many)
}

/// Files left by killed engines, untouched for an hour: stale, never read, so the live engine
/// is exported all the same (only the first 256 names used to be read).
#[test]
fn files_left_by_dead_engines_never_hide_a_live_one() {
    let (exported, too_many) = dead_engines_beside_a_live_one("stale-cap", 3600);
    assert_eq!(exported, ["live"]);
    assert_eq!(too_many, 0, "stale files are dropped before the cap");
}

/// The same with engines killed a minute ago (files still recent): newest first, so the live
/// file is read although 300 others come before it by name.
#[test]
fn recent_dead_files_over_the_cap_never_hide_a_live_one() {
    let (exported, _) = dead_engines_beside_a_live_one("recent-cap", 60);
    assert_eq!(exported, ["live"]);
}

/// A snapshot an hour in the future would never go stale: refused. A few seconds of clock
/// skew between containers is fine.
#[test]
fn snapshots_from_the_future_are_refused() {
    let dir = Scratch::new("future");
    let t = unix_now();
    dir.file(
        "future.json",
        published(std::process::id(), "future", t + 3600.0, 1, 1).as_bytes(),
    );
    dir.file(
        "skewed.json",
        published(std::process::id() + 1, "skewed", t + 5.0, 1, 1).as_bytes(),
    );
    let mut collector = collector(&dir);
    let collected = collector.scan_at(t);
    let names: Vec<&str> = collected
        .processes
        .iter()
        .map(|p| p.process.as_str())
        .collect();
    assert_eq!(names, ["skewed"]);
    assert_eq!(count(&collected.status.rejected, "invalid"), 1);
}

/// Everything logged on this thread while `body` runs, as text.
fn logged_by(body: impl FnOnce()) -> String {
    use std::sync::{Arc, Mutex};
    let sink = Arc::new(Mutex::new(Vec::<u8>::new()));
    let writer = {
        let sink = Arc::clone(&sink);
        move || SinkWriter(Arc::clone(&sink))
    };
    let subscriber = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, body);
    let bytes = sink.lock().map(|b| b.clone()).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

struct SinkWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for SinkWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut sink) = self.0.lock() {
            sink.extend_from_slice(bytes);
        }
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A file from the future is logged once, not once per scan: how far ahead it is changes every
/// second, and used to be part of what said "logged already".
#[test]
fn a_snapshot_from_the_future_is_logged_once() {
    let dir = Scratch::new("future-once");
    let t = unix_now();
    dir.file(
        "future.json",
        published(std::process::id(), "future", t + 3600.0, 1, 1).as_bytes(),
    );
    let mut collector = collector(&dir);
    let log = logged_by(|| {
        for scan in 0..5 {
            let collected = collector.scan_at(t + f64::from(scan));
            assert_eq!(count(&collected.status.rejected, "invalid"), 1);
        }
    });
    let warnings = log.lines().filter(|l| l.contains("future.json")).count();
    assert_eq!(warnings, 1, "{log}");
    assert!(log.contains("ahead of this host's clock"), "{log}");
}
