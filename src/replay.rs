//! Replays an allocation trace through a real `MemoryManager` and measures what the allocator
//! is judged on: reserved bytes over the requested peak, driver calls, hit ratio, time per op.

use crate::error::AllocError;
use crate::manager::{AllocOptions, DeviceBuffer, MemoryManager};
use crate::trace::{Trace, TraceEvent};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Points kept for the plot of one trace.
const TIMELINE_POINTS: usize = 1500;

/// The result of one replay: the fields DESIGN.md promises for `replay --json`, and more.
#[derive(Clone, Debug, Serialize)]
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
    /// Bytes still reserved after every buffer was freed and the cache emptied (should be 0).
    pub reserved_after_empty_cache_bytes: u64,
    pub ooms: u64,
    /// Largest difference, over the timeline points, between what the device says this process
    /// gained since the start (`mem_info`) and what the pools say they reserve. Within the page
    /// size means the pools' accounting matches the driver's.
    pub max_device_vs_reserved_gap_bytes: u64,
}

/// Requested, in-use and reserved bytes after event `event`, and their extremes over the
/// events since the previous point (a bucket), so a plot of ~1500 points still shows every
/// peak the report prints.
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelinePoint {
    pub event: u64,
    pub requested: u64,
    pub in_use: u64,
    pub reserved: u64,
    pub requested_low: u64,
    pub requested_high: u64,
    /// The pools' peaks over the bucket (reset at its start).
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
}

/// Replays `trace` on `device`, calling `progress(events_done)` now and then.
pub fn replay(
    manager: &MemoryManager,
    device: usize,
    trace: &Trace,
    mut progress: impl FnMut(u64),
) -> Result<(ReplayReport, Vec<TimelinePoint>), ReplayError> {
    manager.reset_peaks();
    let options = AllocOptions::default();
    let mut live: Vec<Option<DeviceBuffer>> = Vec::new();
    live.resize_with(trace.slots, || None);
    let total = trace.events.len();
    let stride = total.div_ceil(TIMELINE_POINTS).max(1);
    let mut timeline = Vec::with_capacity(TIMELINE_POINTS + 1);
    let mut busy = Duration::ZERO;
    let mut requested_now: u64 = 0;
    let mut peak_requested: u64 = 0;
    let used_at_start = device_used(manager, device);
    let mut max_gap: u64 = 0;
    let (mut peak_in_use, mut peak_reserved) = (0, 0);
    for (chunk_index, chunk) in trace.events.chunks(stride).enumerate() {
        // Peaks per bucket (outside the timed part): the plot keeps each bucket's highest.
        manager.reset_peaks();
        let (mut low, mut high) = (requested_now, requested_now);
        let started = Instant::now();
        for (offset, event) in chunk.iter().enumerate() {
            match *event {
                TraceEvent::Alloc { slot, size, .. } => {
                    let buffer = manager.alloc(device, size, &options).map_err(|source| {
                        ReplayError::Alloc {
                            trace: trace.name.clone(),
                            event: (chunk_index * stride + offset) as u64 + 1,
                            size,
                            source,
                        }
                    })?;
                    live[slot as usize] = Some(buffer);
                    requested_now += size;
                    high = high.max(requested_now);
                }
                TraceEvent::Free { slot } => {
                    if let Some(buffer) = live[slot as usize].take() {
                        requested_now -= buffer.size();
                        low = low.min(requested_now);
                        drop(buffer);
                    }
                }
            }
        }
        peak_requested = peak_requested.max(high);
        busy += started.elapsed();
        let done = ((chunk_index + 1) * stride).min(total) as u64;
        let mut point = timeline_point(manager, device, done);
        point.requested_low = low;
        point.requested_high = high;
        peak_in_use = peak_in_use.max(point.in_use_high);
        peak_reserved = peak_reserved.max(point.reserved_high);
        if let (Some(start), Some(now)) = (used_at_start, device_used(manager, device)) {
            let gained = now.saturating_sub(start);
            max_gap = max_gap.max(gained.abs_diff(point.reserved));
        }
        timeline.push(point);
        progress(done);
    }
    let at_end = manager.device_stats(device).ok();
    drop(live);
    manager.empty_cache();
    let after = manager.device_stats(device).ok();
    let counters = at_end.as_ref().map(|s| s.counters).unwrap_or_default();
    let report = ReplayReport {
        trace: trace.name.clone(),
        backend: manager.backend().kind().to_string(),
        strategy: format!("{:?}", manager.config().strategy).to_lowercase(),
        events: total as u64,
        peak_requested_bytes: peak_requested,
        peak_in_use_bytes: peak_in_use,
        peak_reserved_bytes: peak_reserved,
        reserved_over_peak: if peak_requested == 0 {
            0.0
        } else {
            peak_reserved as f64 / peak_requested as f64
        },
        driver_allocs: counters.driver_allocs,
        driver_frees: after
            .as_ref()
            .map_or(counters.driver_frees, |s| s.counters.driver_frees),
        pool_hit_ratio: counters.hit_ratio(),
        ns_per_op: if total == 0 {
            0.0
        } else {
            busy.as_nanos() as f64 / total as f64
        },
        reserved_after_empty_cache_bytes: after.map_or(0, |s| s.counters.reserved_bytes),
        ooms: counters_ooms(at_end.as_ref()),
        max_device_vs_reserved_gap_bytes: max_gap,
    };
    Ok((report, timeline))
}

fn counters_ooms(stats: Option<&crate::manager::views::DeviceStats>) -> u64 {
    stats.map_or(0, |s| s.ooms)
}

fn device_used(manager: &MemoryManager, device: usize) -> Option<u64> {
    manager
        .backend()
        .mem_info(device)
        .ok()
        .map(|info| info.used())
}

fn timeline_point(manager: &MemoryManager, device: usize, event: u64) -> TimelinePoint {
    let counters = manager
        .device_stats(device)
        .map(|s| s.counters)
        .unwrap_or_default();
    TimelinePoint {
        event,
        requested: counters.requested_bytes,
        in_use: counters.in_use_bytes,
        reserved: counters.reserved_bytes,
        requested_low: counters.requested_bytes,
        requested_high: counters.requested_bytes,
        in_use_high: counters.peak_in_use_bytes,
        reserved_high: counters.peak_reserved_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{SimBackend, SimConfig};
    use crate::units::MIB;
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
}
