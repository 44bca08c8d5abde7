//! A backend that passes every call on to another and counts how many of each kind it made and
//! how long they took: what `gpumem bench` and `gpumem replay` use to say how much of a miss, or
//! of a replay's time per operation, was spent inside the driver and how much in the allocator.

use super::{
    BackendKind, Detaching, DeviceBackend, DeviceProperties, DevicePtr, DirectMemory, DriverPool,
    Fence, HostContext, MemInfo, PhysicalChunk, ShareableMemory, StreamId, StreamOrder,
};
use crate::error::BackendError;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// The kinds of call counted apart, each named as the driver call behind it; declared in the
/// order of [`CallKind::ALL`], so that `kind as usize` is its slot there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// `cuMemMap` of kept chunks and `cuMemCreate` of new ones, with one `cuMemSetAccess`.
    Map,
    /// `cuMemUnmap`.
    Unmap,
    /// `cuMemRelease`.
    Release,
    /// `cuMemAlloc` / `cuMemFree`.
    Direct,
    /// Stream synchronisation and fences: `cuStreamSynchronize`, `cuStreamQuery`,
    /// `cuEventRecord`, `cuEventQuery`, `cuEventSynchronize`.
    Sync,
    /// Everything else: queries of memory and properties, address ranges, capture state.
    Other,
}

impl CallKind {
    /// Every kind, each at its own `as usize`.
    pub const ALL: [CallKind; 6] = [
        CallKind::Map,
        CallKind::Unmap,
        CallKind::Release,
        CallKind::Direct,
        CallKind::Sync,
        CallKind::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CallKind::Map => "map",
            CallKind::Unmap => "unmap",
            CallKind::Release => "release",
            CallKind::Direct => "alloc/free",
            CallKind::Sync => "sync",
            CallKind::Other => "other",
        }
    }
}

/// Calls made and nanoseconds spent, per [`CallKind`] (in the order of [`CallKind::ALL`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTotals {
    pub calls: [u64; 6],
    pub nanos: [u64; 6],
}

impl CallTotals {
    /// What was counted after `earlier` was taken.
    pub fn since(&self, earlier: &CallTotals) -> CallTotals {
        let mut diff = CallTotals::default();
        for i in 0..CallKind::ALL.len() {
            diff.calls[i] = self.calls[i].saturating_sub(earlier.calls[i]);
            diff.nanos[i] = self.nanos[i].saturating_sub(earlier.nanos[i]);
        }
        diff
    }

    pub fn total_nanos(&self) -> u64 {
        self.nanos.iter().sum()
    }
}

pub struct TimedBackend {
    inner: Arc<dyn DeviceBackend>,
    calls: [AtomicU64; 6],
    nanos: [AtomicU64; 6],
}

impl TimedBackend {
    pub fn new(inner: Arc<dyn DeviceBackend>) -> Self {
        TimedBackend {
            inner,
            calls: Default::default(),
            nanos: Default::default(),
        }
    }

    /// Everything counted so far.
    pub fn totals(&self) -> CallTotals {
        let mut totals = CallTotals::default();
        for i in 0..CallKind::ALL.len() {
            totals.calls[i] = self.calls[i].load(Relaxed);
            totals.nanos[i] = self.nanos[i].load(Relaxed);
        }
        totals
    }

    fn time<R>(&self, kind: CallKind, call: impl FnOnce(&dyn DeviceBackend) -> R) -> R {
        let started = Instant::now();
        let result = call(&*self.inner);
        let took = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        let slot = kind as usize;
        self.calls[slot].fetch_add(1, Relaxed);
        self.nanos[slot].fetch_add(took, Relaxed);
        result
    }
}

