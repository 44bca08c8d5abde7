//! Allocator pools, written once over [`DeviceBackend`](crate::backend::DeviceBackend): a [`Pool`] holds the arenas of one
//! device, stream and shard (small requests and large ones apart, as their lifetimes differ;
//! `shared.rs`: the pools that streams without pools of their own share), and [`DirectPool`]
//! sends every request to the driver (the no-pool baseline).

pub(crate) mod arena;
mod atomic;
mod device_totals;
pub(crate) mod direct;
mod fences;
pub(crate) mod knobs;
pub(crate) mod latency;
mod lending;
mod lock;
pub(crate) mod miss_clock;
pub(crate) mod pages;
pub(crate) mod reserve;
mod shared;
mod short_wait;
pub mod stats;
pub(crate) mod tlsf;

pub use arena::{ArenaError, MapAsk, MapDecision, MappedSegment, Placed, ReleaseError, Released};
pub use device_totals::DeviceReserve;
pub use direct::DirectPool;
pub use knobs::{CacheKnobs, KnobValues};
pub use miss_clock::MissTime;
pub use reserve::{ChunkSizes, Cut, PageReserve};
pub use stats::{CounterValues, PoolCounters};
pub use tlsf::{LiveInfo, MIN_BLOCK};

use crate::backend::{DevicePtr, StreamId};
use crate::error::BackendError;
use arena::{Arena, PageCounts};
use lock::ArenaLock;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// Which pool a request is served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    /// Requests up to `small_max` bytes (64 KiB by default).
    Small,
    /// Everything larger.
    Large,
    /// Straight to the driver, no caching.
    Direct,
}

impl PoolKind {
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
            PoolKind::Direct => "direct",
        }
    }
}

/// Sizing and caching policy of the pooled strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSettings {
    /// Largest request served by the small pool.
    pub small_max: u64,
    /// Address space each arena reserves.
    pub span: u64,
    /// Whether arenas place a block on free mapped pages before unmapped ones
    /// (`place_on_mapped_pages` of the configuration; `arena/block_placement.rs`).
    pub place_on_mapped_pages: bool,
}

/// What an arena's lock guards: the arena, created on first use, and the device's page
/// reserve (with the backend) it maps through. Both leave together when the pool is retired and
/// holds no live block, so a pool handle that outlives its manager (see `manager::handles`)
/// keeps neither device memory nor the driver's context alive.
struct SlotState {
    arena: Option<Arena>,
    reserve: Option<Arc<PageReserve>>,
    /// Blocks of a shared pool freed on a stream whose work may still use them (`shared.rs`);
    /// always empty elsewhere.
    waiting: Vec<shared::Waiting>,
}

/// What a release does about a pool whose stream still has work queued (the work may touch the
/// pages it would unmap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusyStreams {
    /// Wait for the stream (`cuStreamSynchronize`): the memory must come back.
    Wait,
    /// Take only the pages the stream's queued work is done with (all of them if the stream is
    /// idle) and leave the rest for a later try: the upkeep thread's rounds, which would
    /// otherwise hold the pool's lock, and so its allocating threads, for as long as the
    /// stream's queued work takes; and a miss making room with `make_room_without_waiting`.
    Skip,
}

/// One arena and its counters. Aligned to two cache lines so that the slots of pools used by
/// different threads never share one (adjacent prefetch pairs lines on x86).
#[repr(align(128))]
pub struct ArenaSlot {
    state: ArenaLock<SlotState>,
    pub counters: PoolCounters,
}

impl ArenaSlot {
    fn new(reserve: Arc<PageReserve>) -> Self {
        ArenaSlot {
            state: ArenaLock::new(SlotState {
                arena: None,
                reserve: Some(reserve),
                waiting: Vec::new(),
            }),
            counters: PoolCounters::default(),
        }
    }
}

impl SlotState {
    /// Returns a live block to the arena. Pages it leaves empty stay mapped (idle) for reuse.
    #[inline(always)]
    fn free_block(&mut self, counters: &PoolCounters, block: u32) {
        let SlotState { arena, reserve, .. } = self;
        if let Some(arena) = arena.as_mut() {
            let (size, live) = arena.free(block);
            counters.on_free(live.requested, size);
            if let Some(reserve) = reserve.as_deref() {
                reserve.held().on_free(live.requested, size);
                arena.fence_idle_pages(reserve.backend());
            }
            counters.set_pages(arena.mapped_pages() as u64, arena.live_pages() as u64);
        }
    }

