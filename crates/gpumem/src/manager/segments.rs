//! The device's memory as segments and blocks, the way PyTorch's memory snapshot draws it:
//! each run of mapped pages of a pool is a segment (like one of PyTorch's expandable segments),
//! holding live blocks and the free space between them; a direct allocation is a segment of
//! its own. Walks every arena under its lock: for snapshots, never per request.

use super::{tag, MemoryManager};
use crate::backend::StreamId;
use crate::error::BackendError;
use crate::pool::PoolKind;

/// One segment: mapped memory of one pool, in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentLayout {
    pub stream: StreamId,
    pub pool: PoolKind,
    /// Held for CUDA graphs (a pinned graph pool).
    pub graph_pool: bool,
    pub address: u64,
    pub size: u64,
    /// Every byte of the segment, in order: live blocks and the free space between them.
    pub blocks: Vec<BlockLayout>,
}

/// A stretch of a segment: a live block, or free space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    pub address: u64,
    pub size: u64,
    /// What the caller asked for (0 for free space).
    pub requested: u64,
    pub allocated: bool,
    pub tag: Option<String>,
}

impl MemoryManager {
    /// Every segment of `device`, its pools' first, then direct allocations.
    pub fn segments(&self, device: usize) -> Result<Vec<SegmentLayout>, BackendError> {
        let managed = self.device(device)?;
        let mut segments = Vec::new();
        for pool in managed.pools() {
            for (kind, mapped) in pool.mapped_segments() {
                let live = mapped
                    .live
                    .iter()
                    .map(|&(ptr, size, info)| (ptr, size, info.requested, info.tag));
                segments.push(SegmentLayout {
                    stream: pool.stream,
                    pool: kind,
                    graph_pool: pool.is_pinned(),
                    address: mapped.address,
                    size: mapped.size,
                    blocks: with_free_space(mapped.address, mapped.size, live),
                });
            }
        }
        managed.direct.for_each_live(|ptr, size, info| {
            segments.push(SegmentLayout {
                stream: StreamId::DEFAULT,
                pool: PoolKind::Direct,
                graph_pool: false,
                address: ptr,
                size,
                blocks: with_free_space(ptr, size, [(ptr, size, info.requested, info.tag)]),
            });
        });
        Ok(segments)
    }
}

/// The blocks of a segment at `[start, start + size)`: the live ones given (in address order)
/// and a free block for each gap between them.
fn with_free_space(
    start: u64,
    size: u64,
    live: impl IntoIterator<Item = (u64, u64, u64, u32)>,
) -> Vec<BlockLayout> {
    let mut blocks = Vec::new();
    let mut at = start;
    let free = |address: u64, size: u64| BlockLayout {
        address,
        size,
        requested: 0,
        allocated: false,
        tag: None,
    };
    for (ptr, block, requested, tag_id) in live {
        if ptr > at {
            blocks.push(free(at, ptr - at));
        }
        blocks.push(BlockLayout {
            address: ptr,
            size: block,
            requested,
            allocated: true,
            tag: tag::name_of(tag_id).map(|name| name.to_string()),
        });
        at = at.max(ptr + block);
    }
    let end = start + size;
    if end > at {
        blocks.push(free(at, end - at));
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_between_live_blocks_become_free_blocks() {
        let blocks = with_free_space(1000, 100, [(1010, 20, 17, 0), (1030, 10, 10, 0)]);
        let shape: Vec<_> = blocks
            .iter()
            .map(|b| (b.address, b.size, b.allocated))
            .collect();
        assert_eq!(
            shape,
            vec![
                (1000, 10, false),
                (1010, 20, true),
                (1030, 10, true),
                (1040, 60, false)
            ]
        );
        assert_eq!(blocks[1].requested, 17);
        assert_eq!(blocks.iter().map(|b| b.size).sum::<u64>(), 100);
    }

    #[test]
    fn a_segment_with_nothing_live_is_one_free_block() {
        let blocks = with_free_space(0, 64, []);
        assert_eq!(blocks.len(), 1);
        assert!(!blocks[0].allocated);
    }
}
