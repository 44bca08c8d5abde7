//! `GET /`: the status page. Turns a snapshot into a view of ready-to-print strings and renders
//! `templates/index.html` with askama; every number is on the page without JavaScript (the
//! chart, fed by `/api/v1/history`, is the only script).

mod sidecar;

pub(crate) use sidecar::SidecarView;

use super::format;
use askama::Template;
use gpumem::manager::PressureLevel;
use gpumem::snapshot::{DeviceSnapshot, Snapshot};

#[derive(Template)]
#[template(path = "index.html")]
pub struct IndexPage {
    pub(crate) version: String,
    pub(crate) backend: String,
    pub(crate) taken_at: String,
    pub(crate) healthy: bool,
    /// The header badge's colour: `ok` (green), `warn` (amber: sampling works, but a source
    /// does not — a sidecar blind to the device), `bad` (red).
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
    /// The sidecar's sources and processes (`gpumem serve`); `None` in-process.
    pub(crate) sidecar: Option<SidecarView>,
    /// What needs attention and where the runbook says what to do, most urgent first.
    pub(crate) hints: Vec<Hint>,
    /// The OOM flight recorder's latest records, newest first.
    pub(crate) oom_records: Vec<OomRow>,
}

/// "Memory pressure is critical on GPU 0: …" and the runbook section that says what to do.
pub(crate) struct Hint {
    /// `critical` or `warn`: the colour.
    pub(crate) class: &'static str,
    pub(crate) text: String,
    pub(crate) link: String,
}

/// One flight record, as the page lists it.
pub(crate) struct OomRow {
    pub(crate) time: String,
    pub(crate) trigger: &'static str,
    pub(crate) summary: String,
    pub(crate) file: String,
}

/// The runbook's section for each state (docs/runbook.md; anchors are the alerts' names).
const RUNBOOK_PRESSURE_HIGH: &str = "gpumempressurehigh";
const RUNBOOK_PRESSURE_CRITICAL: &str = "gpumempressurecritical";
const RUNBOOK_LEAKS: &str = "gpumemleaksuspectsgrowing";
const RUNBOOK_FRAGMENTED: &str = "gpumempoolfragmented";
const RUNBOOK_OOM: &str = "gpumemoutofmemory";
const RUNBOOK_SAMPLING: &str = "gpumemsamplingfailing";
const RUNBOOK_NVML: &str = "gpumemnvmlunavailable";

pub(crate) struct DeviceView {
    pub index: usize,
    pub name: String,
    pub uuid: String,
    pub simulated: bool,
    pub total_bytes: u64,
    /// Whether this process has pools on the device (false in the sidecar, which only reads
    /// device memory: its pool panels would be empty).
    pub own_pools: bool,
    /// CSS class and label of the pressure badge.
    pub pressure_class: &'static str,
    pub pressure_label: String,
    /// The level alone ("high"), for the overview table.
    pub pressure_short: &'static str,
    pub summary: Summary,
    pub memory_known: bool,
    pub bar: Vec<BarSegment>,
    pub tiles: Vec<Tile>,
    pub pools: Vec<PoolRow>,
    pub leaks: Vec<GroupRow>,
    pub tags: Vec<GroupRow>,
    pub oldest: Vec<AllocationRow>,
    /// Buffers allocated outside gpumem and registered with `track_external`, by tag.
    pub external: Vec<GroupRow>,
    /// "3 buffers, 1.50 GiB" (empty when none are registered).
    pub external_total: String,
    /// "2 pools, 52.00 MiB (35.00 MiB in use)" when CUDA graphs hold memory, else empty.
    pub graphs_total: String,
}

/// One device's row in the overview shown when there are several.
pub(crate) struct Summary {
    pub device_used: String,
    /// "of 80.00 GiB": hidden on a phone, where the column must stay narrow.
    pub device_total: String,
    pub in_use: String,
    pub reserved: String,
    pub leaks: String,
    pub leaks_warn: bool,
    pub ooms: String,
}

/// One part of the memory bar, and its legend entry.
pub(crate) struct BarSegment {
    pub class: &'static str,
    pub label: &'static str,
    pub value: String,
    /// Width as a CSS percentage, e.g. "12.50".
    pub width: String,
    /// The bytes behind it (a `data-bytes` attribute, for scripts and tests).
    pub bytes: u64,
}

