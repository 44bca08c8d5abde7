//! What the pools keep cached and when it goes back to the driver: the cache budget checked
//! before every mapping, trimming, emptying, age-based release, and peaks.

use super::adaptive::inside_chunk_cap_bytes;
use super::{ManagedDevice, MemoryManager, PressureLevel};
use crate::error::BackendError;
use crate::pool::reserve::INSIDE_CHUNK_SLACKS;
use crate::pool::{BusyStreams, MapAsk, MapDecision};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// Where pages unmapped from the pools go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unmapped {
    /// Into the device's page reserve, for the next mapping (still held).
    Kept,
    /// Back to the driver, with every page the reserve held.
    Released,
}

impl MemoryManager {
    /// Whether mapping `ask.bytes` more keeps the device's pools within their cache budget: the
    /// pages they hold (mapped, or kept in the page reserve) stay within the recent peak of
    /// pages under live blocks plus a slack (capped by `max_cached_bytes`, and never below
    /// `preallocate_bytes`). Idle mapped pages and kept ones share the slack. Asked only before
    /// the driver is called (a miss), so the hot path never pays for it. Pages ahead of a
    /// growing arena (`ask.ahead_bytes`) are idle when mapped: they count against the slack,
    /// never towards the peak, and are allowed only where the budget holds them without making
    /// room ([`MapDecision::AllowBlockOnly`] otherwise).
    pub(super) fn cache_budget_check(&self, managed: &ManagedDevice, ask: MapAsk) -> MapDecision {
        let (mut mapped, mut live) = (0, 0);
        for pool in managed.pools() {
            let (m, l) = pool.page_census();
            mapped += m;
            live += l;
        }
        let spare = managed.pages.spare_pages();
        let page = managed.page_size;
        let new_pages = ask.bytes / page;
        let ahead_pages = ask.ahead_bytes / page;
        // Pages taken from the reserve are held already; only the rest would be created.
        let creating = new_pages.saturating_sub(spare);
        let creating_ahead = (new_pages + ahead_pages).saturating_sub(spare);
        let peaks = &managed.events.live_pages_peak;
        peaks[0].fetch_max((live + new_pages) as usize, Relaxed);
        let peak = peaks[0].load(Relaxed).max(peaks[1].load(Relaxed)) as u64;
        let config = self.config();
        // The device's knobs: the configured values, or where the adaptive default moved them.
        let knobs = managed.pages.knobs();
        let mut slack =
            (knobs.idle_pages_kept() as u64).max(peak * knobs.idle_per_mille() as u64 / 1024);
        if let Some(cap) = config.max_cached_bytes {
            slack = slack.min(cap / page);
        }
        let inside_cap = match managed.adapting {
            Some(_) => inside_chunk_cap_bytes(peak * page) / page,
            None => slack * INSIDE_CHUNK_SLACKS,
        };
        managed.pages.note_inside_cap(inside_cap);
        let budget = (peak + slack).max(config.preallocate_bytes.div_ceil(page));
        let idle = mapped.saturating_sub(live);
        let held = mapped + spare;
        if ahead_pages > 0 && held + creating_ahead <= budget {
            return MapDecision::Allow;
        }
        let block_only = if ahead_pages > 0 {
            MapDecision::AllowBlockOnly
        } else {
            MapDecision::Allow
        };
        if creating == 0 || held + creating <= budget || idle == 0 {
            return block_only;
        }
        // Idle pages unmapped into the reserve are what the mapping then takes: each one
        // unmapped is one page fewer to create.
        let excess_pages = (held + creating - budget).min(idle).min(creating);
        self.lend_once_a_wait_was_long(managed);
        // `make_room_without_waiting` is a room without end.
        let room_without_waiting = self.room_without_waiting_bytes(managed) / page;
        let within_room = config.make_room_without_waiting
            || held + creating <= budget.saturating_add(room_without_waiting);
        MapDecision::NeedsRoom(excess_pages * page, self.making_room(managed, within_room))
    }

