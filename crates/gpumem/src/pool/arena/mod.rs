//! One arena: a reserved range of device address space, a TLSF index of its blocks, and the
//! pages the driver has backed. Blocks live anywhere in the range; a page is mapped while a
//! live block touches it, and kept for reuse (idle) or unmapped when it is not.

use super::fences::FenceTrail;
use super::miss_clock::MissClock;
use super::pages::{PageRun, PageTable};
use super::reserve::PageReserve;
use super::tlsf::{BlockState, LiveInfo, Tlsf};
use super::BusyStreams;
use crate::backend::{DeviceBackend, DevicePtr, StreamId};
use crate::error::BackendError;
use old_addresses::OldAddresses;
use pinning::{BlockCut, Recut};
use std::sync::Arc;
pub(crate) use unmapping::UnmapsInFlight;

/// Why an arena could not place a block.
#[derive(Debug)]
pub enum ArenaError {
    /// The arena's address range has no hole large enough (as good as out of memory).
    AddressSpaceFull,
    /// Mapping the block's pages would pass the pool's size cap.
    OverLimit,
    /// Mapping would grow the cache past its budget while idle pages could make room: release
    /// this many bytes of idle pages, waiting for busy streams or not as the budget said, then
    /// retry.
    NeedsRoom(u64, BusyStreams),
    /// The device is at critical pressure and mapping would leave less than the configured
    /// minimum free.
    BelowMinFree,
    /// The driver refused to map the block's pages.
    Backend(BackendError),
}

/// What a miss asks to map: its block's pages, and at a new high of the arena's pages (where
/// the cache setting says so) free pages after the block, mapped ahead of the arena's growth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapAsk {
    pub bytes: u64,
    pub ahead_bytes: u64,
}

/// The answer to "may the arena map this many more bytes?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapDecision {
    /// Everything asked, pages ahead included.
    Allow,
    /// The block's own pages, not those ahead of it.
    AllowBlockOnly,
    OverLimit,
    /// Over the cache budget by this many bytes: unmap idle pages first, waiting for their
    /// stream's queued work or only taking those it is done with, as `BusyStreams` says.
    NeedsRoom(u64, BusyStreams),
    BelowMinFree,
}

impl MapDecision {
    /// The same answer for the block's own pages alone: nothing ahead of it.
    pub fn block_only(self) -> MapDecision {
        match self {
            MapDecision::Allow => MapDecision::AllowBlockOnly,
            other => other,
        }
    }
}

/// An arena's pages at one moment: mapped, and under at least one live block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageCounts {
    pub(crate) mapped: u64,
    pub(crate) live: u64,
}

/// A block handed out by `Arena::alloc`. Every field is a word, or half of one whose halves a
/// hit writes together: a hit writes the block's index and the pointer, and its callers copy
/// the struct a word at a time. A `u32` index beside a zero `u32` was written in two stores and
/// read back in one, which the CPU cannot forward from its store buffer (a sixth of a hit).
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    /// The block's index ([`Placed::block`]), widened to a word.
    pub(crate) block_index: u64,
    pub ptr: DevicePtr,
    /// Bytes of pages mapped for this block (0 on a pool hit).
    pub mapped_bytes: u64,
    pub map_calls: u64,
    /// On a miss, how long mapping its pages took (making room included), in nanoseconds.
    pub miss_ns: u32,
    /// On a miss, what it cost the adaptive default: `miss_ns`, or on a device that models its
    /// costs the driver time charged (see [`MissTime`](crate::pool::MissTime)).
    pub miss_cost_ns: u32,
}

impl Placed {
    /// The block's index in its arena.
    #[inline]
    pub fn block(&self) -> u32 {
        self.block_index as u32
    }
}

/// Pages unmapped from an arena (kept in the device's page reserve until it is trimmed).
#[derive(Clone, Copy, Debug, Default)]
pub struct Released {
    pub bytes: u64,
    pub calls: u64,
}

