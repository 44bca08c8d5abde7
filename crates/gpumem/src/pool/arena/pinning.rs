//! Chunks a new block would pin, given back first when the arena is about to map more pages than
//! it ever has: the moment pinning costs memory.
//!
//! A chunk is unmapped whole or not at all, so a block placed on a corner of a wholly idle chunk
//! keeps all of it mapped while it lives. Below the arena's high-water mark of mapped pages that
//! costs nothing the arena has not held before, and the idle pages stay ready for the next block
//! of the size that made the chunk. At a new high they are pages held beside the new ones, at
//! the moment the peak is set. Then a long miss's inside chunk (larger than an ordinary miss's)
//! that the block would cover less than half of goes back to the reserve first, and the block
//! maps only its own pages. Measured on the simulated H100 (docs/performance.md): detect_multiscale
//! 1.0316 -> 1.0235 and vae_decode 1.0132 -> 1.0100 of their peaks, misses unchanged across the
//! corpus; applied at every placement instead, it cost 1.6x the misses. A CUDA graph's pool never
//! does this: a captured graph may still use the idle chunk's addresses.
//!
//! With `whole_chunks_when_growing` on, a miss at a new high maps its block's own pages as one
//! chunk (the driver charges per chunk), and a smaller block that later lands on such a chunk
//! cuts it again around itself: its own pages as an ordinary miss would cut them, the rest in
//! chunks of the ordinary size. Off by default: it costs misses and time on traces whose
//! layout changes every step (docs/performance.md).

use super::{Arena, Released};
use crate::pool::miss_clock::{MissClock, MissTime};
use crate::pool::pages::{PageRun, Pinned};
use crate::pool::reserve::{Cut, PageReserve};
use crate::pool::BusyStreams;

/// The pieces of `chunk` before, under and after a block on `first..=last`, cut apart so that
/// each is cut again on its own: the block's pages in chunks of their own, as a miss for the
/// block alone would have made them, and the rest in chunks whose ends meet the block's, so
/// that neither the block nor a later neighbour keeps the other's pages mapped.
fn around(chunk: PageRun, first: u32, last: u32) -> impl Iterator<Item = PageRun> {
    let under_from = first.clamp(chunk.first, chunk.end());
    let under_to = (last + 1).clamp(chunk.first, chunk.end());
    [
        (chunk.first, under_from),
        (under_from, under_to),
        (under_to, chunk.end()),
    ]
    .into_iter()
    .filter(|(from, to)| from < to)
    .map(|(from, to)| PageRun {
        first: from,
        count: to - from,
    })
}

/// What [`Arena::recut_whole_chunks_it_would_pin`] mapped again, and how long it took.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Recut {
    pub(super) mapped: Released,
    pub(super) time: MissTime,
}

/// How a placement cuts the pages it creates: [`Cut::Whole`] for a block on `first..=last`,
/// with a lone chunk for each end page the block may share with a neighbour.
#[derive(Clone, Copy, Debug)]
pub(crate) enum BlockCut {
    Ordinary,
    Whole {
        first: u32,
        last: u32,
        shared_first: bool,
        shared_last: bool,
    },
}

impl BlockCut {
    /// The cut of one of the block's unmapped runs: only the block's own end pages are lone.
    pub(super) fn for_run(self, run: PageRun) -> Cut {
        match self {
            BlockCut::Ordinary => Cut::Ordinary,
            BlockCut::Whole {
                first,
                last,
                shared_first,
                shared_last,
            } => Cut::Whole {
                lone_first: shared_first && run.first == first,
                lone_last: shared_last && run.end() - 1 == last,
            },
        }
    }
}

impl Arena {
    /// Whether mapping `self.runs` (the pages a placement lacks) would take the arena past the
    /// most pages it has had mapped.
    pub(super) fn would_set_a_new_high(&self) -> bool {
        let wanted: usize = self.runs.iter().map(|run| run.count as usize).sum();
        self.pages.mapped_pages() + wanted > self.mapped_high
    }

    /// How a block at `offset` of `size` bytes, placed at a new high, cuts the pages it
    /// creates: as few chunks as its ends allow. A growing arena (a model loading, a first
    /// step) pays the driver per chunk, not per byte, and its blocks have no smaller blocks
    /// beside them yet to pin anything; when one lands on such a chunk later, the chunk is cut
    /// again first ([`recut_whole_chunks_it_would_pin`](Self::recut_whole_chunks_it_would_pin)).
    pub(super) fn growth_cut(&self, offset: u64, size: u64) -> BlockCut {
        let (first, last) = self.page_span(offset, size);
        let in_page = self.page_size - 1;
        BlockCut::Whole {
            first,
            last,
            shared_first: offset & in_page != 0,
            shared_last: (offset + size) & in_page != 0,
        }
    }