    /// How far past the cache budget a miss may take the device rather than wait for the GPU
    /// to finish with the idle pages it would unmap: `room_without_waiting_bytes`, or none once
    /// the adaptive default has seen that the GPU paces the process (`Adapting::gpu_paces`: a
    /// gigabyte block, or a wait for the GPU of
    /// [`LONG_GPU_WAIT_NS`](super::adaptive::LONG_GPU_WAIT_NS)). The room is for short
    /// steps that the host paces, where a wait empties the GPU's queue and the step then runs
    /// at the host's speed: a ResNet-50 server's batch-128 step took 17–23 ms waiting against
    /// 11.3 without (docs/performance.md, "The wait at a miss"). Where the GPU paces the steps
    /// the room holds memory and buys little: under PyTorch on an H200 a point-cloud network
    /// (pairwise distances of 1 GiB, 550 ms steps) held 3,632 MiB at its peak with the room,
    /// over expandable segments' 3,592, and 3,588 waiting, its round 551 ms with the room and
    /// 549 waiting (docs/gpu-results.md); a long-convolution trainer's misses, on the H100,
    /// waited 30 to 60 ms a miss with the room or without, and it held up to 200 MiB more with
    /// it. At the large sizes of ResNet-50 and GPT-2 medium the room had held what waiting held.
    fn room_without_waiting_bytes(&self, managed: &ManagedDevice) -> u64 {
        let longest_wait_ns = managed.pages.gpu_wait_ns.longest();
        let gpu_paces = managed
            .adapting
            .as_ref()
            .is_some_and(|adapting| adapting.gpu_paces(longest_wait_ns));
        if gpu_paces {
            0
        } else {
            self.config().room_without_waiting_bytes
        }
    }

    /// `stream_ordered_reuse` left to the adaptive default: once a wait for the GPU has lasted
    /// [`LONG_GPU_WAIT_NS`](super::adaptive::LONG_GPU_WAIT_NS) (the room past the budget is
    /// gone then), a miss that must make room lends its own stream's busy idle pages to itself
    /// instead of waiting (`pool/lending.rs`); not once the device has mapped a gigabyte block.
    /// Under PyTorch on an H200 a long-convolution trainer, whose longest waits were 110-128 ms,
    /// took 0.994 of the default allocator's round lending from the start and 1.007 waiting,
    /// at peaks under expandable segments' both ways. A point-cloud network (pairwise distances
    /// of 1 GiB) waited 17-18 ms at most, and lending there held 28 MiB more, over expandable
    /// segments' peak (docs/gpu-results.md). Both conditions only ever turn true, so lending
    /// starts once and stops once.
    fn lend_once_a_wait_was_long(&self, managed: &ManagedDevice) {
        let Some(adapting) = &managed.adapting else {
            return;
        };
        if self.config().stream_ordered_reuse.is_none() {
            let long_wait =
                managed.pages.gpu_wait_ns.longest() >= super::adaptive::LONG_GPU_WAIT_NS;
            let lend = long_wait && !adapting.large_blocks();
            managed.pages.set_stream_ordered_reuse(lend);
        }
    }

    /// Whether a miss on `device` that must make room from its own stream's busy idle pages
    /// lends them to itself now instead of waiting (`stream_ordered_reuse`, or the adaptive
    /// default's decision), and how many misses have lent so far.
    pub fn stream_ordered_reuse(&self, device: usize) -> Result<(bool, u64), BackendError> {
        let pages = &self.device(device)?.pages;
        Ok((pages.lends_in_stream_order(), pages.lendings.made()))
    }

    /// How far past its cache budget a miss on `device` may go now rather than wait for the
    /// GPU (`room_without_waiting_bytes`, 0 once the adaptive default saw the GPU pace the
    /// process), or `None` where it may go any distance (`make_room_without_waiting`).
    pub fn room_without_waiting(&self, device: usize) -> Result<Option<u64>, BackendError> {
        let managed = self.device(device)?;
        Ok((!self.config().make_room_without_waiting)
            .then(|| self.room_without_waiting_bytes(managed)))
    }

