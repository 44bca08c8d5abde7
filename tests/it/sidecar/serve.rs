//! `gpumem serve` as a user runs it: next to `gpumem demo --publish-dir` (two real processes),
//! the demo's series appear with `process`/`pid` labels and go when the demo is killed or
//! frozen; bad files and a vanishing directory are reported, never fatal; no NVML is a degraded
//! 200, not a crash; bad flags exit 2; and `gpumem healthcheck` checks it.

use super::{now, published, publishing_demo, serve, TempDir};
use crate::support::{gpumem, promtool_check_metrics, Running};
use crate::web::{eventually, get, tool_available, value_of};
use std::process::Command;
use std::time::Duration;

const INTERVAL_MS: u64 = 200;

fn demo(dir: &TempDir) -> Running {
    publishing_demo(dir, &["--backend", "sim"])
}

fn reserved_of(sidecar: &Running, pid: u32) -> Option<f64> {
    let metrics = get(sidecar.addr, "/metrics").body;
    value_of(
        &metrics,
        "gpumem_reserved_bytes",
        &format!("process=\"gpumem-demo\",pid=\"{pid}\""),
    )
}

/// Three intervals, plus slack for a loaded test machine.
fn within_three_intervals() -> Duration {
    Duration::from_millis(3 * INTERVAL_MS + 3000)
}

