//! The page reserve of one device: physical chunks unmapped from an arena but kept, so the next
//! miss anywhere on the device maps them again (`cuMemMap`) instead of asking the driver for new
//! memory (`cuMemCreate`); and how a miss's run of pages is cut into chunks. Every page the
//! device's pools hold from the driver is counted in [`DeviceReserve`] from its creation to its
//! release, mapped or kept here: the reserve is reserved memory in every figure, and what the
//! driver reports as used matches it to the byte. The cache budget bounds idle mapped pages and
//! kept ones together.

use super::knobs::{CacheKnobs, KnobValues};
use super::latency::LatencyHistogram;
use super::lending::Lendings;
use super::DeviceReserve;
use crate::backend::{DeviceBackend, DevicePtr, PhysicalChunk, StreamId};
use crate::error::BackendError;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

pub struct PageReserve {
    backend: Arc<dyn DeviceBackend>,
    device: usize,
    page_size: u64,
    held: Arc<DeviceReserve>,
    /// How a miss cuts its pages (the largest ordinary chunk, the smallest inside a long run,
    /// whole when growing), the idle pages the cache keeps and where blocks go: fixed, or moved
    /// by the adaptive default while the pools run.
    knobs: CacheKnobs,
    /// The most pages an inside chunk may hold, as the cache budget last saw it (see
    /// [`PageReserve::new_chunks`]).
    inside_cap_pages: AtomicU64,
    spare: Mutex<Vec<PhysicalChunk>>,
    /// The pages of `spare`, readable without the lock (cache budget checks, snapshots)...
    spare_pages: AtomicU64,
    /// ...and those a mapping has taken out of it and not yet mapped or put back...
    in_flight_pages: AtomicU64,
    /// ...and idle pages an arena has let go of that the driver is unmapping into it now
    /// (`arena/unmapping.rs`), or that a miss detached and has not mapped again
    /// (`lending.rs`).
    unmapping_pages: AtomicU64,
    /// Whether a miss making room from its own stream's idle pages detaches them instead of
    /// waiting for the GPU (`stream_ordered_reuse`, where the backend can).
    stream_ordered_reuse: AtomicBool,
    /// Chunks detached by misses whose old addresses are still mapped.
    pub(crate) lendings: Lendings,
    pub pages_created: AtomicU64,
    /// Pages mapped again from the reserve instead of created.
    pub pages_reused: AtomicU64,
    pub pages_released: AtomicU64,
    /// How long allocations that called the driver took, in nanoseconds.
    pub miss_ns: LatencyHistogram,
    /// How long each wait for the GPU to finish the work queued on idle pages took before they
    /// were unmapped (a miss making room, a trim, emptying the cache), in nanoseconds: the part
    /// of a miss's time that is the GPU's, not the driver's.
    pub gpu_wait_ns: LatencyHistogram,
}

/// How a miss cuts the pages it creates into physical chunks (`max_chunk_bytes` and
/// `inside_chunk_bytes` of the configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSizes {
    pub max_bytes: u64,
    /// Chunks inside a long miss (0, or no more than `max_bytes`: none).
    pub inside_bytes: u64,
    /// Whether a miss at a new high of an arena's pages cuts its block's pages whole
    /// ([`Cut::Whole`], `whole_chunks_when_growing` of the configuration).
    pub whole_when_growing: bool,
}

impl ChunkSizes {
    pub fn new(max_bytes: u64, inside_bytes: u64) -> Self {
        ChunkSizes {
            max_bytes,
            inside_bytes,
            whole_when_growing: false,
        }
    }

    pub fn whole_when_growing(self, whole_when_growing: bool) -> Self {
        ChunkSizes {
            whole_when_growing,
            ..self
        }
    }
}

