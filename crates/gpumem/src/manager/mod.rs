//! `MemoryManager`: the public allocator. Routes each request to the pool of its device,
//! stream and thread shard, and turns driver refusals into errors a caller can act on
//! (releasing cached memory and retrying once first). Caching policy, upkeep, leaks, host
//! fallback and multi-device placement live in the submodules.

mod adapting;
pub mod adaptive;
mod buffer;
mod cache;
pub mod config;
#[cfg(feature = "config-file")]
mod config_file;
pub mod external;
pub mod fallback;
mod fraction;
mod graphs;
mod handles;
pub mod leaks;
pub mod ooms;
pub mod placement;
pub mod pressure;
mod refusals;
mod segments;
mod stream_pools;
mod tag;
mod thread_ids;
mod upkeep;
pub mod views;
pub mod workspace;

pub use adaptive::CacheSetting;
pub use buffer::{AllocOptions, DeviceBuffer, GraphPoolId};
pub use config::{CacheMode, ConfigError, ManagerConfig, MemoryConfig, Strategy};
#[cfg(feature = "config-file")]
pub use config_file::{
    env_names as config_env_names, keys as config_keys, load_config, load_config_over,
    parse_config_str, retired as retired_config_key, ConfigSources,
};
pub use external::{ExternalBuffer, ExternalError};
pub use fallback::{FallbackBuffer, HostBuffer};
pub use graphs::GraphPoolView;
pub use pressure::{PressureChange, PressureLevel, PressureThresholds};
pub use segments::{BlockLayout, SegmentLayout};
pub use stream_pools::MAX_STREAMS_WITH_OWN_POOLS;
pub use tag::{clean_tag, held_tags, Tag, MAX_TAGS, MAX_TAG_CHARS, OTHER_TAG};
pub use upkeep::{FRAGMENTATION_CLEAR, FRAGMENTATION_WARNING};
pub use workspace::{Workspace, WorkspaceError, WorkspaceResize};

use crate::backend::{DeviceBackend, DeviceProperties, StreamId};
use crate::error::{AllocError, BackendError, InitError};
use crate::pool::{
    ArenaError, ChunkSizes, DeviceReserve, DirectPool, LiveInfo, MapAsk, MapDecision, PageReserve,
    Pool, PoolKind, PoolSettings, MIN_BLOCK,
};
use crate::units::{align_up, Bytes};
use buffer::PooledBlock;
use parking_lot::{Mutex, RwLock};
use pressure::PressureState;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Instant;
use thread_ids::next_allocation_id;

/// Counters of one device kept outside the pools.
#[derive(Debug, Default)]
pub(crate) struct DeviceEvents {
    pub ooms: AtomicU64,
    pub retries: AtomicU64,
    pub cpu_fallbacks: AtomicU64,
    /// Host bytes now held by fallback buffers for this device.
    pub host_fallback_bytes: AtomicU64,
    /// Most pages under live blocks seen at a cache check, this window and the last.
    pub live_pages_peak: [AtomicUsize; 2],
    /// The latest refusals, for the flight recorder.
    pub recent_ooms: ooms::OomLog,
}

/// Everything the manager keeps for one device.
pub(crate) struct ManagedDevice {
    pub index: usize,
    pub properties: DeviceProperties,
    pub page_size: u64,
    /// The most the pools may hold: `gpu_memory_fraction` and `max_pool_size` together, until
    /// [`MemoryManager::set_memory_fraction`] sets another (read with [`Self::pool_cap`]).
    pool_cap: AtomicU64,
    settings: PoolSettings,
    default_stream: Box<[Arc<Pool>]>,
    /// Streams with pools of their own (`stream_pools.rs`), at most `MAX_STREAMS_WITH_OWN_POOLS`.
    other_streams: RwLock<HashMap<StreamId, Arc<stream_pools::StreamPools>>>,
    /// What the other streams share.
    shared_streams: Box<[Arc<Pool>]>,
    /// Pools of streams dropped from `other_streams` while a block was live in them: still
    /// counted until their last block is freed.
    retiring: Mutex<Vec<Arc<Pool>>>,
    /// Pools of CUDA graphs (`graphs.rs`).
    graph_pools: RwLock<HashMap<GraphPoolId, Arc<Pool>>>,
    pub direct: Arc<DirectPool>,
    pub reserve: Arc<DeviceReserve>,
    /// Physical pages unmapped but kept, for the next miss on any pool of the device.
    pub pages: Arc<PageReserve>,
    pub events: DeviceEvents,
    pub pressure: PressureState,
    /// The adaptive default's state (`adapting.rs`); `None` with a fixed or memory-first cache.
    adapting: Option<adapting::Adapting>,
    /// The cache setting stored at the start (all there is without `adapting`).
    fixed_setting: CacheSetting,
}

