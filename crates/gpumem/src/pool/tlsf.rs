//! Two-level segregated fit (TLSF) index over one address range: O(1) best-fit-like block
//! search, splitting, and coalescing with free neighbours. Pure bookkeeping on offsets; the
//! arena above it decides which pages are backed by device memory.

/// Smallest block and the rounding unit of every request, as in PyTorch's allocator.
pub const MIN_BLOCK: u64 = 512;
/// "No block" in the intrusive lists.
pub(crate) const NIL: u32 = u32::MAX;

/// Each power-of-two size range is split into 2^SL_LOG2 bins.
const SL_LOG2: u32 = 5;
const SL_COUNT: usize = 1 << SL_LOG2;
const FL_COUNT: usize = 64;
/// How many blocks of the request's own bin are compared to find the best fit there.
const EXACT_BIN_SCAN: usize = 16;

/// What is known about a live allocation, for the leak tracker. Kept in the block itself, so
/// tracking costs no extra map insert on the hot path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveInfo {
    pub id: u64,
    pub requested: u64,
    /// When it was allocated, in [`crate::clock`] ticks (0 when tracking is off).
    pub created_ticks: u64,
    pub tag: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockState {
    Free,
    Used,
    /// A slab slot not describing any block (reusable).
    Vacant,
}

#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub offset: u64,
    pub size: u64,
    pub state: BlockState,
    pub live: LiveInfo,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
}

/// The index: a slab of blocks, physically linked in address order, free ones also in bins.
pub(crate) struct Tlsf {
    blocks: Vec<Block>,
    vacant: Vec<u32>,
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    heads: Box<[[u32; SL_COUNT]; FL_COUNT]>,
    free_bytes: u64,
    used_blocks: usize,
}

#[inline]
fn bin_of(size: u64) -> (usize, usize) {
    let fl = 63 - size.leading_zeros();
    let sl = (size >> (fl - SL_LOG2)) as usize & (SL_COUNT - 1);
    (fl as usize, sl)
}

impl Tlsf {
    /// An index over `[0, size)`, all free. `size` is a multiple of [`MIN_BLOCK`].
    pub(crate) fn new(size: u64) -> Self {
        let mut tlsf = Tlsf {
            blocks: Vec::new(),
            vacant: Vec::new(),
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            heads: Box::new([[NIL; SL_COUNT]; FL_COUNT]),
            free_bytes: 0,
            used_blocks: 0,
        };
        let first = tlsf.new_block(0, size, NIL, NIL);
        tlsf.insert_free(first);
        tlsf.free_bytes = size;
        tlsf
    }

    pub(crate) fn block(&self, index: u32) -> &Block {
        &self.blocks[index as usize]
    }

    /// Free bytes right after block `index`: the size of the next block if it is free.
    pub(crate) fn free_after(&self, index: u32) -> u64 {
        let next = self.blocks[index as usize].next_phys;
        if next == NIL || self.blocks[next as usize].state != BlockState::Free {
            return 0;
        }
        self.blocks[next as usize].size
    }

    /// Records a used block's new owner (a block handed out again without a search).
    pub(crate) fn set_live(&mut self, index: u32, live: &LiveInfo) {
        debug_assert_eq!(self.blocks[index as usize].state, BlockState::Used);
        self.blocks[index as usize].live = *live;
    }

    #[cfg(test)]
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    pub(crate) fn used_blocks(&self) -> usize {
        self.used_blocks
    }

    /// Every block that is not vacant, in slab order.
    pub(crate) fn blocks(&self) -> impl Iterator<Item = &Block> {
        self.blocks.iter().filter(|b| b.state != BlockState::Vacant)
    }

    /// Every free block of at least `size` bytes with its index, from the bins that can hold
    /// such blocks only: what it costs grows with those blocks, not with the blocks in use, the
    /// smaller free ones or the empty bins (the bitmaps name the next non-empty bin; testing
    /// each of the two thousand bins in turn took most of a placement's time).
    pub(crate) fn free_blocks_at_least(&self, size: u64) -> impl Iterator<Item = (u32, &Block)> {
        let (fl, sl) = bin_of(size.max(MIN_BLOCK));
        let first = if self.sl_bitmap[fl] & (1 << sl) != 0 {
            Some((fl, sl))
        } else {
            self.next_nonempty_bin(fl, sl)
        };
        std::iter::successors(first, |&(fl, sl)| self.next_nonempty_bin(fl, sl))
            .flat_map(move |(fl, sl)| {
                // A bin whose bit is set has a head; its list ends at NIL.
                std::iter::successors(Some(self.heads[fl][sl]), move |&index| {
                    let next = self.blocks[index as usize].next_free;
                    (next != NIL).then_some(next)
                })
            })
            .map(move |index| (index, &self.blocks[index as usize]))
            .filter(move |(_, b)| b.size >= size)
    }