/// Inside chunks grow to at most this many times the cache's slack where the cache setting is
/// fixed. One chunk that a block beside it pins can then hold up to twice what the cache may
/// keep idle; measured on the fourteen traces at the simulated H100's costs, twice took
/// cnn_serve_large 27 %, gpt2_train 12 % and gpt2_train_cycled 9 % faster than once, with the
/// worst waste unchanged (1.0248; gpt2_train_cycled 1.0183 -> 1.0229), while three times put
/// cnn_serve_cycled at 1.0535. Below a live peak of 1.25 GiB twice the slack (four pages at
/// least, or 1/128 of the peak) is at most the default 16 MiB inside chunk: nothing changes
/// there. The adaptive default bounds them by its own cap instead (see
/// [`PageReserve::note_inside_cap`]).
pub(crate) const INSIDE_CHUNK_SLACKS: u64 = 2;

/// A long miss holds at least this many inside chunks between its two ordinary end chunks;
/// shorter runs are cut as ordinary misses (cutting runs from 48 MiB up took cnn_serve_cycled to
/// 1.0325 of its peak).
const MIN_INSIDE_CHUNKS: u64 = 4;

/// How [`PageReserve::map`] cuts the pages it creates for one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Ordinary chunks, with inside chunks in a long run (see [`PageReserve::map`]).
    Ordinary,
    /// As few chunks as the block's ends allow, for an arena growing past the most it has held:
    /// one chunk for the pages under the block alone, and a chunk of one page for each end page
    /// it may share with a neighbour (`lone_first`, `lone_last`: the block does not begin or end
    /// on a page boundary there). A neighbour keeps only its own page's chunk mapped after the
    /// block is freed; a smaller block landing on the large chunk first cuts it again around
    /// itself (`arena/pinning.rs`). Used only where it makes fewer chunks
    /// than the ordinary cut, and only for pages created, not kept chunks mapped again.
    Whole { lone_first: bool, lone_last: bool },
    /// Chunks of the ordinary size only, no inside chunks: for idle pages no block is over yet
    /// (the pages beside a block that landed on a whole chunk), which smaller blocks will share.
    Small,
}

/// What one [`PageReserve::map`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapped {
    pub created_pages: u64,
    pub reused_pages: u64,
    /// The chunks now behind the range, in pages, in address order.
    pub chunks: Vec<u32>,
    /// Where each chunk sized for the one block over it begins, in pages into the range: the
    /// chunk cut whole for it ([`Cut::Whole`]) and, where whole chunks are cut at all, kept
    /// chunks larger than an ordinary cut of the range would make.
    pub whole_at: Vec<u32>,
}

impl PageReserve {
    /// A reserve whose misses create chunks as `chunks` says.
    pub fn new(
        backend: Arc<dyn DeviceBackend>,
        device: usize,
        held: Arc<DeviceReserve>,
        chunks: ChunkSizes,
    ) -> Result<Self, BackendError> {
        let page_size = backend.granularity(device)?;
        let knobs = CacheKnobs::default();
        knobs.store(
            &KnobValues {
                max_chunk_bytes: chunks.max_bytes,
                inside_chunk_bytes: chunks.inside_bytes,
                whole_when_growing: chunks.whole_when_growing,
                place_on_mapped_pages: false,
                map_ahead_when_growing: false,
                idle_pages_kept: 0,
                idle_per_mille: 0,
            },
            page_size,
        );
        Ok(PageReserve {
            backend,
            device,
            page_size,
            held,
            knobs,
            inside_cap_pages: AtomicU64::new(0),
            spare: Mutex::new(Vec::new()),
            spare_pages: AtomicU64::new(0),
            in_flight_pages: AtomicU64::new(0),
            unmapping_pages: AtomicU64::new(0),
            stream_ordered_reuse: AtomicBool::new(false),
            lendings: Lendings::default(),
            pages_created: AtomicU64::new(0),
            pages_reused: AtomicU64::new(0),
            pages_released: AtomicU64::new(0),
            miss_ns: LatencyHistogram::default(),
            gpu_wait_ns: LatencyHistogram::default(),
        })
    }