impl ManagedDevice {
    /// Every pool of the device: default stream first, then the other streams', the shared
    /// ones, graph pools, and pools retiring with a block still live.
    pub(crate) fn pools(&self) -> Vec<Arc<Pool>> {
        let mut pools: Vec<Arc<Pool>> = self.default_stream.to_vec();
        let others = self.other_streams.read();
        let mut streams: Vec<_> = others.keys().copied().collect();
        streams.sort();
        for stream in streams {
            pools.extend(others[&stream].pools.iter().cloned());
        }
        drop(others);
        pools.extend(self.shared_streams.iter().cloned());
        let graphs = self.graph_pools.read();
        let mut ids: Vec<_> = graphs.keys().copied().collect();
        ids.sort();
        pools.extend(ids.iter().map(|id| Arc::clone(&graphs[id])));
        drop(graphs);
        let mut retiring = self.retiring.lock();
        retiring.retain(|pool| !pool.is_wound_down());
        pools.extend(retiring.iter().cloned());
        pools
    }

    /// The most the pools may hold now.
    pub(crate) fn pool_cap(&self) -> u64 {
        self.pool_cap.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes handed out to live buffers, pooled and direct.
    pub(crate) fn in_use_bytes(&self) -> u64 {
        let pooled: u64 = self.pools().iter().map(|p| p.in_use_bytes()).sum();
        pooled + self.direct.counters.read().in_use_bytes
    }
}

impl Drop for ManagedDevice {
    /// Pool handles can outlive the manager (in live buffers, or parked per thread): retiring
    /// the pools gives their memory back now, or at their last live buffer's free.
    fn drop(&mut self) {
        for pool in self.pools() {
            pool.retire();
        }
    }
}

/// The GPU memory manager. Cheap to clone (shared inside); `Send + Sync`.
#[derive(Clone)]
pub struct MemoryManager {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub backend: Arc<dyn DeviceBackend>,
    pub config: MemoryConfig,
    pub devices: Vec<ManagedDevice>,
    /// Backend device index -> position in `devices`.
    slot_of: Vec<Option<usize>>,
    shard_count: usize,
    window_started: Mutex<Instant>,
    pressure_callbacks: RwLock<Vec<pressure::Callback>>,
    pub(crate) origins: leaks::OriginTable,
    pub(crate) external: external::ExternalTable,
    affinity: Mutex<HashMap<String, usize>>,
    /// Dropped with the manager, which wakes the upkeep thread so it can exit.
    _upkeep_stop: Option<std::sync::mpsc::Sender<()>>,
}

impl MemoryManager {
    /// A manager for the configured devices of `backend`. Maps `preallocate_bytes` per device
    /// and starts the upkeep thread when the configuration asks for them.
    pub fn new(backend: Arc<dyn DeviceBackend>, config: MemoryConfig) -> Result<Self, InitError> {
        config.validate()?;
        let count = backend.device_count();
        let indices: Vec<usize> = match &config.devices {
            Some(list) => list.clone(),
            None => (0..count).collect(),
        };
        let shard_count = config.shard_count();
        let mut slot_of = vec![None; count];
        let mut devices = Vec::with_capacity(indices.len());
        for index in indices {
            if index >= count {
                return Err(BackendError::InvalidDevice {
                    requested: index,
                    count,
                }
                .into());
            }
            let device = Self::manage_device(&backend, &config, index, shard_count)?;
            slot_of[index] = Some(devices.len());
            devices.push(device);
        }
        let (stop, stopped) = std::sync::mpsc::channel();
        let upkeep_interval = config.cleanup_interval;
        let manager = MemoryManager {
            shared: Arc::new(Shared {
                backend,
                config,
                devices,
                slot_of,
                shard_count,
                window_started: Mutex::new(Instant::now()),
                pressure_callbacks: RwLock::new(Vec::new()),
                origins: leaks::OriginTable::default(),
                external: external::ExternalTable::default(),
                affinity: Mutex::new(HashMap::new()),
                _upkeep_stop: upkeep_interval.map(|_| stop),
            }),
        };
        manager.log_devices();
        manager.preallocate()?;
        if let Some(interval) = upkeep_interval {
            upkeep::spawn(&manager, interval, stopped)
                .map_err(|e| InitError::Thread(e.to_string()))?;
        }
        Ok(manager)
    }