/// A release the driver stopped part-way: what was given back before it refused still was,
/// and must be counted.
#[derive(Debug)]
pub struct ReleaseError {
    pub released: Released,
    pub error: BackendError,
}

/// A maximal run of an arena's mapped pages and the live blocks in it, by address.
#[derive(Clone, Debug)]
pub struct MappedSegment {
    pub address: DevicePtr,
    pub size: u64,
    /// (pointer, block size, live info), in address order.
    pub live: Vec<(DevicePtr, u64, LiveInfo)>,
}

pub(crate) struct Arena {
    device: usize,
    stream: StreamId,
    base: DevicePtr,
    span: u64,
    page_size: u64,
    page_shift: u32,
    tlsf: Tlsf,
    pages: PageTable,
    runs: Vec<PageRun>,
    /// The block freed last, if no other was parked: its free is deferred whole — still used in
    /// the index, its pages still live — for the next request of its size, which takes it back
    /// without a search, a split, a merge or a page touched, whatever its size. Everything but
    /// that exact reuse first completes the free ([`unpark`](Self::unpark)), so the index and
    /// the page table are exact where it matters: before a placement, a release, or a
    /// measurement. (Between, the page counts the pool publishes count its pages as live.)
    parked: Option<u32>,
    /// The most pages this arena has had mapped since it last had none (see `pinning.rs`).
    mapped_high: usize,
    released_while_allocating: Released,
    /// Pages a failed allocation mapped and could not unmap again (see `map_runs`).
    kept_after_failed_map: Released,
    /// Fences on the stream behind pages gone idle: what unmapping them must wait for.
    fences: FenceTrail,
    /// Whether a block the index would put on unmapped pages goes to free mapped pages
    /// instead where they hold it (`place_on_mapped_pages` of the configuration).
    place_on_mapped_pages: bool,
    /// Idle chunks taken out to be unmapped after the lock is let go (`unmapping.rs`).
    unmaps: Arc<UnmapsInFlight>,
    /// Old addresses of chunks a miss lent, held so that no block lands there before the GPU
    /// has passed them (`old_addresses.rs`).
    old_addresses: OldAddresses,
}

impl Arena {
    /// Reserves `span` bytes of address space on `device` (no memory is mapped yet).
    pub(crate) fn new(
        backend: &dyn DeviceBackend,
        device: usize,
        stream: StreamId,
        span: u64,
    ) -> Result<Self, BackendError> {
        let page_size = backend.granularity(device)?;
        if !page_size.is_power_of_two() {
            return Err(BackendError::InvalidArgument {
                call: "granularity",
                reason: format!("page size {page_size} is not a power of two"),
            });
        }
        let span = crate::units::align_up(span, page_size);
        let base = backend.reserve_address_range(device, span)?;
        Ok(Arena {
            device,
            stream,
            base,
            span,
            page_size,
            page_shift: page_size.trailing_zeros(),
            tlsf: Tlsf::new(span),
            pages: PageTable::default(),
            runs: Vec::new(),
            parked: None,
            mapped_high: 0,
            released_while_allocating: Released::default(),
            kept_after_failed_map: Released::default(),
            fences: FenceTrail::default(),
            place_on_mapped_pages: false,
            unmaps: Arc::default(),
            old_addresses: OldAddresses::default(),
        })
    }

    /// The arena with [`place`](Self::place) preferring free mapped pages, or not.
    pub(crate) fn placing_on_mapped_pages(mut self, on: bool) -> Self {
        self.place_on_mapped_pages = on;
        self
    }

    pub(crate) fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Pages under at least one live block.
    pub(crate) fn live_pages(&self) -> usize {
        self.pages.mapped_pages() - self.pages.idle_pages()
    }

    pub(crate) fn mapped_pages(&self) -> usize {
        self.pages.mapped_pages()
    }

    pub(crate) fn idle_pages(&self) -> usize {
        self.pages.idle_pages()
    }