    /// What making room within the cache budget does about a stream whose queued work may still
    /// touch the idle pages it would unmap. By default it waits for that work: the memory comes
    /// back, and a host running ahead of its GPU stalls until the GPU catches up. While the
    /// mapping stays within the room the configuration gives past the budget (`within_room`:
    /// `room_without_waiting_bytes`, or no end with `make_room_without_waiting`), below high
    /// pressure, it takes only the pages the GPU is done with, and the mapping creates pages
    /// for the rest: the process holds more, and the host does not wait (docs/performance.md,
    /// "The wait at a miss, step by step").
    fn making_room(&self, managed: &ManagedDevice, within_room: bool) -> BusyStreams {
        let may_grow = within_room && managed.pressure.level() < PressureLevel::High;
        if may_grow {
            BusyStreams::Skip
        } else {
            BusyStreams::Wait
        }
    }

    /// Unmaps idle pages on one device, oldest first, while `keep_going(bytes_so_far,
    /// idle_since)`, into the device's page reserve; with [`Unmapped::Released`] the reserve's
    /// pages (those kept before included) then go back to the driver. Pools whose stream is
    /// still busy are waited for or skipped, as `busy` says. Returns the bytes unmapped
    /// (`Kept`) or released (`Released`). A driver error is logged and stops the pool.
    pub(super) fn release_cached_on(
        &self,
        managed: &ManagedDevice,
        unmapped: Unmapped,
        busy: BusyStreams,
        mut keep_going: impl FnMut(u64, u64) -> bool,
    ) -> u64 {
        let mut done = 0;
        if unmapped == Unmapped::Released {
            // Kept pages go first: they back nothing, so they are the cheapest to lose.
            done += self.trim_reserve_on(managed, 0);
        }
        for pool in managed.pools() {
            let before = done;
            match pool.release_idle(busy, |bytes, since| keep_going(before + bytes, since)) {
                Ok(bytes) if unmapped == Unmapped::Kept => done += bytes,
                Ok(_) => done = before + self.trim_reserve_on(managed, 0),
                Err(error) => {
                    tracing::warn!(device = managed.index, %error, "could not unmap cached memory")
                }
            }
        }
        if unmapped == Unmapped::Released {
            // Pages another thread took out of a pool are still on their way to the reserve:
            // everything cached goes back, whichever thread was unmapping it.
            managed.pages.wait_for_unmapping();
            done += self.trim_reserve_on(managed, 0);
        }
        done
    }

    /// Releases the device's kept pages down to `keep_pages`; returns the bytes released.
    fn trim_reserve_on(&self, managed: &ManagedDevice, keep_pages: u64) -> u64 {
        let before = managed.reserve.reserved_bytes.load(Relaxed);
        if let Err(error) = managed.pages.trim(keep_pages) {
            tracing::warn!(device = managed.index, %error, "could not return kept pages to the driver");
        }
        before.saturating_sub(managed.reserve.reserved_bytes.load(Relaxed))
    }

    /// Unmaps every idle page of every device into its page reserve: the memory stays held
    /// (and counted as reserved), but the next miss on any pool or stream of the device maps
    /// it again instead of asking the driver for new memory. Returns the bytes unmapped.
    pub fn unmap_cached(&self) -> u64 {
        self.shared()
            .devices
            .iter()
            .map(|managed| {
                self.release_cached_on(managed, Unmapped::Kept, BusyStreams::Wait, |_, _| true)
            })
            .sum()
    }

    /// Returns cached memory to the driver until the pools of every device together hold at
    /// most `target_bytes` (or nothing cached is left). Returns the bytes released.
    pub fn trim(&self, target_bytes: u64) -> u64 {
        let mut released = 0;
        for managed in &self.shared().devices {
            let held = self.reserved_bytes();
            if held <= target_bytes {
                break;
            }
            let excess = held - target_bytes;
            released += self.release_cached_on(
                managed,
                Unmapped::Released,
                BusyStreams::Wait,
                |bytes, _| bytes < excess,
            );
        }
        released
    }

