//! `gpumem demo` as a user runs it: prints its URL, serves live allocations, forces a pressure
//! spike on request, exits 0 after `--duration` or on SIGTERM, and refuses bad flags and a
//! taken port with one line and the right exit code. (Starting it is `support::Running`, which
//! the Prometheus and browser tests, `e2e` and `browser`, use as well.)

use crate::support::{gpumem, Running};
use crate::web::{eventually, get, request, value_of};
use std::net::SocketAddr;
use std::time::Duration;

fn live_allocations(addr: SocketAddr) -> f64 {
    let metrics = get(addr, "/metrics");
    value_of(&metrics.body, "gpumem_live_allocations", "gpu=\"0\"").unwrap_or(0.0)
}

#[test]
fn the_demo_serves_live_allocations_and_exits_after_its_duration() {
    let mut demo = Running::sim_demo("5s");
    let addr = demo.addr;
    assert!(
        eventually(Duration::from_secs(4), || live_allocations(addr) > 0.0),
        "no live allocations on /metrics"
    );
    assert!(
        eventually(Duration::from_secs(4), || {
            let page = get(addr, "/").body;
            page.contains("Simulated H100") && page.contains("kv_cache")
        }),
        "the page should show the device and the KV cache once the model is loaded"
    );
    assert_eq!(get(addr, "/healthz").status, 200);
    let status = demo.wait(Duration::from_secs(30));
    assert!(status.success(), "demo exited with {status}");
}

#[cfg(unix)]
#[test]
fn a_pressure_spike_goes_critical_and_sigterm_stops_the_demo() {
    let mut demo = Running::start(&[
        "demo",
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "100ms",
        "--backend",
        "sim",
        "--sim-memory",
        "16GiB",
    ]);
    let addr = demo.addr;
    let spike =
        request(addr, "POST", "/api/v1/demo/pressure-spike?seconds=30").expect("spike request");
    assert_eq!(spike.status, 202, "{}", spike.body);
    assert_eq!(
        request(addr, "POST", "/api/v1/demo/pressure-spike?seconds=0")
            .expect("request")
            .status,
        400
    );
    let critical = "state=\"critical\"";
    assert!(
        eventually(Duration::from_secs(10), || {
            value_of(
                &get(addr, "/metrics").body,
                "gpumem_pressure_state",
                critical,
            ) == Some(1.0)
        }),
        "the spike did not make pressure critical"
    );
    assert_eq!(
        value_of(
            &get(addr, "/metrics").body,
            "gpumem_pressure_level",
            "gpu=\"0\""
        ),
        Some(3.0)
    );

    let status = demo.terminate(Duration::from_secs(20));
    assert!(status.success(), "demo exited with {status} on SIGTERM");
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    for (args, flag) in [
        (&["--interval", "10ms"][..], "--interval"),
        (&["--interval", "soon"][..], "--interval"),
        (&["--listen", "localhost"][..], "--listen"),
        (&["--duration", "5"][..], "--duration"),
        (&["--leak-age", "old"][..], "--leak-age"),
    ] {
        let output = gpumem(&["demo"])
            .args(args)
            .args(["--backend", "sim"])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(flag),
            "{args:?} should name {flag}: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(output.stdout.is_empty());
    }
}

#[test]
fn a_taken_port_is_one_line_and_exit_1() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let output = gpumem(&[
        "demo",
        "--listen",
        &addr,
        "--duration",
        "2s",
        "--backend",
        "sim",
    ])
    .output()
    .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("could not listen on {addr}")),
        "{stderr}"
    );
    assert!(
        stderr.contains("--listen"),
        "the error should say how to fix it: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}
