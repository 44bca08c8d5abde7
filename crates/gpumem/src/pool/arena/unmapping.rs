//! Idle chunks on their way out of an arena: taken under the arena's lock, waited for and
//! unmapped into the page reserve after it is let go, so that a pool giving pages back (the
//! upkeep thread's rounds, `empty_cache` on another thread) never holds the lock its
//! allocating threads need across a driver call or a wait for the GPU. Until the driver has
//! unmapped them, no miss of the arena maps those pages again: it waits for them first.

use super::{Arena, ReleaseError, Released};
use crate::backend::{DevicePtr, StreamId};
use crate::pool::fences::WaitFor;
use crate::pool::lending::Lending;
use crate::pool::pages::PageRun;
use crate::pool::reserve::PageReserve;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What an arena has being unmapped outside its lock, shared with those doing it. Until the
/// arena has looked at it again, a chunk is out of its page table but maybe still mapped: being
/// unmapped, or refused by the driver (mapped still, to be marked idle again).
#[derive(Debug, Default)]
pub(crate) struct UnmapsInFlight {
    /// Pages taken and being unmapped now...
    unmapping: AtomicU64,
    /// ...and pages the driver refused to unmap, not yet back in the page table.
    refused_pages: AtomicU64,
    /// The chunks being unmapped now.
    chunks: Mutex<Vec<PageRun>>,
    /// The chunks refused, to be marked idle again by the arena under its lock
    /// ([`Arena::settle_unmaps`]).
    refused: Mutex<Vec<PageRun>>,
    /// Old addresses of lent chunks the driver refused to unmap, tried again later: no
    /// longer waited for, still held off in the index (`old_addresses.rs`).
    held_off: Mutex<Vec<PageRun>>,
    /// How many lendings of the arena's pages have been settled: the arena then frees what
    /// held their old addresses (`old_addresses.rs`).
    pub(super) lendings_ended: AtomicU64,
}

impl UnmapsInFlight {
    /// Whether any chunk is out of the page table and maybe mapped (two loads: asked on misses
    /// only).
    fn any(&self) -> bool {
        self.unmapping.load(Ordering::Acquire) + self.refused_pages.load(Ordering::Acquire) > 0
    }

    /// Whether any of `runs` is out of the page table and maybe mapped: being unmapped, or
    /// refused. A chunk moves from the first list to the second (pushed there before it leaves
    /// the first), so looking at them in this order never misses one in between.
    fn overlaps(&self, runs: &[PageRun]) -> bool {
        meets(&self.chunks.lock(), runs) || meets(&self.refused.lock(), runs)
    }

    pub(crate) fn done(&self, chunks: &[PageRun], refused: &[PageRun]) {
        if !refused.is_empty() {
            // Counted as refused before they stop counting as being unmapped: while they are out
            // of the page table, a miss always sees them counted as one or the other.
            let pages: u64 = refused.iter().map(|c| c.count as u64).sum();
            self.refused.lock().extend_from_slice(refused);
            self.refused_pages.fetch_add(pages, Ordering::AcqRel);
        }
        let mut taken = self.chunks.lock();
        taken.retain(|c| !chunks.contains(c));
        let pages: u64 = chunks.iter().map(|c| c.count as u64).sum();
        self.unmapping.fetch_sub(pages, Ordering::AcqRel);
    }

    /// Whether `run` is still being unmapped, or held off after the driver refused to unmap
    /// it: no block may be placed on it.
    pub(super) fn is_in_flight(&self, run: PageRun) -> bool {
        self.chunks.lock().contains(&run) || self.held_off.lock().contains(&run)
    }

    /// Old addresses of lent chunks the driver would not unmap: no longer being unmapped (no
    /// one waits for them), still out of reach of new blocks until
    /// [`release_held_off`](Self::release_held_off).
    pub(crate) fn hold_off(&self, runs: &[PageRun]) {
        if runs.is_empty() {
            return;
        }
        self.held_off.lock().extend_from_slice(runs);
        self.done(runs, &[]);
    }

