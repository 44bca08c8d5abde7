//! Replays an allocation trace through a real `MemoryManager` — or, as the baseline, through
//! the CUDA driver's own stream-ordered pool — and measures what the allocator is judged on:
//! reserved bytes over the requested peak, driver calls, misses and their cost, time per op.

use crate::trace::{Trace, TraceEvent};
use gpumem::backend::timed::TimedBackend;
use gpumem::error::AllocError;
use gpumem::manager::{AllocOptions, DeviceBuffer, MemoryConfig, MemoryManager};
use serde::Serialize;
use std::time::{Duration, Instant};

mod driver_pool;
mod misses;
pub use driver_pool::replay_driver_pool;
pub use misses::{replay_logging_misses, MissRecord};

/// Points kept for the plot of one trace.
const TIMELINE_POINTS: usize = 1500;

/// The result of one replay: the fields DESIGN.md promises for `replay --json`, and more.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReplayReport {
    pub trace: String,
    pub backend: String,
    pub strategy: String,
    pub events: u64,
    pub peak_requested_bytes: u64,
    pub peak_in_use_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub reserved_over_peak: f64,
    pub driver_allocs: u64,
    pub driver_frees: u64,
    pub pool_hit_ratio: f64,
    pub ns_per_op: f64,
    /// Of `ns_per_op`, the time spent inside driver calls, where the replay timed them (the
    /// pooled strategy from the command line): what is left is the allocator's own work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_ns_per_op: Option<f64>,
    /// Bytes still reserved after every buffer was freed and the cache emptied (should be 0).
    pub reserved_after_empty_cache_bytes: u64,
    pub ooms: u64,
    /// Largest difference, over the timeline points, between what the device says this process
    /// gained since the start (`mem_info`) and what the pools say they reserve. Within the page
    /// size means the pools' accounting matches the driver's.
    pub max_device_vs_reserved_gap_bytes: u64,
    /// How the run chose its cache setting: `adaptive`, `memory-first` or `fixed`.
    pub cache_mode: String,
    /// With the adaptive default, the level of its ladder the run ended at (0 memory-first,
    /// 1 the configured setting, higher keeps more; `manager/adaptive.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adaptive_level: Option<u8>,
    /// The cache setting of the run at its end (`--idle-pages`, `--idle-per-mille`,
    /// `max_chunk_bytes`, `inside_chunk_bytes`, `whole_chunks_when_growing`,
    /// `place_on_mapped_pages`, `map_ahead_when_growing`): the configured one, or where the
    /// adaptive default landed.
    pub idle_pages_kept: usize,
    pub idle_per_mille: usize,
    pub max_chunk_bytes: u64,
    pub inside_chunk_bytes: u64,
    pub whole_chunks_when_growing: bool,
    pub place_on_mapped_pages: bool,
    pub map_ahead_when_growing: bool,
    /// Allocations that called the driver to map pages, and how long those allocations took
    /// (median and 99th percentile, within 12.5%); 0 for the baselines, which do not say.
    pub misses: u64,
    pub miss_p50_ns: u64,
    pub miss_p99_ns: u64,
    /// Physical pages created by the driver, mapped again from the page reserve instead, and
    /// released back to the driver (the final emptying included).
    pub pages_created: u64,
    pub pages_reused: u64,
    pub pages_released: u64,
    /// Waits for the GPU to finish work queued on idle pages before they could be mapped
    /// again: each would stall a host running ahead of its GPU. A replay queues no kernels, so
    /// on a GPU they end at once; the simulated GPU kept behind (`--sim-gpu-behind`) passes no
    /// fence by itself, which shows every wait such a host would make.
    pub gpu_waits: u64,
    /// With `replay --repeat N`, every replay's ns/op in the order run; `ns_per_op` and every
    /// other figure then come from the replay with the median ns/op.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ns_per_op_runs: Vec<f64>,
}