impl fmt::Debug for TimedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimedBackend")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl DeviceBackend for TimedBackend {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }

    fn device_count(&self) -> usize {
        self.inner.device_count()
    }

    fn properties(&self, device: usize) -> Result<DeviceProperties, BackendError> {
        self.time(CallKind::Other, |b| b.properties(device))
    }

    fn mem_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        self.time(CallKind::Other, |b| b.mem_info(device))
    }

    fn granularity(&self, device: usize) -> Result<u64, BackendError> {
        self.time(CallKind::Other, |b| b.granularity(device))
    }

    fn reserve_address_range(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError> {
        self.time(CallKind::Other, |b| b.reserve_address_range(device, size))
    }

    fn release_address_range(
        &self,
        device: usize,
        base: DevicePtr,
        size: u64,
    ) -> Result<(), BackendError> {
        self.time(CallKind::Other, |b| {
            b.release_address_range(device, base, size)
        })
    }

    fn map_reusing(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        reuse: &mut Vec<PhysicalChunk>,
        new_chunks: &[u32],
    ) -> Result<u64, BackendError> {
        self.time(CallKind::Map, |b| {
            b.map_reusing(device, addr, size, reuse, new_chunks)
        })
    }

    fn unmap_keeping(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        into: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        self.time(CallKind::Unmap, |b| {
            b.unmap_keeping(device, addr, size, into)
        })
    }

    fn release_chunks(
        &self,
        device: usize,
        chunks: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        self.time(CallKind::Release, |b| b.release_chunks(device, chunks))
    }

    fn streams(&self) -> Option<&dyn StreamOrder> {
        self.inner.streams().map(|_| self as &dyn StreamOrder)
    }

    fn direct(&self) -> Option<&dyn DirectMemory> {
        self.inner.direct().map(|_| self as &dyn DirectMemory)
    }

    fn detaching(&self) -> Option<&dyn Detaching> {
        self.inner.detaching().map(|_| self as &dyn Detaching)
    }

    /// The inner backend's, untimed: the baseline is not what this backend measures.
    fn driver_pool(&self) -> Option<&dyn DriverPool> {
        self.inner.driver_pool()
    }

    fn host_context(&self) -> Option<&dyn HostContext> {
        self.inner.host_context()
    }

    fn shareable(&self) -> Option<&dyn ShareableMemory> {
        self.inner.shareable()
    }

    fn charged_ns(&self) -> Option<u64> {
        self.inner.charged_ns()
    }
}

impl StreamOrder for TimedBackend {
    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        self.time(CallKind::Sync, |b| b.synchronize_stream(device, stream))
    }

    fn stream_idle(&self, device: usize, stream: StreamId) -> Result<bool, BackendError> {
        self.time(CallKind::Sync, |b| b.stream_idle(device, stream))
    }

    fn record_fence(&self, device: usize, stream: StreamId) -> Result<Fence, BackendError> {
        self.time(CallKind::Sync, |b| b.record_fence(device, stream))
    }

    fn fence_passed(&self, device: usize, fence: Fence) -> Result<bool, BackendError> {
        self.time(CallKind::Sync, |b| b.fence_passed(device, fence))
    }

    fn wait_fence(&self, device: usize, fence: Fence) -> Result<(), BackendError> {
        self.time(CallKind::Sync, |b| b.wait_fence(device, fence))
    }

    fn capture_of(&self, device: usize, stream: StreamId) -> Result<Option<u64>, BackendError> {
        self.time(CallKind::Other, |b| b.capture_of(device, stream))
    }
}

impl DirectMemory for TimedBackend {
    fn alloc(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError> {
        self.time(CallKind::Direct, |b| b.alloc(device, size))
    }

    fn free(&self, device: usize, ptr: DevicePtr) -> Result<(), BackendError> {
        self.time(CallKind::Direct, |b| b.free(device, ptr))
    }

    fn alloc_pinned_host(&self, device: usize, size: u64) -> Result<u64, BackendError> {
        self.time(CallKind::Other, |b| b.alloc_pinned_host(device, size))
    }

    fn free_pinned_host(&self, device: usize, ptr: u64) -> Result<(), BackendError> {
        self.time(CallKind::Other, |b| b.free_pinned_host(device, ptr))
    }
}

impl Detaching for TimedBackend {
    fn detach_keeping(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        into: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        // No driver call: the backend's own table changes.
        self.time(CallKind::Other, |b| {
            b.detach_keeping(device, addr, size, into)
        })
    }

    fn unmap_detached(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
    ) -> Result<(), BackendError> {
        self.time(CallKind::Unmap, |b| b.unmap_detached(device, addr, size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{DriverCosts, SimBackend, SimConfig};
    use crate::units::MIB;

    #[test]
    fn every_kind_sits_at_its_own_slot() {
        for (slot, kind) in CallKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, slot, "{kind:?}");
        }
    }

    #[test]
    fn counts_each_kind_of_call_and_the_time_it_took() {
        let sim = SimBackend::new(SimConfig {
            driver_costs: DriverCosts::H100,
            ..SimConfig::default()
        });
        let timed = TimedBackend::new(Arc::new(sim));
        let base = timed.reserve_address_range(0, 8 * MIB).unwrap();
        let before = timed.totals();
        timed.map(0, base, 4 * MIB).unwrap();
        timed.unmap(0, base, 4 * MIB).unwrap();
        let spent = timed.totals().since(&before);
        let (map, unmap) = (CallKind::Map as usize, CallKind::Unmap as usize);
        assert_eq!((spent.calls[map], spent.calls[unmap]), (1, 1));
        // The simulated H100 spends what the driver would: a map of one new chunk costs at
        // least 40 µs there, an unmap of one chunk at least 18 µs.
        assert!(spent.nanos[map] >= 40_000, "{spent:?}");
        assert!(spent.nanos[unmap] >= 18_000, "{spent:?}");
        assert_eq!(
            spent.calls.iter().sum::<u64>(),
            4,
            "map, unmap, release, granularity"
        );
        timed.release_address_range(0, base, 8 * MIB).unwrap();
    }
}
