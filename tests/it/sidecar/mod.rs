//! The sidecar: publishing (`gpumem_observe::publish`), collecting (`gpumem_observe::collect`), `gpumem serve`
//! as a user runs it next to `gpumem demo --publish-dir`, NVML (real where there is a GPU, its
//! absence everywhere else), CUDA graph pools and outside memory published as the process's own
//! exporter shows them, the Python writer of docs/publish-format.md, and the Docker and
//! Kubernetes files checked against what the binary serves.

mod blind;
mod collect;
mod compose;
mod device_wide;
mod gpu;
mod k8s;
pub(crate) mod manifests;
pub(crate) mod node_agent;
mod publish;
mod python;
mod serve;

use crate::support::Running;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory under the system's temporary directory, removed when dropped.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
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

    /// The directory `path`, made now and removed when dropped; it must not exist yet (what
    /// was there would be removed with it).
    pub(crate) fn at(path: &Path) -> TempDir {
        assert!(
            !path.exists(),
            "{} exists: move it away first",
            path.display()
        );
        std::fs::create_dir_all(path).expect("create the directory");
        TempDir(path.to_path_buf())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub(crate) fn str(&self) -> &str {
        self.0.to_str().expect("temporary paths are UTF-8")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `gpumem serve` on a free loopback port, sampling every 200 ms, collecting from `dir`, with
/// `extra` flags.
pub(crate) fn serve(dir: &TempDir, extra: &[&str]) -> Running {
    serve_logging_to(dir, extra, std::process::Stdio::inherit())
}

/// [`serve`], its log (stderr) going to `stderr`.
pub(crate) fn serve_logging_to(
    dir: &TempDir,
    extra: &[&str],
    stderr: impl Into<std::process::Stdio>,
) -> Running {
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "200ms",
        "--collect-dir",
        dir.str(),
    ];
    args.extend_from_slice(extra);
    Running::start_with_stderr(&args, stderr)
}

/// `gpumem demo` on `backend` (its flags), on a free loopback port, sampling every 200 ms and
/// publishing to `dir`.
pub(crate) fn publishing_demo(dir: &TempDir, backend: &[&str]) -> Running {
    let mut args = vec!["demo"];
    args.extend_from_slice(backend);
    args.extend([
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "200ms",
        "--publish-dir",
        dir.str(),
    ]);
    Running::start(&args)
}

/// A valid published file for `pid`, taken at `timestamp`, with one device.
pub(crate) fn published(pid: u32, process: &str, timestamp: f64) -> String {
    serde_json::json!({
        "format": "gpumem.publish",
        "version": 1,
        "pid": pid,
        "process": process,
        "pid_namespace": gpumem_wire::process::current_pid_namespace(),
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
pub(crate) fn now() -> f64 {
    gpumem_wire::unix_now()
}
