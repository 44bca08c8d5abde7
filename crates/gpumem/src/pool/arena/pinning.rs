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

use super::{Arena, Released};
use crate::pool::reserve::PageReserve;
use crate::pool::BusyStreams;

impl Arena {
    /// Whether mapping `self.runs` (the pages a placement lacks) would take the arena past the
    /// most pages it has had mapped.
    pub(super) fn would_set_a_new_high(&self) -> bool {
        let wanted: usize = self.runs.iter().map(|run| run.count as usize).sum();
        self.pages.mapped_pages() + wanted > self.mapped_high
    }

    /// Unmaps into the reserve the idle inside chunks a block on `first..=last` would pin, and
    /// recomputes the pages it lacks (`self.runs`). What the driver refuses to unmap stays mapped
    /// and pinned: a lost saving, not an error.
    pub(super) fn give_back_chunks_it_would_pin(
        &mut self,
        reserve: &PageReserve,
        first: u32,
        last: u32,
    ) {
        let mut victims = Vec::new();
        let ordinary = reserve.ordinary_chunk_pages();
        self.pages
            .chunks_a_block_would_pin(first, last, ordinary, &mut victims);
        if victims.is_empty() {
            return;
        }
        let released = self.release_pages(
            reserve,
            |_, _| true,
            |chunk| !victims.contains(&chunk),
            BusyStreams::Wait,
        );
        self.count_released_while_allocating(released.unwrap_or_else(|e| e.released));
        self.runs.clear();
        self.pages.unmapped_runs(first, last, &mut self.runs);
    }

    /// Adds to what this allocation unmapped, reported once it ends
    /// ([`take_released_while_allocating`](Self::take_released_while_allocating)).
    pub(super) fn count_released_while_allocating(&mut self, released: Released) {
        self.released_while_allocating.bytes += released.bytes;
        self.released_while_allocating.calls += released.calls;
    }
}
