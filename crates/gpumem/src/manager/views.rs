//! Read-only views of a manager for stats and snapshots: per device and per pool counters
//! (lock-free reads of atomics) and the live allocations with their ages (walks each arena).

use super::{ManagedDevice, MemoryManager};
use crate::error::BackendError;
use crate::pool::{CounterValues, LiveInfo, PoolKind};
use serde::Serialize;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// One kind of pool on one device, all streams and shards added up.
#[derive(Clone, Debug, Serialize)]
pub struct PoolView {
    pub device: usize,
    pub pool: PoolKind,
    #[serde(flatten)]
    pub counters: CounterValues,
    /// Reserved bytes not handed out: `reserved - in_use`.
    pub cached_free_bytes: u64,
    /// The largest block that could be handed out without calling the driver.
    pub largest_cached_free_block_bytes: u64,
    /// `1 - largest_cached_free_block / cached_free` (0 when nothing is cached).
    pub fragmentation_ratio: f64,
    pub idle_pages: u64,
}

/// Totals of one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceStats {
    pub device: usize,
    #[serde(flatten)]
    pub counters: CounterValues,
    pub ooms: u64,
    pub oom_retries: u64,
    /// Requests served from host memory because the device could not.
    pub cpu_fallbacks: u64,
    /// Host bytes now held by fallback buffers.
    pub host_fallback_bytes: u64,
    /// The pressure level seen at the last upkeep.
    pub pressure: super::PressureLevel,
    /// Bytes of physical pages unmapped but kept for the next miss (part of `reserved_bytes`).
    pub page_reserve_bytes: u64,
    /// Physical pages the driver created for the pools, pages mapped again from the reserve
    /// instead, and pages released back to the driver.
    pub pages_created: u64,
    pub pages_reused: u64,
    pub pages_released: u64,
    /// Pooled allocations that called the driver to map pages, and how long they took (in all,
    /// and median and 99th percentile within 12.5%).
    pub misses: u64,
    pub miss_ns_total: u64,
    pub miss_p50_ns: u64,
    pub miss_p99_ns: u64,
    /// Waits for the GPU's queued work before idle pages were unmapped (most of them inside
    /// misses making room), their time in all, and the longest of them.
    pub gpu_waits: u64,
    pub gpu_wait_ns_total: u64,
    pub gpu_wait_ns_longest: u64,
}

/// A live allocation, for the leak tracker.
#[derive(Clone, Debug, Serialize)]
pub struct LiveAllocation {
    pub id: u64,
    pub device: usize,
    pub ptr: u64,
    pub requested_bytes: u64,
    pub block_bytes: u64,
    pub tag: Option<String>,
    pub pool: PoolKind,
    /// Zero when allocation tracking is off.
    pub age: Duration,
}

pub fn fragmentation(largest_free_block: u64, cached_free: u64) -> f64 {
    if cached_free == 0 {
        0.0
    } else {
        1.0 - largest_free_block.min(cached_free) as f64 / cached_free as f64
    }
}

impl MemoryManager {
    /// Totals for `device`, read lock-free. The reserved peak is exact; the other peaks are
    /// exact while one pool is active and otherwise the sum of each pool's own peak.
    pub fn device_stats(&self, device: usize) -> Result<DeviceStats, BackendError> {
        let managed = self.device(device)?;
        let mut counters = CounterValues::default();
        for pool in managed.pools() {
            for kind in [PoolKind::Small, PoolKind::Large] {
                counters.add(&pool.slot(kind).counters.read());
            }
        }
        counters.add(&managed.direct.counters.read());
        // The device's own totals where it keeps them: exact peaks, where the pools' summed
        // peaks are an upper bound only.
        (counters.reserved_bytes, counters.peak_reserved_bytes) = managed.reserve.read();
        if let Some((in_use, requested)) = managed.reserve.usage() {
            (counters.in_use_bytes, counters.peak_in_use_bytes) = in_use;
            (counters.requested_bytes, counters.peak_requested_bytes) = requested;
        }
        Ok(DeviceStats {
            device,
            counters,
            ooms: managed.events.ooms.load(Relaxed),
            oom_retries: managed.events.retries.load(Relaxed),
            cpu_fallbacks: managed.events.cpu_fallbacks.load(Relaxed),
            host_fallback_bytes: managed.events.host_fallback_bytes.load(Relaxed),
            pressure: managed.pressure.level(),
            page_reserve_bytes: managed.pages.spare_pages() * managed.page_size,
            pages_created: managed.pages.pages_created.load(Relaxed),
            pages_reused: managed.pages.pages_reused.load(Relaxed),
            pages_released: managed.pages.pages_released.load(Relaxed),
            misses: managed.pages.miss_ns.count(),
            miss_ns_total: managed.pages.miss_ns.total(),
            miss_p50_ns: managed.pages.miss_ns.quantile(0.5),
            miss_p99_ns: managed.pages.miss_ns.quantile(0.99),
            gpu_waits: managed.pages.gpu_wait_ns.count(),
            gpu_wait_ns_total: managed.pages.gpu_wait_ns.total(),
            gpu_wait_ns_longest: managed.pages.gpu_wait_ns.longest(),
        })
    }

