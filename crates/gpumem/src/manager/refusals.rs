//! What follows a pool's refusal: making room within the cache budget, releasing cached memory
//! and retrying once, the limits on mapping more (the pool cap, the minimum free memory at
//! critical pressure), and the error a request that still cannot be served gets.

use super::{cache, ooms, tag, ManagedDevice, MemoryManager, PressureLevel};
use crate::error::{AllocError, BackendError};
use crate::pool::miss_clock::MissClock;
use crate::pool::{ArenaError, BusyStreams, LiveInfo, MapAsk, MapDecision, Placed, Pool, PoolKind};
use std::sync::atomic::Ordering::Relaxed;

impl MemoryManager {
    /// What follows a pool's refusal: make room within the cache budget, or release cached
    /// memory and retry once when the driver or the pool cap said no. A success counts as a
    /// miss taking the time from here to the end; a failure is the caller's to explain.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn alloc_pooled_retrying(
        &self,
        managed: &ManagedDevice,
        pool: &Pool,
        kind: PoolKind,
        size: u64,
        align: u64,
        live: LiveInfo,
        refusal: ArenaError,
    ) -> Result<Placed, ArenaError> {
        // The first attempt's mapping, if it got that far, was counted where it failed.
        let clock = MissClock::start(self.shared.backend.as_ref());
        // A retry maps the block's own pages only.
        let may_map = |ask: MapAsk| self.may_map(managed, ask.bytes).block_only();
        let mut outcome = Err(refusal);
        if let Err(ArenaError::NeedsRoom(excess, busy)) = outcome {
            // The arena's own idle pages were not enough: other pools unmap their oldest into
            // the reserve, where this mapping takes them, so mapping never lifts the device
            // above its recent peak plus slack and creates no page. Busy streams are waited
            // for unless the budget said otherwise (`making_room`); the retry below then
            // creates what could not be unmapped.
            self.release_cached_on(managed, cache::Unmapped::Kept, busy, |bytes, _| {
                bytes < excess
            });
            outcome = pool.alloc(kind, size, align, &live, may_map);
        }
        if let Err(
            ArenaError::Backend(BackendError::OutOfMemory { .. })
            | ArenaError::OverLimit
            | ArenaError::BelowMinFree,
        ) = outcome
        {
            // Cached pages of every pool on the device, and the pages kept in its reserve, may be
            // what stands in the way. At critical pressure too: giving idle pages back raises free
            // memory, which may be all the minimum-free rule wants (without this, retries stayed
            // 0 while pages sat idle).
            managed.events.retries.fetch_add(1, Relaxed);
            self.release_cached_on(
                managed,
                cache::Unmapped::Released,
                BusyStreams::Wait,
                |_, _| true,
            );
            outcome = pool.alloc(kind, size, align, &live, may_map);
        }
        if let Ok(placed) = &outcome {
            if placed.map_calls > 0 {
                let took = clock.stop(self.shared.backend.as_ref());
                self.record_miss(
                    managed,
                    &Placed {
                        miss_ns: took.ns,
                        miss_cost_ns: took.cost_ns,
                        ..*placed
                    },
                );
            }
        }
        outcome
    }

    /// The limits on mapping `bytes` more: the pool cap, and at critical pressure the minimum
    /// free memory. Asked only on a miss, before the driver is called.
    pub(super) fn may_map(&self, managed: &ManagedDevice, bytes: u64) -> MapDecision {
        // Pages kept in the reserve are held already: only the rest is new memory.
        let creating = bytes.saturating_sub(managed.pages.spare_pages() * managed.page_size);
        // A cap at the device's size is no cap: let the driver say it is full.
        let cap = managed.pool_cap();
        let capped = cap < managed.properties.total_memory_bytes;
        if capped && managed.reserve.reserved_bytes.load(Relaxed) + creating > cap {
            return MapDecision::OverLimit;
        }
        if creating > 0 && managed.pressure.level() == PressureLevel::Critical {
            let min_free = self.shared.config.min_free_bytes;
            if let Ok(info) = self.shared.backend.mem_info(managed.index) {
                if info.free < creating.saturating_add(min_free) {
                    return MapDecision::BelowMinFree;
                }
            }
        }
        MapDecision::Allow
    }

    /// The error a refused request gets; counts it and records it for the flight recorder.
    #[cold]
    pub(super) fn explain_failure(
        &self,
        managed: &ManagedDevice,
        live: &LiveInfo,
        pool: PoolKind,
        error: ArenaError,
    ) -> AllocError {
        let requested = live.requested;
        let reserved = managed.reserve.reserved_bytes.load(Relaxed);
        let info = || self.shared.backend.mem_info(managed.index).ok();
        let error = match error {
            ArenaError::Backend(BackendError::OutOfMemory { .. })
            | ArenaError::AddressSpaceFull
            // Only asked for with a budget check, and the retry runs without one.
            | ArenaError::NeedsRoom(..) => {
                let info = info();
                AllocError::OutOfMemory {
                    device: managed.index,
                    requested,
                    device_free: info.map_or(0, |i| i.free),
                    device_total: info.map_or(managed.properties.total_memory_bytes, |i| i.total),
                    reserved,
                    in_use: managed.in_use_bytes(),
                }
            }
            ArenaError::OverLimit => AllocError::PoolLimit {
                device: managed.index,
                requested,
                reserved,
                limit: managed.pool_cap(),
            },
            ArenaError::BelowMinFree => AllocError::PressureCritical {
                device: managed.index,
                requested,
                free: info().map_or(0, |i| i.free),
                min_free: self.shared.config.min_free_bytes,
            },
            ArenaError::Backend(other) => return AllocError::Backend(other),
        };
        let seq = managed.events.ooms.fetch_add(1, Relaxed) + 1;
        let kind = match &error {
            AllocError::PoolLimit { .. } => "pool_limit",
            AllocError::PressureCritical { .. } => "pressure_critical",
            _ => "out_of_memory",
        };
        managed.events.recent_ooms.record(ooms::OomEvent {
            seq,
            timestamp_seconds: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            requested_bytes: requested,
            tag: tag::name_of(live.tag).map(|name| name.to_string()),
            pool: pool.name().to_string(),
            kind: kind.to_string(),
            message: error.to_string(),
        });
        error
    }

    /// The latest out-of-memory refusals on `device`, oldest first (at most
    /// [`ooms::KEPT_PER_DEVICE`]).
    pub fn recent_ooms(&self, device: usize) -> Vec<ooms::OomEvent> {
        self.device(device)
            .map(|d| d.events.recent_ooms.recent())
            .unwrap_or_default()
    }
}