/// A headline number.
pub(crate) struct Tile {
    pub label: &'static str,
    pub value: String,
    pub note: String,
    /// Draws the eye when something needs looking at.
    pub warn: bool,
}

pub(crate) struct PoolRow {
    pub pool: String,
    pub reserved: String,
    pub in_use: String,
    pub cached_free: String,
    pub largest_free: String,
    pub hit_ratio: String,
    pub fragmentation: String,
    pub live: String,
    pub driver_calls: String,
}

pub(crate) struct GroupRow {
    pub tag: String,
    pub count: String,
    pub bytes: String,
    pub oldest: String,
}

pub(crate) struct AllocationRow {
    pub(crate) id: String,
    pub tag: String,
    pub size: String,
    pub age: String,
    pub pool: String,
    /// Thread and backtrace of the allocation, when `capture_backtraces` recorded them.
    pub origin: Option<String>,
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
        let (health_class, health_text) = match &snapshot.sidecar {
            _ if !healthy => ("bad", health_text),
            Some(sidecar) if sidecar.blind().is_some() => {
                ("warn", "blind to the device (no NVML)".to_string())
            }
            Some(sidecar) if !sidecar.degraded().is_empty() => {
                ("warn", "sampling ok · degraded".to_string())
            }
            _ => ("ok", health_text),
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
                .map(|d| DeviceView::new(d, snapshot.sidecar.is_none()))
                .collect(),
            sidecar: snapshot.sidecar.as_ref().map(SidecarView::new),
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

/// The page's hints for `snapshot`: one per state that needs attention, most urgent first.
fn hints(snapshot: &Snapshot, fresh: bool, runbook: &str) -> Vec<Hint> {
    let link = |anchor: &str| format!("{runbook}#{anchor}");
    let mut hints = Vec::new();
    let mut hint = |class, text: String, anchor| {
        hints.push(Hint {
            class,
            text,
            link: link(anchor),
        })
    };
    if !snapshot.health.latest_ok || !fresh {
        hint(
            "warn",
            "Sampling is failing or stalled: the numbers below are old. /healthz says why."
                .to_string(),
            RUNBOOK_SAMPLING,
        );
    }
    if let Some(blind) = snapshot.sidecar.as_ref().and_then(|s| s.blind()) {
        let mut text = blind;
        if let Some(first) = text.get(..1) {
            text = format!("{}{}.", first.to_uppercase(), &text[1..]);
        }
        hint("warn", text, RUNBOOK_NVML);
    }
    for device in &snapshot.devices {
        let gpu = device.index;
        if let Some(p) = device.pressure {
            let pct = format::percent(p.used_ratio);
            match p.level {
                PressureLevel::Critical => hint(
                    "critical",
                    format!("GPU {gpu} is at critical memory pressure ({pct} of usable): allocations are about to fail. Find who holds the memory and free it or lower the load."),
                    RUNBOOK_PRESSURE_CRITICAL,
                ),
                PressureLevel::High => hint(
                    "warn",
                    format!("GPU {gpu} is at high memory pressure ({pct} of usable): caches are trimmed and larger batches may not fit."),
                    RUNBOOK_PRESSURE_HIGH,
                ),
                _ => {}
            }
        }
        let ooms = device.stats.ooms + collected(snapshot, device, |d| d.ooms_total);
        if ooms > 0 {
            hint(
                "critical",
                format!("GPU {gpu}: {} allocation(s) refused with out-of-memory. The flight records below say what was asked for and who held the memory.", format::count(ooms)),
                RUNBOOK_OOM,
            );
        }
        let leaks =
            device.live.leak_suspect_bytes + collected(snapshot, device, |d| d.leak_suspect_bytes);
        if leaks > 0 {
            hint(
                "warn",
                format!("GPU {gpu}: {} held by leak suspects (allocations older than {}). If it keeps growing, something allocates and never frees.", format::bytes(leaks), format::age(snapshot.leak_age_seconds)),
                RUNBOOK_LEAKS,
            );
        }
        let fragmented = device
            .pools
            .iter()
            .map(|p| p.fragmentation_ratio)
            .fold(0.0, f64::max);
        if fragmented > gpumem::manager::FRAGMENTATION_WARNING {
            hint(
                "warn",
                format!("GPU {gpu}: a pool's cached memory is {} splinters; large requests may miss although memory is cached.", format::percent(fragmented)),
                RUNBOOK_FRAGMENTED,
            );
        }
    }
    hints.sort_by_key(|h| h.class != "critical");
    hints
}

/// A published number summed over the collected processes on `device` (sidecar only).
fn collected(
    snapshot: &Snapshot,
    device: &DeviceSnapshot,
    value: fn(&gpumem::snapshot::ProcessDevice) -> Option<u64>,
) -> u64 {
    let Some(sidecar) = &snapshot.sidecar else {
        return 0;
    };
    sidecar
        .processes
        .iter()
        .flat_map(|p| &p.devices)
        .filter(|d| d.is(device))
        .filter_map(value)
        .sum()
}

impl DeviceView {
    fn new(device: &DeviceSnapshot, own_pools: bool) -> Self {
        let stats = &device.stats;
        let (pressure_class, pressure_label) = match device.pressure {
            Some(p) => (
                p.level.name(),
                format!(
                    "{} pressure · {} of usable",
                    p.level.name(),
                    format::percent(p.used_ratio)
                ),
            ),
            None => ("unknown", "pressure unknown".to_string()),
        };
        let leak_count = device.live.leak_suspect_count;
        let mut tiles = vec![
            Tile {
                label: "In use",
                value: format::bytes(stats.pools.in_use_bytes),
                note: format!("peak {}", format::bytes(stats.pools.peak_in_use_bytes)),
                warn: false,
            },
            Tile {
                label: "Reserved",
                value: format::bytes(stats.pools.reserved_bytes),
                note: format!("peak {}", format::bytes(stats.pools.peak_reserved_bytes)),
                warn: false,
            },
            Tile {
                label: "Pool hit ratio",
                value: format::percent(stats.hit_ratio()),
                note: format!("{} requests", format::count(stats.pools.requests)),
                warn: false,
            },
            Tile {
                label: "Live allocations",
                value: format::count(device.live.count),
                note: format::bytes(device.live.bytes),
                warn: false,
            },
            Tile {
                label: "Leak suspects",
                value: format::count(leak_count),
                note: format::bytes(device.live.leak_suspect_bytes),
                warn: leak_count > 0,
            },
            Tile {
                label: "Out of memory",
                value: format::count(stats.ooms),
                note: format!(
                    "{} retries · {} to host",
                    format::count(stats.oom_retries),
                    format::count(stats.cpu_fallbacks)
                ),
                warn: stats.ooms > 0,
            },
        ];
        if !own_pools {
            tiles.clear();
        }
        if let Some(memory) = device.memory {
            // The one percentage on the page is the pressure's: used over usable memory.
            let note = match device.pressure {
                Some(p) => format!("{} of usable", format::percent(p.used_ratio)),
                None => format!("of {}", format::bytes(memory.total_bytes)),
            };
            tiles.insert(
                tiles.len().min(2),
                Tile {
                    label: "Device used",
                    value: format::bytes(memory.used_bytes),
                    note,
                    warn: device
                        .pressure
                        .is_some_and(|p| p.level >= PressureLevel::High),
                },
            );
        }
        DeviceView {
            index: device.index,
            name: device.name.clone(),
            uuid: device.uuid.clone(),
            simulated: device.simulated,
            total_bytes: device.memory.map_or(device.total_bytes, |m| m.total_bytes),
            own_pools,
            pressure_class,
            pressure_label,
            pressure_short: device.pressure.map_or("unknown", |p| p.level.name()),
            summary: Summary {
                device_used: device
                    .memory
                    .map_or_else(|| "unknown".to_string(), |m| format::bytes(m.used_bytes)),
                device_total: format!("of {}", format::bytes(device.total_bytes)),
                in_use: format::bytes(stats.pools.in_use_bytes),
                reserved: format::bytes(stats.pools.reserved_bytes),
                leaks: format::count(leak_count),
                leaks_warn: leak_count > 0,
                ooms: format::count(stats.ooms),
            },
            memory_known: device.memory.is_some(),
            bar: memory_bar(device, own_pools),
            tiles,
            pools: device.pools.iter().map(pool_row).collect(),
            leaks: device.leak_suspects.iter().map(group_row).collect(),
            tags: device.by_tag.iter().map(group_row).collect(),
            oldest: device
                .oldest_allocations
                .iter()
                .map(|a| AllocationRow {
                    id: format!("{:#x}", a.id),
                    tag: a.tag.clone(),
                    size: format::bytes(a.requested_bytes),
                    age: format::age(a.age_seconds),
                    pool: a.pool.clone(),
                    origin: a.backtrace.as_ref().map(|trace| {
                        let thread = a.thread.as_deref().unwrap_or("unknown thread");
                        format!("thread {thread}\n{trace}")
                    }),
                })
                .collect(),
            external: device.external.by_tag.iter().map(group_row).collect(),
            graphs_total: unless_none(device.graphs.pools, || {
                format!(
                    "{} ({} in use)",
                    format::graph_pools(device.graphs.pools, device.graphs.reserved_bytes),
                    format::bytes(device.graphs.in_use_bytes)
                )
            }),
            external_total: unless_none(device.external.count, || {
                format!(
                    "{} buffers, {}",
                    format::count(device.external.count),
                    format::bytes(device.external.bytes)
                )
            }),
        }
    }
}

/// The bar: this process's memory in use, its cached memory, other users, free (without pools
/// of its own: used and free).
fn memory_bar(device: &DeviceSnapshot, own_pools: bool) -> Vec<BarSegment> {
    let stats = &device.stats;
    let in_use = stats.pools.in_use_bytes.min(stats.pools.reserved_bytes);
    let cached = stats.pools.reserved_bytes - in_use;
    let (total, others, free) = match device.memory {
        Some(m) => (
            m.total_bytes,
            Some(m.used_by_others_bytes),
            Some(m.free_bytes),
        ),
        None => (device.total_bytes, None, None),
    };
    let width = |bytes: u64| format!("{:.2}", bytes as f64 * 100.0 / total.max(1) as f64);
    let segment = |class, label, bytes: u64| BarSegment {
        class,
        label,
        value: format::bytes(bytes),
        width: width(bytes),
        bytes,
    };
    let mut bar = Vec::new();
    if own_pools {
        bar.push(segment("in-use", "In use (this process)", in_use));
        bar.push(segment("cached", "Cached by pools", cached));
    } else if stats.pools.reserved_bytes > 0 {
        // The sidecar: what the collected processes hold, as their own tables say.
        bar.push(segment("in-use", "In use (published processes)", in_use));
        bar.push(segment("cached", "Cached by their pools", cached));
    }
    if let (Some(others), Some(free)) = (others, free) {
        let label = if own_pools || stats.pools.reserved_bytes > 0 {
            "Used by others"
        } else {
            "Used"
        };
        bar.push(segment("others", label, others));
        bar.push(segment("free", "Free", free));
    }
    bar
}

fn pool_row(pool: &gpumem::snapshot::PoolSnapshot) -> PoolRow {
    PoolRow {
        pool: pool.pool.clone(),
        reserved: format::bytes(pool.reserved_bytes),
        in_use: format::bytes(pool.in_use_bytes),
        cached_free: format::bytes(pool.cached_free_bytes),
        largest_free: format::bytes(pool.largest_free_block_bytes),
        hit_ratio: if pool.requests == 0 {
            "–".to_string()
        } else {
            format::percent(pool.hit_ratio())
        },
        fragmentation: format::percent(pool.fragmentation_ratio),
        live: format::count(pool.live_allocations),
        driver_calls: format!(
            "{} / {}",
            format::count(pool.driver_allocs),
            format::count(pool.driver_frees)
        ),
    }
}

/// A panel's summary line: empty (the panel hidden) while there is nothing to sum up.
fn unless_none(count: u64, summary: impl FnOnce() -> String) -> String {
    if count == 0 {
        String::new()
    } else {
        summary()
    }
}

fn group_row(group: &gpumem::snapshot::TagGroup) -> GroupRow {
    GroupRow {
        tag: group.tag.clone(),
        count: format::count(group.count),
        bytes: format::bytes(group.bytes),
        oldest: format::age(group.oldest_age_seconds),
    }
}
