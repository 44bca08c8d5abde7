//! Processes that stopped publishing: when a collected process drops out (its pid is gone, its
//! file went stale, or it removed its file), the collector keeps its last snapshot — peak, OOM
//! count, pools, tags — as "exited" for a while, so the moment that most needs explaining does
//! not vanish with its series. A file left behind by a process that is gone is removed (once),
//! so the directory does not fill with the dead.
//!
//! Nothing live is deleted: a process can drop out of a scan while it runs (over the budget, a
//! duplicate, a paused writer), and its file can meanwhile belong to another process (a pid
//! reused under a new name, another PID namespace). So the file is opened afresh and removed
//! only if it still holds the process judged gone — same pid, same name — that process's pid
//! namespace is the collector's own, and `/proc` says the pid is gone; and only if the name still
//! points at the file that was checked. (A file newer than the last scan is no sign of life: a
//! writer killed with `kill -9` often wrote once more after the collector last read it. A live
//! writer under that pid and name keeps its pid in `/proc`, and its file stays.)

use super::read::{parse, MAX_FILE_BYTES};
use crate::newest;
use gpumem::safe_fs::{open_regular, read_capped};
use gpumem_wire::process::{current_pid_namespace, pid_alive};
use gpumem_wire::{CollectedProcess, ExitedProcess};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long an exited process stays listed unless `--exited-retention` says otherwise.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(15 * 60);
/// Exited processes listed at most (a crash loop must not grow the page without bound).
pub const MAX_EXITED: usize = 64;
/// Gone processes remembered as logged, at most: past it the oldest are forgotten, so 44,000
/// publishers renamed within the retention hold about 100 KiB here, not the 4 MiB they held for
/// 15 minutes. One forgotten that drops out again is logged again: a line more, among a thousand.
const MAX_LOGGED: usize = 1024;

/// Remembers the live processes of the previous scan and the exited ones.
pub struct ExitedTracker {
    dir: PathBuf,
    retention: Duration,
    live: BTreeMap<(String, u32), CollectedProcess>,
    exited: Vec<ExitedProcess>,
    pid_namespace: Option<String>,
    /// The gone processes already logged, and when: one that drops out again (in and out of
    /// the budget, say) is not logged again within the retention.
    logged: BTreeMap<(String, u32), f64>,
    /// Warnings logged, for tests.
    warnings: u64,
}

/// What the file a gone process published holds now, read afresh.
enum LeftBehind {
    /// No file: the process removed it as it stopped.
    Nothing,
    /// Still the process judged gone (same pid and name): the file's device and inode, and
    /// whether its pid namespace is the collector's.
    Same {
        inode: (u64, u64),
        own_namespace: bool,
    },
    /// Written since by another process (a reused pid under another name, another pid), or
    /// not a readable published file: not the collector's to remove.
    Other,
}

impl ExitedTracker {
    pub fn new(dir: PathBuf, retention: Duration) -> Self {
        ExitedTracker {
            dir,
            retention,
            live: BTreeMap::new(),
            exited: Vec::new(),
            pid_namespace: current_pid_namespace(),
            logged: BTreeMap::new(),
            warnings: 0,
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
        // A scan that lost hundreds of processes grew the list past what it keeps.
        if self.exited.capacity() > 2 * MAX_EXITED {
            self.exited.shrink_to(MAX_EXITED);
        }
        self.logged.retain(|_, at| now - *at <= keep);
        if self.logged.len() > MAX_LOGGED {
            if let Some(oldest_kept) = newest::cutoff(self.logged.values().copied(), MAX_LOGGED / 2)
            {
                self.logged.retain(|_, at| *at >= oldest_kept);
            }
        }
        self.exited.clone()
    }

    /// What `last`'s file holds now; see [`LeftBehind`].
    fn left_behind(&self, path: &Path, last: &CollectedProcess) -> LeftBehind {
        let file = match open_regular(path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return LeftBehind::Nothing
            }
            Err(_) => return LeftBehind::Other,
        };
        let Ok(meta) = file.metadata() else {
            return LeftBehind::Other;
        };
        let Ok(Ok(bytes)) = read_capped(file, MAX_FILE_BYTES) else {
            return LeftBehind::Other;
        };
        let Ok(published) = parse(&bytes) else {
            return LeftBehind::Other;
        };
        // A newer snapshot by the same pid and name is the same process's last words (written
        // after the last scan): whether it is gone is the pid's to say.
        let same = published.pid == last.pid && published.process == last.process;
        if !same {
            return LeftBehind::Other;
        }
        LeftBehind::Same {
            inode: (meta.dev(), meta.ino()),
            own_namespace: published.pid_namespace.is_some()
                && published.pid_namespace == self.pid_namespace,
        }
    }