/// The configuration a replay runs under: `base` on one device and one shard, with no upkeep
/// thread, no age-based release and no pool cap, so the allocator alone is measured.
pub fn replay_config(base: MemoryConfig, device: usize) -> MemoryConfig {
    MemoryConfig {
        devices: Some(vec![device]),
        shards: 1,
        release_idle_after: None,
        cleanup_interval: None,
        gpu_memory_fraction: 1.0,
        preallocate_bytes: 0,
        ..base
    }
}

/// Requested, in-use and reserved bytes after event `event`, and their range over the bucket of
/// events that ends there, for the plot: with the highs, the plotted peaks are the printed ones.
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelinePoint {
    pub event: u64,
    pub requested: u64,
    pub in_use: u64,
    pub reserved: u64,
    pub requested_low: u64,
    pub requested_high: u64,
    /// The allocator's peaks over the bucket (reset at its start).
    pub in_use_high: u64,
    pub reserved_high: u64,
}

/// Why a replay stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{trace}: event {event} (allocating {size} bytes) failed: {source}")]
    Alloc {
        trace: String,
        event: u64,
        size: u64,
        source: AllocError,
    },
    #[error("{trace}: {source}")]
    Baseline {
        trace: String,
        source: gpumem::error::BackendError,
    },
}

/// What the replay loop drives: an allocator, and where its reserved bytes can be read.
trait Replayed {
    type Buffer;
    fn alloc(&mut self, size: u64) -> Result<Self::Buffer, AllocError>;
    fn free(&mut self, buffer: Self::Buffer);
    /// Starts a bucket: the highs [`held`](Self::held) reports count from here.
    fn reset_peaks(&mut self);
    /// Bytes in use and reserved now, and their highs since the last reset.
    fn held(&self) -> Held;
    /// Bytes the device says are used (by every process), when it can tell.
    fn device_used(&self) -> Option<u64>;
    /// Nanoseconds spent inside driver calls so far, where they are timed.
    fn driver_nanos(&self) -> Option<u64> {
        None
    }
}

/// What an allocator holds: now, and at most since its peaks were reset.
struct Held {
    in_use: u64,
    reserved: u64,
    in_use_high: u64,
    reserved_high: u64,
}

/// What the replay loop saw.
struct Played {
    requested_peak: u64,
    in_use_peak: u64,
    reserved_peak: u64,
    busy: Duration,
    /// Of `busy`, inside driver calls (where timed).
    in_driver: Option<u64>,
    max_gap: u64,
    timeline: Vec<TimelinePoint>,
}

