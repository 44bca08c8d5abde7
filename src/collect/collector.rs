//! The collector: every interval, reads each published file in the collect directory and decides
//! which processes to export. A process is dropped when its file is stale (older than three
//! intervals) or its pid is gone; a bad file is skipped, counted and logged once, and the last
//! good content of that file is kept until it goes stale (so a torn write does not flap series).

use super::read::{read_file, MAX_FILE_BYTES, REJECTION_REASONS};
use crate::publish::format::{is_published_name, PublishedFile};
use crate::publish::process::{current_pid_namespace, pid_alive};
use crate::snapshot::{unix_now, CollectStatus, CollectedProcess, ReasonCount};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Files read per scan, at most: bounds the work and the `process`/`pid` label values.
pub const MAX_FILES: usize = 256;
/// Why a process stops being exported (metric label values).
pub const DROP_REASONS: [&str; 2] = ["stale", "exited"];
/// A writer's own interval counts towards staleness only up to this: a file claiming a huge
/// interval must still expire.
const MAX_WRITER_INTERVAL: Duration = Duration::from_secs(600);

/// What to collect from.
#[derive(Clone, Debug)]
pub struct CollectSettings {
    pub dir: PathBuf,
    /// The collector's own interval; staleness is three of these (or of the writer's, if longer).
    pub interval: Duration,
    pub max_file_bytes: u64,
    pub max_files: usize,
}

impl CollectSettings {
    pub fn new(dir: impl Into<PathBuf>, interval: Duration) -> Self {
        CollectSettings {
            dir: dir.into(),
            interval,
            max_file_bytes: MAX_FILE_BYTES,
            max_files: MAX_FILES,
        }
    }
}

/// Checks the directory once at start, so a typo is an error and not an empty sidecar.
pub fn check_dir(dir: &Path) -> Result<(), String> {
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => std::fs::read_dir(dir)
            .map(drop)
            .map_err(|e| format!("cannot read the directory {shown}: {e}")),
        Ok(_) => Err(format!("{shown} is not a directory")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "{shown} does not exist (create it, or mount the volume the engines publish to there)"
        )),
        Err(e) => Err(format!("cannot read {shown}: {e}")),
    }
}

/// One scan's result.
#[derive(Debug, Default)]
pub struct Collected {
    /// Processes to export, sorted by process name and pid.
    pub processes: Vec<CollectedProcess>,
    pub status: CollectStatus,
    /// Set when the directory could not be listed: the sample counts as failed.
    pub problem: Option<String>,
}

/// What the collector remembers about one file between scans.
#[derive(Default)]
struct FileState {
    /// The last content that parsed and validated.
    latest: Option<PublishedFile>,
    /// The problem last logged for it, so each is logged once.
    problem: Option<String>,
    /// Why its process is not exported now (`stale`, `exited`), once counted.
    dropped: Option<&'static str>,
    duplicate_logged: bool,
}

/// Reads the collect directory; see the module documentation.
pub struct Collector {
    settings: CollectSettings,
    pid_namespace: Option<String>,
    files: BTreeMap<String, FileState>,
    rejections_total: BTreeMap<&'static str, u64>,
    dropped_total: BTreeMap<&'static str, u64>,
    dir_errors_total: u64,
    dir_problem: Option<String>,
    warned_too_many: bool,
}

impl Collector {
    pub fn new(settings: CollectSettings) -> Self {
        Collector {
            settings,
            pid_namespace: current_pid_namespace(),
            files: BTreeMap::new(),
            // Every reason from the start, at zero: counters should exist before they move.
            rejections_total: REJECTION_REASONS.iter().map(|r| (*r, 0)).collect(),
            dropped_total: DROP_REASONS.iter().map(|r| (*r, 0)).collect(),
            dir_errors_total: 0,
            dir_problem: None,
            warned_too_many: false,
        }
    }

    pub fn settings(&self) -> &CollectSettings {
        &self.settings
    }

    /// Reads every file and decides what to export, as of now.
    pub fn scan(&mut self) -> Collected {
        self.scan_at(unix_now())
    }

