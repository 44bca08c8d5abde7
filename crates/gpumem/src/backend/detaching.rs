//! Moving mapped chunks to a second address without waiting for the work queued on the first:
//! the capability behind `stream_ordered_reuse`, where a miss maps its own stream's idle
//! chunks at the new address at once and unmaps the old address once the GPU has passed it.

use super::{DevicePtr, PhysicalChunk};
use crate::error::BackendError;

/// Chunks mapped under two addresses for a while. The driver lets one physical chunk sit under
/// several addresses; work on one stream runs in order, so a block at the new address that only
/// work queued after the old address's last use touches never meets that use. The caller keeps
/// that promise (one stream), and unmaps the old address only once the GPU has passed it.
pub trait Detaching: Send + Sync {
    /// Takes the whole chunks of `[addr, addr + size)` out of those the backend knows as mapped
    /// there and appends them to `into` in address order, as
    /// [`unmap_keeping`](super::DeviceBackend::unmap_keeping) does, but leaves the range
    /// mapped: work queued on it still reaches the same memory, and the chunks may be mapped
    /// at another address at once. The range stays mapped, and the chunks may not be released,
    /// until [`unmap_detached`](Self::unmap_detached). On an error nothing changes.
    fn detach_keeping(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        into: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError>;

    /// Unmaps `[addr, addr + size)`, a range detached whole by
    /// [`detach_keeping`](Self::detach_keeping); its chunks stay held by whoever holds them.
    /// On an error the range stays detached, to be unmapped again later.
    fn unmap_detached(&self, device: usize, addr: DevicePtr, size: u64)
        -> Result<(), BackendError>;
}