    /// Finds and takes a block of exactly `size` bytes at an offset aligned to `align`.
    /// `size` is a multiple of [`MIN_BLOCK`]; `align` a power of two. Returns the block's index.
    #[inline]
    pub(crate) fn alloc(&mut self, size: u64, align: u64, live: &LiveInfo) -> Option<u32> {
        let padded = if align <= MIN_BLOCK {
            size
        } else {
            size + align - MIN_BLOCK
        };
        let index = self.find_fit(padded)?;
        self.remove_free(index);
        // Every offset is a multiple of MIN_BLOCK, so smaller alignments hold already.
        let index = if align <= MIN_BLOCK {
            index
        } else {
            self.split_front_for_alignment(index, align)
        };
        self.take(index, size, live);
        Some(index)
    }

    /// Takes `size` bytes at `offset` out of the free block `index`, which must hold them;
    /// what lies before and after stays free. Returns the new used block's index.
    pub(crate) fn alloc_at(&mut self, index: u32, offset: u64, size: u64, live: &LiveInfo) -> u32 {
        let block = &self.blocks[index as usize];
        debug_assert_eq!(block.state, BlockState::Free);
        debug_assert!(block.offset <= offset && offset + size <= block.offset + block.size);
        self.remove_free(index);
        let index = self.split_front(index, offset - self.blocks[index as usize].offset);
        self.take(index, size, live);
        index
    }

    /// Turns a block already out of the bins, beginning where the new one must, into the used
    /// block of exactly `size` bytes; the rest becomes a free block after it.
    fn take(&mut self, index: u32, size: u64, live: &LiveInfo) {
        self.split_tail(index, size);
        let block = &mut self.blocks[index as usize];
        block.state = BlockState::Used;
        block.live = *live;
        self.free_bytes -= size;
        self.used_blocks += 1;
    }

    /// Frees a used block and merges it with free neighbours; returns the merged free block.
    #[inline]
    pub(crate) fn free(&mut self, index: u32) -> u32 {
        let block = &mut self.blocks[index as usize];
        debug_assert_eq!(block.state, BlockState::Used);
        block.state = BlockState::Free;
        self.free_bytes += block.size;
        self.used_blocks -= 1;
        let (prev, next) = (block.prev_phys, block.next_phys);
        let mut merged = index;
        if next != NIL && self.blocks[next as usize].state == BlockState::Free {
            self.remove_free(next);
            self.absorb_next(merged);
        }
        if prev != NIL && self.blocks[prev as usize].state == BlockState::Free {
            self.remove_free(prev);
            self.absorb_next(prev);
            merged = prev;
        }
        self.insert_free(merged);
        merged
    }

    /// Best fit among the first blocks of the request's own bin, else the head of the next
    /// non-empty bin, every block of which is large enough.
    #[inline]
    fn find_fit(&self, size: u64) -> Option<u32> {
        let (fl, sl) = bin_of(size);
        let mut best = NIL;
        let mut cursor = self.heads[fl][sl];
        for _ in 0..EXACT_BIN_SCAN {
            if cursor == NIL {
                break;
            }
            let candidate = &self.blocks[cursor as usize];
            if candidate.size >= size
                && (best == NIL || candidate.size < self.blocks[best as usize].size)
            {
                best = cursor;
                if candidate.size == size {
                    break;
                }
            }
            cursor = candidate.next_free;
        }
        if best != NIL {
            return Some(best);
        }
        let (fl, sl) = self.next_nonempty_bin(fl, sl)?;
        Some(self.heads[fl][sl])
    }

    fn next_nonempty_bin(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
        let sl_map = if sl + 1 < SL_COUNT {
            self.sl_bitmap[fl] & (!0u32 << (sl + 1))
        } else {
            0
        };
        if sl_map != 0 {
            return Some((fl, sl_map.trailing_zeros() as usize));
        }
        let fl_map = if fl + 1 < FL_COUNT {
            self.fl_bitmap & (!0u64 << (fl + 1))
        } else {
            0
        };
        if fl_map == 0 {
            return None;
        }
        let fl = fl_map.trailing_zeros() as usize;
        Some((fl, self.sl_bitmap[fl].trailing_zeros() as usize))
    }

