//! Keeping blocks off the old addresses of chunks a miss lent (`stream_ordered_reuse`): until
//! the GPU has passed them, those addresses are still mapped, and a block placed there could
//! be mapped only after waiting for the GPU. Each old address is held in the index by a block
//! no one is handed, so placements go elsewhere in the arena's address range (plentiful) and
//! the miss that needs room lends again instead of waiting; the holder goes once the lending
//! has ended.

use super::Arena;
use crate::pool::lending::Lending;
use crate::pool::pages::PageRun;
use crate::pool::tlsf::LiveInfo;
use std::sync::atomic::Ordering;

/// The arena's held old addresses, and how many lendings had ended when it last looked.
#[derive(Debug, Default)]
pub(super) struct OldAddresses {
    /// (the pages, the index block holding them).
    holders: Vec<(PageRun, u32)>,
    ended_seen: u64,
}

impl OldAddresses {
    /// Whether the block at `block_offset` holds an old address (no one was handed it).
    pub(super) fn holds(&self, block_offset: u64, page_shift: u32) -> bool {
        self.holders
            .iter()
            .any(|(run, _)| (u64::from(run.first) << page_shift) == block_offset)
    }

    pub(super) fn count(&self) -> usize {
        self.holders.len()
    }
}

impl Arena {
    /// Holds `lending`'s old addresses in the index. They lie in free space: their pages were
    /// idle, so no block is on them, and free neighbours are merged, so one free block holds
    /// each. One not found (never expected) is left to the wait a miss placed there makes.
    pub(super) fn hold_old_addresses(&mut self, lending: &Lending) {
        for &(run, addr, bytes) in &lending.ranges {
            let offset = addr - self.base;
            let holder = self
                .tlsf
                .free_blocks_at_least(bytes)
                .find(|(_, b)| b.offset <= offset && offset + bytes <= b.offset + b.size)
                .map(|(index, _)| index);
            if let Some(holder) = holder {
                let held = self
                    .tlsf
                    .alloc_at(holder, offset, bytes, &LiveInfo::default());
                self.old_addresses.holders.push((run, held));
            }
        }
    }

    /// Frees the holders of old addresses whose lending has ended (the GPU passed them and
    /// they were unmapped). One atomic load while none has ended since the last look: this is
    /// on every placement.
    #[inline]
    pub(super) fn free_passed_old_addresses(&mut self) {
        if self.old_addresses.holders.is_empty() {
            return;
        }
        let ended = self.unmaps.lendings_ended.load(Ordering::Acquire);
        if ended == self.old_addresses.ended_seen {
            return;
        }
        self.old_addresses.ended_seen = ended;
        let Self {
            old_addresses,
            tlsf,
            unmaps,
            ..
        } = self;
        old_addresses.holders.retain(|&(run, holder)| {
            let pending = unmaps.is_in_flight(run);
            if !pending {
                tlsf.free(holder);
            }
            pending
        });
    }
}
