//! `MemoryManager`: the public allocator. Routes each request to the pool of its device,
//! stream and thread shard, turns driver refusals into errors a caller can act on (releasing
//! cached memory and retrying once first), and gives cached memory back on request.

mod buffer;
pub mod config;
pub mod pressure;
mod tag;
pub mod views;

pub use buffer::{AllocOptions, DeviceBuffer};
pub use config::{ManagerConfig, Strategy};
pub use tag::Tag;

use crate::backend::{DeviceBackend, DeviceProperties, StreamId};
use crate::error::{AllocError, BackendError};
use crate::pool::{
    ArenaError, DeviceReserve, DirectPool, LiveInfo, MapDecision, Pool, PoolSettings, MIN_BLOCK,
};
use crate::units::align_up;
use buffer::Origin;
use parking_lot::RwLock;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Each thread gets a small number once: it picks the thread's shard and prefixes its
/// allocation ids, so neither needs a shared counter on the hot path.
static NEXT_THREAD_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The thread's next allocation id: its slot in the top 24 bits, a counter below. Zero
    /// means "no slot yet".
    static NEXT_ID: Cell<u64> = const { Cell::new(0) };
}

/// The calling thread's slot and a process-unique allocation id.
#[inline]
fn next_allocation_id() -> (usize, u64) {
    NEXT_ID.with(|next| {
        let mut id = next.get();
        if id == 0 {
            let slot = NEXT_THREAD_SLOT.fetch_add(1, Relaxed) as u64 + 1;
            id = slot << 40;
        }
        next.set(id + 1);
        (((id >> 40) - 1) as usize, id)
    })
}

/// Counters of one device kept outside the pools.
#[derive(Debug, Default)]
pub(crate) struct DeviceEvents {
    pub ooms: AtomicU64,
    pub retries: AtomicU64,
    /// Most pages under live blocks seen at a cache check, this window and the last.
    live_pages_peak: [AtomicUsize; 2],
}

/// Everything the manager keeps for one device.
pub(crate) struct ManagedDevice {
    pub index: usize,
    pub properties: DeviceProperties,
    pub page_size: u64,
    settings: PoolSettings,
    default_stream: Box<[Arc<Pool>]>,
    other_streams: RwLock<HashMap<StreamId, Arc<[Arc<Pool>]>>>,
    pub direct: Arc<DirectPool>,
    pub reserve: Arc<DeviceReserve>,
    pub events: DeviceEvents,
}

impl ManagedDevice {
    fn shards(
        &self,
        backend: &Arc<dyn DeviceBackend>,
        stream: StreamId,
        count: usize,
    ) -> Vec<Arc<Pool>> {
        (0..count)
            .map(|_| {
                Arc::new(Pool::new(
                    Arc::clone(backend),
                    self.index,
                    stream,
                    self.settings,
                    Arc::clone(&self.reserve),
                ))
            })
            .collect()
    }

    /// Every pool of the device, default stream first.
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        let mut pools: Vec<Arc<Pool>> = self.default_stream.to_vec();
        let others = self.other_streams.read();
        let mut streams: Vec<_> = others.keys().copied().collect();
        streams.sort();
        for stream in streams {
            pools.extend(others[&stream].iter().cloned());
        }
        pools
    }
}

/// The GPU memory manager. Cheap to clone (shared inside); `Send + Sync`.
#[derive(Clone)]
pub struct MemoryManager {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub backend: Arc<dyn DeviceBackend>,
    pub config: ManagerConfig,
    pub devices: Vec<ManagedDevice>,
    /// Backend device index -> position in `devices`.
    slot_of: Vec<Option<usize>>,
    shard_count: usize,
    window_started: parking_lot::Mutex<Instant>,
}