    /// Gives the bytes before the first aligned offset of a (taken) block back as a free block.
    fn split_front_for_alignment(&mut self, index: u32, align: u64) -> u32 {
        let block = &self.blocks[index as usize];
        let pad = crate::units::align_up(block.offset, align) - block.offset;
        self.split_front(index, pad)
    }

    /// Gives the first `pad` bytes of a (taken) block back as a free block.
    fn split_front(&mut self, index: u32, pad: u64) -> u32 {
        let block = &self.blocks[index as usize];
        if pad == 0 {
            return index;
        }
        let (offset, size, prev) = (block.offset, block.size, block.prev_phys);
        let front = self.new_block(offset, pad, prev, index);
        if prev != NIL {
            self.blocks[prev as usize].next_phys = front;
        }
        let block = &mut self.blocks[index as usize];
        block.offset = offset + pad;
        block.size = size - pad;
        block.prev_phys = front;
        self.insert_free(front);
        index
    }

    /// Leaves exactly `size` bytes in a (taken) block, the rest becoming a free block after it.
    fn split_tail(&mut self, index: u32, size: u64) {
        let block = &self.blocks[index as usize];
        if block.size == size {
            return;
        }
        let (rest_offset, rest_size, next) =
            (block.offset + size, block.size - size, block.next_phys);
        let rest = self.new_block(rest_offset, rest_size, index, next);
        if next != NIL {
            self.blocks[next as usize].prev_phys = rest;
        }
        let block = &mut self.blocks[index as usize];
        block.size = size;
        block.next_phys = rest;
        self.insert_free(rest);
    }

    /// Merges the block after `index` into it (the absorbed one must be out of the bins).
    fn absorb_next(&mut self, index: u32) {
        let next = self.blocks[index as usize].next_phys;
        let (next_size, after) = {
            let n = &mut self.blocks[next as usize];
            n.state = BlockState::Vacant;
            (n.size, n.next_phys)
        };
        self.vacant.push(next);
        let block = &mut self.blocks[index as usize];
        block.size += next_size;
        block.next_phys = after;
        if after != NIL {
            self.blocks[after as usize].prev_phys = index;
        }
    }