    fn manage_device(
        backend: &Arc<dyn DeviceBackend>,
        config: &MemoryConfig,
        index: usize,
        shard_count: usize,
    ) -> Result<ManagedDevice, BackendError> {
        let properties = backend.properties(index)?;
        let page_size = backend.granularity(index)?;
        let total = properties.total_memory_bytes;
        let reserve = Arc::new(DeviceReserve::new(shard_count));
        let direct = Arc::new(DirectPool::new(
            Arc::clone(backend),
            index,
            Arc::clone(&reserve),
        )?);
        let pages = Arc::new(PageReserve::new(
            Arc::clone(backend),
            index,
            Arc::clone(&reserve),
            ChunkSizes::new(config.max_chunk_bytes, config.inside_chunk_bytes)
                .whole_when_growing(config.whole_chunks_when_growing),
        )?);
        pages.set_stream_ordered_reuse(config.stream_ordered_reuse == Some(true));
        let (setting, adapting) = adapting::starting(config, page_size);
        adapting::store(pages.knobs(), &setting, page_size);
        let mut device = ManagedDevice {
            index,
            properties,
            page_size,
            pool_cap: AtomicU64::new(config.pool_cap(total)),
            settings: config.pool_settings(align_up(total, page_size)),
            default_stream: Box::new([]),
            other_streams: RwLock::new(HashMap::new()),
            shared_streams: Box::new([]),
            retiring: Mutex::new(Vec::new()),
            graph_pools: RwLock::new(HashMap::new()),
            direct,
            reserve,
            pages,
            events: DeviceEvents::default(),
            pressure: PressureState::default(),
            adapting,
            fixed_setting: setting,
        };
        device.default_stream = device
            .shards(StreamId::DEFAULT, shard_count)
            .into_boxed_slice();
        device.shared_streams = device.shared_shards(shard_count).into_boxed_slice();
        Ok(device)
    }

    /// One line per managed device as the manager starts: total, usable (total minus the
    /// pressure reserve) and free memory, and the cap on the pools — the figures every later
    /// pressure level and OOM message is measured against.
    fn log_devices(&self) {
        let thresholds = &self.shared.config.pressure;
        for managed in &self.shared.devices {
            let total = managed.properties.total_memory_bytes;
            let free = self.shared.backend.mem_info(managed.index).map(|i| i.free);
            let free = free.map_or_else(|e| format!("unknown ({e})"), |f| Bytes(f).to_string());
            tracing::info!(
                target: "gpumem::startup",
                "managing GPU {} ({}): {} total, {} usable, {} free; pools capped at {}",
                managed.index,
                managed.properties.name,
                Bytes(total),
                Bytes(thresholds.usable(total)),
                free,
                Bytes(managed.pool_cap())
            );
        }
    }

    /// `preallocate_bytes`: map that much per device now, so the first requests hit.
    fn preallocate(&self) -> Result<(), InitError> {
        let bytes = self.shared.config.preallocate_bytes;
        if bytes == 0 || self.shared.config.strategy == Strategy::Direct {
            return Ok(());
        }
        for index in self.device_indices() {
            let buffer = self
                .alloc(index, bytes, &AllocOptions::default())
                .map_err(|e| {
                    InitError::Config(ConfigError::new(
                        "preallocate_bytes",
                        format!("could not preallocate on device {index}: {e}"),
                    ))
                })?;
            drop(buffer);
        }
        Ok(())
    }

    pub fn backend(&self) -> &Arc<dyn DeviceBackend> {
        &self.shared.backend
    }

    pub fn config(&self) -> &MemoryConfig {
        &self.shared.config
    }