impl MemoryManager {
    /// A manager for the configured devices of `backend`. Nothing is allocated yet.
    pub fn new(
        backend: Arc<dyn DeviceBackend>,
        config: ManagerConfig,
    ) -> Result<Self, BackendError> {
        let count = backend.device_count();
        let indices: Vec<usize> = match &config.devices {
            Some(list) => list.clone(),
            None => (0..count).collect(),
        };
        let shard_count = config.shard_count();
        let mut slot_of = vec![None; count];
        let mut devices = Vec::with_capacity(indices.len());
        for index in indices {
            let properties = backend.properties(index)?;
            let page_size = backend.granularity(index)?;
            let settings = config.pool_settings(align_up(properties.total_memory_bytes, page_size));
            let reserve = Arc::new(DeviceReserve::default());
            let direct = Arc::new(DirectPool::new(
                Arc::clone(&backend),
                index,
                Arc::clone(&reserve),
            )?);
            let mut device = ManagedDevice {
                index,
                properties,
                page_size,
                settings,
                default_stream: Box::new([]),
                other_streams: RwLock::new(HashMap::new()),
                direct,
                reserve,
                events: DeviceEvents::default(),
            };
            device.default_stream = device
                .shards(&backend, StreamId::DEFAULT, shard_count)
                .into_boxed_slice();
            slot_of[index] = Some(devices.len());
            devices.push(device);
        }
        Ok(MemoryManager {
            shared: Arc::new(Shared {
                backend,
                config,
                devices,
                slot_of,
                shard_count,
                window_started: parking_lot::Mutex::new(Instant::now()),
            }),
        })
    }

    pub fn backend(&self) -> &Arc<dyn DeviceBackend> {
        &self.shared.backend
    }

    pub fn config(&self) -> &ManagerConfig {
        &self.shared.config
    }

