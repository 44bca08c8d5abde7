//! The OOM flight recorder. After every sample it looks for what needs explaining later — new
//! out-of-memory refusals, a device rising to critical pressure, (in a collector) a collected
//! process whose OOM count went up, and (the node agent) a GPU process that vanished holding
//! memory — and for each writes one self-contained JSON record ([`record`]) into a bounded
//! directory ([`store`]), logs one line naming the file, and keeps the latest records in memory
//! for `/api/v1/oom` and the status page. What it watches inside an engine process is in
//! `in_process`, in a collector (a sidecar or the node agent) in `collected`, vanished GPU
//! processes in `exits`.
//!
//! Driven by the sampler on its blocking thread, never by the allocator: an OOM costs the
//! allocator one entry in its small refusal log, nothing more. Records of one device are at
//! least `min_gap` apart; refusals in between are counted in the next record.

mod collected;
mod exits;
mod in_process;
pub mod record;
pub mod store;
mod summary;

pub use record::{FlightRecord, Trigger};

use crate::history::History;
use crate::nvml::NvmlReader;
use gpumem::manager::pressure::PressureLevel;
use gpumem_wire::Snapshot;
use parking_lot::RwLock;
use record::{RecordDevice, RecordProcess};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Records kept in memory for the API and the page.
pub const KEPT_IN_MEMORY: usize = 20;

/// Where records go and how many are kept.
#[derive(Clone, Debug, PartialEq)]
pub struct FlightSettings {
    /// The directory records are written to; `None` keeps them in memory only.
    pub dir: Option<PathBuf>,
    /// Records kept in the directory, at most (oldest removed first).
    pub max_files: usize,
    /// Bytes all records in the directory take, at most.
    pub max_bytes: u64,
    /// How much history each record carries.
    pub history: Duration,
    /// The shortest time between two records of one device (or collected process).
    pub min_gap: Duration,
    /// Another directory whose records are listed too: a collector shows the engines' records
    /// from `<collect-dir>/oom`.
    pub read_dir: Option<PathBuf>,
}

impl Default for FlightSettings {
    fn default() -> Self {
        FlightSettings {
            dir: None,
            max_files: 50,
            max_bytes: 64 << 20,
            history: Duration::from_secs(300),
            min_gap: Duration::from_secs(10),
            read_dir: None,
        }
    }
}

/// The latest records, newest first, shared with the web layer.
#[derive(Debug, Default)]
pub struct FlightLog {
    records: RwLock<VecDeque<Arc<FlightRecord>>>,
    /// Where records are written, for people reading the API.
    pub dir: Option<String>,
}

impl FlightLog {
    /// The latest records, newest first.
    pub fn latest(&self) -> Vec<Arc<FlightRecord>> {
        self.records.read().iter().cloned().collect()
    }

    fn add(&self, record: FlightRecord) {
        let mut records = self.records.write();
        let at = records.partition_point(|r| r.timestamp_seconds > record.timestamp_seconds);
        records.insert(at, Arc::new(record));
        records.truncate(KEPT_IN_MEMORY);
    }
}

/// What the recorder remembers about one device or collected process.
struct Watch {
    ooms: u64,
    level: PressureLevel,
    /// When the last record of each trigger was written: an OOM right after a rise to
    /// critical pressure is still recorded.
    last_oom: Option<Instant>,
    last_critical: Option<Instant>,
    /// When a sample last showed it: a watch unseen for [`WATCH_RETENTION`] is forgotten.
    seen: Instant,
}

/// How long the recorder remembers a device or collected process no sample shows any more.
/// Publishers that rename themselves (a process name per run, say) would otherwise grow the
/// table for the life of the collector: 44k identities took 6 MiB and kept it. One that comes
/// back later is met afresh (its OOM count from then on is the baseline).
pub const WATCH_RETENTION: Duration = Duration::from_secs(15 * 60);
/// How often the table is swept for watches past their retention.
const WATCH_SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Watches kept at most; past it the table keeps the half seen most recently. Far more than a
/// node's devices and collected processes (256 files of a few GPUs each), which every sample
/// sees again; freed in thousands of small pieces, 44k watches' memory stayed with the process.
const MAX_WATCHES: usize = 8192;

/// Something to record: why, and how many refusals are new since which count.
struct Due {
    trigger: Trigger,
    new_ooms: u64,
    previous_ooms: u64,
}

