//! The pools that streams without pools of their own share ([`StreamId::SHARED`]). Memory freed
//! on a stream is reused at once on that stream because the stream runs its work in order; a
//! pool serving many streams has no such order, so a block freed there comes back to the arena
//! only once a fence recorded on its stream at the free has passed — the work queued on that
//! stream by then, which may still read or write the block, has run. Until then it waits in its
//! slot, still counted as live (its memory is not free yet). Nothing ever waits for those fences
//! on an allocation's path: they are polled, a few at every allocation and free of the pool and
//! all of them when the pool releases memory, and waited for only when the pool is retired.
//!
//! Pages the arena then finds idle are past every stream's work, so releasing them waits for
//! nothing (`FenceTrail::wait_past`).

use super::{Pool, PoolKind, PoolSettings, SlotState};
use crate::backend::{DeviceBackend, Fence, StreamId};
use crate::pool::{PageReserve, PoolCounters};
use std::sync::Arc;

/// Waiting frees polled per allocation or free: few, since each is a driver query (about half a
/// microsecond on CUDA), enough that a pool freed into steadily keeps up.
const POLLED_PER_CALL: usize = 8;

/// A block freed on `stream` whose memory that stream's work may still use.
#[derive(Debug)]
pub(super) struct Waiting {
    block: u32,
    /// Marks the stream's work queued at the free; `None` where none could be recorded (the
    /// stream was capturing a graph): then the whole stream must be idle.
    fence: Option<Fence>,
    stream: StreamId,
}

/// How much of what waits to look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Settle {
    /// The oldest few, without waiting.
    Poll,
    /// All, without waiting.
    PollAll,
    /// All, waiting for each (the pool is being retired).
    Wait,
}

impl Waiting {
    /// Whether the stream's work queued at the free has run, asked (or, with `Settle::Wait`,
    /// waited for) now. A fence whose query fails is gone: as the C ABI's frees waiting for
    /// other streams do, the block is then given back (the device is in error; holding memory
    /// back would help nobody).
    fn done(&self, backend: &dyn DeviceBackend, device: usize, how: Settle) -> bool {
        match (self.fence, how) {
            (Some(fence), Settle::Wait) => {
                if let Err(error) = backend.wait_fence(device, fence) {
                    tracing::debug!(device, %error, "waiting for a freed block's fence failed");
                }
                true
            }
            (Some(fence), _) => backend.fence_passed(device, fence).unwrap_or(true),
            (None, Settle::Wait) => backend.synchronize_stream(device, self.stream).is_ok(),
            (None, _) => backend.stream_idle(device, self.stream).unwrap_or(false),
        }
    }
}

impl SlotState {
    /// Returns the waiting blocks whose streams are past them to the arena.
    pub(super) fn settle(&mut self, counters: &PoolCounters, device: usize, how: Settle) {
        if self.waiting.is_empty() {
            return;
        }
        let mut waiting = std::mem::take(&mut self.waiting);
        let limit = match how {
            Settle::Poll => POLLED_PER_CALL,
            Settle::PollAll | Settle::Wait => waiting.len(),
        };
        let mut looked = 0;
        waiting.retain(|entry| {
            if looked == limit {
                return true;
            }
            looked += 1;
            let Some(reserve) = self.reserve.as_deref() else {
                return true;
            };
            if !entry.done(reserve.backend(), device, how) {
                return true;
            }
            self.free_block(counters, entry.block);
            false
        });
        self.waiting = waiting;
    }
}

impl Pool {
    /// The pool of one shard that streams without pools of their own share.
    pub fn for_shared_streams(reserve: Arc<PageReserve>, settings: PoolSettings) -> Self {
        Pool::new(reserve, StreamId::SHARED, settings)
    }

    /// Frees a block of a shared pool used on `stream`: it comes back once the work queued on
    /// `stream` so far has run (at once on the simulated device, whose work never lags unless
    /// a test holds it back).
    pub fn free_fenced(&self, kind: PoolKind, block: u32, stream: StreamId) {
        debug_assert_eq!(self.stream, StreamId::SHARED);
        let slot = self.slot(kind);
        let mut state = slot.state.lock();
        let Some(reserve) = state.reserve.as_deref() else {
            // Wound down: no block of it can be live.
            return;
        };
        // Recorded under the lock: a fence for each free, in the order of the frees.
        let fence = reserve.backend().record_fence(self.device, stream).ok();
        state.waiting.push(Waiting {
            block,
            fence,
            stream,
        });
        state.settle(&slot.counters, self.device, Settle::Poll);
        if self.is_retired() {
            state.settle(&slot.counters, self.device, Settle::Wait);
            state.wind_down_unless_live(&slot.counters, self.device);
        }
    }
}