#[test]
fn the_demos_series_appear_in_the_sidecar_and_go_with_it() {
    let dir = TempDir::new("serve-demo");
    let sidecar = serve(&dir, &["--backend", "sim"]);
    let mut engine = demo(&dir);
    let pid = engine.pid();
    assert!(
        eventually(Duration::from_secs(10), || reserved_of(&sidecar, pid)
            .is_some_and(|v| v > 0.0)),
        "the demo's reserved bytes never showed up in the sidecar"
    );
    let metrics = get(sidecar.addr, "/metrics").body;
    let labels = format!("process=\"gpumem-demo\",pid=\"{pid}\",gpu=\"0\",uuid=\"GPU-");
    for family in [
        "gpumem_in_use_bytes",
        "gpumem_live_allocations",
        "gpumem_allocations_total",
        "gpumem_leak_suspect_bytes",
    ] {
        assert!(
            value_of(&metrics, family, &labels).is_some(),
            "{family} missing:\n{metrics}"
        );
    }
    assert!(value_of(&metrics, "gpumem_pool_reserved_bytes", "pool=\"large\"").is_some());
    assert_eq!(
        value_of(&metrics, "gpumem_collect_processes", ""),
        Some(1.0)
    );
    assert_eq!(
        value_of(&metrics, "gpumem_up", "source=\"collect\""),
        Some(1.0)
    );
    assert_eq!(value_of(&metrics, "gpumem_up", "source=\"sim\""), Some(1.0));
    // The sidecar has no pools of its own: only process-labelled manager series.
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("gpumem_reserved_bytes{gpu=")),
        "{metrics}"
    );
    let snapshot: serde_json::Value =
        serde_json::from_str(&get(sidecar.addr, "/api/v1/snapshot").body).expect("JSON");
    assert_eq!(snapshot["sidecar"]["processes"][0]["pid"], pid);
    let page = get(sidecar.addr, "/").body;
    assert!(
        page.contains("gpumem-demo") && page.contains("Processes"),
        "{page}"
    );

    // Frozen (SIGSTOP): alive but silent, so stale after three intervals; back on SIGCONT.
    let signal = |name: &str| {
        let sent = Command::new("kill")
            .args([name, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
    };
    signal("-STOP");
    assert!(
        eventually(within_three_intervals(), || reserved_of(&sidecar, pid)
            .is_none()),
        "a frozen demo's series should go stale"
    );
    let metrics = get(sidecar.addr, "/metrics").body;
    assert_eq!(
        value_of(
            &metrics,
            "gpumem_collect_dropped_processes_total",
            "reason=\"stale\""
        ),
        Some(1.0)
    );
    signal("-CONT");
    assert!(
        eventually(Duration::from_secs(5), || reserved_of(&sidecar, pid)
            .is_some()),
        "the series should come back with fresh snapshots"
    );

    // Killed hard: the file stays behind, but the pid is gone.
    engine.kill_hard();
    assert!(dir.join(&format!("gpumem-{pid}.json")).exists());
    assert!(
        eventually(within_three_intervals(), || reserved_of(&sidecar, pid)
            .is_none()),
        "a killed demo's series should disappear within three intervals"
    );
    let metrics = get(sidecar.addr, "/metrics").body;
    assert_eq!(
        value_of(
            &metrics,
            "gpumem_collect_dropped_processes_total",
            "reason=\"exited\""
        ),
        Some(1.0)
    );
    assert_eq!(
        value_of(&metrics, "gpumem_collect_processes", ""),
        Some(0.0)
    );
    assert_eq!(get(sidecar.addr, "/healthz").status, 200);
}

#[test]
fn a_demo_stopped_with_sigterm_removes_its_file() {
    let dir = TempDir::new("serve-sigterm");
    let mut engine = demo(&dir);
    let file = dir.join(&format!("gpumem-{}.json", engine.pid()));
    assert!(eventually(Duration::from_secs(5), || file.exists()));
    let status = engine.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    assert!(
        !file.exists(),
        "the demo should remove its file when it stops"
    );
}

#[test]
fn bad_files_are_counted_while_the_good_ones_are_served() {
    let dir = TempDir::new("serve-bad");
    let me = std::process::id();
    let sidecar = serve(&dir, &["--backend", "sim"]);
    let good = published(me, "engine", now());
    std::fs::write(dir.join("torn.json"), &good[..good.len() / 3]).expect("write");
    std::fs::write(dir.join("garbage.json"), "%%%").expect("write");
    std::fs::write(dir.join("empty.json"), "").expect("write");
    std::fs::write(
        dir.join("future.json"),
        r#"{"format":"gpumem.publish","version":2}"#,
    )
    .expect("write");
    let rejected = |reason: &str| {
        value_of(
            &get(sidecar.addr, "/metrics").body,
            "gpumem_collect_rejected_files",
            &format!("reason=\"{reason}\""),
        )
    };
    // Keep a good file fresh while the sidecar looks.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = false;
    while std::time::Instant::now() < deadline && !seen {
        gpumem::safe_fs::write_atomically(
            &dir.path().join("good.json"),
            published(me, "engine", now()).as_bytes(),
            &Default::default(),
        )
        .expect("write");
        seen = ["truncated", "not_json", "empty", "newer_version"]
            .iter()
            .all(|r| rejected(r) == Some(1.0));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(seen, "{}", get(sidecar.addr, "/metrics").body);
    let metrics = get(sidecar.addr, "/metrics").body;
    assert!(value_of(&metrics, "gpumem_ooms_total", "process=\"engine\"").is_some());
    assert_eq!(get(sidecar.addr, "/healthz").status, 200);
}

#[test]
fn without_nvml_serve_keeps_serving_and_says_why() {
    let dir = TempDir::new("serve-no-nvml");
    // libm loads everywhere and is not NVML: the "no usable NVML" path, on any machine.
    let sidecar = serve(&dir, &["--nvml-library", "libm.so.6"]);
    std::fs::write(
        dir.join("a.json"),
        published(std::process::id(), "engine", now() + 5.0),
    )
    .expect("write");
    assert!(eventually(Duration::from_secs(5), || {
        value_of(
            &get(sidecar.addr, "/metrics").body,
            "gpumem_collect_processes",
            "",
        ) == Some(1.0)
    }));
    let metrics = get(sidecar.addr, "/metrics").body;
    assert_eq!(
        value_of(&metrics, "gpumem_up", "source=\"nvml\""),
        Some(0.0),
        "{metrics}"
    );
    assert!(
        metrics.contains("\ngpumem_up{source=\"sampler\"} 1\n"),
        "sampling itself works: {metrics}"
    );
    assert!(metrics.contains("backend=\"none\""), "{metrics}");
    let health = get(sidecar.addr, "/healthz");
    assert_eq!(health.status, 200, "a missing NVML must not fail liveness");
    assert!(health.body.starts_with("ok, degraded:"), "{}", health.body);
    assert!(health.body.contains("nvml: libm.so.6"), "{}", health.body);
    assert_eq!(get(sidecar.addr, "/").status, 200);
}

#[test]
fn on_a_host_without_nvml_the_default_is_the_same() {
    if gpumem_observe::nvml::NvmlReader::open(None).is_ok() {
        eprintln!("skipped: this host has NVML (the GPU tests cover it)");
        return;
    }
    let dir = TempDir::new("serve-default");
    let sidecar = serve(&dir, &[]);
    let metrics = get(sidecar.addr, "/metrics").body;
    assert_eq!(
        value_of(&metrics, "gpumem_up", "source=\"nvml\""),
        Some(0.0)
    );
    let health = get(sidecar.addr, "/healthz").body;
    assert!(health.contains("libnvidia-ml.so.1"), "{health}");
}

#[test]
fn a_collect_dir_that_disappears_turns_healthz_503_and_back() {
    let dir = TempDir::new("serve-vanish");
    let sidecar = serve(&dir, &["--backend", "sim"]);
    assert_eq!(get(sidecar.addr, "/healthz").status, 200);
    std::fs::remove_dir_all(dir.path()).expect("remove");
    assert!(
        eventually(Duration::from_secs(5), || get(sidecar.addr, "/healthz")
            .status
            == 503),
        "healthz should report the missing directory"
    );
    let health = get(sidecar.addr, "/healthz").body;
    assert!(
        health.contains("cannot read the collect directory"),
        "{health}"
    );
    let metrics = get(sidecar.addr, "/metrics").body;
    assert!(value_of(&metrics, "gpumem_collect_dir_errors_total", "").is_some_and(|v| v >= 1.0));
    assert_eq!(
        value_of(&metrics, "gpumem_up", "source=\"collect\""),
        Some(0.0)
    );
    std::fs::create_dir_all(dir.path()).expect("recreate");
    assert!(
        eventually(Duration::from_secs(5), || get(sidecar.addr, "/healthz")
            .status
            == 200),
        "healthz should recover with the directory"
    );
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    let dir = TempDir::new("serve-flags");
    std::fs::write(dir.join("file"), "").expect("write");
    let missing = dir.join("missing");
    let file = dir.join("file");
    for (args, says) in [
        (
            vec!["--collect-dir", missing.to_str().expect("utf-8")],
            "does not exist",
        ),
        (
            vec!["--collect-dir", file.to_str().expect("utf-8")],
            "is not a directory",
        ),
        (vec!["--backend", "cuda"], "--allow-cuda-context"),
        (vec!["--interval", "1ms"], "--interval"),
        (vec!["--listen", "nowhere"], "--listen"),
        (
            vec!["--backend", "sim", "--devices", "3"],
            "device 3 does not exist",
        ),
    ] {
        let output = gpumem(&["serve"]).args(&args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{args:?} should say {says}: {stderr}"
        );
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{args:?}: one line: {stderr}"
        );
        assert!(!stderr.contains("panicked"));
    }
}

#[test]
fn promtool_accepts_the_sidecars_metrics() {
    if !tool_available("promtool") {
        return;
    }
    let dir = TempDir::new("serve-promtool");
    let sidecar = serve(&dir, &["--backend", "sim", "--nvml-library", "libm.so.6"]);
    let _engine = demo(&dir);
    assert!(eventually(Duration::from_secs(10), || {
        value_of(
            &get(sidecar.addr, "/metrics").body,
            "gpumem_collect_processes",
            "",
        ) == Some(1.0)
    }));
    std::fs::write(dir.join("bad.json"), "nope").expect("write");
    std::thread::sleep(Duration::from_millis(3 * INTERVAL_MS));
    let body = get(sidecar.addr, "/metrics").body;
    let (status, said) = promtool_check_metrics(&body);
    assert!(
        status.success() && said.trim().is_empty(),
        "promtool: {said}\n{body}"
    );
}

#[test]
fn healthcheck_exits_0_when_healthy_and_1_when_not() {
    let dir = TempDir::new("healthcheck");
    let sidecar = serve(&dir, &["--backend", "sim"]);
    let base = format!("http://{}", sidecar.addr);
    let run = |args: &[&str]| gpumem(&["healthcheck"]).args(args).output().expect("runs");

    let ok = run(&["--url", &format!("{base}/healthz")]);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    // The default URL follows GPUMEM_LISTEN, checking an unspecified address on loopback.
    let listen = format!("0.0.0.0:{}", sidecar.addr.port());
    let by_env = gpumem(&["healthcheck"])
        .env("GPUMEM_LISTEN", &listen)
        .output()
        .expect("runs");
    assert_eq!(by_env.status.code(), Some(0), "{by_env:?}");

    let not_found = run(&["--url", &format!("{base}/nope")]);
    assert_eq!(not_found.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&not_found.stderr).contains("404"));
    std::fs::remove_dir_all(dir.path()).expect("remove");
    assert!(eventually(Duration::from_secs(5), || run(&[
        "--url",
        &format!("{base}/healthz")
    ])
    .status
    .code()
        == Some(1)));

    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let refused = run(&[
        "--url",
        &format!("http://127.0.0.1:{port}/healthz"),
        "--timeout",
        "1s",
    ]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert_eq!(run(&["--url", "ftp://x/"]).status.code(), Some(2));
}