/// See the module documentation.
pub struct FlightRecorder {
    settings: FlightSettings,
    log: Arc<FlightLog>,
    this_process: RecordProcess,
    watched: HashMap<String, Watch>,
    /// Files of `read_dir` already read (or refused), so each is read once.
    known_files: HashSet<String>,
    /// NVML, opened at the first in-process record (a collector has its own readings).
    nvml: Option<Result<NvmlReader, String>>,
    /// Exited GPU processes already recorded, by (host pid, UUID, when).
    exits_recorded: HashSet<(u32, String, u64)>,
    /// The pod of this gpumem (the downward API), from the latest sample.
    recorded_in: Option<gpumem_wire::ThisPod>,
    /// When `watched` was last swept.
    swept: Instant,
}

impl FlightRecorder {
    pub fn new(settings: FlightSettings) -> Self {
        let identity = gpumem_wire::process::current_identity();
        let log = Arc::new(FlightLog {
            records: RwLock::new(VecDeque::new()),
            dir: settings.dir.as_ref().map(|d| d.display().to_string()),
        });
        FlightRecorder {
            settings,
            log,
            this_process: RecordProcess {
                pid: identity.pid,
                process: identity.process,
                pod: None,
            },
            watched: HashMap::new(),
            known_files: HashSet::new(),
            nvml: None,
            exits_recorded: HashSet::new(),
            recorded_in: None,
            swept: Instant::now(),
        }
    }

    /// Forgets the watches no sample has shown for `retention`, and past [`MAX_WATCHES`] those
    /// seen least recently, and gives their memory back.
    fn forget_unseen(&mut self, retention: Duration) {
        self.watched
            .retain(|_, watch| watch.seen.elapsed() <= retention);
        if self.watched.len() > MAX_WATCHES {
            let seen = self.watched.values().map(|watch| watch.seen);
            if let Some(oldest_kept) = crate::newest::cutoff(seen, MAX_WATCHES / 2) {
                self.watched.retain(|_, watch| watch.seen >= oldest_kept);
            }
        }
        if self.watched.len() < self.watched.capacity() / 4 {
            self.watched.shrink_to_fit();
        }
        self.swept = Instant::now();
    }

    pub fn log(&self) -> Arc<FlightLog> {
        Arc::clone(&self.log)
    }

    /// Looks at one sample; writes and logs the records it calls for.
    pub fn observe(&mut self, snapshot: &Snapshot, history: &History) {
        let since = snapshot.timestamp_seconds - self.settings.history.as_secs_f64();
        let points = history.reply_since(Some(since)).points;
        // In-process nothing is collected: no exits, no collected processes, no pod.
        let collected = snapshot.collected();
        self.recorded_in = collected.this_pod.clone();
        for device in &snapshot.devices {
            if snapshot.from_collector() {
                self.observe_read_device(device, collected, &points, snapshot);
            } else {
                self.observe_own(device, &points, snapshot.timestamp_seconds);
            }
        }
        self.observe_exits(collected, &points, snapshot);
        for process in &collected.processes {
            for device in &process.devices {
                self.observe_collected(process, device, collected, &points, snapshot);
            }
        }
        self.read_others();
        if self.swept.elapsed() >= WATCH_SWEEP_EVERY || self.watched.len() > MAX_WATCHES {
            self.forget_unseen(WATCH_RETENTION);
        }
    }

    /// Whether `key` calls for a record now. `count_existing`: OOMs counted before the first
    /// look are new (in-process, where the count starts at 0); a collector meeting a process
    /// for the first time only starts watching it.
    fn due(
        &mut self,
        key: String,
        ooms: u64,
        level: Option<PressureLevel>,
        count_existing: bool,
    ) -> Option<Due> {
        let min_gap = self.settings.min_gap;
        let watch = self.watched.entry(key).or_insert_with(|| Watch {
            ooms: if count_existing { 0 } else { ooms },
            level: PressureLevel::Low,
            last_oom: None,
            last_critical: None,
            seen: Instant::now(),
        });
        watch.seen = Instant::now();
        // A count that went down is a restarted process: start again from there.
        watch.ooms = watch.ooms.min(ooms);
        let rose = level == Some(PressureLevel::Critical) && watch.level < PressureLevel::Critical;
        if let Some(level) = level {
            watch.level = level;
        }
        let new_ooms = ooms - watch.ooms;
        let trigger = match (new_ooms > 0, rose) {
            (true, _) => Trigger::Oom,
            (false, true) => Trigger::CriticalPressure,
            (false, false) => return None,
        };
        let last = match trigger {
            // Exits keep their own watches (`exits`), under their own keys.
            Trigger::Oom | Trigger::Exited => &mut watch.last_oom,
            Trigger::CriticalPressure => &mut watch.last_critical,
        };
        if last.is_some_and(|t| t.elapsed() < min_gap) {
            return None;
        }
        *last = Some(Instant::now());
        let previous_ooms = watch.ooms;
        watch.ooms = ooms;
        Some(Due {
            trigger,
            new_ooms,
            previous_ooms,
        })
    }