    pub(crate) fn page_counts(&self) -> PageCounts {
        PageCounts {
            mapped: self.mapped_pages() as u64,
            live: self.live_pages() as u64,
        }
    }

    #[inline]
    fn page_span(&self, offset: u64, size: u64) -> (u32, u32) {
        let first = (offset >> self.page_shift) as u32;
        let last = ((offset + size - 1) >> self.page_shift) as u32;
        (first, last)
    }

    /// Places `size` bytes (a multiple of 512) aligned to `align`, mapping pages as needed.
    /// `may_map(ask, pages)` is asked before any page is mapped, to enforce the pool's cap and
    /// the cache budget (and whether pages ahead of a growing arena may be mapped too); `pages`
    /// are this arena's pages as they stand then, which this call may already have changed (a
    /// parked block's free completed). `may_unmap` is false in a CUDA graph's pool, all of whose
    /// pages a captured graph may use (see `pinning.rs`).
    #[inline(always)]
    pub(crate) fn alloc(
        &mut self,
        reserve: &PageReserve,
        size: u64,
        align: u64,
        live: &LiveInfo,
        may_unmap: bool,
        may_map: impl FnOnce(MapAsk, PageCounts) -> MapDecision,
    ) -> Result<Placed, ArenaError> {
        if let Some(block) = self.parked {
            let parked = self.tlsf.block(block);
            if parked.size == size && parked.offset & (align - 1) == 0 {
                self.parked = None;
                let offset = parked.offset;
                self.tlsf.set_live(block, live);
                // Its pages stayed live while it was parked: nothing to acquire.
                return Ok(Placed {
                    block_index: u64::from(block),
                    miss_ns: 0,
                    ptr: self.base + offset,
                    mapped_bytes: 0,
                    map_calls: 0,
                    miss_cost_ns: 0,
                });
            }
            self.unpark();
            self.fence_idle_pages(reserve.backend());
        }
        let block = self.place(size, align, live, || {
            reserve.knobs().place_on_mapped_pages()
        })?;
        let offset = self.tlsf.block(block).offset;
        let (first, last) = self.page_span(offset, size);
        if !self.runs.is_empty() {
            // A miss: its pages may not be mapped again while another thread still unmaps them.
            self.wait_for_unmaps_under(reserve, first, last);
        }
        let (mut cut, mut recut) = (BlockCut::Ordinary, Recut::default());
        if may_unmap {
            recut = self.recut_whole_chunks_it_would_pin(reserve, first, last);
            if !self.runs.is_empty() && self.would_set_a_new_high() {
                self.give_back_chunks_it_would_pin(reserve, first, last);
                if reserve.cuts_whole_when_growing() {
                    cut = self.growth_cut(offset, size);
                }
            }
        }
        // A recut's mapping is this allocation's, reported with its own.
        let (mut mapped, mut miss) = (recut.mapped, recut.time);
        if !self.runs.is_empty() {
            let clock = MissClock::start(reserve.backend());
            let wanted: u64 =
                self.runs.iter().map(|r| r.count as u64).sum::<u64>() * self.page_size;
            // Whole-chunk cutting gives a growing block's pages a chunk of their own: nothing
            // ahead joins it.
            let ordinary = matches!(cut, BlockCut::Ordinary);
            let ahead = if ordinary && may_unmap && reserve.knobs().map_ahead_when_growing() {
                self.pages_ahead(reserve, block, offset + size, last)
            } else {
                0
            };
            let ask = MapAsk {
                bytes: wanted,
                ahead_bytes: u64::from(ahead) * self.page_size,
            };
            let outcome = match may_map(ask, self.page_counts()) {
                MapDecision::Allow => {
                    if let Some(run) = self.runs.last_mut() {
                        run.count += ahead;
                    }
                    self.map_runs(reserve, cut, &mut Vec::new())
                }
                MapDecision::AllowBlockOnly => self.map_runs(reserve, cut, &mut Vec::new()),
                MapDecision::OverLimit => Err(ArenaError::OverLimit),
                MapDecision::BelowMinFree => Err(ArenaError::BelowMinFree),
                MapDecision::NeedsRoom(excess, busy) => {
                    // Make room from this arena's own idle pages first, sparing those the new
                    // block is about to reuse: unmapped into the reserve, they are what the
                    // mapping below takes, so no page is created. The rest must come from
                    // other pools. With `stream_ordered_reuse`, pages the stream may still be
                    // using are lent to this mapping instead of waited for.
                    let spare = |chunk: PageRun| chunk.overlaps(first, last);
                    let mut released = Released::default();
                    let mut lending = None;
                    if busy == BusyStreams::Wait && self.may_lend(reserve) {
                        let fits_in = self.runs.iter().map(|run| run.count).max().unwrap_or(0);
                        let lent = self.lend_idle_sparing(reserve, excess, spare, fits_in);
                        released = lent.0.unwrap_or_else(|e| e.released);
                        lending = lent.1;
                        if let Some(lending) = &lending {
                            self.hold_old_addresses(lending);
                        }
                    }
                    if released.bytes < excess {
                        let left = excess - released.bytes;
                        let more = self.release_idle_sparing(reserve, left, spare, busy);
                        let more = more.unwrap_or_else(|e| e.released);
                        released.bytes += more.bytes;
                        released.calls += more.calls;
                    }
                    self.count_released_while_allocating(released);
                    let mut lent = lending
                        .as_mut()
                        .map(|lending| std::mem::take(&mut lending.chunks))
                        .unwrap_or_default();
                    let outcome = if released.bytes >= excess {
                        self.map_runs(reserve, cut, &mut lent)
                    } else {
                        Err(ArenaError::NeedsRoom(excess - released.bytes, busy))
                    };
                    if let Some(mut lending) = lending {
                        // What the mapping did not take waits with the old addresses.
                        lending.chunks = lent;
                        reserve.lendings.park(reserve, lending);
                    }
                    outcome
                }
            };
            match outcome {
                Ok(done) => {
                    mapped.bytes += done.bytes;
                    mapped.calls += done.calls;
                }
                Err(error) => {
                    self.tlsf.free(block);
                    // The recut pages stay mapped, idle: counted like a failed map's leftovers.
                    self.kept_after_failed_map.bytes += recut.mapped.bytes;
                    self.kept_after_failed_map.calls += recut.mapped.calls;
                    return Err(error);
                }
            }
            miss = miss.plus(clock.stop(reserve.backend()));
        }
        self.pages.acquire(first, last);
        self.mapped_high = self.mapped_high.max(self.pages.mapped_pages());
        Ok(Placed {
            block_index: u64::from(block),
            miss_ns: miss.ns,
            ptr: self.base + offset,
            mapped_bytes: mapped.bytes,
            map_calls: mapped.calls,
            miss_cost_ns: miss.cost_ns,
        })
    }

