//! The sampler: one background task that, every interval, lets each manager release long-idle
//! pages, takes a snapshot, publishes it through a watch channel and appends it to the history
//! ring. Failures are counted and shown in the snapshot's health, never fatal. The snapshot
//! work itself runs on a blocking thread, so the async runtime keeps serving requests.

mod options;

pub(crate) use options::{sampling_setters, SamplingOptions};

use crate::flight::{FlightLog, FlightRecorder, FlightSettings};
use crate::history::{History, Sample};
use gpumem::manager::MemoryManager;
use gpumem::snapshot::{capture, CaptureSettings};
use gpumem_wire::Snapshot;
use gpumem_wire::{unix_now, SamplerHealth};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

/// The shortest interval the sampler accepts: a snapshot walks every arena.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// How much the history ring covers.
pub const HISTORY_WINDOW: Duration = Duration::from_secs(3600);

/// Something other than in-process managers that produces snapshots: a collector's NVML
/// readings and collected files (`collect::Collector`). Called on the sampler's blocking thread.
pub trait SnapshotSource: Send {
    /// Takes one snapshot. Entries in its `problems` make the sample count as failed.
    fn capture(&mut self, settings: &CaptureSettings) -> Snapshot;
}

/// Where samples come from.
enum Source {
    Managers(Vec<MemoryManager>),
    Other(Box<dyn SnapshotSource>),
}

/// Takes samples; the state (health counters, the previous sample) lives between ticks.
pub struct Sampler {
    source: Source,
    settings: CaptureSettings,
    health: SamplerHealth,
    history: Arc<History>,
    last_history_point: Option<Instant>,
    latest: Option<Arc<Sample>>,
    /// Writes a record for every OOM and rise to critical pressure the samples show; one per
    /// process is enough (the exporter's, or the publisher's when there is no exporter).
    recorder: Option<FlightRecorder>,
    flight_log: Arc<FlightLog>,
}

impl Sampler {
    /// A sampler for `managers`; `settings.interval` must already be at least [`MIN_INTERVAL`].
    pub fn new(managers: Vec<MemoryManager>, settings: CaptureSettings) -> Self {
        Self::from_source(Source::Managers(managers), settings)
    }

    /// A sampler over `source` instead of managers (same interval rule as [`Sampler::new`]).
    pub fn with_source(source: Box<dyn SnapshotSource>, settings: CaptureSettings) -> Self {
        Self::from_source(Source::Other(source), settings)
    }

    fn from_source(source: Source, settings: CaptureSettings) -> Self {
        let history = Arc::new(History::new(settings.interval, HISTORY_WINDOW));
        Sampler {
            source,
            settings,
            health: SamplerHealth::default(),
            history,
            last_history_point: None,
            latest: None,
            recorder: None,
            flight_log: Arc::default(),
        }
    }

    /// Records OOMs and critical pressure as `settings` say (without this call, not at all).
    pub fn with_flight(mut self, settings: FlightSettings) -> Self {
        let recorder = FlightRecorder::new(settings);
        self.flight_log = recorder.log();
        self.recorder = Some(recorder);
        self
    }

    /// The flight recorder's latest records (for `/api/v1/oom` and the page).
    pub fn flight_log(&self) -> Arc<FlightLog> {
        Arc::clone(&self.flight_log)
    }

    pub fn history(&self) -> Arc<History> {
        Arc::clone(&self.history)
    }

    pub fn interval(&self) -> Duration {
        self.settings.interval
    }

    /// Does one tick's work: snapshot, health, history. It only reads the managers (their
    /// upkeep is the upkeep thread's, or the embedder's `maintain()`), so sampling never changes
    /// what the allocator holds. Blocking (walks arenas, calls the driver): call it from a
    /// blocking thread.
    pub fn sample(&mut self) -> Arc<Sample> {
        let mut snapshot = match &mut self.source {
            Source::Managers(managers) => capture(managers, &self.settings),
            Source::Other(source) => source.capture(&self.settings),
        };
        if snapshot.problems.is_empty() {
            self.health.samples_ok += 1;
            self.health.latest_ok = true;
            self.health.last_success_timestamp_seconds = Some(snapshot.timestamp_seconds);
        } else {
            self.note_failure(snapshot.problems.join("; "));
        }
        snapshot.health = self.health.clone();
        let sample = Arc::new(Sample {
            snapshot,
            taken_at: Instant::now(),
        });
        let due = self
            .last_history_point
            .is_none_or(|last| last.elapsed() + self.settings.interval / 2 >= self.history.step());
        if due {
            self.history.record(&sample);
            self.last_history_point = Some(sample.taken_at);
        }
        if let Some(recorder) = &mut self.recorder {
            recorder.observe(&sample.snapshot, &self.history);
        }
        self.latest = Some(Arc::clone(&sample));
        sample
    }