    /// `runs`, held off, are unmapped now.
    pub(crate) fn release_held_off(&self, runs: &[PageRun]) {
        if !runs.is_empty() {
            self.held_off.lock().retain(|run| !runs.contains(run));
        }
    }

    /// Whether an old address the driver refused to unmap is still mapped in the arena.
    pub(super) fn any_held_off(&self) -> bool {
        !self.held_off.lock().is_empty()
    }

    /// A lending of the arena's pages ended (after [`done`](Self::done) with its chunks).
    pub(crate) fn lending_ended(&self) {
        self.lendings_ended.fetch_add(1, Ordering::AcqRel);
    }

    /// Waits until nothing is being unmapped.
    fn wait_until_none(&self) {
        crate::pool::short_wait::until(|| self.unmapping.load(Ordering::Acquire) == 0);
    }

    /// Waits until none of `runs` is being unmapped (refused chunks aside: the arena puts
    /// those back itself). Chunks a miss lent count as being unmapped until the GPU has passed
    /// their old address, which may be long after: a miss waits only for those under its block
    /// (ended first by whoever calls this), not for every one of the arena.
    fn wait_until_none_under(&self, runs: &[PageRun]) {
        crate::pool::short_wait::until(|| !meets(&self.chunks.lock(), runs));
    }
}

/// Whether any of `chunks` shares a page with any of `runs`.
fn meets(chunks: &[PageRun], runs: &[PageRun]) -> bool {
    runs.iter().any(|run| {
        chunks
            .iter()
            .any(|chunk| chunk.overlaps(run.first, run.end() - 1))
    })
}

/// Idle chunks taken out of an arena, to be unmapped by [`Unmapping::finish`] with or without
/// the arena's lock. Their pages count as the reserve's (held, unmapped) from the moment they
/// are taken, so the cache budget never sees less held than there is.
#[must_use = "taken chunks must be unmapped (finish) or the arena never maps those pages again"]
pub(crate) struct Unmapping {
    device: usize,
    stream: StreamId,
    /// (the chunk's pages in the arena, its address, its bytes), in the order taken.
    chunks: Vec<(PageRun, DevicePtr, u64)>,
    wait: WaitFor,
    in_flight: Arc<UnmapsInFlight>,
}

impl Unmapping {
    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Waits for the work queued before the pages went idle, then unmaps them into the reserve.
    /// Chunks the driver refused stay mapped and go back to the arena, idle. Returns what was
    /// unmapped, with the order below which the arena's idle pages are now past their work.
    pub(crate) fn finish(self, reserve: &PageReserve) -> (Result<Released, ReleaseError>, u64) {
        let backend = reserve.backend();
        let pages: Vec<PageRun> = self.chunks.iter().map(|&(run, _, _)| run).collect();
        let mut released = Released::default();
        let wait_started = (self.wait != WaitFor::Nothing).then(std::time::Instant::now);
        let waited = self.wait.wait(backend, self.device, self.stream);
        if let Some(started) = wait_started {
            let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            reserve.gpu_wait_ns.record(ns);
        }
        let outcome = match waited {
            Err(error) => Err((0, error)),
            Ok(cleared) => {
                let mut failed = None;
                for (index, &(run, addr, bytes)) in self.chunks.iter().enumerate() {
                    if let Err(error) = reserve.unmap(addr, bytes) {
                        failed = Some((index, error));
                        break;
                    }
                    // Kept in the reserve now: no longer counted as on its way there.
                    reserve.end_unmapping(run.count as u64);
                    released.bytes += bytes;
                    released.calls += 1;
                }
                match failed {
                    None => Ok(cleared),
                    Some(failure) => Err(failure),
                }
            }
        };
        match outcome {
            Ok(cleared) => {
                self.in_flight.done(&pages, &[]);
                (Ok(released), cleared)
            }
            Err((index, error)) => {
                // Still mapped: the arena's again once it marks them idle.
                let refused = &pages[index..];
                reserve.end_unmapping(refused.iter().map(|c| c.count as u64).sum());
                self.in_flight.done(&pages, refused);
                (Err(ReleaseError { released, error }), 0)
            }
        }
    }