    /// Gives the arena and the backend up (the pool is retired) unless a block is still live,
    /// or the driver would not take its pages back: then the pool keeps both, its counters
    /// still say what it holds, and [`Pool::wind_down`] tries again (upkeep does, for every
    /// retired pool still listed). Dropping the arena there would hide pages still mapped.
    fn wind_down_unless_live(&mut self, counters: &PoolCounters, device: usize) {
        if self
            .arena
            .as_ref()
            .is_some_and(|a| a.live_block_count() > 0)
        {
            return;
        }
        if let (Some(arena), Some(reserve)) = (self.arena.as_mut(), self.reserve.as_deref()) {
            // Pages another thread is unmapping must have left (or come back) first.
            arena.wait_for_all_unmaps(reserve);
            if arena.holds_off_old_addresses() {
                tracing::warn!(device, "an address whose pages a miss lent is still mapped (the driver refused to unmap it); the pool keeps its range for another try");
                return;
            }
            let released = arena.release_idle(reserve, |_, _| true, BusyStreams::Wait);
            counters.set_pages(arena.mapped_pages() as u64, arena.live_pages() as u64);
            if let Err(error) = account_release(counters, released) {
                tracing::warn!(device, %error, "could not unmap a retired pool's pages; the pool keeps them for another try");
                return;
            }
            if let Some(arena) = self.arena.take() {
                if let Err(error) = arena.close(reserve) {
                    tracing::warn!(device, %error, "could not give a retired pool's address range back");
                }
            }
        }
        // The last holder of the reserve releases its pages.
        self.reserve = None;
    }
}

/// The pools of one device, stream and shard.
pub struct Pool {
    pub device: usize,
    pub stream: StreamId,
    settings: PoolSettings,
    /// Set once, before the slots are locked to wind down; read under a slot's lock, whose
    /// release and acquire order it, so a relaxed flag is enough.
    retired: AtomicBool,
    /// A CUDA graph's pool: a graph replays into the addresses it captured, including those of
    /// blocks freed since, so none of its pages may be unmapped or counted as idle until the
    /// graphs are gone ([`unpin`](Self::unpin)).
    pinned: AtomicBool,
    small: ArenaSlot,
    large: ArenaSlot,
}

/// Per-arena figures computed at snapshot time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ArenaView {
    pub largest_cached_free_block: u64,
    pub idle_pages: u64,
}

impl Pool {
    pub fn new(reserve: Arc<PageReserve>, stream: StreamId, settings: PoolSettings) -> Self {
        Pool {
            device: reserve.device(),
            stream,
            settings,
            retired: AtomicBool::new(false),
            pinned: AtomicBool::new(false),
            small: ArenaSlot::new(Arc::clone(&reserve)),
            large: ArenaSlot::new(reserve),
        }
    }

    /// A pool for CUDA graphs: pinned from the start, waiting for the whole device before it
    /// unmaps anything once unpinned (a graph may have been replayed on any stream).
    pub fn for_graphs(reserve: Arc<PageReserve>, settings: PoolSettings) -> Self {
        let pool = Pool::new(reserve, StreamId::ANY, settings);
        pool.pin();
        pool
    }

    /// Keeps every page mapped and counted as in use, whatever is freed.
    pub fn pin(&self) {
        self.pinned.store(true, Relaxed);
    }

    /// Lets the pool's free pages go idle and back to the driver like any other pool's.
    pub fn unpin(&self) {
        self.pinned.store(false, Relaxed);
    }

    #[inline]
    pub fn is_pinned(&self) -> bool {
        self.pinned.load(Relaxed)
    }