    /// Backend indices of the managed devices.
    pub fn device_indices(&self) -> Vec<usize> {
        self.shared.devices.iter().map(|d| d.index).collect()
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    pub(crate) fn device(&self, device: usize) -> Result<&ManagedDevice, BackendError> {
        self.shared
            .slot_of
            .get(device)
            .copied()
            .flatten()
            .map(|slot| &self.shared.devices[slot])
            .ok_or(BackendError::InvalidDevice {
                requested: device,
                count: self.shared.backend.device_count(),
            })
    }

    /// Allocates `size` bytes on `device`.
    pub fn alloc(
        &self,
        device: usize,
        size: u64,
        options: &AllocOptions,
    ) -> Result<DeviceBuffer, AllocError> {
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        let managed = self.device(device)?;
        let align = options.alignment;
        if !align.is_power_of_two() || align > managed.page_size {
            return Err(AllocError::InvalidAlignment(align));
        }
        let total = managed.properties.total_memory_bytes;
        if size > total {
            return Err(AllocError::TooLarge {
                device,
                requested: size,
                total,
            });
        }
        let (thread_slot, id) = next_allocation_id();
        let live = LiveInfo {
            id,
            requested: size,
            created_ticks: if self.shared.config.track_allocations {
                crate::clock::now()
            } else {
                0
            },
            tag: options.tag.map_or(tag::UNTAGGED, Tag::id),
        };
        let block_size = align_up(size, MIN_BLOCK);
        let (ptr, origin) = match self.shared.config.strategy {
            config::Strategy::Direct => self.alloc_direct(managed, block_size, live)?,
            config::Strategy::Pooled => {
                let pool = self.pool_for(managed, options.stream, thread_slot);
                self.alloc_pooled(managed, pool, block_size, align, live)?
            }
        };
        Ok(DeviceBuffer {
            ptr,
            size,
            device,
            tag: options.tag,
            stream: options.stream,
            origin: Some(origin),
        })
    }

    fn pool_for(&self, managed: &ManagedDevice, stream: StreamId, thread_slot: usize) -> Arc<Pool> {
        let shard = thread_slot & (self.shared.shard_count - 1);
        if stream == StreamId::DEFAULT {
            return Arc::clone(&managed.default_stream[shard]);
        }
        if let Some(pools) = managed.other_streams.read().get(&stream) {
            return Arc::clone(&pools[shard]);
        }
        let mut streams = managed.other_streams.write();
        let pools = streams.entry(stream).or_insert_with(|| {
            managed
                .shards(&self.shared.backend, stream, self.shared.shard_count)
                .into()
        });
        Arc::clone(&pools[shard])
    }

    fn alloc_pooled(
        &self,
        managed: &ManagedDevice,
        pool: Arc<Pool>,
        size: u64,
        align: u64,
        live: LiveInfo,
    ) -> Result<(u64, Origin), AllocError> {
        let kind = pool.kind_for(size);
        let within_cap = |bytes: u64| {
            let limit = self.shared.config.max_pool_bytes;
            if limit.is_none_or(|cap| managed.reserve.reserved_bytes.load(Relaxed) + bytes <= cap) {
                MapDecision::Allow
            } else {
                MapDecision::OverLimit
            }
        };
        let within_budget = |bytes: u64| match self.cache_budget_check(managed, bytes) {
            MapDecision::Allow => within_cap(bytes),
            other => other,
        };
        let mut first = pool.alloc(kind, size, align, live, within_budget);
        if let Err(ArenaError::NeedsRoom(excess)) = first {
            // The arena's own idle pages were not enough: other pools give back their oldest,
            // so mapping new pages never lifts the device above its recent peak plus slack.
            self.release_cached_on(managed, |bytes, _| bytes < excess);
            first = pool.alloc(kind, size, align, live, within_cap);
        }
        let may_map = within_cap;
        let outcome = match first {
            Err(ArenaError::Backend(BackendError::OutOfMemory { .. }) | ArenaError::OverLimit) => {
                // Cached pages of every pool on the device may be what stands in the way.
                managed.events.retries.fetch_add(1, Relaxed);
                self.release_cached_on(managed, |_, _| true);
                pool.alloc(kind, size, align, live, may_map)
            }
            other => other,
        };
        match outcome {
            Ok(placed) => Ok((
                placed.ptr,
                Origin::Pooled {
                    pool,
                    kind,
                    block: placed.block,
                },
            )),
            Err(error) => Err(self.explain_failure(managed, live.requested, error)),
        }
    }

    fn alloc_direct(
        &self,
        managed: &ManagedDevice,
        size: u64,
        live: LiveInfo,
    ) -> Result<(u64, Origin), AllocError> {
        match managed.direct.alloc(size, live) {
            Ok(ptr) => Ok((ptr, Origin::Direct(Arc::clone(&managed.direct)))),
            Err(error) => {
                Err(self.explain_failure(managed, live.requested, ArenaError::Backend(error)))
            }
        }
    }

    fn explain_failure(
        &self,
        managed: &ManagedDevice,
        requested: u64,
        error: ArenaError,
    ) -> AllocError {
        let reserved = managed.reserve.reserved_bytes.load(Relaxed);
        let out_of_memory = |managed: &ManagedDevice| {
            managed.events.ooms.fetch_add(1, Relaxed);
            let info = self.shared.backend.mem_info(managed.index).ok();
            AllocError::OutOfMemory {
                device: managed.index,
                requested,
                device_free: info.map_or(0, |i| i.free),
                device_total: info.map_or(managed.properties.total_memory_bytes, |i| i.total),
                reserved,
                in_use: self.in_use_bytes(managed),
            }
        };
        match error {
            ArenaError::Backend(BackendError::OutOfMemory { .. })
            | ArenaError::AddressSpaceFull => out_of_memory(managed),
            ArenaError::OverLimit => {
                managed.events.ooms.fetch_add(1, Relaxed);
                AllocError::PoolLimit {
                    device: managed.index,
                    requested,
                    in_use: reserved,
                    limit: self.shared.config.max_pool_bytes.unwrap_or(0),
                }
            }
            ArenaError::Backend(other) => AllocError::Backend(other),
            // Only asked for with a budget check, and the retry runs without one.
            ArenaError::NeedsRoom(_) => out_of_memory(managed),
        }
    }

    fn in_use_bytes(&self, managed: &ManagedDevice) -> u64 {
        let pooled: u64 = managed
            .pools()
            .iter()
            .map(|p| {
                p.slot(crate::pool::PoolKind::Small)
                    .counters
                    .read()
                    .in_use_bytes
                    + p.slot(crate::pool::PoolKind::Large)
                        .counters
                        .read()
                        .in_use_bytes
            })
            .sum();
        pooled + managed.direct.counters.read().in_use_bytes
    }

    /// Whether mapping `bytes` more keeps the device's pools within their cache budget: the
    /// recent peak of pages under live blocks plus a slack. Asked only before the driver is
    /// called (a miss), so the hot path never pays for it.
    fn cache_budget_check(&self, managed: &ManagedDevice, bytes: u64) -> MapDecision {
        let (mut mapped, mut live) = (0, 0);
        for pool in managed.pools() {
            let (m, l) = pool.page_census();
            mapped += m;
            live += l;
        }
        let new_pages = bytes / managed.page_size;
        let peaks = &managed.events.live_pages_peak;
        peaks[0].fetch_max((live + new_pages) as usize, Relaxed);
        let peak = peaks[0].load(Relaxed).max(peaks[1].load(Relaxed)) as u64;
        let config = &self.shared.config;
        let slack = (config.idle_pages_kept as u64).max(peak * config.idle_per_mille as u64 / 1024);
        let budget = peak + slack;
        let idle = mapped.saturating_sub(live);
        if mapped + new_pages <= budget || idle == 0 {
            return MapDecision::Allow;
        }
        let excess_pages = (mapped + new_pages - budget).min(idle);
        MapDecision::NeedsRoom(excess_pages * managed.page_size)
    }

    /// Frees a buffer now (the same as dropping it, but reports a driver error).
    pub fn free(&self, buffer: DeviceBuffer) -> Result<(), BackendError> {
        buffer.free()
    }

    /// Unmaps idle pages on one device while `keep_going(bytes_so_far, idle_since)`; returns bytes.
    fn release_cached_on(
        &self,
        managed: &ManagedDevice,
        mut keep_going: impl FnMut(u64, u64) -> bool,
    ) -> u64 {
        let mut released = 0;
        for pool in managed.pools() {
            let before = released;
            match pool.release_idle(|bytes, since| keep_going(before + bytes, since)) {
                Ok(bytes) => released += bytes,
                Err(error) => {
                    tracing::warn!(device = managed.index, %error, "could not return cached memory to the driver")
                }
            }
        }
        released
    }

    /// Returns cached memory to the driver until the pools of every device together hold at
    /// most `target_bytes` (or nothing cached is left). Returns the bytes released.
    pub fn trim(&self, target_bytes: u64) -> u64 {
        let mut released = 0;
        for managed in &self.shared.devices {
            let held: u64 = self.reserved_bytes();
            if held <= target_bytes {
                break;
            }
            let excess = held - target_bytes;
            released += self.release_cached_on(managed, |bytes, _| bytes < excess);
        }
        released
    }

    /// Returns every cached page to the driver; live buffers are untouched.
    pub fn empty_cache(&self) -> u64 {
        self.shared
            .devices
            .iter()
            .map(|managed| self.release_cached_on(managed, |_, _| true))
            .sum()
    }

    /// Periodic upkeep (the sampler calls it every interval): returns pages idle for longer
    /// than `release_idle_after`, and every `release_idle_after` starts a new window for the
    /// live-page peak that sizes the cache, so a burst long past stops pinning memory.
    pub fn maintain(&self) -> u64 {
        let Some(age) = self.shared.config.release_idle_after else {
            return 0;
        };
        let mut window = self.shared.window_started.lock();
        if window.elapsed() >= age {
            *window = Instant::now();
            for managed in &self.shared.devices {
                let peaks = &managed.events.live_pages_peak;
                peaks[1].store(peaks[0].swap(0, Relaxed), Relaxed);
            }
        }
        drop(window);
        self.release_idle_older_than(age)
    }

    pub fn release_idle_older_than(&self, age: Duration) -> u64 {
        let now = crate::clock::now();
        self.shared
            .devices
            .iter()
            .map(|managed| {
                self.release_cached_on(managed, |_, since| crate::clock::between(since, now) >= age)
            })
            .sum()
    }

    /// Bytes held from the driver by all pools of all devices.
    pub fn reserved_bytes(&self) -> u64 {
        self.shared
            .devices
            .iter()
            .map(|d| d.reserve.reserved_bytes.load(Relaxed))
            .sum()
    }

    /// Restarts every peak from the current values.
    pub fn reset_peaks(&self) {
        for managed in &self.shared.devices {
            for pool in managed.pools() {
                pool.reset_peaks();
            }
            managed.direct.counters.reset_peaks();
            managed.reserve.reset_peak();
        }
    }
}