    /// [`scan`](Self::scan) with the clock given (Unix seconds), for tests.
    pub fn scan_at(&mut self, now: f64) -> Collected {
        let mut rejected: BTreeMap<&'static str, u64> =
            REJECTION_REASONS.iter().map(|r| (*r, 0)).collect();
        let (readable, files, problem) = match self.read_dir(&mut rejected) {
            Ok(files) => (true, files, None),
            Err(problem) => (false, 0, Some(problem)),
        };
        let processes = self.export(now, &mut rejected);
        let counts = |map: &BTreeMap<&'static str, u64>| -> Vec<ReasonCount> {
            map.iter()
                .map(|(reason, count)| ReasonCount {
                    reason: (*reason).to_string(),
                    count: *count,
                })
                .collect()
        };
        Collected {
            processes,
            status: CollectStatus {
                dir: self.settings.dir.display().to_string(),
                readable,
                files,
                rejected: counts(&rejected),
                rejections_total: counts(&self.rejections_total),
                dropped_total: counts(&self.dropped_total),
                dir_errors_total: self.dir_errors_total,
            },
            problem,
        }
    }

    /// Lists the directory and reads each candidate file; returns how many there were.
    fn read_dir(&mut self, rejected: &mut BTreeMap<&'static str, u64>) -> Result<u64, String> {
        let dir = &self.settings.dir;
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) => {
                self.dir_errors_total += 1;
                let problem = format!(
                    "cannot read the collect directory {}: {error}",
                    dir.display()
                );
                if self.dir_problem.as_deref() != Some(problem.as_str()) {
                    tracing::warn!("{problem}; keeping what was collected until it goes stale");
                    self.dir_problem = Some(problem.clone());
                }
                return Err(problem);
            }
        };
        if self.dir_problem.take().is_some() {
            tracing::info!("the collect directory {} is readable again", dir.display());
        }
        // Regular files only (the file type does not follow links): a FIFO would block the read.
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|name| is_published_name(name))
            .collect();
        names.sort_unstable();
        let found = names.len() as u64;
        if names.len() > self.settings.max_files {
            let skipped = names.split_off(self.settings.max_files);
            let count = skipped.len() as u64;
            *rejected.entry("too_many_files").or_default() += count;
            *self.rejections_total.entry("too_many_files").or_default() += count;
            if !self.warned_too_many {
                tracing::warn!(
                    "{} holds {found} files; reading the first {} by name, skipping the rest",
                    dir.display(),
                    self.settings.max_files
                );
                self.warned_too_many = true;
            }
        }
        let present: HashSet<&String> = names.iter().collect();
        // A process that stops cleanly removes its file: forget it, and its series go at once.
        self.files.retain(|name, _| present.contains(name));
        for name in &names {
            let state = self.files.entry(name.clone()).or_default();
            match read_file(&dir.join(name), self.settings.max_file_bytes) {
                Ok(file) => {
                    if state.problem.take().is_some() {
                        tracing::info!("collect: {name} is valid again");
                    }
                    state.latest = Some(file);
                }
                Err(rejection) => {
                    let reason = rejection.reason();
                    *rejected.entry(reason).or_default() += 1;
                    *self.rejections_total.entry(reason).or_default() += 1;
                    let message = rejection.to_string();
                    if state.problem.as_deref() != Some(message.as_str()) {
                        let kept = if state.latest.is_some() {
                            "; keeping its previous content until it goes stale"
                        } else {
                            ""
                        };
                        tracing::warn!("collect: skipping {name}: {message}{kept}");
                        state.problem = Some(message);
                    }
                }
            }
        }
        Ok(found)
    }

    /// The processes to export: fresh, alive, one per (process, pid).
    fn export(
        &mut self,
        now: f64,
        rejected: &mut BTreeMap<&'static str, u64>,
    ) -> Vec<CollectedProcess> {
        let interval = self.settings.interval;
        let mut exported: Vec<(String, CollectedProcess)> = Vec::new();
        for (name, state) in &mut self.files {
            let Some(file) = &state.latest else { continue };
            let age = (now - file.timestamp_seconds).max(0.0);
            let writer_interval = file
                .interval_seconds
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .unwrap_or_default()
                .min(MAX_WRITER_INTERVAL);
            let limit = 3.0 * interval.max(writer_interval).as_secs_f64();
            // Only a pid in our own namespace can be checked; elsewhere staleness decides.
            let same_namespace =
                file.pid_namespace.is_some() && file.pid_namespace == self.pid_namespace;
            let verdict = if age > limit {
                Some((
                    "stale",
                    format!("its snapshot is {age:.1}s old (limit {limit:.1}s)"),
                ))
            } else if same_namespace && pid_alive(file.pid) == Some(false) {
                Some(("exited", format!("pid {} is gone", file.pid)))
            } else {
                None
            };
            match (verdict, state.dropped) {
                (Some((reason, why)), None) => {
                    *self.dropped_total.entry(reason).or_default() += 1;
                    tracing::info!(
                        "collect: dropping {} (pid {}, {name}): {why}",
                        file.process,
                        file.pid
                    );
                    state.dropped = Some(reason);
                    continue;
                }
                (Some(_), Some(_)) => continue,
                (None, Some(_)) => {
                    tracing::info!("collect: {name} is fresh again");
                    state.dropped = None;
                }
                (None, None) => {}
            }
            exported.push((
                name.clone(),
                CollectedProcess {
                    pid: file.pid,
                    process: file.process.clone(),
                    writer: file.writer.clone(),
                    file: name.clone(),
                    timestamp_seconds: file.timestamp_seconds,
                    age_seconds: age,
                    devices: file.devices.clone(),
                },
            ));
        }
        // Two files for one (process, pid) would make duplicate series: keep the newest.
        exported.sort_by(|(_, a), (_, b)| {
            (&a.process, a.pid)
                .cmp(&(&b.process, b.pid))
                .then(b.timestamp_seconds.total_cmp(&a.timestamp_seconds))
        });
        let mut processes: Vec<CollectedProcess> = Vec::with_capacity(exported.len());
        for (name, process) in exported {
            let duplicate = processes
                .last()
                .is_some_and(|kept| kept.process == process.process && kept.pid == process.pid);
            if let Some(state) = self.files.get_mut(&name) {
                if duplicate && !state.duplicate_logged {
                    tracing::warn!(
                        "collect: skipping {name}: {} (pid {}) is also published by a newer file; \
                         give each engine its own pid namespace view (shareProcessNamespace) or process name",
                        process.process,
                        process.pid
                    );
                }
                state.duplicate_logged = duplicate;
            }
            if duplicate {
                *rejected.entry("duplicate_pid").or_default() += 1;
                *self.rejections_total.entry("duplicate_pid").or_default() += 1;
            } else {
                processes.push(process);
            }
        }
        processes
    }
}