    /// The counters of `device`'s small and large pools (PyTorch's `small_pool` and
    /// `large_pool`), direct allocations counted as large. Peaks are each pool's own.
    pub fn counters_by_size(&self, device: usize) -> Result<[CounterValues; 2], BackendError> {
        let managed = self.device(device)?;
        let mut by_size = [CounterValues::default(), CounterValues::default()];
        for pool in managed.pools() {
            by_size[0].add(&pool.slot(PoolKind::Small).counters.read());
            by_size[1].add(&pool.slot(PoolKind::Large).counters.read());
        }
        by_size[1].add(&managed.direct.counters.read());
        Ok(by_size)
    }

    /// Per device and pool kind; walks the arenas, so call it at snapshot time, not per request.
    pub fn pool_views(&self) -> Vec<PoolView> {
        let mut views = Vec::new();
        for managed in &self.shared().devices {
            views.extend(self.pool_views_of(managed));
        }
        views
    }

    fn pool_views_of(&self, managed: &ManagedDevice) -> Vec<PoolView> {
        let pools = managed.pools();
        let mut views = Vec::new();
        for kind in [PoolKind::Small, PoolKind::Large] {
            let mut counters = CounterValues::default();
            let (mut largest, mut idle, mut held_for_graphs) = (0, 0, 0);
            for pool in &pools {
                let pool_counters = pool.slot(kind).counters.read();
                counters.add(&pool_counters);
                if pool.is_pinned() {
                    // A graph's free space is its replays' memory, not cache anyone can use.
                    held_for_graphs += pool_counters
                        .reserved_bytes
                        .saturating_sub(pool_counters.in_use_bytes);
                    continue;
                }
                let arena = pool.arena_view(kind);
                largest = largest.max(arena.largest_cached_free_block);
                idle += arena.idle_pages;
            }
            let free = Free {
                largest,
                idle_pages: idle,
                held_for_graphs,
            };
            views.push(pool_view(managed.index, kind, counters, free));
        }
        let direct = managed.direct.counters.read();
        if direct.requests > 0 {
            views.push(pool_view(
                managed.index,
                PoolKind::Direct,
                direct,
                Free::default(),
            ));
        }
        views
    }

    /// Every live allocation with its age, oldest first.
    pub fn live_allocations(&self) -> Vec<LiveAllocation> {
        let now = crate::clock::now();
        let tracking = self.shared().config.track_allocations;
        let mut live = Vec::new();
        let record =
            |device: usize, pool: PoolKind, ptr: u64, size: u64, info: LiveInfo| LiveAllocation {
                id: info.id,
                device,
                ptr,
                requested_bytes: info.requested,
                block_bytes: size,
                tag: super::tag::name_of(info.tag).map(|name| name.to_string()),
                pool,
                age: if tracking {
                    crate::clock::between(info.created_ticks, now)
                } else {
                    Duration::ZERO
                },
            };
        for managed in &self.shared().devices {
            for pool in managed.pools() {
                pool.for_each_live(|kind, ptr, size, info| {
                    live.push(record(managed.index, kind, ptr, size, info))
                });
            }
            managed.direct.for_each_live(|ptr, size, info| {
                live.push(record(managed.index, PoolKind::Direct, ptr, size, info))
            });
        }
        live.sort_by(|a, b| b.age.cmp(&a.age).then(a.id.cmp(&b.id)));
        live
    }
}

/// The free space of one kind of pool on a device.
#[derive(Default)]
struct Free {
    /// The largest free block within mapped pages, over the pools that are not pinned.
    largest: u64,
    idle_pages: u64,
    /// Free bytes of pinned (graph) pools: reserved, but not cache.
    held_for_graphs: u64,
}

fn pool_view(device: usize, pool: PoolKind, counters: CounterValues, free: Free) -> PoolView {
    let cached_free = counters
        .reserved_bytes
        .saturating_sub(counters.in_use_bytes)
        .saturating_sub(free.held_for_graphs);
    PoolView {
        device,
        pool,
        counters,
        cached_free_bytes: cached_free,
        largest_cached_free_block_bytes: free.largest.min(cached_free),
        fragmentation_ratio: fragmentation(free.largest, cached_free),
        idle_pages: free.idle_pages,
    }
}
