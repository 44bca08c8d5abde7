//! Issue 48, case 3: large invalid publisher files cost in proportion to what changed. Twenty
//! files just under the 4 MiB cap, each a valid envelope listing 150k devices, used to be
//! parsed whole at every scan: 85 % of a core, a 227 MiB peak and `/healthz` "sampling
//! stalled". Now an unchanged file is not read again, a file past the entry caps is refused
//! before its entries are built, and a file that keeps changing while invalid is logged once.

use super::{collecting_sidecar, published};
use crate::reliability::Scratch;
use crate::support::peak_kib;
use crate::web::request;
use gpumem_wire::unix_now;
use std::time::{Duration, Instant};

/// Just under the 4 MiB cap: the `{"gpu": n}` entries of `devices` devices.
fn many_devices(pid: u32, salt: u32) -> String {
    let mut text = format!(
        r#"{{"format":"gpumem.publish","version":1,"pid":{pid},"process":"engine-{salt}","timestamp_seconds":{},"interval_seconds":1.0,"devices":["#,
        unix_now()
    );
    let mut gpu = 0u32;
    while text.len() < (4 << 20) - 64 {
        if gpu > 0 {
            text.push(',');
        }
        text.push_str(&format!(r#"{{"gpu":{gpu}}}"#));
        gpu += 1;
    }
    text.push_str("]}");
    text
}

/// CPU time (user + system) of `pid`, from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command (which may hold spaces): state is the 3rd, utime the 14th.
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<u64> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks = fields[11] + fields[12];
    let per_second = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(100)
        .max(1);
    Duration::from_millis(ticks * 1000 / per_second)
}

#[test]
fn twenty_large_invalid_files_cost_little_after_the_first_scan_and_warn_once() {
    let dir = Scratch::new("large-invalid");
    for i in 0..20 {
        let text = many_devices(70_000 + i, i);
        dir.file(&format!("engine-{i}.json"), text.as_bytes());
    }
    // And one valid publisher, so the sidecar has something to export.
    dir.file(
        "valid.json",
        published(std::process::id(), "valid", unix_now(), 1, 1).as_bytes(),
    );
    let log = dir.path().join("sidecar.log");
    let stderr = std::fs::File::create(&log).expect("log file");
    let server = collecting_sidecar(dir.path(), "1s", stderr.into());
    let pid = server.pid();
    // The first scans: every file read once.
    std::thread::sleep(Duration::from_secs(3));
    let (cpu_before, started) = (cpu_time(pid), Instant::now());
    let mut probes = 0;
    let mut unhealthy = Vec::new();
    let mut rewrites = 0;
    while started.elapsed() < Duration::from_secs(8) {
        // Three files keep changing, invalid each time in another way.
        if probes % 4 == 0 {
            for i in 0..3 {
                let text = match rewrites % 2 {
                    0 => {
                        format!("{{\"format\":\"gpumem.publish\",\"version\":1,\"pid\":{rewrites}")
                    }
                    _ => format!("not json {rewrites}"),
                };
                dir.file(&format!("engine-{i}.json"), text.as_bytes());
            }
            rewrites += 1;
        }
        let health = request(server.addr, "GET", "/healthz").expect("/healthz");
        probes += 1;
        if health.status != 200 {
            unhealthy.push(health.body.trim().to_string());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let cpu = (cpu_time(pid) - cpu_before).as_secs_f64() / started.elapsed().as_secs_f64();
    let peak = peak_kib(pid);
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let warnings_for = |name: &str| {
        log_text
            .lines()
            .filter(|line| line.contains("skipping") && line.contains(name))
            .count()
    };
    eprintln!(
        "20 invalid 4 MiB files: {:.1} % of a core after the first scans, peak {} MiB, \
         {} of {probes} probes 200, {rewrites} rewrites; warnings for engine-0: {}, engine-9: {}",
        cpu * 100.0,
        peak / 1024,
        probes - unhealthy.len(),
        warnings_for("engine-0.json"),
        warnings_for("engine-9.json"),
    );
    assert!(unhealthy.is_empty(), "{unhealthy:?}");
    assert!(cpu <= 0.10, "{:.1} % of a core", cpu * 100.0);
    assert!(peak <= 128 * 1024, "peak {peak} KiB");
    for name in [
        "engine-0.json",
        "engine-1.json",
        "engine-9.json",
        "engine-19.json",
    ] {
        assert_eq!(warnings_for(name), 1, "{name}:\n{log_text}");
    }
}

#[test]
fn a_hundred_thousand_junk_files_cost_at_most_a_fifth_of_a_core() {
    let dir = Scratch::new("junk-files");
    for i in 0..100_000u32 {
        // Named like published files, so each is listed and looked at; junk inside.
        dir.file(&format!("junk-{i}.json"), b"junk");
    }
    let server = collecting_sidecar(dir.path(), "1s", std::process::Stdio::null());
    let pid = server.pid();
    std::thread::sleep(Duration::from_secs(4));
    let (cpu_before, started) = (cpu_time(pid), Instant::now());
    let mut unhealthy = 0;
    while started.elapsed() < Duration::from_secs(8) {
        if request(server.addr, "GET", "/healthz").map_or(true, |r| r.status != 200) {
            unhealthy += 1;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let cpu = (cpu_time(pid) - cpu_before).as_secs_f64() / started.elapsed().as_secs_f64();
    eprintln!(
        "100k junk files: {:.1} % of a core after the first scans, peak {} MiB",
        cpu * 100.0,
        peak_kib(pid) / 1024
    );
    assert_eq!(unhealthy, 0);
    assert!(cpu <= 0.20, "{:.1} % of a core", cpu * 100.0);
}