/// Replays `trace` through `target`; every buffer still live at the end is handed back.
fn play<R: Replayed>(
    target: &mut R,
    trace: &Trace,
    progress: &mut impl FnMut(u64),
) -> Result<Played, ReplayError> {
    let mut live: Vec<Option<(R::Buffer, u64)>> = Vec::new();
    live.resize_with(trace.slots, || None);
    let total = trace.events.len();
    let stride = total.div_ceil(TIMELINE_POINTS).max(1);
    let mut played = Played {
        requested_peak: 0,
        in_use_peak: 0,
        reserved_peak: 0,
        busy: Duration::ZERO,
        in_driver: None,
        max_gap: 0,
        timeline: Vec::with_capacity(TIMELINE_POINTS + 1),
    };
    let mut requested_now: u64 = 0;
    let used_at_start = target.device_used();
    for (chunk_index, chunk) in trace.events.chunks(stride).enumerate() {
        // Outside the timed part: each bucket's highs are its own.
        target.reset_peaks();
        let (mut low, mut high) = (requested_now, requested_now);
        let driver_before = target.driver_nanos();
        let started = Instant::now();
        for (offset, event) in chunk.iter().enumerate() {
            match *event {
                TraceEvent::Alloc { slot, size, .. } => {
                    let buffer = target.alloc(size).map_err(|source| ReplayError::Alloc {
                        trace: trace.name.clone(),
                        event: (chunk_index * stride + offset) as u64 + 1,
                        size,
                        source,
                    })?;
                    live[slot as usize] = Some((buffer, size));
                    requested_now += size;
                    high = high.max(requested_now);
                }
                TraceEvent::Free { slot } => {
                    if let Some((buffer, size)) = live[slot as usize].take() {
                        requested_now -= size;
                        low = low.min(requested_now);
                        target.free(buffer);
                    }
                }
            }
        }
        played.busy += started.elapsed();
        if let (Some(before), Some(after)) = (driver_before, target.driver_nanos()) {
            *played.in_driver.get_or_insert(0) += after.saturating_sub(before);
        }
        let done = ((chunk_index + 1) * stride).min(total) as u64;
        let held = target.held();
        if let (Some(start), Some(now)) = (used_at_start, target.device_used()) {
            let gained = now.saturating_sub(start);
            played.max_gap = played.max_gap.max(gained.abs_diff(held.reserved));
        }
        played.requested_peak = played.requested_peak.max(high);
        played.in_use_peak = played.in_use_peak.max(held.in_use_high);
        played.reserved_peak = played.reserved_peak.max(held.reserved_high);
        played.timeline.push(TimelinePoint {
            event: done,
            requested: requested_now,
            in_use: held.in_use,
            reserved: held.reserved,
            requested_low: low,
            requested_high: high,
            in_use_high: held.in_use_high,
            reserved_high: held.reserved_high,
        });
        progress(done);
    }
    for (buffer, _) in live.into_iter().flatten() {
        target.free(buffer);
    }
    Ok(played)
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn per_op(busy: Duration, events: usize) -> f64 {
    if events == 0 {
        0.0
    } else {
        busy.as_nanos() as f64 / events as f64
    }
}

struct Managed<'a> {
    manager: &'a MemoryManager,
    device: usize,
    options: AllocOptions,
    /// The backend `manager` calls the driver through, when it times those calls.
    driver: Option<&'a TimedBackend>,
}

impl<'a> Managed<'a> {
    fn new(manager: &'a MemoryManager, device: usize) -> Self {
        Managed {
            manager,
            device,
            options: AllocOptions::default(),
            driver: None,
        }
    }
}

impl<'a> AsRef<Managed<'a>> for Managed<'a> {
    fn as_ref(&self) -> &Managed<'a> {
        self
    }
}

impl Replayed for Managed<'_> {
    type Buffer = DeviceBuffer;
    fn alloc(&mut self, size: u64) -> Result<DeviceBuffer, AllocError> {
        self.manager.alloc(self.device, size, &self.options)
    }
    fn free(&mut self, buffer: DeviceBuffer) {
        drop(buffer);
    }
    fn reset_peaks(&mut self) {
        self.manager.reset_peaks();
    }
    fn held(&self) -> Held {
        let counters = self
            .manager
            .device_stats(self.device)
            .map(|s| s.counters)
            .unwrap_or_default();
        Held {
            in_use: counters.in_use_bytes,
            reserved: counters.reserved_bytes,
            in_use_high: counters.peak_in_use_bytes,
            reserved_high: counters.peak_reserved_bytes,
        }
    }
    fn device_used(&self) -> Option<u64> {
        let backend = self.manager.backend();
        backend.mem_info(self.device).ok().map(|info| info.used())
    }
    fn driver_nanos(&self) -> Option<u64> {
        self.driver.map(|timed| timed.totals().total_nanos())
    }
}

/// Replays `trace` on `device`, calling `progress(events_done)` now and then.
pub fn replay(
    manager: &MemoryManager,
    device: usize,
    trace: &Trace,
    progress: impl FnMut(u64),
) -> Result<(ReplayReport, Vec<TimelinePoint>), ReplayError> {
    replay_through(&mut Managed::new(manager, device), trace, progress)
}

