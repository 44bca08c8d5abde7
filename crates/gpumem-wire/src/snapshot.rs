//! The snapshot: an owned, serialisable picture of one or more managers and their devices at one
//! instant. The core fills it (`gpumem::snapshot::capture`); the sampler takes one per interval;
//! the web layer (metrics, page, JSON) and the publisher read only these, never the allocator.
//!
//! The types here are the JSON contract of `/api/v1/snapshot`: they copy values out of the
//! manager's internal structs instead of embedding them, so the allocator can change freely.

use crate::{CollectorSnapshot, CounterValues, OomEvent, PressureLevel};
use serde::{Deserialize, Serialize};

/// Everything the exporter knows at one instant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The gpumem version that took it.
    pub version: String,
    /// When it was taken, in seconds since the Unix epoch.
    pub timestamp_seconds: f64,
    /// How long taking it took (reading counters, walking arenas, asking the driver).
    pub sample_duration_seconds: f64,
    /// The sampler's interval.
    pub interval_seconds: f64,
    /// Allocations older than this are leak suspects (unless their tag is long-lived).
    pub leak_age_seconds: f64,
    /// Tags whose allocations are expected to live for the whole run (model weights).
    pub long_lived_tags: Vec<String>,
    /// `cuda` or `sim`.
    pub backend: String,
    pub devices: Vec<DeviceSnapshot>,
    /// What went wrong in this sample (a device whose memory could not be read, ...).
    pub problems: Vec<String>,
    pub health: SamplerHealth,
    /// What the collecting process (`gpumem serve`: a sidecar, or the node agent) adds; absent
    /// for in-process managers. Renderers read it through [`Snapshot::collected`].
    #[serde(rename = "sidecar", default, skip_serializing_if = "Option::is_none")]
    pub collector: Option<CollectorSnapshot>,
}

impl Snapshot {
    /// What the collecting process added: its sources, the processes it collected and those
    /// NVML lists, the pod list, and their health. In-process it is the empty part (no source,
    /// no process, nothing degraded), so a renderer asks the same questions of every snapshot
    /// and branches only where holding pools matters ([`Snapshot::from_collector`]).
    pub fn collected(&self) -> &CollectorSnapshot {
        static NOTHING_COLLECTED: CollectorSnapshot = CollectorSnapshot::EMPTY;
        self.collector.as_ref().unwrap_or(&NOTHING_COLLECTED)
    }

    /// Whether a collecting process took it: one that reads the devices but holds no pools on
    /// them, so its device figures are the collected processes' and it exports no pools of
    /// its own.
    pub fn from_collector(&self) -> bool {
        self.collector.is_some()
    }
}

/// One device: what the driver says about it and what this process's pools hold on it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    pub index: usize,
    pub name: String,
    /// `GPU-…`, joinable with dcgm-exporter's `UUID` label.
    pub uuid: String,
    pub simulated: bool,
    /// From the device's properties; known even when `memory` is not.
    pub total_bytes: u64,
    /// From `cuMemGetInfo`; `None` when that call failed in this sample.
    pub memory: Option<DeviceMemory>,
    /// Derived from `memory`; `None` with it.
    pub pressure: Option<Pressure>,
    pub stats: DeviceCounters,
    pub pools: Vec<PoolSnapshot>,
    pub live: LiveSummary,
    /// Live allocations older than the leak age, grouped by tag, most bytes first.
    pub leak_suspects: Vec<TagGroup>,
    /// The oldest live allocations not tagged long-lived, oldest first.
    pub oldest_allocations: Vec<AllocationSummary>,
    /// Live bytes per tag, most bytes first (the largest few tags, then `other`).
    pub by_tag: Vec<TagGroup>,
    /// The latest out-of-memory refusals, oldest first (what was asked for, tag, why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_ooms: Vec<OomEvent>,
    /// Buffers allocated outside gpumem and registered with `track_external` (NCCL, cuBLAS
    /// workspaces, an engine's own `cuMemAlloc`): not part of any pool figure above.
    #[serde(default)]
    pub external: ExternalSummary,
    /// Memory held for CUDA graphs: pools of graphs not yet released. Part of the pool figures
    /// above, but out of every other allocation's reach.
    #[serde(default)]
    pub graphs: GraphSummary,
}

/// The graph pools of one device that still hold memory for their graphs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphSummary {
    pub pools: u64,
    /// Mapped for the graphs, whether a tensor uses it now or a replay will.
    pub reserved_bytes: u64,
    /// In live allocations (a graph's static inputs and outputs, for one).
    pub in_use_bytes: u64,
}

/// The outside buffers registered on one device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExternalSummary {
    pub count: u64,
    pub bytes: u64,
    /// By tag, most bytes first (the largest few tags, then `other`).
    pub by_tag: Vec<TagGroup>,
}