    /// Classifies a process that dropped out, removes the file it left if it is still that
    /// process's and the process is gone, and says so once.
    fn gone(&mut self, last: CollectedProcess, now: f64) -> ExitedProcess {
        let path = self.dir.join(&last.file);
        let (reason, inode) = match self.left_behind(&path, &last) {
            LeftBehind::Nothing => ("stopped", None),
            // Only a pid in the collector's own namespace can be looked up.
            LeftBehind::Same {
                inode,
                own_namespace: true,
            } if pid_alive(last.pid) == Some(false) => ("exited", Some(inode)),
            LeftBehind::Same { .. } | LeftBehind::Other => ("stale", None),
        };
        let mut removed = false;
        if let Some(checked) = inode {
            // The name must still point at the file checked: a writer renames new files over it.
            let now_there = std::fs::symlink_metadata(&path).map(|m| (m.dev(), m.ino()));
            if now_there.is_ok_and(|inode| inode == checked) {
                match std::fs::remove_file(&path) {
                    Ok(()) => removed = true,
                    Err(error) => {
                        tracing::debug!("collect: could not remove {}: {error}", path.display())
                    }
                }
            }
        }
        let key = (last.process.clone(), last.pid);
        let first_time = !self.logged.contains_key(&key);
        self.logged.insert(key, now);
        if !first_time {
            tracing::debug!(
                "collect: {} (pid {}) dropped out again",
                last.process,
                last.pid
            );
            return ExitedProcess {
                last,
                exited_at_seconds: now,
                reason: reason.to_string(),
                file_removed: removed,
            };
        }
        self.warnings += 1;
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
        named(pid, "engine", file)
    }

    fn named(pid: u32, name: &str, file: &str) -> CollectedProcess {
        CollectedProcess {
            pid,
            process: name.into(),
            file: file.into(),
            timestamp_seconds: 100.0,
            ..CollectedProcess::default()
        }
    }

    /// What `pid` publishing as `name` writes, in this (the collector's) pid namespace or not.
    fn published(pid: u32, name: &str, own_namespace: bool) -> String {
        let namespace = match own_namespace {
            true => current_pid_namespace().unwrap_or_default(),
            false => "pid:[1]".to_string(),
        };
        serde_json::json!({
            "format": "gpumem.publish", "version": 1, "pid": pid, "process": name,
            "pid_namespace": namespace, "timestamp_seconds": 100.0, "devices": [],
        })
        .to_string()
    }

    #[test]
    fn a_vanished_process_is_kept_for_the_retention_then_forgotten() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A pid that cannot run: the file it left is removed.
        let dead = u32::MAX - 7;
        std::fs::write(
            dir.path().join("gpumem-dead.json"),
            published(dead, "engine", true),
        )
        .expect("write");
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

    #[test]
    fn a_file_now_published_under_another_name_is_not_removed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let me = std::process::id();
        let path = dir.path().join("gpumem-engine.json");
        std::fs::write(&path, published(me, "engine", true)).expect("write");
        let mut tracker = ExitedTracker::new(dir.path().to_path_buf(), Duration::from_secs(60));
        tracker.update(&[named(me, "engine", "gpumem-engine.json")], 100.0);
        // The same pid publishes into the same file under a new name: "engine" is gone, the
        // file is the new one's.
        std::fs::write(&path, published(me, "engine-v2", true)).expect("write");
        let exited = tracker.update(&[named(me, "engine-v2", "gpumem-engine.json")], 101.0);
        assert_eq!(exited.len(), 1);
        assert!(!exited[0].file_removed);
        assert!(path.exists(), "the live process's file was deleted");
    }

    #[test]
    fn a_pid_from_another_namespace_or_alive_keeps_its_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let dead_here = u32::MAX - 7;
        let elsewhere = dir.path().join("elsewhere.json");
        std::fs::write(&elsewhere, published(dead_here, "remote", false)).expect("write");
        let alive = dir.path().join("alive.json");
        let me = std::process::id();
        std::fs::write(&alive, published(me, "paused", true)).expect("write");
        let mut tracker = ExitedTracker::new(dir.path().to_path_buf(), Duration::from_secs(60));
        let both = [
            named(dead_here, "remote", "elsewhere.json"),
            named(me, "paused", "alive.json"),
        ];
        tracker.update(&both, 100.0);
        let exited = tracker.update(&[], 101.0);
        assert!(exited
            .iter()
            .all(|e| e.reason == "stale" && !e.file_removed));
        assert!(elsewhere.exists() && alive.exists());
    }

    #[test]
    fn publishers_renamed_again_and_again_leave_bounded_tables() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut tracker = ExitedTracker::new(dir.path().to_path_buf(), DEFAULT_RETENTION);
        // 250 new publishers a scan, each gone by the next: 8,000 within the retention.
        for scan in 0..32u32 {
            let batch: Vec<CollectedProcess> = (0..250)
                .map(|i| {
                    let pid = 1_000_000 + scan * 250 + i;
                    named(pid, &format!("engine-{pid}"), &format!("gpumem-{pid}.json"))
                })
                .collect();
            tracker.update(&batch, 100.0 + f64::from(scan));
            assert!(
                tracker.logged.len() <= MAX_LOGGED,
                "{}",
                tracker.logged.len()
            );
        }
        assert_eq!(tracker.update(&[], 200.0).len(), MAX_EXITED);
        assert!(tracker.exited.capacity() <= 2 * MAX_EXITED);
        assert!(
            tracker.logged.len() >= MAX_LOGGED / 2,
            "the newest are kept"
        );
    }

    #[test]
    fn a_process_that_drops_out_again_is_logged_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut tracker = ExitedTracker::new(dir.path().to_path_buf(), Duration::from_secs(60));
        let flapping = [process(std::process::id(), "gpumem-flap.json")];
        for t in 0..10 {
            tracker.update(&flapping, 100.0 + f64::from(t));
            tracker.update(&[], 100.5 + f64::from(t));
        }
        assert_eq!(tracker.warnings, 1);
    }
}
