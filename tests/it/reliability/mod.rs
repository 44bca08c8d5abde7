//! Reliability (issue 9): bad input everywhere, fault injection through the simulated device,
//! the fuzz targets' checks over their committed corpora, concurrency stress, a model check of
//! the lock-free statistics, HTTP abuse and a short soak. Helpers shared by those modules live
//! here: the binary with a clean environment, scratch directories, and process probes.

mod alloc_model;
mod bad_input;
mod corpus;
mod faults;
mod fuzz_checks;
mod hardening;
mod http_abuse;
mod model_check;
mod properties;
mod retired_pools;
mod server_load;
mod soak;
mod stress;

use std::path::{Path, PathBuf};

/// The bad-input cases run the binary exactly as a user would (no `GPUMEM_LOG` either).
pub(crate) use crate::support::gpumem_as_user as gpumem;

/// A scratch directory, removed when dropped.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new(label: &str) -> Scratch {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "gpumem-reliability-{label}-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `contents` to `name` inside the directory and returns its path.
    pub(crate) fn file(&self, name: &str, contents: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("write a scratch file");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Gzip-compresses `text`.
pub(crate) fn gzip(text: &[u8]) -> Vec<u8> {
    use flate2::write::GzEncoder;
    use std::io::Write;
    let mut encoder = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(text).expect("compress in memory");
    encoder.finish().expect("compress in memory")
}

/// Resident memory of a process in KiB (`VmRSS`), if it is still running.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// Open file descriptors of a process, if it is still running.
pub(crate) fn open_fds(pid: u32) -> Option<usize> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|entries| entries.count())
}