    fn new_block(&mut self, offset: u64, size: u64, prev_phys: u32, next_phys: u32) -> u32 {
        let block = Block {
            offset,
            size,
            state: BlockState::Free,
            live: LiveInfo::default(),
            prev_phys,
            next_phys,
            prev_free: NIL,
            next_free: NIL,
        };
        match self.vacant.pop() {
            Some(slot) => {
                self.blocks[slot as usize] = block;
                slot
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn insert_free(&mut self, index: u32) {
        let (fl, sl) = bin_of(self.blocks[index as usize].size);
        let head = self.heads[fl][sl];
        {
            let block = &mut self.blocks[index as usize];
            block.state = BlockState::Free;
            block.prev_free = NIL;
            block.next_free = head;
        }
        if head != NIL {
            self.blocks[head as usize].prev_free = index;
        }
        self.heads[fl][sl] = index;
        self.sl_bitmap[fl] |= 1 << sl;
        self.fl_bitmap |= 1 << fl;
    }

    fn remove_free(&mut self, index: u32) {
        let block = &self.blocks[index as usize];
        let (prev, next) = (block.prev_free, block.next_free);
        let (fl, sl) = bin_of(block.size);
        if prev != NIL {
            self.blocks[prev as usize].next_free = next;
        } else {
            self.heads[fl][sl] = next;
            if next == NIL {
                self.sl_bitmap[fl] &= !(1 << sl);
                if self.sl_bitmap[fl] == 0 {
                    self.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if next != NIL {
            self.blocks[next as usize].prev_free = prev;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live() -> LiveInfo {
        LiveInfo::default()
    }

    #[test]
    fn splits_and_coalesces_back_to_one_block() {
        let mut tlsf = Tlsf::new(1 << 20);
        let a = tlsf.alloc(512, 256, &live()).unwrap();
        let b = tlsf.alloc(4096, 256, &live()).unwrap();
        let c = tlsf.alloc(1024, 256, &live()).unwrap();
        assert_eq!(tlsf.block(a).offset, 0);
        assert_eq!(tlsf.block(b).offset, 512);
        assert_eq!(tlsf.block(c).offset, 4608);
        assert_eq!(tlsf.free_bytes(), (1 << 20) - 5632);
        tlsf.free(b);
        tlsf.free(a);
        let merged = tlsf.free(c);
        assert_eq!(tlsf.block(merged).offset, 0);
        assert_eq!(tlsf.block(merged).size, 1 << 20);
        assert_eq!(tlsf.blocks().count(), 1);
    }

    #[test]
    fn a_block_taken_at_an_offset_leaves_both_sides_free_and_merges_back() {
        let mut t = Tlsf::new(1 << 20);
        let (whole, _) = t.free_blocks_at_least(0).next().unwrap();
        let taken = t.alloc_at(whole, 4096, 8192, &live());
        assert_eq!((t.block(taken).offset, t.block(taken).size), (4096, 8192));
        let free: Vec<_> = t
            .free_blocks_at_least(0)
            .map(|(_, b)| (b.offset, b.size))
            .collect();
        assert_eq!(free.len(), 2);
        assert_eq!(
            t.free_blocks_at_least(4097).count(),
            1,
            "the front is too small"
        );
        assert!(free.contains(&(0, 4096)) && free.contains(&(12288, (1 << 20) - 12288)));
        assert_eq!(t.free_bytes(), (1 << 20) - 8192);
        t.free(taken);
        let free: Vec<_> = t
            .free_blocks_at_least(0)
            .map(|(_, b)| (b.offset, b.size))
            .collect();
        assert_eq!(free, vec![(0, 1 << 20)]);
        assert_eq!(t.used_blocks(), 0);
    }

    /// Holes of many sizes, spread over many bins: the walk through the bitmaps yields exactly
    /// the free blocks large enough, whatever bin the request's size falls in.
    #[test]
    fn free_blocks_at_least_yields_every_large_enough_free_block() {
        let mut t = Tlsf::new(1 << 30);
        let mut holes = Vec::new();
        for i in 1..=40u64 {
            holes.push(t.alloc(i * i * 1536, 256, &live()).unwrap());
            t.alloc(512, 256, &live()).unwrap(); // keeps the holes apart
        }
        for hole in holes.iter().step_by(2) {
            t.free(*hole);
        }
        for size in [
            0,
            512,
            1536,
            4000,
            1 << 16,
            300_000,
            1 << 21,
            1 << 29,
            1 << 31,
        ] {
            let mut walked: Vec<u64> = t
                .free_blocks_at_least(size)
                .map(|(_, b)| b.offset)
                .collect();
            let mut every: Vec<u64> = t
                .blocks()
                .filter(|b| b.state == BlockState::Free && b.size >= size)
                .map(|b| b.offset)
                .collect();
            walked.sort_unstable();
            every.sort_unstable();
            assert_eq!(walked, every, "at least {size} bytes");
        }
    }

    #[test]
    fn free_after_is_the_next_block_s_size_when_it_is_free() {
        let mut t = Tlsf::new(1 << 20);
        let a = t.alloc(4096, 256, &live()).unwrap();
        let b = t.alloc(4096, 256, &live()).unwrap();
        assert_eq!(t.free_after(a), 0, "the next block is in use");
        assert_eq!(t.free_after(b), (1 << 20) - 8192, "the rest of the arena");
        t.free(b);
        assert_eq!(t.free_after(a), (1 << 20) - 4096);
    }

    #[test]
    fn reuses_the_best_fitting_hole() {
        let mut tlsf = Tlsf::new(1 << 20);
        let small_hole = tlsf.alloc(1024, 256, &live()).unwrap();
        let _guard1 = tlsf.alloc(512, 256, &live()).unwrap();
        let big_hole = tlsf.alloc(8192, 256, &live()).unwrap();
        let _guard2 = tlsf.alloc(512, 256, &live()).unwrap();
        tlsf.free(big_hole);
        tlsf.free(small_hole);
        let again = tlsf.alloc(1024, 256, &live()).unwrap();
        assert_eq!(tlsf.block(again).offset, 0, "the 1 KiB hole fits exactly");
    }

    #[test]
    fn honours_large_alignment() {
        let mut tlsf = Tlsf::new(1 << 24);
        tlsf.alloc(512, 256, &live()).unwrap();
        let aligned = tlsf.alloc(4096, 1 << 16, &live()).unwrap();
        assert_eq!(tlsf.block(aligned).offset % (1 << 16), 0);
    }

    /// The leak tracker's share of each live allocation's host memory (budget: 64 bytes), and
    /// the whole block record the allocator keeps per block anyway.
    #[test]
    fn per_allocation_bookkeeping_stays_small() {
        assert!(std::mem::size_of::<LiveInfo>() <= 32);
        assert!(std::mem::size_of::<Block>() <= 72);
    }

    #[test]
    fn refuses_when_nothing_fits() {
        let mut tlsf = Tlsf::new(4096);
        assert!(tlsf.alloc(4096, 256, &live()).is_some());
        assert!(tlsf.alloc(512, 256, &live()).is_none());
    }
}
