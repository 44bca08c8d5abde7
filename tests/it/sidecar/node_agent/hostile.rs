//! Issue 48: the node agent on a hostile node. Credential files are read like `--config`
//! (regular files only, opened without blocking, size-capped): `/dev/zero` or a FIFO as the CA
//! or the token is one line and exit 2 within 1 s, and a token turned into a FIFO while the
//! agent runs turns `gpumem_pod_list_up` to 0 with the reason on `/healthz`. A pod list larger
//! than the agent's memory allows is refused, said so, and the last good list kept, with the
//! agent's peak memory under the chart's 128 MiB limit.

use super::agent::NODE;
use super::apiserver::{pod, ApiServer};
use crate::sidecar::TempDir;
use crate::support::{peak_kib, serve_args, Running};
use crate::web::{eventually, get, value_of};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn fifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// `serve` listing `NODE`'s pods from `url` with these credential files: its exit status, its
/// stderr and how long it took (killed after 3 s).
fn start_with(url: &str, ca: &Path, token: &Path) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let mut child =
        crate::support::gpumem(&["serve", "--backend", "sim", "--listen", "127.0.0.1:0"])
            .args([
                "--pod-source",
                "kubernetes",
                "--node-name",
                NODE,
                "--kubernetes-url",
                url,
            ])
            .args(["--kubernetes-ca", ca.to_str().expect("utf-8")])
            .args(["--kubernetes-token-file", token.to_str().expect("utf-8")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("runs");
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status.code();
        }
        if started.elapsed() > Duration::from_secs(3) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    (status, stderr, elapsed)
}

#[test]
fn devices_fifos_and_huge_files_as_credentials_are_one_line_and_exit_2_at_once() {
    let api = ApiServer::start(NODE);
    let dir = TempDir::new("credentials");
    let fifo_file = dir.join("fifo");
    fifo(&fifo_file);
    let huge = dir.join("huge");
    std::fs::write(&huge, vec![b'A'; 4 << 20]).expect("write");
    let zero = Path::new("/dev/zero");
    let (ca, token) = (api.ca_file.as_path(), api.token_file.as_path());
    for (what, ca, token, says) in [
        ("CA /dev/zero", zero, token, "CA file"),
        ("CA FIFO", fifo_file.as_path(), token, "CA file"),
        ("CA 4 MiB", huge.as_path(), token, "CA file"),
        ("token /dev/zero", ca, zero, "token"),
        ("token FIFO", ca, fifo_file.as_path(), "token"),
        ("token 4 MiB", ca, huge.as_path(), "token"),
    ] {
        let (status, stderr, took) = start_with(&api.url(), ca, token);
        eprintln!("{what}: exit {status:?} in {took:?}: {}", stderr.trim());
        assert_eq!(status, Some(2), "{what}: {stderr}");
        assert!(took < Duration::from_secs(1), "{what} took {took:?}");
        assert_eq!(stderr.trim().lines().count(), 1, "{what}: {stderr}");
        assert!(
            stderr.starts_with("gpumem: ") && stderr.contains(says),
            "{what}: {stderr}"
        );
    }
}

/// An agent listing `api`'s pods every second (nothing else to do).
fn agent(api: &ApiServer, stderr: Stdio) -> Running {
    let kubernetes = api.agent_args("1s");
    let mut args = serve_args("500ms");
    args.extend(kubernetes.iter().map(String::as_str));
    Running::start_with_stderr(&args, stderr)
}

fn three_pods(api: &ApiServer) {
    api.set_pods(
        (0..3)
            .map(|i| pod("serving", &format!("engine-{i}"), &format!("uid-{i}"), &[]))
            .collect(),
    );
}

fn pod_list(agent: &Running) -> (f64, f64) {
    let metrics = get(agent.addr, "/metrics").body;
    (
        value_of(&metrics, "gpumem_pod_list_up", "").unwrap_or(-1.0),
        value_of(&metrics, "gpumem_pod_list_pods", "").unwrap_or(-1.0),
    )
}

