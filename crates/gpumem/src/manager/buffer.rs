//! What an allocation returns: `DeviceBuffer`, which gives its memory back when dropped, and the
//! options an allocation takes.

use super::leaks::OriginTable;
use super::tag::Tag;
use crate::backend::{DevicePtr, StreamId};
use crate::error::BackendError;
use crate::pool::{DirectPool, Pool, PoolKind};
use std::fmt;
use std::sync::Arc;

/// Options for [`MemoryManager::alloc`](super::MemoryManager::alloc).
/// Not `Copy`: the tag is a counted handle. Build the options once and pass them by reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocOptions {
    /// Alignment of the device pointer: a power of two up to the 2 MiB page (default 256).
    pub alignment: u64,
    pub tag: Option<Tag>,
    /// The stream that will use the buffer; its memory is reused at once on the same stream.
    pub stream: StreamId,
    /// For a CUDA graph being captured: the buffer comes from that graph pool, whose memory no
    /// other allocation reaches and which stays mapped until
    /// [`release_graph_pool`](super::MemoryManager::release_graph_pool) (a graph replays into
    /// the addresses it captured, those of buffers freed since included).
    pub graph_pool: Option<GraphPoolId>,
}

/// Names a pool of memory for CUDA graphs. Graphs captured into the same pool share its memory,
/// as PyTorch's `torch.cuda.graph(pool=...)` does; their replays must not overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphPoolId(pub u128);

impl Default for AllocOptions {
    fn default() -> Self {
        AllocOptions {
            alignment: 256,
            tag: None,
            stream: StreamId::DEFAULT,
            graph_pool: None,
        }
    }
}

impl AllocOptions {
    pub fn tagged(tag: Tag) -> Self {
        AllocOptions {
            tag: Some(tag),
            ..Self::default()
        }
    }

    pub fn with_alignment(mut self, alignment: u64) -> Self {
        self.alignment = alignment;
        self
    }

    pub fn on_stream(mut self, stream: StreamId) -> Self {
        self.stream = stream;
        self
    }

    pub fn in_graph_pool(mut self, pool: GraphPoolId) -> Self {
        self.graph_pool = Some(pool);
        self
    }
}

/// Which arena of the pool and which block in it, packed into one word: written with one
/// store and copied with one load (as two fields, the buffer's copy on return read across
/// two stores and missed store forwarding, several nanoseconds of a pool hit).
#[derive(Clone, Copy)]
pub(crate) struct PooledBlock(u64);

impl PooledBlock {
    const LARGE: u64 = 1 << 32;
    /// What a buffer without a pool's block holds (read by nothing).
    pub(crate) const NONE: PooledBlock = PooledBlock(0);

    pub(crate) fn new(kind: PoolKind, block: u32) -> Self {
        let large = if kind == PoolKind::Large {
            Self::LARGE
        } else {
            0
        };
        PooledBlock(large | block as u64)
    }

    fn kind(self) -> PoolKind {
        if self.0 & Self::LARGE != 0 {
            PoolKind::Large
        } else {
            PoolKind::Small
        }
    }

    fn block(self) -> u32 {
        self.0 as u32
    }
}

/// Device memory owned by the caller; freed when dropped (or by [`free`](Self::free), which
/// reports a driver error instead of logging it).
pub struct DeviceBuffer {
    pub(crate) ptr: DevicePtr,
    pub(crate) size: u64,
    pub(crate) device: usize,
    pub(crate) id: u64,
    /// The tag's interned id, 0 for none: one 4-byte field rather than an `Option`, whose
    /// separately stored halves a later 8-byte copy could not forward from (a pool hit's cost).
    /// The buffer holds one count of it (`tag::release_allocation` when freed), so its name stays.
    pub(crate) tag_id: u32,
    pub(crate) stream: StreamId,
    /// What the memory belongs to, and so where its free goes back to: a pool's block, or
    /// the direct pool (at most one of the two; neither once freed). Plain words rather than
    /// an enum, which the allocation path built on the stack and copied with loads that missed
    /// store forwarding (a few nanoseconds of a pool hit).
    pub(crate) pool: Option<Arc<Pool>>,
    pub(crate) block: PooledBlock,
    pub(crate) direct: Option<Arc<DirectPool>>,
    /// Where the allocating thread and backtrace were recorded, when that is on.
    pub(crate) origins: Option<OriginTable>,
}

impl DeviceBuffer {
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The size that was requested (the block behind it may be slightly larger).
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn device(&self) -> usize {
        self.device
    }

    /// The allocation's id, as the leak tracker reports it.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn tag(&self) -> Option<Tag> {
        Tag::from_id(self.tag_id)
    }

    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Frees now. The memory is reusable at once on the buffer's stream.
    pub fn free(mut self) -> Result<(), BackendError> {
        self.release()
    }

    #[inline(always)]
    fn release(&mut self) -> Result<(), BackendError> {
        if let Some(origins) = self.origins.take() {
            origins.forget(self.id);
        }
        // After the block is back (below), nothing lists this allocation: its tag count goes.
        // Taken out first, so the second call (`free` then `drop`) releases nothing.
        let tag_id = std::mem::replace(&mut self.tag_id, super::tag::UNTAGGED);
        // A pool's free cannot fail. Answered on its own, it returns `Ok` as a constant: one
        // result for both kinds was staged and copied out through the stack, with loads that
        // missed store forwarding (a few nanoseconds of a pool hit).
        if let Some(pool) = self.pool.take() {
            self.free_pooled(pool);
            super::tag::release_allocation(tag_id);
            return Ok(());
        }
        let Some(direct) = self.direct.take() else {
            return Ok(());
        };
        let freed = direct.free(self.ptr);
        if freed.is_ok() {
            super::tag::release_allocation(tag_id);
        } // else the driver kept it: still listed, and its tag with it
        freed
    }

    #[inline(always)]
    fn free_pooled(&self, pool: Arc<Pool>) {
        let block = self.block;
        if pool.stream == StreamId::SHARED {
            pool.free_fenced(block.kind(), block.block(), self.stream);
        } else {
            pool.free(block.kind(), block.block());
        }
        super::handles::park(pool);
    }
}

impl Drop for DeviceBuffer {
    // Inlined with `release`, so a pool's free saves no registers to the stack: its lock's
    // compare-and-swap waits for every earlier store to drain.
    #[inline]
    fn drop(&mut self) {
        if let Err(error) = self.release() {
            // Nothing to return an error to; the pool counted it in its driver errors.
            tracing::warn!(device = self.device, ptr = self.ptr, %error, "freeing a device buffer failed");
        }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("device", &self.device)
            .field("tag", &self.tag())
            .finish()
    }
}