    /// Names, summarises, writes and logs a record, and keeps it for the API.
    fn finish(&mut self, mut record: FlightRecord) {
        record.recorded_in = self.recorded_in.clone();
        record.summary = summary::summary(&record);
        let mut name = format!(
            "{}-{}-gpu{}",
            store::utc_stamp(record.timestamp_seconds),
            record.trigger.name(),
            record.device.gpu
        );
        if let Some(p) = &record.process {
            name.push_str(&format!("-pid{}", p.pid));
        }
        name.push_str(".json");
        let outcome = match &self.settings.dir {
            Some(dir) => {
                record.file = Some(name.clone());
                let written = store::write(
                    dir,
                    &record,
                    self.settings.max_files,
                    self.settings.max_bytes,
                );
                match written {
                    Ok(path) => {
                        self.known_files.insert(name);
                        format!("flight record: {}", path.display())
                    }
                    Err(error) => {
                        record.file = None;
                        format!(
                            "could not write the flight record into {}: {error}",
                            dir.display()
                        )
                    }
                }
            }
            None => "flight record kept in memory only (no --oom-dir); see /api/v1/oom".to_string(),
        };
        tracing::warn!("{}; {outcome}", record.summary);
        self.log.add(record);
    }

    /// Records other processes wrote into `read_dir`, newest first, each read once.
    fn read_others(&mut self) {
        let Some(dir) = self.settings.read_dir.clone() else {
            return;
        };
        let known = &self.known_files;
        let found = store::read_new(&dir, &|name| known.contains(name), KEPT_IN_MEMORY);
        for (name, record) in found {
            if let Some(mut record) = record {
                record.file = Some(name.clone());
                self.log.add(record);
            }
            // Bounded: the directory itself is bounded, so this only guards against churn.
            if self.known_files.len() > 10_000 {
                self.known_files.clear();
            }
            self.known_files.insert(name);
        }
    }
}

/// A record with only the trigger and time filled in.
fn blank(due: Due, timestamp_seconds: f64) -> FlightRecord {
    FlightRecord {
        format: record::FORMAT.to_string(),
        version: record::VERSION,
        trigger: due.trigger,
        timestamp_seconds,
        file: None,
        summary: String::new(),
        process: None,
        device: RecordDevice::default(),
        request: None,
        ooms_since_previous: due.new_ooms,
        recent_ooms: Vec::new(),
        ooms_total: None,
        oom_retries_total: None,
        pools: Vec::new(),
        top_tags: Vec::new(),
        history: Vec::new(),
        other_processes: Vec::new(),
        other_processes_note: None,
        held_bytes: None,
        exit_reason: None,
        recorded_in: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_of_identities_gone_past_retention_are_forgotten_and_their_memory_returned() {
        let mut recorder = FlightRecorder::new(FlightSettings::default());
        // Publishers renamed again and again: each name a watch of its own.
        for i in 0..44_000 {
            let _ = recorder.due(format!("engine-{i} {i} gpu0"), 0, None, false);
        }
        let grown = recorder.watched.capacity();
        std::thread::sleep(Duration::from_millis(60));
        // Ten still publishing.
        for i in 0..10 {
            let _ = recorder.due(format!("engine-{i} {i} gpu0"), 0, None, false);
        }
        recorder.forget_unseen(Duration::from_millis(50));
        assert_eq!(recorder.watched.len(), 10);
        assert!(
            recorder.watched.capacity() < grown / 100,
            "{}",
            recorder.watched.capacity()
        );
        // A watch still seen keeps its count: one more OOM is due.
        let due = recorder.due("engine-3 3 gpu0".to_string(), 1, None, false);
        assert!(due.is_some_and(|d| d.new_ooms == 1));
    }

    #[test]
    fn renamed_identities_within_the_retention_are_bounded_by_count() {
        let mut recorder = FlightRecorder::new(FlightSettings::default());
        for i in 0..MAX_WATCHES + 10 {
            let _ = recorder.due(format!("engine-{i} {i} gpu0"), 0, None, false);
        }
        // The newest, seen again: still watched after the table is cut to half.
        let _ = recorder.due("engine-3 3 gpu0".to_string(), 0, None, false);
        recorder.forget_unseen(WATCH_RETENTION);
        // Watches seen at the same instant stay together: a few more may stay.
        assert!(recorder.watched.len() <= MAX_WATCHES / 2 + 64);
        assert!(recorder.watched.contains_key("engine-3 3 gpu0"));
        assert!(recorder
            .watched
            .contains_key(&format!("engine-{MAX_WATCHES} {MAX_WATCHES} gpu0")));
        assert!(!recorder.watched.contains_key("engine-4 4 gpu0"));
    }
}
