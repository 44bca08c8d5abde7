//! `replay --misses`: every allocation of a replay that had to map memory, with where it
//! landed and what the cache budget unmapped to make room, to see which requests miss and why.

use super::{replay_through, Held, Managed, ReplayError, ReplayReport, Replayed, TimelinePoint};
use crate::trace::Trace;
use gpumem::error::AllocError;
use gpumem::manager::views::DeviceStats;
use gpumem::manager::{DeviceBuffer, MemoryManager};
use serde::Serialize;

/// One allocation that mapped pages.
#[derive(Clone, Debug, Serialize)]
pub struct MissRecord {
    pub trace: String,
    /// Which allocation of the trace it was: 1 for the first `a` line.
    pub allocation: u64,
    pub size: u64,
    /// The device address it got: blocks that land at the same addresses reuse the same pages.
    pub ptr: u64,
    /// Pages mapped for it: kept ones mapped again, and new ones created.
    pub pages_reused: u64,
    pub pages_created: u64,
    /// Physical chunks unmapped while it was placed (to stay within the cache budget).
    pub chunks_unmapped: u64,
    /// After it: bytes in live blocks, and bytes held from the driver.
    pub in_use_bytes: u64,
    pub reserved_bytes: u64,
    /// What the reserved bytes beyond those in use are, after it: pages mapped with no live
    /// block on them (the cache, and pages a live block's chunk keeps mapped), and pages
    /// unmapped but kept for the next miss. The rest is pages only partly covered by live
    /// blocks.
    pub idle_mapped_bytes: u64,
    pub kept_bytes: u64,
}

/// [`super::replay`], also appending a [`MissRecord`] to `log` for each miss. Reads the
/// device's statistics around every allocation, so its time per operation is not comparable
/// with a replay without the log.
pub fn replay_logging_misses(
    manager: &MemoryManager,
    device: usize,
    trace: &Trace,
    progress: impl FnMut(u64),
    log: &mut Vec<MissRecord>,
) -> Result<(ReplayReport, Vec<TimelinePoint>), ReplayError> {
    let mut target = LoggingMisses {
        inner: Managed::new(manager, device),
        trace: &trace.name,
        allocations: 0,
        log,
    };
    replay_through(&mut target, trace, progress)
}

struct LoggingMisses<'a, 'l> {
    inner: Managed<'a>,
    trace: &'l str,
    allocations: u64,
    log: &'l mut Vec<MissRecord>,
}

impl<'a> AsRef<Managed<'a>> for LoggingMisses<'a, '_> {
    fn as_ref(&self) -> &Managed<'a> {
        &self.inner
    }
}

impl LoggingMisses<'_, '_> {
    fn stats(&self) -> Option<DeviceStats> {
        self.inner.manager.device_stats(self.inner.device).ok()
    }

    fn idle_mapped_bytes(&self) -> u64 {
        let manager = self.inner.manager;
        let page_size = manager
            .backend()
            .granularity(self.inner.device)
            .unwrap_or(0);
        let views = manager.pool_views();
        let on_device = views.iter().filter(|v| v.device == self.inner.device);
        on_device.map(|v| v.idle_pages).sum::<u64>() * page_size
    }
}

impl Replayed for LoggingMisses<'_, '_> {
    type Buffer = DeviceBuffer;

    fn alloc(&mut self, size: u64) -> Result<DeviceBuffer, AllocError> {
        self.allocations += 1;
        let before = self.stats();
        let buffer = self.inner.alloc(size)?;
        if let (Some(before), Some(after)) = (before, self.stats()) {
            if after.misses > before.misses {
                self.log.push(MissRecord {
                    trace: self.trace.to_string(),
                    allocation: self.allocations,
                    size,
                    ptr: buffer.ptr(),
                    pages_reused: after.pages_reused - before.pages_reused,
                    pages_created: after.pages_created - before.pages_created,
                    chunks_unmapped: after.counters.driver_frees - before.counters.driver_frees,
                    in_use_bytes: after.counters.in_use_bytes,
                    reserved_bytes: after.counters.reserved_bytes,
                    idle_mapped_bytes: self.idle_mapped_bytes(),
                    kept_bytes: after.page_reserve_bytes,
                });
            }
        }
        Ok(buffer)
    }

    fn free(&mut self, buffer: DeviceBuffer) {
        self.inner.free(buffer);
    }

    fn reset_peaks(&mut self) {
        self.inner.reset_peaks();
    }

    fn held(&self) -> Held {
        self.inner.held()
    }

    fn device_used(&self) -> Option<u64> {
        self.inner.device_used()
    }
}
