//! How a `MemoryManager` allocates: strategy, sharding, caching and limits.

use crate::pool::PoolSettings;
use crate::units::MIB;
use serde::Serialize;
use std::time::Duration;

/// Pooled (the caching allocator) or direct (every request to the driver: the baseline).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Caching arenas over the driver's virtual memory API.
    Pooled,
    /// No pooling: `cuMemAlloc`/`cuMemFree` for every request.
    Direct,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerConfig {
    pub strategy: Strategy,
    /// Backend device indices to manage; `None` manages every device.
    pub devices: Option<Vec<usize>>,
    /// Independent pools per device and stream, picked by thread, so threads rarely share a
    /// lock. 0 picks one per core, at most 8; rounded down to a power of two.
    pub shards: usize,
    /// Requests up to this size are served from the small pool.
    pub small_max_bytes: u64,
    /// Freed pages stay mapped (cached for reuse) while a device's pools map no more than the
    /// recent peak of pages under live blocks plus a slack of this many pages...
    pub idle_pages_kept: usize,
    /// ...or this many per 1024 of that peak, whichever is more. Beyond it, the oldest idle
    /// pages go back to the driver. So the pools keep what the workload needed lately (steps
    /// that repeat hit the cache) while holding at most a small slack above its real peak.
    pub idle_per_mille: usize,
    /// `maintain()` returns pages idle for longer than this to the driver; `None` keeps them.
    pub release_idle_after: Option<Duration>,
    /// Cap on the bytes all pools of one device may hold from the driver.
    pub max_pool_bytes: Option<u64>,
    /// Record each allocation's creation time (for leak ages); ids, sizes and tags are always kept.
    pub track_allocations: bool,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            strategy: Strategy::Pooled,
            devices: None,
            shards: 0,
            small_max_bytes: MIB,
            idle_pages_kept: 4,
            idle_per_mille: 8,
            release_idle_after: Some(Duration::from_secs(60)),
            max_pool_bytes: None,
            track_allocations: true,
        }
    }
}

impl ManagerConfig {
    /// A power of two, so picking a thread's shard is a mask, not a division.
    pub(crate) fn shard_count(&self) -> usize {
        let wanted = if self.shards > 0 {
            self.shards
        } else {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(8)
        };
        1 << wanted.ilog2()
    }

    pub(crate) fn pool_settings(&self, device_total: u64) -> PoolSettings {
        PoolSettings {
            small_max: self.small_max_bytes,
            // Twice the device: address space is cheap, and a hole-riddled range must never
            // be what fails an allocation the device could serve.
            span: device_total.saturating_mul(2),
        }
    }
}