    /// Whether a miss here may lend its own idle pages to itself instead of waiting for the GPU
    /// (`stream_ordered_reuse`): only on a stream of its own, whose work runs in order.
    fn may_lend(&self, reserve: &PageReserve) -> bool {
        self.stream != StreamId::ANY
            && self.stream != StreamId::SHARED
            && reserve.lends_in_stream_order()
    }

    /// Maps every run in `self.runs` (chunks lent by this miss first, then kept ones), cutting
    /// new pages as `cut` says for the block's first and last pages (see
    /// [`Arena::growth_cut`]); on failure unmaps what this call mapped, back into the reserve.
    fn map_runs(
        &mut self,
        reserve: &PageReserve,
        cut: BlockCut,
        lent: &mut Vec<crate::backend::PhysicalChunk>,
    ) -> Result<Released, ArenaError> {
        let now = crate::clock::now();
        let mut done = Released::default();
        let mut layouts = Vec::with_capacity(self.runs.len());
        for index in 0..self.runs.len() {
            let run = self.runs[index];
            let (addr, bytes) = self.run_range(run);
            match reserve.map_lending(addr, bytes, cut.for_run(run), lent, Some(self.stream)) {
                Ok(mapped) => layouts.push(mapped),
                Err(error) => {
                    for (earlier, mapped) in self.runs[..index].iter().zip(&layouts) {
                        let (addr, bytes) = self.run_range(*earlier);
                        // The pages were mapped a moment ago and nothing uses them; if the
                        // driver cannot unmap them now, they stay mapped (idle, released later
                        // like any cached page) and must be counted as mapped by this arena.
                        if reserve.unmap(addr, bytes).is_err() {
                            self.pages.mark_mapped(*earlier, &mapped.chunks, now);
                            self.kept_after_failed_map.bytes += bytes;
                            self.kept_after_failed_map.calls += 1;
                        }
                    }
                    return Err(ArenaError::Backend(error));
                }
            }
            done.bytes += bytes;
            done.calls += 1;
        }
        for (run, mapped) in self.runs.iter().zip(&layouts) {
            self.pages.mark_mapped(*run, &mapped.chunks, now);
            for &at in &mapped.whole_at {
                self.pages.mark_whole(run.first + at);
            }
        }
        Ok(done)
    }