/// Device memory as the driver reports it, split by who holds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemory {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
    /// What this process's pools hold from the driver (their reserved bytes).
    pub used_by_this_process_bytes: u64,
    /// Everything else: other processes, CUDA contexts, libraries allocating on their own.
    pub used_by_others_bytes: u64,
}

/// How full the device is, measured against its usable memory.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pressure {
    pub level: PressureLevel,
    /// Used over usable bytes; the levels are thresholds on it.
    pub used_ratio: f64,
}

/// Counters of one device, all pools added up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCounters {
    /// The pools' counters, summed over the device's pools (flattened: the JSON keeps one
    /// object per device).
    #[serde(flatten)]
    pub pools: CounterValues,
    pub ooms: u64,
    pub oom_retries: u64,
    /// Requests served from host memory because the device could not.
    pub cpu_fallbacks: u64,
    /// Host bytes held by those fallback buffers now.
    pub host_fallback_bytes: u64,
}

impl DeviceCounters {
    /// Requests served without a driver call, over all requests (0 before the first).
    pub fn hit_ratio(&self) -> f64 {
        self.pools.hit_ratio()
    }
}

/// One kind of pool (`small`, `large`, `direct`) on one device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolSnapshot {
    pub pool: String,
    pub requested_bytes: u64,
    pub in_use_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub cached_free_bytes: u64,
    pub largest_free_block_bytes: u64,
    /// `1 - largest free block / cached free`: 0 when the cache is one block (or empty).
    pub fragmentation_ratio: f64,
    pub idle_pages: u64,
    pub live_allocations: u64,
    pub requests: u64,
    pub hits: u64,
    pub driver_allocs: u64,
    pub driver_frees: u64,
    pub driver_errors: u64,
}

impl PoolSnapshot {
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.hits, self.requests)
    }
}

/// The live allocations of one device, counted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveSummary {
    pub count: u64,
    /// Requested bytes (what callers asked for, before rounding to blocks).
    pub bytes: u64,
    pub by_age: Vec<AgeBand>,
    /// Age of the oldest allocation not tagged long-lived (0 when there is none).
    pub oldest_age_seconds: f64,
    pub leak_suspect_count: u64,
    pub leak_suspect_bytes: u64,
}

/// Live allocations whose age falls in `[from, to)`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgeBand {
    /// A fixed label such as `1m-10m`: bounded, so it can be a metric label.
    pub band: String,
    pub count: u64,
    pub bytes: u64,
}

/// Live allocations sharing a tag.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TagGroup {
    /// The tag, `untagged`, or `other` for the tags beyond the largest few.
    pub tag: String,
    pub count: u64,
    pub bytes: u64,
    pub oldest_age_seconds: f64,
    /// Of these, the leak suspects (older than the leak age, tag not long-lived).
    #[serde(default)]
    pub leak_suspect_count: u64,
    #[serde(default)]
    pub leak_suspect_bytes: u64,
}

/// One live allocation, as the page lists it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocationSummary {
    /// The allocation's id (as `DeviceBuffer::id` and `MemoryManager::origin_of` know it).
    #[serde(default)]
    pub id: u64,
    pub tag: String,
    pub requested_bytes: u64,
    pub age_seconds: f64,
    pub pool: String,
    /// The allocating thread, when `capture_backtraces` is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// Where it was allocated (the caller's frames), when `capture_backtraces` is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backtrace: Option<String>,
}

/// How the sampler has been doing, as of this snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplerHealth {
    pub samples_ok: u64,
    pub samples_failed: u64,
    /// Whether this sample succeeded.
    pub latest_ok: bool,
    pub last_error: Option<String>,
    pub last_error_timestamp_seconds: Option<f64>,
    pub last_success_timestamp_seconds: Option<f64>,
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Seconds since the Unix epoch, now (0 if the clock is before 1970).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Rust field says what it is; the JSON keeps the name dashboards and scripts read.
    #[test]
    fn the_collector_part_keeps_its_json_name_and_is_empty_in_process() {
        let mut snapshot = Snapshot::default();
        assert!(!snapshot.from_collector());
        assert_eq!(*snapshot.collected(), CollectorSnapshot::default());
        let json = serde_json::to_value(&snapshot).expect("encodes");
        assert!(json.get("sidecar").is_none(), "{json}");

        snapshot.collector = Some(CollectorSnapshot {
            sources: vec![crate::SourceStatus {
                source: "nvml".to_string(),
                up: true,
                reason: None,
            }],
            ..CollectorSnapshot::default()
        });
        let json = serde_json::to_value(&snapshot).expect("encodes");
        assert_eq!(json["sidecar"]["sources"][0]["source"], "nvml", "{json}");
        assert!(json.get("collector").is_none(), "{json}");
        let back: Snapshot = serde_json::from_value(json).expect("decodes");
        assert_eq!(back, snapshot);
        assert!(back.from_collector());
    }
}
