//! Where a block goes: the index's fit, or, with `place_on_mapped_pages`, free bytes whose
//! pages are mapped already when the fit would land on pages that are not.
//!
//! The index (TLSF) picks a free block by size alone. When the arena's layout changes from one
//! step to the next, that block often lies on pages the cache has unmapped, while idle mapped
//! pages sit elsewhere in free blocks too small or too far down the index's lists: the miss
//! then unmaps those idle pages to stay within the cache budget and maps them again under the
//! block, paying the driver twice. Placed on a free stretch of mapped pages instead, the request
//! is a hit. Off by default: blocks moved into the cache's idle pages leave less room for the
//! next large block, and on the trace corpus the peaks rose (docs/performance.md, "Placing a
//! block on mapped pages").

use super::{Arena, ArenaError};
use crate::pool::tlsf::{BlockState, LiveInfo};

impl Arena {
    /// Takes a free block for `size` bytes aligned to `align` and leaves in `self.runs` the
    /// pages under it that are not mapped. Where the index's fit lands on unmapped pages and
    /// the setting is on, the block goes to the smallest free stretch wholly on mapped pages
    /// that holds it, if any does; `on_mapped_pages` turns the setting on for this call (the
    /// device's cache settings say so; read only once the fit has missed).
    pub(super) fn place(
        &mut self,
        size: u64,
        align: u64,
        live: &LiveInfo,
        on_mapped_pages: impl FnOnce() -> bool,
    ) -> Result<u32, ArenaError> {
        self.free_passed_old_addresses();
        let block = self
            .tlsf
            .alloc(size, align, live)
            .ok_or(ArenaError::AddressSpaceFull)?;
        self.runs.clear();
        let (first, last) = self.page_span(self.tlsf.block(block).offset, size);
        self.pages.unmapped_runs(first, last, &mut self.runs);
        if self.runs.is_empty() || !(self.place_on_mapped_pages || on_mapped_pages()) {
            return Ok(block);
        }
        let Some((holder, offset)) = self.smallest_cached_stretch(size, align) else {
            return Ok(block);
        };
        // Freeing the fit merges it with its free neighbours; if the stretch's block was the
        // one after it, that block is now part of the merged one.
        let merged = self.tlsf.free(block);
        let holder = if self.tlsf.block(holder).state == BlockState::Vacant {
            merged
        } else {
            holder
        };
        self.runs.clear();
        Ok(self.tlsf.alloc_at(holder, offset, size, live))
    }

    /// The free block and offset of the smallest stretch of free bytes lying wholly in mapped
    /// pages that holds `size` bytes at an `align`ed offset, if any does (the lowest on a tie).
    fn smallest_cached_stretch(&self, size: u64, align: u64) -> Option<(u32, u64)> {
        let mut best: Option<(u64, u32, u64)> = None;
        for (block, start, end) in self.cached_free_stretches(size) {
            let at = crate::units::align_up(start, align);
            let len = end - start;
            let better = best.is_none_or(|(best_len, _, best_at)| {
                len < best_len || (len == best_len && at < best_at)
            });
            if at + size <= end && better {
                best = Some((len, block, at));
            }
        }
        best.map(|(_, block, at)| (block, at))
    }

    /// Every stretch of free bytes lying wholly in mapped pages, in free blocks of at least
    /// `size` bytes: (free block, start, end).
    pub(super) fn cached_free_stretches(
        &self,
        size: u64,
    ) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        let shift = self.page_shift;
        self.tlsf
            .free_blocks_at_least(size)
            .flat_map(move |(index, block)| {
                let end = block.offset + block.size;
                let (first, last) = self.page_span(block.offset, block.size);
                // Mapped runs are maximal, so each is one stretch of cached bytes, cut to the block.
                self.pages.mapped_runs(first, last).map(move |run| {
                    let start = ((run.first as u64) << shift).max(block.offset);
                    let stop = ((run.end() as u64) << shift).min(end);
                    (index, start, stop)
                })
            })
    }
}