    /// How many free, unmapped pages after a block ending at byte `end` (its last page `last`)
    /// a miss at a new high of the arena's pages maps ahead: those that fill its last run's
    /// last ordinary chunk, at most the idle pages the cache keeps. A growing arena (a first
    /// training step, a model loading) then meets its next small blocks on mapped pages: one
    /// miss for a chunk's worth of them instead of one each (audio_ctc_train made 360 of its
    /// 399 misses at new highs, blocks of 2 to 10 MiB). Zero where the block's last run does
    /// not end the block or no such page follows it, and in an arena that holds no page: its
    /// first miss, or the first after the cache was emptied, is no sign of growth yet (mapped
    /// ahead, a cold miss of 16 MiB mapped and released a 64 MiB chunk each time: 1.80x the
    /// driver pool's round trip on an H200).
    fn pages_ahead(&mut self, reserve: &PageReserve, block: u32, end: u64, last: u32) -> u32 {
        let Some(run) = self.runs.last().copied() else {
            return 0;
        };
        let growing = self.pages.mapped_pages() > 0 && self.would_set_a_new_high();
        if run.end() != last + 1 || !growing {
            return 0;
        }
        let chunk = reserve.ordinary_chunk_pages().max(1);
        let filling = run.count.div_ceil(chunk) * chunk - run.count;
        let kept = u32::try_from(reserve.knobs().idle_pages_kept()).unwrap_or(u32::MAX);
        let free_end = (end + self.tlsf.free_after(block)) >> self.page_shift;
        let free = u32::try_from(free_end.saturating_sub(u64::from(last) + 1)).unwrap_or(u32::MAX);
        let wanted = filling.min(kept).min(free);
        if wanted == 0 {
            return 0;
        }
        let mut after = Vec::with_capacity(1);
        self.pages
            .unmapped_runs(last + 1, last + wanted, &mut after);
        match after.first() {
            Some(unmapped) if unmapped.first == last + 1 => unmapped.count.min(wanted),
            _ => 0,
        }
    }

    fn run_range(&self, run: PageRun) -> (DevicePtr, u64) {
        (
            self.base + ((run.first as u64) << self.page_shift),
            (run.count as u64) << self.page_shift,
        )
    }

    /// Frees a block handed out by [`alloc`](Self::alloc); returns its size and live info.
    #[inline(always)]
    pub(crate) fn free(&mut self, block: u32) -> (u64, LiveInfo) {
        let (offset, size, live) = {
            let b = self.tlsf.block(block);
            debug_assert_eq!(b.state, BlockState::Used);
            (b.offset, b.size, b.live)
        };
        if self.parked.is_none() {
            self.parked = Some(block);
        } else {
            self.release_block(block, offset, size);
        }
        (size, live)
    }