    /// Instead of waiting for the GPU and unmapping ([`finish`](Self::finish)): detaches the
    /// chunks, still mapped at their old addresses, to lend them to the miss that took them
    /// (`pool/lending.rs`). Returned unchanged where nothing had to be waited for (unmapping
    /// then costs no wait) or no fence can be had; its wait is then the fence this call
    /// recorded, if any. A chunk the backend would not detach (nothing the driver does: only
    /// a table out of step) is waited for and unmapped here, with those after it.
    pub(crate) fn lend(mut self, reserve: &PageReserve) -> Result<Lending, Unmapping> {
        let backend = reserve.backend();
        let fence = match self.wait {
            WaitFor::Nothing => return Err(self),
            WaitFor::Fence { fence, .. } => fence,
            WaitFor::Stream { clears } => match backend.record_fence(self.device, self.stream) {
                Ok(fence) => {
                    self.wait = WaitFor::Fence { fence, clears };
                    fence
                }
                Err(_) => return Err(self),
            },
        };
        let mut chunks = Vec::new();
        let mut detached = 0;
        for &(_, addr, bytes) in &self.chunks {
            if let Err(error) = backend.detach_keeping(self.device, addr, bytes, &mut chunks) {
                tracing::warn!(device = self.device, %error, "could not detach idle pages; waiting for the GPU instead");
                break;
            }
            detached += 1;
        }
        if detached == 0 {
            return Err(self);
        }
        let rest = self.chunks.split_off(detached);
        if !rest.is_empty() {
            let unmapping = Unmapping {
                device: self.device,
                stream: self.stream,
                chunks: rest,
                wait: WaitFor::Stream { clears: 0 },
                in_flight: Arc::clone(&self.in_flight),
            };
            let _ = unmapping.finish(reserve);
        }
        Ok(Lending {
            ranges: self.chunks,
            fence,
            handles: chunks.iter().map(|c| c.handle).collect(),
            chunks,
            stream: self.stream,
            held_off: false,
            in_flight: self.in_flight,
        })
    }
}

impl Arena {
    /// Takes idle chunks, oldest first, while `keep_going(pages_taken, idle_since)` says so, and
    /// passing over those `spare` names: out of the page table, into the reserve's count of
    /// pages being unmapped, with what their unmapping must wait for. Pages idle since a fence
    /// the stream has not passed are taken only if `wait` (else they stay for a later try).
    pub(crate) fn take_for_unmapping(
        &mut self,
        reserve: &PageReserve,
        keep_going: impl FnMut(usize, u64) -> bool,
        spare: impl Fn(PageRun) -> bool,
        wait: bool,
    ) -> Unmapping {
        let backend = reserve.backend();
        reserve.lendings.settle_passed(reserve);
        self.settle_unmaps();
        let mut unmapping = Unmapping {
            device: self.device,
            stream: self.stream,
            chunks: Vec::new(),
            wait: WaitFor::Nothing,
            in_flight: Arc::clone(&self.unmaps),
        };
        // Not waiting for a busy stream: only the pages that went idle before a fence it has
        // passed may go.
        let mut idle_before = u64::MAX;
        if !wait
            && !backend
                .stream_idle(self.device, self.stream)
                .unwrap_or(false)
        {
            idle_before = self.fences.cleared_below(backend, self.device);
            if idle_before == 0 {
                return unmapping;
            }
        }
        // Complete a parked block's free first: its pages can then go idle and be released
        // (a cache being emptied must reach them), and it is never handed out again after.
        self.unpark();
        self.fence_idle_pages(backend);
        let chunks = self.pages.take_idle(keep_going, spare, idle_before);
        if chunks.is_empty() {
            return unmapping;
        }
        // An idle stream has nothing queued that could touch the pages; a busy one has nothing
        // that touches these (they went idle before a fence that has passed), unless waiting,
        // when the unmapping waits for the oldest fence after them or else the stream.
        if wait {
            let newest = self.pages.newest_order(&chunks);
            unmapping.wait = self
                .fences
                .wait_target(backend, self.device, self.stream, newest);
        }
        let pages: u64 = chunks.iter().map(|c| c.count as u64).sum();
        reserve.begin_unmapping(pages);
        self.unmaps.chunks.lock().extend_from_slice(&chunks);
        self.unmaps.unmapping.fetch_add(pages, Ordering::AcqRel);
        unmapping.chunks = chunks
            .into_iter()
            .map(|run| {
                let (addr, bytes) = self.run_range(run);
                (run, addr, bytes)
            })
            .collect();
        if self.pages.mapped_pages() == 0 {
            // Holding nothing, the arena is as new: growing again is growth (`pinning.rs`).
            self.mapped_high = 0;
        }
        unmapping
    }

