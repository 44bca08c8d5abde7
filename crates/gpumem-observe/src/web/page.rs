//! `GET /`: the status page. Turns a snapshot into a view of ready-to-print strings and renders
//! `templates/index.html` with askama; every number is on the page without JavaScript (the
//! chart, fed by `/api/v1/history`, is the only script). A device's panels are built in
//! `device`, the hints in `hints`, what a collector (a sidecar or the node agent) adds — its
//! sources and processes — in `collected`.

mod collected;
mod device;
mod hints;

pub(crate) use collected::CollectedView;

use super::format;
use askama::Template;
use device::DeviceView;
use gpumem_wire::Snapshot;
use hints::{hints, Hint};

#[derive(Template)]
#[template(path = "index.html")]
pub struct IndexPage {
    pub(crate) version: String,
    pub(crate) backend: String,
    pub(crate) taken_at: String,
    pub(crate) healthy: bool,
    /// The header badge's colour: `ok` (green), `warn` (amber: sampling works, but a source
    /// does not — a collector blind to the device), `bad` (red).
    pub(crate) health_class: &'static str,
    pub(crate) health_text: String,
    pub(crate) interval_ms: u64,
    pub(crate) refresh_seconds: u64,
    pub(crate) leak_age: String,
    pub(crate) long_lived_tags: String,
    pub(crate) samples_ok: String,
    pub(crate) samples_failed: String,
    pub(crate) problems: Vec<String>,
    pub(crate) devices: Vec<DeviceView>,
    /// A collector's sources and processes (`gpumem serve`); `None` in-process.
    pub(crate) collected: Option<CollectedView>,
    /// What needs attention and where the runbook says what to do, most urgent first.
    pub(crate) hints: Vec<Hint>,
    /// The OOM flight recorder's latest records, newest first.
    pub(crate) oom_records: Vec<OomRow>,
}

/// One flight record, as the page lists it.
pub(crate) struct OomRow {
    pub(crate) time: String,
    pub(crate) trigger: &'static str,
    pub(crate) summary: String,
    pub(crate) file: String,
}

impl IndexPage {
    /// The page for `snapshot`; `fresh` is false when the sampler has fallen behind.
    pub fn new(snapshot: &Snapshot, fresh: bool) -> Self {
        let health = &snapshot.health;
        let (healthy, health_text) = match (&health.last_error, health.latest_ok, fresh) {
            (_, true, true) => (true, "sampling ok".to_string()),
            (_, true, false) => (false, "sampling stalled".to_string()),
            (Some(error), false, _) => (false, format!("sampling failed: {error}")),
            (None, false, _) => (false, "no sample yet".to_string()),
        };
        let interval_ms = (snapshot.interval_seconds * 1000.0).round().max(100.0) as u64;
        // In-process nothing is collected, so nothing is blind or degraded.
        let collected = snapshot.collected();
        let (health_class, health_text) = if !healthy {
            ("bad", health_text)
        } else if collected.blind().is_some() {
            ("warn", "blind to the device (no NVML)".to_string())
        } else if !collected.degraded().is_empty() {
            ("warn", "sampling ok · degraded".to_string())
        } else {
            ("ok", health_text)
        };
        IndexPage {
            version: snapshot.version.clone(),
            backend: snapshot.backend.clone(),
            taken_at: format::clock_utc(snapshot.timestamp_seconds),
            healthy,
            health_class,
            health_text,
            interval_ms,
            // Numbers are server-rendered; reloading refreshes them without any script.
            refresh_seconds: (interval_ms * 10 / 1000).clamp(5, 60),
            leak_age: format::age(snapshot.leak_age_seconds),
            long_lived_tags: snapshot.long_lived_tags.join(", "),
            samples_ok: format::count(health.samples_ok),
            samples_failed: format::count(health.samples_failed),
            problems: snapshot.problems.clone(),
            devices: snapshot
                .devices
                .iter()
                .map(|d| DeviceView::new(d, !snapshot.from_collector()))
                .collect(),
            collected: snapshot.collector.as_ref().map(CollectedView::new),
            hints: Vec::new(),
            oom_records: Vec::new(),
        }
        .with_hints(snapshot, fresh, crate::web::DEFAULT_RUNBOOK)
    }

    /// Says what needs attention, linking `runbook` (a URL of docs/runbook.md) sections.
    pub fn with_hints(mut self, snapshot: &Snapshot, fresh: bool, runbook: &str) -> Self {
        self.hints = hints(snapshot, fresh, runbook);
        self
    }

    /// Lists the flight recorder's records.
    pub fn with_oom_records(
        mut self,
        records: &[std::sync::Arc<crate::flight::FlightRecord>],
    ) -> Self {
        self.oom_records = records
            .iter()
            .map(|r| OomRow {
                time: format::clock_utc(r.timestamp_seconds),
                trigger: match r.trigger {
                    crate::flight::Trigger::Oom => "OOM",
                    crate::flight::Trigger::CriticalPressure => "critical",
                    crate::flight::Trigger::Exited => "exited",
                },
                summary: r.summary.clone(),
                file: r
                    .file
                    .clone()
                    .unwrap_or_else(|| "in memory only".to_string()),
            })
            .collect();
        self
    }
}
