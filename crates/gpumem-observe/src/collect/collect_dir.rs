//! The collect directory ([`CollectDir`]): every interval, reads each published file in it and
//! decides which processes to export. A process is dropped when its file is stale (older than three
//! intervals) or its pid is gone; a bad file is skipped, counted and logged once, and the last
//! good content of that file is kept until it goes stale (so a torn write does not flap series).
//!
//! What is kept is bounded whatever the directory holds: files are read newest first (by
//! modification time), files untouched for longer than any writer's staleness are not opened,
//! at most `max_files` are read, and the content kept must fit a budget of series and bytes
//! sized for the collector's memory limit; a file over the budget is skipped and counted.

use super::read::{read_sized, Rejection, MAX_FILE_BYTES, REJECTION_REASONS};
use gpumem_wire::process::{current_pid_namespace, pid_alive};
use gpumem_wire::published::PublishedFile;
use gpumem_wire::{unix_now, CollectStatus, CollectedProcess, ReasonCount};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod listing;
use listing::{Listing, Stamp};

/// Files read per scan, at most: bounds the work and the `process`/`pid` label values.
pub const MAX_FILES: usize = 256;
/// The series all collected processes may add to `/metrics`, by default. Rendering costs about
/// 1 KiB of memory per series at the peak of a scrape, so this keeps the sidecar well inside the
/// shipped manifest's 128 Mi limit (docs/reliability.md has the measurement).
pub const DEFAULT_MAX_SERIES: u64 = 40_000;
/// The bytes of file content kept for all collected processes, by default: the shipped
/// manifest's collect volume is a 16 MiB emptyDir.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 20;
/// Series one collected device and one of its pools add: one for each of the manager's
/// per-device and per-pool families (declared in `web::metrics`); and one per process (its
/// snapshot age).
pub const SERIES_PER_DEVICE: u64 = gpumem_wire::DEVICE_FAMILIES.len() as u64;
pub const SERIES_PER_POOL: u64 = crate::web::metrics::MANAGER_POOL.len() as u64;
/// A snapshot may claim to be this far in the future (clocks of two containers on one node
/// differ by little); beyond it the file is rejected, or it would never go stale.
pub const MAX_CLOCK_SKEW_SECONDS: f64 = 30.0;
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
    /// The series all exported processes may add, together.
    pub max_series: u64,
    /// The bytes of file content kept for all processes, together.
    pub max_bytes: u64,
}

