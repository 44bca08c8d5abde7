//! The sidecar: publishing (`gpumem::publish`), collecting (`gpumem::collect`), `gpumem serve`
//! as a user runs it next to `gpumem demo --publish-dir`, NVML (real where there is a GPU, its
//! absence everywhere else), the Python writer of docs/publish-format.md, and the Docker and
//! Kubernetes files checked against what the binary serves.

mod collect;
mod compose;
mod gpu;
mod k8s;
mod manifests;
mod publish;
mod python;
mod serve;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A directory under the system's temporary directory, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "gpumem-it-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn str(&self) -> &str {
        self.0.to_str().expect("temporary paths are UTF-8")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The gpumem binary with a clean environment (no GPUMEM_* settings from the caller).
pub fn gpumem(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpumem"));
    command.args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("GPUMEM_") {
            command.env_remove(key);
        }
    }
    command.env("GPUMEM_LOG", "warn");
    command
}

/// A serving gpumem command (`demo`, `serve`); killed if the test ends first.
pub struct Running {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Running {
    /// Starts `gpumem <args>` and waits for its "gpumem <command>: open http://ADDR/" line.
    pub fn start(args: &[&str]) -> Running {
        let mut child = gpumem(args)
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
            .unwrap_or_else(|_| panic!("gpumem {args:?} printed no URL"));
        let url = line
            .split_once(": open http://")
            .map(|(_, url)| url)
            .unwrap_or_else(|| panic!("unexpected first line: {line}"));
        let addr = url
            .trim_end_matches('/')
            .parse()
            .expect("a socket address in the URL");
        Running { child, addr }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it with SIGKILL (no chance to clean up) and reaps it, so its pid is gone.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self, limit: Duration) -> ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_hard();
        }
    }
}

/// A valid published file for `pid`, taken at `timestamp`, with one device.
pub fn published(pid: u32, process: &str, timestamp: f64) -> String {
    serde_json::json!({
        "format": "gpumem.publish",
        "version": 1,
        "pid": pid,
        "process": process,
        "pid_namespace": gpumem::publish::process::current_pid_namespace(),
        "timestamp_seconds": timestamp,
        "interval_seconds": 1.0,
        "writer": "test",
        "devices": [{
            "gpu": 0,
            "uuid": "GPU-00000000-1111-2222-3333-444444444444",
            "reserved_bytes": 64u64 << 20,
            "in_use_bytes": 48u64 << 20,
            "ooms_total": 2,
            "pools": [{"pool": "large", "reserved_bytes": 64u64 << 20}]
        }]
    })
    .to_string()
}

/// Seconds since the Unix epoch.
pub fn now() -> f64 {
    gpumem::snapshot::unix_now()
}
