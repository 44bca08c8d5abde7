//! The baseline: a trace replayed through the CUDA driver's own stream-ordered pool
//! (`cuMemAllocAsync` / `cuMemFreeAsync`), by the same loop that replays gpumem.

use super::{per_op, play, ratio, Held, ReplayError, ReplayReport, Replayed, TimelinePoint};
use crate::trace::Trace;
use gpumem::backend::{DeviceBackend, DevicePtr, DriverPool as Pool};
use gpumem::error::AllocError;
use gpumem::error::BackendError;

struct DriverPool<'a> {
    backend: &'a dyn DeviceBackend,
    cuda: &'a dyn Pool,
    device: usize,
    allocs: u64,
    frees: u64,
    in_use: u64,
    in_use_high: u64,
}

impl Replayed for DriverPool<'_> {
    type Buffer = (DevicePtr, u64);
    fn alloc(&mut self, size: u64) -> Result<(DevicePtr, u64), AllocError> {
        let ptr = self.cuda.alloc_stream_ordered(self.device, size)?;
        self.allocs += 1;
        self.in_use += size;
        self.in_use_high = self.in_use_high.max(self.in_use);
        Ok((ptr, size))
    }
    fn free(&mut self, (ptr, size): (DevicePtr, u64)) {
        match self.cuda.free_stream_ordered(self.device, ptr) {
            Ok(()) => {
                self.frees += 1;
                self.in_use -= size;
            }
            Err(error) => tracing::warn!(%error, "cuMemFreeAsync failed during a replay"),
        }
    }
    fn reset_peaks(&mut self) {
        self.in_use_high = self.in_use;
        if let Err(error) = self.cuda.reset_stream_ordered_peak(self.device) {
            tracing::warn!(%error, "resetting the driver pool's high-water mark failed");
        }
    }
    fn held(&self) -> Held {
        let (reserved, reserved_high) = self
            .cuda
            .stream_ordered_reserved(self.device)
            .unwrap_or((0, 0));
        Held {
            in_use: self.in_use,
            reserved,
            in_use_high: self.in_use_high,
            reserved_high,
        }
    }
    fn device_used(&self) -> Option<u64> {
        self.backend
            .mem_info(self.device)
            .ok()
            .map(|info| info.used())
    }
}

/// Replays `trace` through the driver's stream-ordered pool (`cuMemAllocAsync` /
/// `cuMemFreeAsync` on the device's default pool, release threshold max): the baseline,
/// measured by the same loop. Its reserved peak is the pool's own high-water mark.
pub fn replay_driver_pool(
    backend: &dyn DeviceBackend,
    device: usize,
    trace: &Trace,
    mut progress: impl FnMut(u64),
) -> Result<(ReplayReport, Vec<TimelinePoint>), ReplayError> {
    let baseline = |source| ReplayError::Baseline {
        trace: trace.name.clone(),
        source,
    };
    let cuda = backend
        .driver_pool()
        .ok_or_else(|| BackendError::DriverUnavailable {
            reason: format!("the {} backend has no driver pool", backend.kind()),
        })
        .map_err(baseline)?;
    cuda.prepare_stream_ordered_pool(device).map_err(baseline)?;
    cuda.trim_stream_ordered_pool(device).map_err(baseline)?;
    cuda.reset_stream_ordered_peak(device).map_err(baseline)?;
    let mut target = DriverPool {
        backend,
        cuda,
        device,
        allocs: 0,
        frees: 0,
        in_use: 0,
        in_use_high: 0,
    };
    let played = play(&mut target, trace, &mut progress);
    let trimmed = cuda.trim_stream_ordered_pool(device);
    let played = played?;
    trimmed.map_err(baseline)?;
    let peak = played.reserved_peak;
    let after = cuda.stream_ordered_reserved(device).map_err(baseline)?.0;
    let report = ReplayReport {
        trace: trace.name.clone(),
        backend: "cuda".to_string(),
        strategy: "driver-pool".to_string(),
        events: trace.events.len() as u64,
        peak_requested_bytes: played.requested_peak,
        peak_in_use_bytes: played.in_use_peak,
        peak_reserved_bytes: peak,
        reserved_over_peak: ratio(peak, played.requested_peak),
        driver_allocs: target.allocs,
        driver_frees: target.frees,
        pool_hit_ratio: 0.0,
        ns_per_op: per_op(played.busy, trace.events.len()),
        driver_ns_per_op: None,
        reserved_after_empty_cache_bytes: after,
        ooms: 0,
        max_device_vs_reserved_gap_bytes: played.max_gap,
        cache_mode: String::new(),
        adaptive_level: None,
        idle_pages_kept: 0,
        idle_per_mille: 0,
        max_chunk_bytes: 0,
        inside_chunk_bytes: 0,
        whole_chunks_when_growing: false,
        place_on_mapped_pages: false,
        map_ahead_when_growing: false,
        misses: 0,
        miss_p50_ns: 0,
        miss_p99_ns: 0,
        pages_created: 0,
        pages_reused: 0,
        pages_released: 0,
        gpu_waits: 0,
        ns_per_op_runs: Vec::new(),
    };
    Ok((report, played.timeline))
}