    /// Completes the parked block's free: its pages released, its space merged back.
    pub(crate) fn unpark(&mut self) {
        if let Some(block) = self.parked.take() {
            let b = self.tlsf.block(block);
            let (offset, size) = (b.offset, b.size);
            self.release_block(block, offset, size);
        }
    }

    fn release_block(&mut self, block: u32, offset: u64, size: u64) {
        let (first, last) = self.page_span(offset, size);
        let idle_before = self.pages.idle_pages();
        // The clock is read only if a page actually goes idle.
        self.pages.release(first, last, crate::clock::now);
        if self.pages.idle_pages() > idle_before {
            self.fences.pages_went_idle();
        }
        self.tlsf.free(block);
    }

    /// Live blocks: (device pointer, block size, live info).
    pub(crate) fn live_blocks(&self) -> impl Iterator<Item = (DevicePtr, u64, LiveInfo)> + '_ {
        let parked = self.parked.map(|block| self.tlsf.block(block).offset);
        self.tlsf
            .blocks()
            .filter(move |b| b.state == BlockState::Used && Some(b.offset) != parked)
            .filter(|b| !self.old_addresses.holds(b.offset, self.page_shift))
            .map(|b| (self.base + b.offset, b.size, b.live))
    }

    /// The arena's mapped memory as segments: each maximal run of mapped pages, with the live
    /// blocks inside it (a live block's pages are all mapped, so it lies in one run). Walks the
    /// index: snapshot time only.
    pub(crate) fn mapped_segments(&self) -> Vec<MappedSegment> {
        let mut segments: Vec<MappedSegment> = self
            .pages
            .all_mapped_runs()
            .map(|run| MappedSegment {
                address: self.base + (u64::from(run.first) << self.page_shift),
                size: u64::from(run.count) << self.page_shift,
                live: Vec::new(),
            })
            .collect();
        let mut live: Vec<_> = self.live_blocks().collect();
        live.sort_by_key(|&(ptr, _, _)| ptr);
        for (ptr, size, info) in live {
            let at = segments.partition_point(|s| s.address + s.size <= ptr);
            if let Some(segment) = segments.get_mut(at).filter(|s| s.address <= ptr) {
                segment.live.push((ptr, size, info));
            }
        }
        segments
    }

    /// The largest run of free bytes lying entirely in mapped pages: what could be handed out
    /// right now without asking the driver. Merges the parked block back first, as it is free.
    pub(crate) fn largest_cached_free_block(&mut self) -> u64 {
        self.unpark();
        self.cached_free_stretches(0)
            .map(|(_, start, end)| end - start)
            .max()
            .unwrap_or(0)
    }

    /// Unmaps everything into the reserve and gives the address range back. Live blocks must
    /// be gone. On an error the arena is gone all the same: a caller that must not lose pages
    /// still mapped unmaps them first ([`release_idle`](Self::release_idle)) and then
    /// [`close`](Self::close)s it.
    #[cfg(test)]
    pub(crate) fn destroy(mut self, reserve: &PageReserve) -> Result<Released, BackendError> {
        let released = self
            .release_idle(reserve, |_, _| true, super::BusyStreams::Wait)
            .map_err(|e| e.error)?;
        self.close(reserve)?;
        Ok(released)
    }

    /// Gives the address range back, once no page of it is mapped.
    pub(crate) fn close(mut self, reserve: &PageReserve) -> Result<(), BackendError> {
        self.wait_for_all_unmaps(reserve);
        debug_assert_eq!(self.mapped_pages(), 0, "closing an arena with pages mapped");
        self.fences.drain(reserve.backend(), self.device);
        reserve
            .backend()
            .release_address_range(self.device, self.base, self.span)
    }

    pub(crate) fn live_block_count(&self) -> usize {
        self.tlsf.used_blocks() - usize::from(self.parked.is_some()) - self.old_addresses.count()
    }
}

mod block_placement;
mod old_addresses;
mod pinning;
mod release;
#[cfg(test)]
mod tests;
mod unmapping;