    #[inline]
    pub fn kind_for(&self, size: u64) -> PoolKind {
        if size <= self.settings.small_max {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    #[inline]
    pub fn slot(&self, kind: PoolKind) -> &ArenaSlot {
        match kind {
            PoolKind::Small | PoolKind::Direct => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    /// Places a block of `size` bytes (a multiple of 512) for a request of `live.requested`.
    #[inline(always)]
    pub fn alloc(
        &self,
        kind: PoolKind,
        size: u64,
        align: u64,
        live: &LiveInfo,
        may_map: impl FnOnce(MapAsk) -> MapDecision,
    ) -> Result<Placed, ArenaError> {
        let slot = self.slot(kind);
        let mut guard = slot.state.lock();
        if !guard.waiting.is_empty() {
            guard.settle(&slot.counters, self.device, shared::Settle::Poll);
        }
        let SlotState { arena, reserve, .. } = &mut *guard;
        let Some(reserve) = reserve.as_deref() else {
            return Err(ArenaError::Backend(BackendError::InvalidArgument {
                call: "alloc",
                reason: "the pool was retired with its memory manager".to_string(),
            }));
        };
        let arena = match arena {
            Some(arena) => arena,
            None => arena.insert(
                Arena::new(
                    reserve.backend(),
                    self.device,
                    self.stream,
                    self.settings.span,
                )
                .map_err(ArenaError::Backend)?
                .placing_on_mapped_pages(self.settings.place_on_mapped_pages),
            ),
        };
        let counters = &slot.counters;
        let may_map = |ask, pages: PageCounts| {
            // The cache budget reads every pool's published page counts; this arena's lag
            // behind what this call did before its miss (a parked block's free completed, its
            // pages idle now), and a stale count of live pages would raise the budget's peak
            // for good.
            counters.set_pages(pages.mapped, pages.live);
            may_map(ask)
        };
        // Read under the slot's lock, which a capture takes only after pinning the pool.
        let may_unmap = !self.is_pinned();
        let outcome = arena.alloc(reserve, size, align, live, may_unmap, may_map);
        // The pool's own counters follow its mapped pages; the device's held bytes follow
        // the driver's creations and releases, which the reserve counts.
        let released = arena.take_released_while_allocating();
        if released.calls > 0 {
            slot.counters.on_release(released.bytes, released.calls);
        }
        let kept = arena.take_kept_after_failed_map();
        if kept.calls > 0 {
            slot.counters.on_reserve(kept.bytes, kept.calls);
        }
        slot.counters
            .set_pages(arena.mapped_pages() as u64, arena.live_pages() as u64);
        match outcome {
            Ok(placed) => {
                if placed.map_calls > 0 {
                    slot.counters
                        .on_reserve(placed.mapped_bytes, placed.map_calls);
                }
                slot.counters
                    .on_alloc(live.requested, size, placed.map_calls == 0);
                reserve.held().on_alloc(live.requested, size);
                Ok(placed)
            }
            Err(error @ ArenaError::NeedsRoom(..)) => Err(error),
            Err(error) => {
                slot.counters.on_failed_request();
                if matches!(error, ArenaError::Backend(_)) {
                    slot.counters.on_driver_error();
                }
                Err(error)
            }
        }
    }

    /// Frees a block. Pages it leaves empty stay mapped (idle) for reuse; the manager decides
    /// when cached pages go back to the driver. The last free of a retired pool releases its
    /// memory.
    #[inline(always)]
    pub fn free(&self, kind: PoolKind, block: u32) {
        let slot = self.slot(kind);
        let mut state = slot.state.lock();
        state.free_block(&slot.counters, block);
        if self.retired.load(Relaxed) {
            state.wind_down_unless_live(&slot.counters, self.device);
        }
    }

    /// The manager is gone: release each arena now if nothing in it is live, else when its last
    /// live block is freed. Handles to the pool may outlive this; they keep only its shell.
    pub fn retire(&self) {
        self.retired.store(true, Relaxed);
        self.wind_down();
    }

    /// Gives a retired pool's memory back if nothing in it is live: at retirement, and again
    /// (upkeep) where the driver refused to unmap its pages then.
    pub fn wind_down(&self) {
        if !self.is_retired() {
            return;
        }
        for slot in [&self.small, &self.large] {
            let mut state = slot.state.lock();
            // No later call would look at what waits: wait for it now.
            state.settle(&slot.counters, self.device, shared::Settle::Wait);
            state.wind_down_unless_live(&slot.counters, self.device);
        }
    }

    #[inline]
    pub fn is_retired(&self) -> bool {
        self.retired.load(Relaxed)
    }

    /// Retired, and its memory and backend given up (no block was live, or the last is freed).
    pub fn is_wound_down(&self) -> bool {
        self.is_retired()
            && [&self.small, &self.large]
                .iter()
                .all(|slot| slot.state.lock().reserve.is_none())
    }

    /// Bytes of live blocks in both arenas.
    pub fn in_use_bytes(&self) -> u64 {
        [&self.small, &self.large]
            .iter()
            .map(|slot| slot.counters.read().in_use_bytes)
            .sum()
    }

    /// (mapped, live) pages of both arenas, read lock-free: live pages hold a live block (in a
    /// pinned pool, every page does).
    pub fn page_census(&self) -> (u64, u64) {
        let (mut mapped, mut live) = (0, 0);
        for slot in [&self.small, &self.large] {
            let (m, l) = slot.counters.pages();
            mapped += m;
            live += l;
        }
        if self.is_pinned() {
            live = mapped;
        }
        (mapped, live)
    }

    /// Counts what a release unmapped — all of it, or what it unmapped before the driver
    /// refused (those pages are in the reserve all the same).
    /// Unmaps idle pages of both arenas into the device's page reserve, oldest first, while
    /// `keep_going(bytes_unmapped_so_far, idle_since)` says so. A pinned pool has none.
    pub fn release_idle(
        &self,
        mut busy: BusyStreams,
        mut keep_going: impl FnMut(u64, u64) -> bool,
    ) -> Result<u64, BackendError> {
        if self.stream == StreamId::SHARED {
            // Its idle pages are past all work already: nothing to wait for, and no stream to ask.
            busy = BusyStreams::Wait;
        }
        let mut total = 0;
        for slot in [&self.small, &self.large] {
            // The chunks are taken under the slot's lock and unmapped after it is let go: the
            // pool's allocating threads go on while the driver unmaps (and the GPU catches up).
            let (unmapping, reserve) = {
                let mut guard = slot.state.lock();
                guard.settle(&slot.counters, self.device, shared::Settle::PollAll);
                // Read under the slot's lock: a capture pins the pool before it takes this lock
                // to allocate, so a release running beside a new capture into a released pool
                // cannot unmap what that capture has just freed (taken, it is out of reach).
                if self.is_pinned() {
                    break;
                }
                let SlotState {
                    arena: Some(arena),
                    reserve: Some(reserve),
                    ..
                } = &mut *guard
                else {
                    continue;
                };
                let page = arena.page_size();
                let before = total;
                let unmapping = arena.take_for_unmapping(
                    reserve,
                    |taken, since| keep_going(before + taken as u64 * page, since),
                    |_| false,
                    busy == BusyStreams::Wait,
                );
                slot.counters
                    .set_pages(arena.mapped_pages() as u64, arena.live_pages() as u64);
                (unmapping, Arc::clone(reserve))
            };
            if unmapping.is_empty() {
                continue;
            }
            let (released, _) = unmapping.finish(&reserve);
            if released.is_err() {
                // What the driver refused is the arena's again, idle.
                let mut guard = slot.state.lock();
                if let Some(arena) = guard.arena.as_mut() {
                    arena.settle_unmaps();
                    slot.counters
                        .set_pages(arena.mapped_pages() as u64, arena.live_pages() as u64);
                }
            }
            total += account_release(&slot.counters, released)?.bytes;
        }
        Ok(total)
    }

    /// Live blocks of both arenas as (kind, pointer, block size, info), under each arena's lock.
    pub fn for_each_live(&self, mut visit: impl FnMut(PoolKind, DevicePtr, u64, LiveInfo)) {
        for (kind, slot) in [
            (PoolKind::Small, &self.small),
            (PoolKind::Large, &self.large),
        ] {
            if let Some(arena) = slot.state.lock().arena.as_ref() {
                for (ptr, size, live) in arena.live_blocks() {
                    visit(kind, ptr, size, live);
                }
            }
        }
    }

    /// Each arena's mapped segments with their live blocks (snapshot time only).
    pub fn mapped_segments(&self) -> Vec<(PoolKind, MappedSegment)> {
        let mut segments = Vec::new();
        for kind in [PoolKind::Small, PoolKind::Large] {
            if let Some(arena) = self.slot(kind).state.lock().arena.as_ref() {
                segments.extend(arena.mapped_segments().into_iter().map(|s| (kind, s)));
            }
        }
        segments
    }

    /// Figures that need a walk over the arena (snapshot time only).
    pub fn arena_view(&self, kind: PoolKind) -> ArenaView {
        match self.slot(kind).state.lock().arena.as_mut() {
            Some(arena) => ArenaView {
                largest_cached_free_block: arena.largest_cached_free_block(),
                idle_pages: arena.idle_pages() as u64,
            },
            None => ArenaView::default(),
        }
    }

    pub fn reset_peaks(&self) {
        for slot in [&self.small, &self.large] {
            let _guard = slot.state.lock();
            slot.counters.reset_peaks();
        }
    }

    /// Event counts restart from zero ([`PoolCounters::reset_counts`]).
    pub fn reset_counts(&self) {
        for slot in [&self.small, &self.large] {
            let _guard = slot.state.lock();
            slot.counters.reset_counts();
        }
    }
}

/// Counts what a release gave back, the part before a failure included; returns the driver's
/// error, if any, after counting it.
fn account_release(
    counters: &PoolCounters,
    released: Result<Released, ReleaseError>,
) -> Result<Released, BackendError> {
    let (released, error) = match released {
        Ok(released) => (released, None),
        Err(partial) => (partial.released, Some(partial.error)),
    };
    if released.calls > 0 {
        counters.on_release(released.bytes, released.calls);
    }
    match error {
        None => Ok(released),
        Some(error) => {
            counters.on_driver_error();
            Err(error)
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for slot in [&self.small, &self.large] {
            let mut state = slot.state.lock();
            if let Some(live) = state.arena.as_ref().map(Arena::live_block_count) {
                if live > 0 {
                    // Buffers hold the pool alive, so this only happens if one was leaked with
                    // mem::forget: keep the address range rather than free memory still in use.
                    tracing::warn!(
                        device = self.device,
                        live,
                        "pool dropped with live blocks; leaving its memory mapped"
                    );
                    std::mem::forget(state.arena.take());
                    continue;
                }
            }
            state.wind_down_unless_live(&slot.counters, self.device);
        }
    }
}