impl CollectSettings {
    pub fn new(dir: impl Into<PathBuf>, interval: Duration) -> Self {
        CollectSettings {
            dir: dir.into(),
            interval,
            max_file_bytes: MAX_FILE_BYTES,
            max_files: MAX_FILES,
            max_series: DEFAULT_MAX_SERIES,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }

    /// The longest a file can go unmodified and still be exported: three of the longest
    /// interval a writer may claim. Older files are not even opened.
    fn horizon_seconds(&self) -> f64 {
        3.0 * self.interval.max(MAX_WRITER_INTERVAL).as_secs_f64()
    }
}

/// Checks the directory once at start, so a typo is an error and not an empty collector.
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

/// What reading one version of a file gave: its content and size, or why it was refused (the
/// metric reason and the message).
type Outcome = Result<(PublishedFile, u64), (&'static str, String)>;

/// What is remembered about one file between scans.
#[derive(Default)]
struct FileState {
    /// The version last read and what it gave.
    read: Option<(Stamp, Outcome)>,
    /// The last content that parsed and validated, and its size in bytes.
    latest: Option<PublishedFile>,
    latest_bytes: u64,
    /// Its latest problem; one is logged only when the file was valid (or new) before, so a
    /// file rewritten invalid again and again logs one line until it turns valid.
    problem: Option<String>,
    /// Why its process is not exported now (`stale`, `exited`), once counted.
    dropped: Option<&'static str>,
    duplicate_logged: bool,
}

/// Reads the collect directory; see the module documentation.
pub struct CollectDir {
    settings: CollectSettings,
    pid_namespace: Option<String>,
    files: BTreeMap<String, FileState>,
    rejections_total: BTreeMap<&'static str, u64>,
    dropped_total: BTreeMap<&'static str, u64>,
    dir_errors_total: u64,
    dir_problem: Option<String>,
    warned_too_many: bool,
    budget_exceeded_total: u64,
    warned_budget: bool,
    /// The latest full listing of the directory.
    listing: Option<Listing>,
}

impl CollectDir {
    pub fn new(settings: CollectSettings) -> Self {
        CollectDir {
            settings,
            pid_namespace: current_pid_namespace(),
            files: BTreeMap::new(),
            // Every reason from the start, at zero: counters should exist before they move.
            rejections_total: REJECTION_REASONS.iter().map(|r| (*r, 0)).collect(),
            dropped_total: DROP_REASONS.iter().map(|r| (*r, 0)).collect(),
            dir_errors_total: 0,
            dir_problem: None,
            warned_too_many: false,
            budget_exceeded_total: 0,
            warned_budget: false,
            listing: None,
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
        let (readable, files, problem) = match self.read_dir(now, &mut rejected) {
            Ok(files) => (true, files, None),
            Err(problem) => (false, 0, Some(problem)),
        };
        let over_budget = rejected.get("over_budget").copied().unwrap_or(0);
        if over_budget > 0 {
            self.budget_exceeded_total += 1;
        }
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
                budget_exceeded_total: self.budget_exceeded_total,
                over_budget: (over_budget > 0).then(|| {
                    format!(
                        "{over_budget} file(s) skipped: the collected data is over its budget \
                         ({} series, {} bytes; --collect-max-series, --collect-max-bytes)",
                        self.settings.max_series, self.settings.max_bytes
                    )
                }),
            },
            problem,
        }
    }

    /// Lists the directory and reads each candidate file; returns how many there were.
    fn read_dir(
        &mut self,
        now: f64,
        rejected: &mut BTreeMap<&'static str, u64>,
    ) -> Result<u64, String> {
        let dir = self.settings.dir.clone();
        let horizon = now - self.settings.horizon_seconds();
        let listing = match self.list(&dir, horizon) {
            Ok(listing) => listing,
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
        let (found, skipped) = (listing.found, listing.skipped.clone());
        let candidates = listing.candidates.clone();
        self.listing = Some(listing);
        if !skipped.is_empty() {
            let count = skipped.len() as u64;
            for name in &skipped {
                if let Some(state) = self.files.get_mut(name) {
                    state.latest = None;
                }
            }
            *rejected.entry("too_many_files").or_default() += count;
            *self.rejections_total.entry("too_many_files").or_default() += count;
            if !self.warned_too_many {
                tracing::warn!(
                    "{} holds {} recent files; reading the newest {}, skipping the rest",
                    dir.display(),
                    candidates.len() + skipped.len(),
                    self.settings.max_files
                );
                self.warned_too_many = true;
            }
        }
        let dir = &dir;
        let mut budget = Budget::default();
        let reading_until = std::time::Instant::now() + scan_budget(self.settings.interval);
        let mut read = HashSet::new();
        for (name, _, stamp) in &candidates {
            let state = self.files.entry(name.clone()).or_default();
            let outcome = match &state.read {
                // Unchanged since it was read: what it gave then stands.
                Some((seen, outcome)) if seen == stamp => outcome.clone(),
                // Changed, but this scan has spent its time: the file keeps what it had and is
                // read at a later scan, so sampling never waits for a directory of big files.
                Some((_, outcome)) if std::time::Instant::now() >= reading_until => outcome.clone(),
                None if std::time::Instant::now() >= reading_until => continue,
                _ => {
                    let outcome = read_sized(&dir.join(name), self.settings.max_file_bytes)
                        .map_err(|rejection| (rejection.reason(), rejection.to_string()));
                    state.read = Some((*stamp, outcome.clone()));
                    outcome
                }
            };
            read.insert(name.clone());
            let outcome = outcome.and_then(|f| {
                // No figure that changes from scan to scan (how far ahead it is) in the
                // message: it is also what says the problem was logged already.
                if f.0.timestamp_seconds - now > MAX_CLOCK_SKEW_SECONDS {
                    let rejection = Rejection::Invalid(format!(
                        "\"timestamp_seconds\" is more than {MAX_CLOCK_SKEW_SECONDS}s ahead of \
                         this host's clock (is the writer's clock wrong?)"
                    ));
                    return Err((rejection.reason(), rejection.to_string()));
                }
                Ok(f)
            });
            match outcome {
                Ok((mut file, bytes)) => {
                    if state.problem.take().is_some() {
                        tracing::info!("collect: {name} is valid again");
                    }
                    // Stale content only decides that its process is dropped: keep none of
                    // its devices, and charge nothing to the budget.
                    if now - file.timestamp_seconds > stale_limit(self.settings.interval, &file) {
                        file.devices = Vec::new();
                    } else if !budget.admit(&file, bytes, &self.settings) {
                        *rejected.entry("over_budget").or_default() += 1;
                        *self.rejections_total.entry("over_budget").or_default() += 1;
                        if !self.warned_budget {
                            tracing::warn!(
                                "collect: skipping {name}: the collected data is over its budget \
                                 ({} series, {} bytes); raise --collect-max-series or \
                                 --collect-max-bytes if the sidecar has the memory",
                                self.settings.max_series,
                                self.settings.max_bytes
                            );
                            self.warned_budget = true;
                        }
                        state.latest = None;
                        continue;
                    }
                    state.latest = Some(file);
                    state.latest_bytes = bytes;
                }
                Err((reason, message)) => {
                    *rejected.entry(reason).or_default() += 1;
                    *self.rejections_total.entry(reason).or_default() += 1;
                    // The previous content stays only while the budget has room for it.
                    if let Some(previous) = &state.latest {
                        if !budget.admit(previous, state.latest_bytes, &self.settings) {
                            state.latest = None;
                        }
                    }
                    if state.problem.is_none() {
                        let kept = if state.latest.is_some() {
                            "; keeping its previous content until it goes stale"
                        } else {
                            ""
                        };
                        tracing::warn!(
                            "collect: skipping {name}: {message}{kept} (logged once until it \
                             is valid again)"
                        );
                    }
                    state.problem = Some(message);
                }
            }
        }
        // Files not read (over the cap, untouched too long) keep no devices: an old file's
        // process is then dropped as stale, once, by `export`.
        for (name, state) in &mut self.files {
            if !read.contains(name) {
                if let Some(file) = &mut state.latest {
                    file.devices = Vec::new();
                    state.latest_bytes = 0;
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
            let limit = stale_limit(interval, file);
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
                    pid_namespace: file.pid_namespace.clone(),
                    pod: None,
                    host_pid: None,
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

/// How long one scan may spend reading files that changed: a quarter of the interval, between
/// 50 ms and 2 s. Unchanged files cost a `stat` and are not counted against it.
fn scan_budget(interval: Duration) -> Duration {
    (interval / 4).clamp(Duration::from_millis(50), Duration::from_secs(2))
}

/// How old a file's snapshot may be and still be exported: three intervals, the collector's or
/// the writer's own if longer (up to [`MAX_WRITER_INTERVAL`]: a huge claim must still expire).
fn stale_limit(interval: Duration, file: &PublishedFile) -> f64 {
    // A claim too large for a `Duration` (1.8e19 s) is the longest allowed, not none at all.
    let writer_interval = file
        .interval_seconds
        .map(|s| Duration::try_from_secs_f64(s).unwrap_or(MAX_WRITER_INTERVAL))
        .unwrap_or_default()
        .min(MAX_WRITER_INTERVAL);
    3.0 * interval.max(writer_interval).as_secs_f64()
}

/// The series a file's content adds to `/metrics`.
pub fn series_of(file: &PublishedFile) -> u64 {
    let pools: usize = file.devices.iter().map(|d| d.pools.len()).sum();
    1 + SERIES_PER_DEVICE * file.devices.len() as u64 + SERIES_PER_POOL * pools as u64
}

/// What the content kept in one scan adds up to.
#[derive(Default)]
struct Budget {
    series: u64,
    bytes: u64,
}

impl Budget {
    /// Takes `file` into the budget if it fits; files are offered newest first.
    fn admit(&mut self, file: &PublishedFile, bytes: u64, settings: &CollectSettings) -> bool {
        let series = self.series.saturating_add(series_of(file));
        let bytes = self.bytes.saturating_add(bytes);
        if series > settings.max_series || bytes > settings.max_bytes {
            return false;
        }
        (self.series, self.bytes) = (series, bytes);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claiming(interval_seconds: &str) -> PublishedFile {
        super::super::read::parse(
            format!(
                r#"{{"format":"gpumem.publish","version":1,"pid":42,"process":"p",
                "timestamp_seconds":1700000000.0,"interval_seconds":{interval_seconds},
                "devices":[]}}"#
            )
            .as_bytes(),
        )
        .expect("a valid file")
    }

    #[test]
    fn a_huge_writer_interval_counts_as_the_longest_allowed() {
        let second = Duration::from_secs(1);
        assert_eq!(stale_limit(second, &claiming("2.0")), 6.0);
        assert_eq!(stale_limit(second, &claiming("1e6")), 1800.0);
        // Past what a Duration holds (about 1.8e19 s): it used to count as no claim at all
        // (3 s here), so a 5 s old file of a writer that says it writes rarely was dropped.
        assert_eq!(stale_limit(second, &claiming("1.8e19")), 1800.0);
        assert_eq!(stale_limit(second, &claiming("1.9e19")), 1800.0);
        assert_eq!(stale_limit(second, &claiming("1e300")), 1800.0);
    }
}
