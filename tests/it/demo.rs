//! `gpumem demo` as a user runs it: prints its URL, serves live allocations, forces a pressure
//! spike on request, exits 0 after `--duration` or on SIGTERM, and refuses bad flags and a
//! taken port with one line and the right exit code. [`Running`] is the running demo the
//! Prometheus and browser tests (`e2e`, `browser`) start as well.

use crate::web::{eventually, get, request, value_of};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The demo binary with a clean environment (no GPUMEM_* flags leaking in from the caller).
fn demo(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpumem"));
    command.arg("demo").args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("GPUMEM_") {
            command.env_remove(key);
        }
    }
    command.env("GPUMEM_LOG", "warn");
    command
}

/// A running demo; killed if the test fails before it exits.
pub(crate) struct Running {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Running {
    /// Starts `gpumem demo ARGS` and waits (up to 30 s) for the URL it prints.
    pub(crate) fn start(args: &[&str]) -> Running {
        let mut child = demo(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the gpumem binary starts");
        let stdout = child.stdout.take().expect("stdout");
        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let line = received
            .recv_timeout(Duration::from_secs(30))
            .expect("the demo prints its URL");
        let url = line
            .strip_prefix("gpumem demo: open http://")
            .unwrap_or_else(|| panic!("unexpected first line: {line}"));
        let addr = url
            .trim_end_matches('/')
            .parse()
            .expect("a socket address in the URL");
        Running { child, addr }
    }

    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the demo did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn live_allocations(addr: SocketAddr) -> f64 {
    let metrics = get(addr, "/metrics");
    value_of(&metrics.body, "gpumem_live_allocations", "gpu=\"0\"").unwrap_or(0.0)
}

#[test]
fn the_demo_serves_live_allocations_and_exits_after_its_duration() {
    let mut demo = Running::start(&[
        "--listen",
        "127.0.0.1:0",
        "--duration",
        "5s",
        "--interval",
        "200ms",
        "--backend",
        "sim",
    ]);
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

    let killed = Command::new("kill")
        .args(["-TERM", &demo.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let status = demo.wait(Duration::from_secs(20));
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
        let output = demo(args)
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
    let output = demo(&["--listen", &addr, "--duration", "2s", "--backend", "sim"])
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