    /// Returns every cached page, and every page kept in a reserve, to the driver; live
    /// buffers are untouched.
    pub fn empty_cache(&self) -> u64 {
        self.shared()
            .devices
            .iter()
            .map(|managed| self.empty_cache_on(managed))
            .sum()
    }

    pub(super) fn empty_cache_on(&self, managed: &ManagedDevice) -> u64 {
        self.release_cached_on(managed, Unmapped::Released, BusyStreams::Wait, |_, _| true)
    }

    /// Returns pages idle for at least `age`, keeping `preallocate_bytes` per device. Run by
    /// the upkeep thread: pools whose stream is busy wait for a later round.
    pub fn release_idle_older_than(&self, age: Duration) -> u64 {
        let now = crate::clock::now();
        let floor = self.config().preallocate_bytes;
        self.shared()
            .devices
            .iter()
            .map(|managed| {
                let held = managed.reserve.reserved_bytes.load(Relaxed);
                let spare = held.saturating_sub(floor);
                self.release_cached_on(
                    managed,
                    Unmapped::Released,
                    BusyStreams::Skip,
                    |bytes, since| bytes < spare && crate::clock::between(since, now) >= age,
                )
            })
            .sum()
    }

    /// Returns the oldest idle pages of each device beyond `max_cached_bytes` (pools whose
    /// stream is busy wait for a later round of upkeep).
    pub(super) fn enforce_max_cached(&self) -> u64 {
        let Some(cap) = self.config().max_cached_bytes else {
            return 0;
        };
        self.shared()
            .devices
            .iter()
            .map(|managed| {
                let cached = managed
                    .reserve
                    .reserved_bytes
                    .load(Relaxed)
                    .saturating_sub(managed.in_use_bytes());
                let excess = cached.saturating_sub(cap);
                if excess == 0 {
                    return 0;
                }
                self.release_cached_on(
                    managed,
                    Unmapped::Released,
                    BusyStreams::Skip,
                    |bytes, _| bytes < excess,
                )
            })
            .sum()
    }

    /// Bytes held from the driver by all pools of all devices.
    pub fn reserved_bytes(&self) -> u64 {
        self.shared()
            .devices
            .iter()
            .map(|d| d.reserve.reserved_bytes.load(Relaxed))
            .sum()
    }

    /// Restarts every peak from the current values.
    pub fn reset_peaks(&self) {
        for managed in &self.shared().devices {
            for pool in managed.pools() {
                pool.reset_peaks();
            }
            managed.direct.reset_peaks();
            managed.reserve.reset_peak();
        }
    }

    /// Restarts the statistics: every peak from the current values, and the counts of events
    /// (requests, hits, allocations, frees, driver calls, OOMs, retries, host fallbacks) from
    /// zero — for measuring one phase of a program. What is held now (bytes in use and
    /// reserved, live allocations, external buffers) is state, not statistics, and stays.
    /// Prometheus reads the counters' drop as a counter reset, which `rate()` handles.
    pub fn reset_stats(&self) {
        self.reset_peaks();
        for managed in &self.shared().devices {
            for pool in managed.pools() {
                pool.reset_counts();
            }
            managed.direct.reset_counts();
            let events = &managed.events;
            for count in [&events.ooms, &events.retries, &events.cpu_fallbacks] {
                count.store(0, Relaxed);
            }
        }
    }

    /// Starts a new window for the live-page peak that sizes the cache: a burst long past
    /// stops pinning memory one window later.
    pub(super) fn roll_peak_window(&self) {
        for managed in &self.shared().devices {
            let peaks = &managed.events.live_pages_peak;
            peaks[1].store(peaks[0].swap(0, Relaxed), Relaxed);
        }
    }
}