/// An API server with three pods on the node, and an agent whose pod list is up with them.
fn agent_listing_three_pods() -> (ApiServer, Running) {
    let api = ApiServer::start(NODE);
    three_pods(&api);
    let agent = agent(&api, Stdio::null());
    assert!(
        eventually(Duration::from_secs(15), || pod_list(&agent) == (1.0, 3.0)),
        "the pod list is up"
    );
    (api, agent)
}

#[test]
fn a_token_turned_into_a_fifo_turns_the_pod_list_down_within_two_refreshes() {
    let (api, agent) = agent_listing_three_pods();
    std::fs::remove_file(&api.token_file).expect("remove the token");
    fifo(&api.token_file);
    let swapped = Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || pod_list(&agent).0 == 0.0),
        "the pod list is down"
    );
    let took = swapped.elapsed();
    let health = get(agent.addr, "/healthz").body;
    eprintln!("down {took:?} after the swap; /healthz: {}", health.trim());
    assert!(
        took <= Duration::from_secs(2) + Duration::from_millis(1500),
        "{took:?}"
    );
    assert!(health.contains("token"), "{health}");
    // The last good list is kept, and a token put back brings it up again.
    assert_eq!(pod_list(&agent).1, 3.0);
    std::fs::remove_file(&api.token_file).expect("remove the FIFO");
    std::fs::write(&api.token_file, format!("{}\n", super::apiserver::TOKEN)).expect("write");
    assert!(
        eventually(Duration::from_secs(15), || pod_list(&agent).0 == 1.0),
        "the pod list is up again"
    );
}

#[test]
fn a_60_mib_pod_list_is_refused_within_the_memory_limit_and_the_last_one_kept() {
    let (api, agent) = agent_listing_three_pods();
    // Minimal pods (a UID each), the cheapest to send and the most objects per byte.
    let mut raw = String::with_capacity(61 << 20);
    raw.push_str(r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":["#);
    let mut i = 0u64;
    while raw.len() < 60 << 20 {
        if i > 0 {
            raw.push(',');
        }
        raw.push_str(&format!(r#"{{"metadata":{{"uid":"u{i:09}"}}}}"#));
        i += 1;
    }
    raw.push_str("]}");
    *api.shared.raw_list.lock() = Some(Arc::new(raw));
    let before = api.requests();
    assert!(
        eventually(Duration::from_secs(30), || api.requests() >= before + 2),
        "two more requests"
    );
    assert!(
        eventually(Duration::from_secs(10), || pod_list(&agent).0 == 0.0),
        "the pod list is down"
    );
    let health = get(agent.addr, "/healthz").body;
    let peak = peak_kib(agent.pid());
    eprintln!(
        "a 60 MiB pod list: peak {} MiB; /healthz: {}",
        peak / 1024,
        health.trim()
    );
    assert!(health.contains("larger than"), "{health}");
    assert_eq!(pod_list(&agent).1, 3.0, "the last good list is kept");
    assert!(peak <= 128 * 1024, "peak {peak} KiB");
}

#[test]
fn a_ca_file_changed_at_run_time_is_read_again_under_the_same_rules() {
    let (api, agent) = agent_listing_three_pods();
    let good_ca = std::fs::read(&api.ca_file).expect("the CA");
    // Another CA, which did not sign the API server's certificate: read again, trusted, refused.
    let other = rcgen::generate_simple_self_signed(vec!["other-ca.test".to_string()])
        .expect("a certificate");
    std::fs::write(&api.ca_file, other.cert.pem()).expect("write");
    assert!(
        eventually(Duration::from_secs(10), || pod_list(&agent).0 == 0.0),
        "a CA that did not sign the server is used"
    );
    // A FIFO in its place: refused at once, named on /healthz.
    std::fs::remove_file(&api.ca_file).expect("remove");
    fifo(&api.ca_file);
    assert!(
        eventually(Duration::from_secs(10), || get(agent.addr, "/healthz")
            .body
            .contains("is a FIFO")),
        "/healthz names the FIFO: {}",
        get(agent.addr, "/healthz").body
    );
    std::fs::remove_file(&api.ca_file).expect("remove");
    std::fs::write(&api.ca_file, good_ca).expect("write");
    assert!(
        eventually(Duration::from_secs(15), || pod_list(&agent).0 == 1.0),
        "the pod list is up again with the right CA"
    );
}