/// [`replay`] for a `manager` that reaches the driver through `driver`: the report also says
/// how much of the time per operation was spent inside driver calls.
pub fn replay_timing_driver(
    manager: &MemoryManager,
    driver: &TimedBackend,
    device: usize,
    trace: &Trace,
    progress: impl FnMut(u64),
) -> Result<(ReplayReport, Vec<TimelinePoint>), ReplayError> {
    let mut target = Managed {
        driver: Some(driver),
        ..Managed::new(manager, device)
    };
    replay_through(&mut target, trace, progress)
}

/// [`replay`] through `target`, which drives `manager` (itself, or something watching it).
fn replay_through<'a, R: Replayed + AsRef<Managed<'a>>>(
    target: &mut R,
    trace: &Trace,
    mut progress: impl FnMut(u64),
) -> Result<(ReplayReport, Vec<TimelinePoint>), ReplayError> {
    let (manager, device) = (target.as_ref().manager, target.as_ref().device);
    manager.reset_peaks();
    let played = play(target, trace, &mut progress);
    // Read before the final emptying, which releases every page and is not part of the trace.
    let at_end = manager.device_stats(device).ok();
    let landed = manager.cache_setting(device);
    manager.empty_cache();
    let played = played?;
    let after = manager.device_stats(device).ok();
    let counters = at_end.as_ref().map(|s| s.counters).unwrap_or_default();
    let config = manager.config();
    let report = ReplayReport {
        trace: trace.name.clone(),
        backend: manager.backend().kind().to_string(),
        strategy: format!("{:?}", config.strategy).to_lowercase(),
        events: trace.events.len() as u64,
        peak_requested_bytes: played.requested_peak,
        peak_in_use_bytes: played.in_use_peak,
        peak_reserved_bytes: played.reserved_peak,
        reserved_over_peak: ratio(played.reserved_peak, played.requested_peak),
        driver_allocs: counters.driver_allocs,
        driver_frees: after
            .as_ref()
            .map_or(counters.driver_frees, |s| s.counters.driver_frees),
        pool_hit_ratio: counters.hit_ratio(),
        ns_per_op: per_op(played.busy, trace.events.len()),
        driver_ns_per_op: played
            .in_driver
            .map(|ns| per_op(Duration::from_nanos(ns), trace.events.len())),
        reserved_after_empty_cache_bytes: after.as_ref().map_or(0, |s| s.counters.reserved_bytes),
        ooms: at_end.as_ref().map_or(0, |s| s.ooms),
        max_device_vs_reserved_gap_bytes: played.max_gap,
        cache_mode: gpumem::named::Named::name(config.cache_mode).to_string(),
        adaptive_level: landed.and_then(|(_, level)| level),
        idle_pages_kept: landed.map_or(config.idle_pages_kept, |(s, _)| s.idle_pages_kept),
        idle_per_mille: landed.map_or(config.idle_per_mille, |(s, _)| s.idle_per_mille),
        max_chunk_bytes: landed.map_or(config.max_chunk_bytes, |(s, _)| s.max_chunk_bytes),
        inside_chunk_bytes: landed.map_or(config.inside_chunk_bytes, |(s, _)| s.inside_chunk_bytes),
        whole_chunks_when_growing: landed.map_or(config.whole_chunks_when_growing, |(s, _)| {
            s.whole_chunks_when_growing
        }),
        place_on_mapped_pages: landed.map_or(config.place_on_mapped_pages, |(s, _)| {
            s.place_on_mapped_pages
        }),
        map_ahead_when_growing: landed.map_or(config.map_ahead_when_growing, |(s, _)| {
            s.map_ahead_when_growing
        }),
        misses: at_end.as_ref().map_or(0, |s| s.misses),
        miss_p50_ns: at_end.as_ref().map_or(0, |s| s.miss_p50_ns),
        miss_p99_ns: at_end.as_ref().map_or(0, |s| s.miss_p99_ns),
        pages_created: after.as_ref().map_or(0, |s| s.pages_created),
        pages_reused: after.as_ref().map_or(0, |s| s.pages_reused),
        pages_released: after.as_ref().map_or(0, |s| s.pages_released),
        gpu_waits: at_end.as_ref().map_or(0, |s| s.gpu_waits),
        ns_per_op_runs: Vec::new(),
    };
    Ok((report, played.timeline))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem::backend::sim::{SimBackend, SimConfig};
    use gpumem::units::MIB;
    use std::sync::Arc;

    /// A spike inside one bucket: the timeline's highs reach the printed peaks although the
    /// bucket ends long after the spike is freed.
    #[test]
    fn each_bucket_keeps_its_peak() {
        let mut events = Vec::new();
        // 30,000 events: about 20 per bucket; the 256 MiB spike lives for two events.
        for i in 0..15_000u32 {
            let size = if i == 7_001 { 256 * MIB } else { MIB };
            events.push(TraceEvent::Alloc {
                slot: 0,
                size,
                stream: 0,
            });
            events.push(TraceEvent::Free { slot: 0 });
        }
        let trace = Trace {
            name: "spike".into(),
            metadata: None,
            events,
            slots: 1,
            peak_requested_bytes: 256 * MIB,
        };
        let sim = Arc::new(SimBackend::new(SimConfig::default()));
        let manager = MemoryManager::new(sim, Default::default()).expect("manager");
        let (report, timeline) = replay(&manager, 0, &trace, |_| {}).expect("replays");
        let highest = |pick: fn(&TimelinePoint) -> u64| timeline.iter().map(pick).max();
        assert_eq!(report.peak_requested_bytes, 256 * MIB);
        assert_eq!(
            highest(|p| p.requested_high),
            Some(report.peak_requested_bytes)
        );
        assert_eq!(highest(|p| p.in_use_high), Some(report.peak_in_use_bytes));
        assert_eq!(
            highest(|p| p.reserved_high),
            Some(report.peak_reserved_bytes)
        );
        assert!(report.peak_reserved_bytes >= 256 * MIB);
        assert!(
            timeline.iter().map(|p| p.requested).max() < Some(256 * MIB),
            "the end-of-bucket values alone miss the spike (what the plot drew before)"
        );
    }

    /// Misses on the simulated H100 spend its driver costs; the report says how much of the
    /// time per operation went there, and only when the calls were timed.
    #[test]
    fn a_timed_replay_says_how_much_of_it_was_driver_time() {
        let mut events = Vec::new();
        // Allocations that grow one after another, each mapping new pages: misses.
        for slot in 0..8u32 {
            events.push(TraceEvent::Alloc {
                slot,
                size: 4 * MIB,
                stream: 0,
            });
        }
        let trace = Trace {
            name: "growth".into(),
            metadata: None,
            events,
            slots: 8,
            peak_requested_bytes: 32 * MIB,
        };
        let sim: Arc<dyn gpumem::backend::DeviceBackend> = Arc::new(SimBackend::new(SimConfig {
            driver_costs: gpumem::backend::sim::DriverCosts::H100,
            ..SimConfig::default()
        }));
        let timed = Arc::new(TimedBackend::new(Arc::clone(&sim)));
        let manager = MemoryManager::new(timed.clone(), Default::default()).expect("manager");
        let (report, _) =
            replay_timing_driver(&manager, &timed, 0, &trace, |_| {}).expect("replays");
        let in_driver = report.driver_ns_per_op.expect("timed");
        // Eight misses of at least 42 µs each (one new chunk mapped), over eight events.
        assert!(in_driver >= 40_000.0, "{in_driver}");
        assert!(
            in_driver <= report.ns_per_op,
            "{in_driver} > {}",
            report.ns_per_op
        );
        let plain = MemoryManager::new(sim, Default::default()).expect("manager");
        let (untimed, _) = replay(&plain, 0, &trace, |_| {}).expect("replays");
        assert_eq!(untimed.driver_ns_per_op, None);
    }
}