    /// The largest chunk an ordinary miss creates, in pages: larger ones are a long miss's
    /// inside chunks.
    pub(crate) fn ordinary_chunk_pages(&self) -> u32 {
        self.knobs.max_chunk_pages()
    }

    /// Whether a block at a new high of its arena's pages gets [`Cut::Whole`].
    pub(crate) fn cuts_whole_when_growing(&self) -> bool {
        self.knobs.whole_when_growing()
    }

    /// The device's cache settings, which the manager sets (once, or as the adaptive default
    /// moves them).
    pub fn knobs(&self) -> &CacheKnobs {
        &self.knobs
    }

    pub fn backend(&self) -> &dyn DeviceBackend {
        &*self.backend
    }

    pub fn device(&self) -> usize {
        self.device
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// The bytes held from the driver by the device's pools, kept pages included.
    pub fn held(&self) -> &DeviceReserve {
        &self.held
    }

    /// Pages kept unmapped, now (those a mapping is about to take, and those being unmapped
    /// into the reserve, included).
    pub fn spare_pages(&self) -> u64 {
        self.spare_pages.load(Relaxed)
            + self.in_flight_pages.load(Relaxed)
            + self.unmapping_pages.load(Relaxed)
    }

    /// `pages` idle pages are on their way here from an arena (unmapped outside its lock).
    pub(crate) fn begin_unmapping(&self, pages: u64) {
        self.unmapping_pages.fetch_add(pages, Relaxed);
    }

    /// `pages` of those arrived (or went back to their arena, the driver refusing them).
    pub(crate) fn end_unmapping(&self, pages: u64) {
        self.unmapping_pages.fetch_sub(pages, Relaxed);
    }

    /// Waits until no arena has pages on their way here, so that a trim after it reaches them
    /// (`empty_cache` returns everything cached, whichever thread was unmapping it): detached
    /// chunks too, once the GPU has passed their old addresses.
    pub fn wait_for_unmapping(&self) {
        // A miss on another thread may lend more meanwhile: each look ends what is lent.
        super::short_wait::until(|| {
            self.lendings.settle_all(self);
            self.unmapping_pages.load(Relaxed) == 0
        });
    }

    /// Sets `stream_ordered_reuse`: whether a miss making room from its own stream's busy idle
    /// pages lends them to itself instead of waiting for the GPU (`lending.rs`).
    pub fn set_stream_ordered_reuse(&self, on: bool) {
        self.stream_ordered_reuse.store(on, Relaxed);
    }

    /// Whether a miss making room from its own stream's idle pages, where the GPU may still be
    /// using them, detaches them and maps them at its block's address at once
    /// (`lending.rs`), instead of waiting: `stream_ordered_reuse` is on and the backend can.
    pub(crate) fn lends_in_stream_order(&self) -> bool {
        self.stream_ordered_reuse.load(Relaxed) && self.backend.detaching().is_some()
    }

    /// Puts chunks unmapped elsewhere into the reserve (still held).
    pub(crate) fn keep(&self, chunks: Vec<PhysicalChunk>) {
        if chunks.is_empty() {
            return;
        }
        let mut spare = self.spare.lock();
        spare.extend(chunks);
        self.store_spare(&spare);
    }

    /// The most pages a chunk inside a long miss may hold from now on, as the cache budget
    /// sees it at a miss: `INSIDE_CHUNK_SLACKS` (2) times its slack for a fixed setting; the
    /// adaptive default's largest chunk (an eighth of the recent live peak, 64 to 512 MiB), which
    /// bounds what one pinned chunk can hold beside the live blocks.
    pub fn note_inside_cap(&self, pages: u64) {
        if self.inside_cap_pages.load(Relaxed) != pages {
            self.inside_cap_pages.store(pages, Relaxed);
        }
    }

    /// Maps `[addr, addr + size)`: kept chunks first, the largest that still fit, then new
    /// chunks for the rest, cut as `new_chunks` says. Access is granted per call and the
    /// driver charges it (and a later unmap) per chunk: one chunk for a whole run is what makes
    /// a miss cheap; the cap keeps a chunk from pinning much more than the block that made it,
    /// since only a chunk with no live block on any of its pages can be unmapped.
    pub fn map(&self, addr: DevicePtr, size: u64, cut: Cut) -> Result<Mapped, BackendError> {
        self.map_lending(addr, size, cut, &mut Vec::new(), None)
    }

    /// [`map`](Self::map), taking chunks from `lent` before the reserve's: chunks a miss
    /// detached from its own stream's idle pages, still mapped at their old address
    /// (`pool/lending.rs`). They count as on their way into the reserve until mapped here;
    /// those that do not fit stay in `lent`. Kept chunks a lending still holds are taken only
    /// for a mapping on the lending's own `stream`.
    pub(crate) fn map_lending(
        &self,
        addr: DevicePtr,
        size: u64,
        cut: Cut,
        lent: &mut Vec<PhysicalChunk>,
        stream: Option<StreamId>,
    ) -> Result<Mapped, BackendError> {
        let pages = size / self.page_size;
        let from_lent = take_fitting(lent, pages, 1);
        let (lent_count, lent_pages) = (from_lent.len(), sum_pages(&from_lent));
        // What this run takes from the reserve is taken under its lock; the driver is called
        // without it, so that misses on other threads wait for the driver (which serialises
        // them itself) and not also for each other here. Until they are back or mapped, the
        // chunks taken still count as kept (`in_flight_pages`), so the cache budget never
        // sees less held than there is.
        self.in_flight_pages.fetch_add(lent_pages, Relaxed);
        self.end_unmapping(lent_pages);
        let (mut reuse, mut going) = {
            let mut spare = self.spare.lock();
            let wanted = pages - lent_pages;
            let mut reuse = from_lent;
            // A chunk still lent by a miss (its old address mapped, maybe still in use) goes to
            // no other stream until that lending ends.
            let smallest = self.smallest_worth_reusing(pages);
            if self.lendings.any() {
                let (mut free, held): (Vec<_>, Vec<_>) = std::mem::take(&mut *spare)
                    .into_iter()
                    .partition(|c| !self.lendings.holds_against(c.handle, stream));
                reuse.extend(take_fitting(&mut free, wanted, smallest));
                *spare = free;
                spare.extend(held);
            } else {
                reuse.extend(take_fitting(&mut spare, wanted, smallest));
            }
            let reused: u64 = reuse.iter().map(|c| c.pages as u64).sum();
            // Kept chunks too large for this run would hold memory beside the new pages: as
            // many pages of them as are about to be created go back to the driver, so what the
            // device holds does not grow past what the cache budget allowed for.
            let creating = pages - reused;
            let going = if creating > 0 && !spare.is_empty() {
                spare.sort_unstable_by_key(|c| std::cmp::Reverse(c.pages));
                pop_pages(&mut spare, creating)
            } else {
                Vec::new()
            };
            let taken: u64 = reuse.iter().chain(&going).map(|c| c.pages as u64).sum();
            self.in_flight_pages.fetch_add(taken - lent_pages, Relaxed);
            self.store_spare(&spare);
            (reuse, going)
        };
        let reused_pages: u64 = reuse.iter().map(|c| c.pages as u64).sum();
        let going_pages: u64 = going.iter().map(|c| c.pages as u64).sum();
        if !going.is_empty() {
            if let Err(error) = self.release_unlocked(&mut going) {
                tracing::warn!(device = self.device, %error, "could not return kept chunks to the driver");
            }
        }
        let (new_chunks, whole_from) = match cut {
            Cut::Whole {
                lone_first,
                lone_last,
            } if reused_pages == 0 => self.whole_chunks(pages, lone_first, lone_last),
            Cut::Small => (
                crate::backend::new_chunks(pages - reused_pages, self.ordinary_chunk_pages())
                    .collect(),
                None,
            ),
            _ => (self.new_chunks(pages - reused_pages), None),
        };
        let mut chunks: Vec<u32> = reuse.iter().map(|c| c.pages).collect();
        let mut whole_at = self.kept_whole(&chunks, pages);
        whole_at.extend(whole_from.map(|from| from + reused_pages as u32));
        chunks.extend(&new_chunks);
        let result = self
            .backend
            .map_reusing(self.device, addr, size, &mut reuse, &new_chunks);
        // On an error the chunks taken are still ours, unmapped (those from `lent` still
        // mapped at their old address: back to it); chunks the driver would not take back are
        // kept.
        if result.is_err() {
            let back: Vec<PhysicalChunk> = reuse.drain(..lent_count).collect();
            self.begin_unmapping(sum_pages(&back));
            lent.extend(back);
        }
        {
            let mut spare = self.spare.lock();
            spare.append(&mut reuse);
            spare.append(&mut going);
            self.store_spare(&spare);
            self.in_flight_pages
                .fetch_sub(reused_pages + going_pages, Relaxed);
        }
        let created = result?;
        self.account_created(created);
        self.pages_reused.fetch_add(reused_pages, Relaxed);
        Ok(Mapped {
            created_pages: created,
            reused_pages,
            chunks,
            whole_at,
        })
    }

    /// How a miss cuts the `creating` pages it creates into chunks: `max_chunk_pages` each; or,
    /// for a run holding at least [`MIN_INSIDE_CHUNKS`] inside chunks between two of those,
    /// inside chunks between two ordinary ones. Such a run lies under one large block, whose
    /// pages are freed together; only its end pages may be shared with the blocks beside it, and
    /// a block there keeps its whole chunk mapped, so the ends stay small.
    ///
    /// Inside chunks are `inside_chunk_pages`, or larger where both the run and the cap the
    /// cache budget noted are ([`PageReserve::note_inside_cap`]): a quarter of the run at most,
    /// so that one chunk a block beside it pins holds little beside what the cache may keep
    /// idle anyway. The driver charges per chunk, not per byte (a grant of access took 44 µs
    /// for 2 MiB and 48 µs for 256 MiB on an H100): with 16 MiB chunks a process whose blocks
    /// are gigabytes paid hundreds of grants and as many unmaps a miss (a cold miss of 1 GiB:
    /// 66 chunks, 2.2–2.9 ms on an H200 where the driver's pool took 1.1 ms).
    fn new_chunks(&self, creating: u64) -> Vec<u32> {
        let cap = self.ordinary_chunk_pages();
        let Some(inside) = self.inside_chunk_pages_for(creating) else {
            return crate::backend::new_chunks(creating, cap).collect();
        };
        let inner = creating - 2 * cap as u64;
        let mut chunks = vec![cap];
        chunks.extend(crate::backend::new_chunks(inner, inside));
        chunks.push(cap);
        chunks
    }

    /// Gives back to the driver one kept chunk of `pages` pages, the one large chunk an arena
    /// has just unmapped to cut its pages again (chunks of one size are alike): the device then
    /// never holds more than before when the arena maps those pages again in smaller chunks
    /// (see `arena/pinning.rs`). False if no such chunk is kept any more (a miss on another
    /// pool of the device took it meanwhile): mapping then would hold more than the cache
    /// budget allowed, so the arena leaves the pages unmapped.
    pub fn release_one_kept(&self, pages: u32) -> Result<bool, BackendError> {
        let mut spare = self.spare.lock();
        let Some(at) = spare
            .iter()
            .position(|c| c.pages == pages && !self.lendings.holds(c.handle))
        else {
            return Ok(false);
        };
        let going = vec![spare.swap_remove(at)];
        let released = self.release(going, &mut spare);
        self.store_spare(&spare);
        released.map(|_| true)
    }

    /// Where whole chunks are cut, the kept chunks among `reused` (mapped again for a run of
    /// `pages`, from its start) that are larger than an ordinary cut of the run would make:
    /// once whole chunks, or inside chunks of a longer run, each now under one block alone.
    /// Marked whole, they are cut again when a smaller block lands on them, as a whole chunk
    /// is, instead of staying mapped whole under it.
    fn kept_whole(&self, reused: &[u32], pages: u64) -> Vec<u32> {
        if !self.cuts_whole_when_growing() || reused.is_empty() {
            return Vec::new();
        }
        let ordinary = self.new_chunks(pages).into_iter().max().unwrap_or(0);
        let mut at = 0;
        let mut whole = Vec::new();
        for &chunk in reused {
            if chunk > ordinary {
                whole.push(at);
            }
            at += chunk;
        }
        whole
    }

    /// [`Cut::Whole`] of `pages` new pages, or the ordinary cut where that has no more chunks.
    fn whole_chunks(
        &self,
        pages: u64,
        lone_first: bool,
        lone_last: bool,
    ) -> (Vec<u32>, Option<u32>) {
        let ends = u64::from(lone_first) + u64::from(lone_last);
        let ordinary = self.new_chunks(pages);
        if pages <= ends || pages - ends > u32::MAX as u64 || ordinary.len() as u64 <= ends + 1 {
            return (ordinary, None);
        }
        let mut chunks = Vec::with_capacity(3);
        if lone_first {
            chunks.push(1);
        }
        chunks.push((pages - ends) as u32);
        if lone_last {
            chunks.push(1);
        }
        (chunks, Some(u32::from(lone_first)))
    }

    /// The inside chunks of a run of `pages` new pages, if it is long enough to have any.
    fn inside_chunk_pages_for(&self, pages: u64) -> Option<u32> {
        let cap = self.ordinary_chunk_pages() as u64;
        let smallest = self.knobs.inside_chunk_pages() as u64;
        let long = smallest > cap && pages >= 2 * cap + MIN_INSIDE_CHUNKS * smallest;
        if !long {
            return None;
        }
        let inner = pages - 2 * cap;
        let inside = (inner / MIN_INSIDE_CHUNKS)
            .min(self.inside_cap_pages.load(Relaxed))
            .clamp(smallest, u32::MAX as u64);
        Some(inside as u32)
    }

    /// The smallest kept chunk worth mapping into a run of `pages`. Mapping a kept chunk costs
    /// a grant of access (~45 µs on an H100) whatever its size; creating one costs about 60 µs
    /// with its grant, and releasing a kept one ~20 µs. Where a run's inside chunks have grown
    /// past `inside_chunk_bytes`, kept chunks under a quarter of their size cost more grants
    /// than they save: they are released (smallest first, as many pages as the run creates)
    /// and the run gets large new chunks instead. Other runs take any kept chunk.
    fn smallest_worth_reusing(&self, pages: u64) -> u32 {
        match self.inside_chunk_pages_for(pages) {
            Some(inside) if inside > self.knobs.inside_chunk_pages() => inside / 4,
            _ => 1,
        }
    }

    /// Returns `going` to the driver and counts what went; what the driver refused goes back
    /// to `spare`. Returns the bytes released, or the driver's error.
    fn release(
        &self,
        mut going: Vec<PhysicalChunk>,
        spare: &mut Vec<PhysicalChunk>,
    ) -> Result<u64, BackendError> {
        let result = self.release_unlocked(&mut going);
        spare.extend(going);
        result
    }

    /// Returns `going` to the driver and counts what went, leaving in `going` what the driver
    /// refused. Returns the bytes released, or the driver's error.
    fn release_unlocked(&self, going: &mut Vec<PhysicalChunk>) -> Result<u64, BackendError> {
        // A chunk a miss detached may be back here while its old address is still mapped (the
        // GPU has passed it; nobody has unmapped it yet): it stays, for a later release.
        let mut still_lent = Vec::new();
        if self.lendings.any() {
            going.retain(|c| {
                let lent = self.lendings.holds(c.handle);
                if lent {
                    still_lent.push(*c);
                }
                !lent
            });
        }
        let before = sum_pages(going);
        let result = self.backend.release_chunks(self.device, going);
        let released = before - sum_pages(going);
        going.extend(still_lent);
        if released > 0 {
            self.held.shrink(released * self.page_size);
            self.pages_released.fetch_add(released, Relaxed);
        }
        result.map(|()| released * self.page_size)
    }

    fn account_created(&self, pages: u64) {
        if pages > 0 {
            self.held.grow(pages * self.page_size);
            self.pages_created.fetch_add(pages, Relaxed);
        }
    }

    fn store_spare(&self, spare: &[PhysicalChunk]) {
        let pages = spare.iter().map(|c| c.pages as u64).sum();
        self.spare_pages.store(pages, Relaxed);
    }

    /// Unmaps `[addr, addr + size)` (whole chunks) and keeps its chunks here (still held).
    pub fn unmap(&self, addr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let mut chunks = Vec::new();
        self.backend
            .unmap_keeping(self.device, addr, size, &mut chunks)?;
        let mut spare = self.spare.lock();
        spare.extend(chunks);
        self.store_spare(&spare);
        Ok(())
    }

    /// Returns kept chunks to the driver, largest first, until at most `keep_pages` pages are
    /// left; returns the bytes released. On an error, what was released before it is accounted
    /// all the same.
    pub fn trim(&self, keep_pages: u64) -> Result<u64, BackendError> {
        let mut spare = self.spare.lock();
        let kept: u64 = spare.iter().map(|c| c.pages as u64).sum();
        if kept <= keep_pages {
            return Ok(0);
        }
        spare.sort_unstable_by_key(|c| c.pages);
        let going = pop_pages(&mut spare, kept - keep_pages);
        let result = self.release(going, &mut spare);
        self.store_spare(&spare);
        result
    }
}

fn sum_pages(chunks: &[PhysicalChunk]) -> u64 {
    chunks.iter().map(|c| c.pages as u64).sum()
}

/// Pops chunks off the end of `spare` until they hold at least `pages` pages (or none is left).
fn pop_pages(spare: &mut Vec<PhysicalChunk>, pages: u64) -> Vec<PhysicalChunk> {
    let mut popped = Vec::new();
    let mut held = 0;
    while held < pages {
        let Some(chunk) = spare.pop() else { break };
        held += chunk.pages as u64;
        popped.push(chunk);
    }
    popped
}

/// Takes from `spare` the kept chunks of at least `smallest` pages to map into a run of `pages`:
/// largest first, each that still fits, so the run needs as few chunks as it can and as few new
/// pages.
fn take_fitting(spare: &mut Vec<PhysicalChunk>, pages: u64, smallest: u32) -> Vec<PhysicalChunk> {
    if spare.is_empty() {
        return Vec::new();
    }
    spare.sort_unstable_by_key(|c| std::cmp::Reverse(c.pages));
    let mut left = pages;
    let mut taken = Vec::new();
    spare.retain(|chunk| {
        if chunk.pages >= smallest && (chunk.pages as u64) <= left {
            left -= chunk.pages as u64;
            taken.push(*chunk);
            false
        } else {
            true
        }
    });
    taken
}

impl Drop for PageReserve {
    fn drop(&mut self) {
        self.lendings.settle_all(self);
        if let Err(error) = self.trim(0) {
            tracing::warn!(device = self.device, %error, "could not release kept pages at shutdown");
        }
    }
}

impl std::fmt::Debug for PageReserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageReserve")
            .field("device", &self.device)
            .field("spare_pages", &self.spare_pages())
            .finish_non_exhaustive()
    }
}