    /// Backend indices of the managed devices.
    pub fn device_indices(&self) -> Vec<usize> {
        self.shared.devices.iter().map(|d| d.index).collect()
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The managed device `device`. Inlined, with the error built out of line, so that an
    /// allocation reads the device from a register rather than from a result staged on the stack.
    #[inline]
    pub(crate) fn device(&self, device: usize) -> Result<&ManagedDevice, BackendError> {
        match self.shared.slot_of.get(device).copied().flatten() {
            Some(slot) => Ok(&self.shared.devices[slot]),
            None => Err(self.not_managed(device)),
        }
    }

    #[cold]
    #[inline(never)]
    fn not_managed(&self, device: usize) -> BackendError {
        BackendError::InvalidDevice {
            requested: device,
            count: self.shared.backend.device_count(),
        }
    }

    /// Allocates `size` bytes on `device`.
    // Always inlined: returned from a call, the buffer's words were stored one by one into the
    // caller's result and read back with wider loads, which miss store forwarding (a sixth of a
    // pool hit). The cold paths stay out of line, behind `alloc_pooled_retrying`.
    #[inline(always)]
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
        // Counted until the buffer is freed (or dropped on an error below), so the name stays.
        let tag_id = options
            .tag
            .as_ref()
            .map_or(tag::UNTAGGED, Tag::retain_for_allocation);
        let live = LiveInfo {
            id,
            requested: size,
            created_ticks: if self.shared.config.track_allocations {
                crate::clock::now()
            } else {
                0
            },
            tag: tag_id,
        };
        let block_size = align_up(size, MIN_BLOCK);
        // Nothing holds the tag's count until the buffer exists: an error gives it back here.
        let failed = |error| {
            tag::release_allocation(tag_id);
            error
        };
        // The block's owner comes back in registers and the buffer is assembled from them at
        // the end. Building the buffer first and filling it in, or passing its owner as an
        // enum, staged them on the stack, where the buffer's copy to the caller read them with
        // wide loads across narrower stores and missed store forwarding (a few nanoseconds of
        // a pool hit).
        let (ptr, pool, block, direct) = match self.shared.config.strategy {
            Strategy::Direct => {
                let (ptr, direct) = self
                    .alloc_direct(managed, block_size, live)
                    .map_err(failed)?;
                (ptr, None, PooledBlock::NONE, Some(direct))
            }
            Strategy::Pooled => {
                let pool = match options.graph_pool {
                    None => self.pool_for(managed, options.stream, thread_slot),
                    Some(id) => managed.graph_pool(id),
                };
                let (ptr, pool, block) = self
                    .alloc_pooled(managed, pool, block_size, align, live)
                    .map_err(failed)?;
                (ptr, Some(pool), block, None)
            }
        };
        let origins = self.shared.config.capture_backtraces.then(|| {
            self.shared.origins.record(id);
            self.shared.origins.clone()
        });
        Ok(DeviceBuffer {
            ptr,
            size,
            device,
            id,
            tag_id,
            stream: options.stream,
            pool,
            block,
            direct,
            origins,
        })
    }

    /// A pooled allocation: its pointer, pool and block. Inlined into `alloc` so the hit path
    /// keeps them in registers until the buffer is assembled; everything after a first refusal
    /// lives in `alloc_pooled_retrying`.
    #[inline(always)]
    fn alloc_pooled(
        &self,
        managed: &ManagedDevice,
        pool: Arc<Pool>,
        size: u64,
        align: u64,
        live: LiveInfo,
    ) -> Result<(u64, Arc<Pool>, PooledBlock), AllocError> {
        let kind = pool.kind_for(size);
        // A graph's pool keeps all it maps: it has nothing to make room with, and asking the
        // other pools to unmap would wait on their streams, one of which may be capturing.
        // Pages ahead of a growing arena are mapped only where the budget and the pool's cap
        // hold them as well; otherwise the block's own pages alone.
        let within_budget = |ask: MapAsk| {
            if pool.is_pinned() {
                return self.may_map(managed, ask.bytes).block_only();
            }
            match self.cache_budget_check(managed, ask) {
                MapDecision::Allow => match self.may_map(managed, ask.bytes + ask.ahead_bytes) {
                    MapDecision::Allow => MapDecision::Allow,
                    _ => self.may_map(managed, ask.bytes).block_only(),
                },
                MapDecision::AllowBlockOnly => self.may_map(managed, ask.bytes).block_only(),
                other => other,
            }
        };
        // Only the fields a caller needs leave the match: moving the whole `Placed` into another
        // result copied it with 8-byte loads over the hit path's 4-byte stores, which the CPU
        // cannot forward (a sixth of a hit here).
        let (ptr, block) = match pool.alloc(kind, size, align, &live, within_budget) {
            Ok(placed) => {
                if placed.map_calls > 0 {
                    self.record_miss(managed, &placed);
                }
                (placed.ptr, placed.block())
            }
            Err(refusal) => {
                match self.alloc_pooled_retrying(managed, &pool, kind, size, align, live, refusal) {
                    Ok(placed) => (placed.ptr, placed.block()),
                    // Upkeep dropped the stream's pools after this thread took one: not a
                    // refusal, and the stream's pool now serves the request.
                    Err(_) if pool.is_retired() => {
                        return self.alloc_after_retirement(managed, pool.stream, size, align, live)
                    }
                    Err(error) => return Err(self.explain_failure(managed, &live, kind, error)),
                }
            }
        };
        Ok((ptr, pool, PooledBlock::new(kind, block)))
    }

    fn alloc_direct(
        &self,
        managed: &ManagedDevice,
        size: u64,
        live: LiveInfo,
    ) -> Result<(u64, Arc<DirectPool>), AllocError> {
        match managed.direct.alloc(size, live) {
            Ok(ptr) => Ok((ptr, Arc::clone(&managed.direct))),
            Err(error) => {
                let error = ArenaError::Backend(error);
                Err(self.explain_failure(managed, &live, PoolKind::Direct, error))
            }
        }
    }

    /// Frees a buffer now (the same as dropping it, but reports a driver error).
    pub fn free(&self, buffer: DeviceBuffer) -> Result<(), BackendError> {
        buffer.free()
    }
}
