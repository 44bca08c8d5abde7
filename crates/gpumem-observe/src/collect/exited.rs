//! Processes that stopped publishing: when a collected process drops out (its pid is gone, its
//! file went stale, or it removed its file), the sidecar keeps its last snapshot — peak, OOM
//! count, pools, tags — as "exited" for a while, so the moment that most needs explaining does
//! not vanish with its series. A file left behind by a process that is gone is removed (once),
//! so the directory does not fill with the dead.

use gpumem::snapshot::process::pid_alive;
use gpumem::snapshot::{CollectedProcess, ExitedProcess};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How long an exited process stays listed unless `--exited-retention` says otherwise.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(15 * 60);
/// Exited processes listed at most (a crash loop must not grow the page without bound).
pub const MAX_EXITED: usize = 64;

/// Remembers the live processes of the previous scan and the exited ones.
pub struct ExitedTracker {
    dir: PathBuf,
    retention: Duration,
    live: BTreeMap<(String, u32), CollectedProcess>,
    exited: Vec<ExitedProcess>,
}

impl ExitedTracker {
    pub fn new(dir: PathBuf, retention: Duration) -> Self {
        ExitedTracker {
            dir,
            retention,
            live: BTreeMap::new(),
            exited: Vec::new(),
        }
    }

    /// Compares this scan's processes with the last one's; returns the exited ones to list,
    /// newest first.
    pub fn update(&mut self, processes: &[CollectedProcess], now: f64) -> Vec<ExitedProcess> {
        let mut live: BTreeMap<(String, u32), CollectedProcess> = processes
            .iter()
            .map(|p| ((p.process.clone(), p.pid), p.clone()))
            .collect();
        // Back again (a stale file written to again, a pid reused): no longer exited.
        self.exited
            .retain(|e| !live.contains_key(&(e.last.process.clone(), e.last.pid)));
        for (key, last) in std::mem::take(&mut self.live) {
            if live.contains_key(&key) {
                continue;
            }
            let exited = self.gone(last, now);
            self.exited.insert(0, exited);
        }
        std::mem::swap(&mut self.live, &mut live);
        let keep = self.retention.as_secs_f64();
        self.exited.retain(|e| now - e.exited_at_seconds <= keep);
        self.exited.truncate(MAX_EXITED);
        self.exited.clone()
    }

    /// Classifies a process that dropped out, removes the file it left, and says so once.
    fn gone(&self, last: CollectedProcess, now: f64) -> ExitedProcess {
        let path = self.dir.join(&last.file);
        let left_behind = path.is_file();
        let reason = if !left_behind {
            "stopped"
        } else if pid_alive(last.pid) == Some(false) {
            "exited"
        } else {
            "stale"
        };
        let mut removed = false;
        if left_behind {
            match std::fs::remove_file(&path) {
                Ok(()) => removed = true,
                Err(error) => {
                    tracing::debug!("collect: could not remove {}: {error}", path.display())
                }
            }
        }
        let peak: u64 = last
            .devices
            .iter()
            .filter_map(|d| d.reserved_peak_bytes)
            .sum();
        let ooms: u64 = last.devices.iter().filter_map(|d| d.ooms_total).sum();
        tracing::warn!(
            "collect: {} (pid {}) {}: last seen {:.0}s ago, reserved peak {}, {} OOM(s); listed as exited for {}{}",
            last.process,
            last.pid,
            match reason {
                "stopped" => "stopped and removed its file",
                "exited" => "is gone (its pid no longer runs)",
                _ => "stopped publishing",
            },
            (now - last.timestamp_seconds).max(0.0),
            gpumem::units::Bytes(peak),
            ooms,
            gpumem::units::format_duration(self.retention),
            if removed { "; its file was removed" } else { "" }
        );
        ExitedProcess {
            last,
            exited_at_seconds: now,
            reason: reason.to_string(),
            file_removed: removed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: u32, file: &str) -> CollectedProcess {
        CollectedProcess {
            pid,
            process: "engine".into(),
            file: file.into(),
            timestamp_seconds: 100.0,
            ..CollectedProcess::default()
        }
    }

    #[test]
    fn a_vanished_process_is_kept_for_the_retention_then_forgotten() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A pid that cannot run: the file it left is removed.
        let dead = u32::MAX - 7;
        std::fs::write(dir.path().join("gpumem-dead.json"), b"{}").expect("write");
        let mut tracker = ExitedTracker::new(dir.path().to_path_buf(), Duration::from_secs(60));
        let both = [
            process(dead, "gpumem-dead.json"),
            process(1, "gpumem-1.json"),
        ];
        assert!(tracker.update(&both, 100.0).is_empty());
        let exited = tracker.update(&both[1..], 101.0);
        assert_eq!(exited.len(), 1);
        assert_eq!(exited[0].last.pid, dead);
        assert_eq!(exited[0].reason, "exited");
        assert!(exited[0].file_removed);
        assert!(!dir.path().join("gpumem-dead.json").exists());
        assert_eq!(tracker.update(&both[1..], 160.0).len(), 1);
        assert!(
            tracker.update(&both[1..], 162.0).is_empty(),
            "past the retention"
        );
        // One that removed its own file stopped cleanly.
        assert!(tracker.update(&[], 163.0)[0].reason == "stopped");
    }
}