    /// Counts a sample that produced nothing at all (the sampling thread died) and returns the
    /// previous snapshot marked as failed, so the health endpoint reports it.
    pub fn sample_lost(&mut self, reason: String) -> Arc<Sample> {
        self.note_failure(reason);
        let (snapshot, taken_at) = match &self.latest {
            Some(previous) => (previous.snapshot.clone(), previous.taken_at),
            None => (Snapshot::default(), Instant::now()),
        };
        let sample = Arc::new(Sample {
            snapshot: Snapshot {
                health: self.health.clone(),
                ..snapshot
            },
            taken_at,
        });
        self.latest = Some(Arc::clone(&sample));
        sample
    }

    fn note_failure(&mut self, reason: String) {
        // Said once per change, not once per tick: a device that stays broken is one line.
        if self.health.last_error.as_deref() != Some(reason.as_str()) || self.health.latest_ok {
            tracing::warn!("sampling failed: {reason}");
        }
        self.health.samples_failed += 1;
        self.health.latest_ok = false;
        self.health.last_error = Some(reason);
        self.health.last_error_timestamp_seconds = Some(unix_now());
    }
}

/// Runs `sampler` every interval until `shutdown` turns true (or its sender is dropped),
/// publishing each sample on `publish`. The first tick comes one interval from now: the caller
/// publishes an initial sample itself so the endpoints have data from the start.
pub fn spawn(
    sampler: Sampler,
    publish: watch::Sender<Arc<Sample>>,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let interval = sampler.interval();
    let sampler = Arc::new(Mutex::new(sampler));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        // A slow sample (a stuck driver call) delays the next one instead of queueing a burst.
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                    continue;
                }
            }
            let worker = Arc::clone(&sampler);
            let sample = match tokio::task::spawn_blocking(move || worker.lock().sample()).await {
                Ok(sample) => sample,
                Err(error) => sampler
                    .lock()
                    .sample_lost(format!("the sampling thread failed: {error}")),
            };
            // No receivers left means nobody serves the data any more: stop.
            if publish.send(sample).is_err() {
                break;
            }
        }
        tracing::debug!("sampler stopped");
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem::backend::sim::{SimBackend, SimConfig};

    #[test]
    fn a_sample_older_than_three_intervals_is_stale() {
        let interval = Duration::from_secs(1);
        let fresh = Sample {
            snapshot: Snapshot::default(),
            taken_at: Instant::now(),
        };
        assert!(!fresh.is_stale(interval));
        if let Some(then) = Instant::now().checked_sub(Duration::from_secs(4)) {
            let old = Sample {
                snapshot: Snapshot::default(),
                taken_at: then,
            };
            assert!(old.is_stale(interval));
        }
    }

    #[test]
    fn failures_are_counted_and_cleared_by_the_next_success() {
        let sim = std::sync::Arc::new(SimBackend::new(SimConfig::default()));
        let faults = sim.faults();
        let manager = MemoryManager::new(sim, Default::default()).expect("manager");
        let mut sampler = Sampler::new(vec![manager], CaptureSettings::default());
        assert!(sampler.sample().snapshot.health.latest_ok);
        faults.set_fail_mem_info(true);
        let failed = sampler.sample();
        let health = &failed.snapshot.health;
        assert!(!health.latest_ok);
        assert_eq!((health.samples_ok, health.samples_failed), (1, 1));
        assert!(health
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("mem_info")));
        faults.set_fail_mem_info(false);
        let lost = sampler.sample_lost("the thread died".to_string());
        assert_eq!(lost.snapshot.health.samples_failed, 2);
        let recovered = sampler.sample();
        assert!(recovered.snapshot.health.latest_ok);
        assert_eq!(recovered.snapshot.health.samples_ok, 2);
        assert_eq!(sampler.history().len(), 1, "one point per second at most");
    }
}