    /// Unmaps into the reserve the idle inside chunks a block on `first..=last` would pin (at a
    /// new high: see the module's documentation), and recomputes the pages it lacks
    /// (`self.runs`). What the driver refuses to unmap stays mapped and pinned: a lost saving,
    /// not an error.
    pub(super) fn give_back_chunks_it_would_pin(
        &mut self,
        reserve: &PageReserve,
        first: u32,
        last: u32,
    ) {
        let mut victims = Vec::new();
        let inside = Pinned::UnderHalfOfLargerThan(reserve.ordinary_chunk_pages());
        self.pages
            .chunks_a_block_would_pin(first, last, inside, &mut victims);
        if victims.is_empty() {
            return;
        }
        self.unmap_into_reserve(reserve, &victims);
        self.runs.clear();
        self.pages.unmapped_runs(first, last, &mut self.runs);
    }

    /// Cuts again any wholly idle whole chunk (sized for the one block that made it, or mapped
    /// again from the reserve under a block of its size) that a block on `first..=last` would
    /// cover in part, at any placement: the chunk is unmapped and released, and its pages
    /// mapped again, still idle, cut [`around`] the block, so that the block keeps only its own
    /// pages mapped and the smaller blocks that come after it pin at most an ordinary chunk.
    /// A growing arena paid for one chunk, and pays for the smaller ones only if smaller blocks
    /// come to use its pages. What the driver refuses leaves the pages unmapped (the block maps
    /// its own) or the chunk mapped and pinned: a lost saving, not an error. So does a chunk
    /// another pool's miss took from the reserve meanwhile (its pages stay unmapped).
    /// Recomputes the pages the block lacks (`self.runs`).
    pub(super) fn recut_whole_chunks_it_would_pin(
        &mut self,
        reserve: &PageReserve,
        first: u32,
        last: u32,
    ) -> Recut {
        // Whole chunks exist only where the setting is on.
        if !reserve.cuts_whole_when_growing() || self.pages.idle_pages() == 0 {
            return Recut::default();
        }
        let mut victims = Vec::new();
        self.pages
            .chunks_a_block_would_pin(first, last, Pinned::WholeInPart, &mut victims);
        if victims.is_empty() {
            return Recut::default();
        }
        let clock = MissClock::start(reserve.backend());
        self.unmap_into_reserve(reserve, &victims);
        let mut recut = Recut::default();
        for victim in victims {
            if self
                .pages
                .mapped_runs(victim.first, victim.first)
                .next()
                .is_some()
            {
                continue; // the driver would not unmap it
            }
            match reserve.release_one_kept(victim.count) {
                Ok(true) => {}
                Ok(false) => continue, // taken meanwhile: the block maps its own pages
                Err(error) => {
                    tracing::debug!(device = self.device, %error, "could not release a whole chunk to cut it again");
                    continue;
                }
            }
            for piece in around(victim, first, last) {
                let (addr, bytes) = self.run_range(piece);
                let under_block = piece.overlaps(first, last);
                let cut = if under_block {
                    Cut::Ordinary
                } else {
                    Cut::Small
                };
                match reserve.map(addr, bytes, cut) {
                    Ok(mapped) => {
                        self.pages
                            .mark_mapped(piece, &mapped.chunks, crate::clock::now());
                        recut.mapped.bytes += bytes;
                        recut.mapped.calls += 1;
                    }
                    Err(error) => {
                        tracing::debug!(device = self.device, %error, "could not map a recut chunk's pages again");
                    }
                }
            }
        }
        self.runs.clear();
        self.pages.unmapped_runs(first, last, &mut self.runs);
        recut.time = clock.stop(reserve.backend());
        recut
    }

    /// Unmaps `victims` (wholly idle chunks) into the reserve, counted as this allocation's.
    fn unmap_into_reserve(&mut self, reserve: &PageReserve, victims: &[PageRun]) {
        let released = self.release_pages(
            reserve,
            |_, _| true,
            |chunk| !victims.contains(&chunk),
            BusyStreams::Wait,
        );
        self.count_released_while_allocating(released.unwrap_or_else(|e| e.released));
    }

    /// Adds to what this allocation unmapped, reported once it ends
    /// ([`take_released_while_allocating`](Self::take_released_while_allocating)).
    pub(super) fn count_released_while_allocating(&mut self, released: Released) {
        self.released_while_allocating.bytes += released.bytes;
        self.released_while_allocating.calls += released.calls;
    }
}