    /// After an [`Unmapping`] finished with the arena at hand: the fences it waited past.
    pub(crate) fn unmapped(&mut self, reserve: &PageReserve, cleared: u64) {
        if cleared > 0 {
            self.fences.cleared(reserve.backend(), self.device, cleared);
        }
        self.settle_unmaps();
    }

    /// Marks idle again the chunks the driver refused to unmap outside the lock.
    pub(crate) fn settle_unmaps(&mut self) {
        if self.unmaps.refused_pages.load(Ordering::Acquire) == 0 {
            return;
        }
        let refused = std::mem::take(&mut *self.unmaps.refused.lock());
        let now = crate::clock::now();
        let mut pages = 0;
        for chunk in refused {
            self.pages.restore_idle(chunk, now);
            pages += chunk.count as u64;
        }
        self.unmaps.refused_pages.fetch_sub(pages, Ordering::AcqRel);
        // Taking them may have reset the high mark (an arena left with nothing mapped).
        self.mapped_high = self.mapped_high.max(self.pages.mapped_pages());
    }

    /// Before a miss maps the pages in `self.runs`: if any of them is still being unmapped
    /// (given back on another thread), waits for it, then puts back what the driver refused
    /// and looks again at which of the block's pages are unmapped.
    pub(crate) fn wait_for_unmaps_under(&mut self, reserve: &PageReserve, first: u32, last: u32) {
        if !self.unmaps.any() {
            return;
        }
        reserve.lendings.settle_passed(reserve);
        if !self.unmaps.overlaps(&self.runs) {
            return;
        }
        // Old addresses of chunks a miss lent are unmapped once the GPU has passed them: those
        // under the block are waited for.
        let runs = &self.runs;
        reserve
            .lendings
            .settle_with(reserve, |lending| lending.blocks(&self.unmaps, runs));
        self.unmaps.wait_until_none_under(runs);
        self.settle_unmaps();
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        self.pages.unmapped_runs(first, last, &mut runs);
        self.runs = runs;
    }

    /// Whether an old address of chunks a miss lent is still mapped because the driver refused
    /// to unmap it: the arena's address range must not go back yet.
    pub(crate) fn holds_off_old_addresses(&self) -> bool {
        self.unmaps.any_held_off()
    }

    /// Before the arena's address range goes back: nothing may be left being unmapped in it
    /// (an old address the driver refused to unmap stays mapped:
    /// [`holds_off_old_addresses`](Self::holds_off_old_addresses)).
    pub(crate) fn wait_for_all_unmaps(&mut self, reserve: &PageReserve) {
        let unmaps = &self.unmaps;
        reserve
            .lendings
            .settle_with(reserve, |lending| lending.blocks_any(unmaps));
        self.unmaps.wait_until_none();
        self.settle_unmaps();
    }
}
