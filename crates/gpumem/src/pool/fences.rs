//! Fences an arena records on its stream as its pages go idle, so that unmapping a page waits
//! only for the work queued before that page went idle — usually long done — instead of for
//! everything the stream has queued (`cuStreamSynchronize`), which would stall a host running
//! ahead of the GPU at the very allocation that had to make room.
//!
//! Pages are ordered by when they went idle ([`PageTable`](super::pages::PageTable)'s idle
//! order, exact, unlike the coarse clock): a fence marks the order reached when it was recorded,
//! and once it has passed every page idle before that mark is no longer touched by queued work.

use crate::backend::{DeviceBackend, Fence, StreamId};
use crate::error::BackendError;
use std::collections::VecDeque;

/// Most fences outstanding per arena: enough for the few steps a GPU lags behind its host at
/// one fence per clock tick, few enough that pruning them costs nothing worth counting.
const MAX_OUTSTANDING: usize = 16;

#[derive(Debug, Default)]
pub(crate) struct FenceTrail {
    /// Recorded and not yet seen passed, oldest first: (fence, idle order reached then).
    outstanding: VecDeque<(Fence, u64)>,
    /// Pages with an idle order below this are past all work that touched them.
    cleared_below: u64,
    /// Pages went idle since the last fence was recorded.
    unfenced: bool,
    /// Clock tick of the last fence recorded: at most one per tick.
    last_recorded_tick: u64,
}

impl FenceTrail {
    /// Pages have just gone idle: a fence should follow.
    #[inline]
    pub(crate) fn pages_went_idle(&mut self) {
        self.unfenced = true;
    }

    #[inline]
    pub(crate) fn wants_fence(&self) -> bool {
        self.unfenced
    }

    /// Records a fence marking idle order `mark` on `stream`, unless one was recorded this
    /// clock tick or too many are outstanding (pages idle since then wait for a later one).
    /// A stream that cannot be fenced now (capturing a graph, or the whole device) gets none:
    /// its pages are waited for the old way. The shared pools need none (see `wait_past`).
    pub(crate) fn record(
        &mut self,
        backend: &dyn DeviceBackend,
        device: usize,
        stream: StreamId,
        mark: u64,
    ) {
        if stream == StreamId::ANY || stream == StreamId::SHARED {
            self.unfenced = false;
            return;
        }
        let now = crate::clock::now();
        if now == self.last_recorded_tick {
            return;
        }
        // Tried once a tick, recorded or not: a GPU far behind costs one query a tick, not one
        // a free.
        self.last_recorded_tick = now;
        self.prune(backend, device);
        if self.outstanding.len() >= MAX_OUTSTANDING {
            return;
        }
        self.unfenced = false;
        match backend.record_fence(device, stream) {
            Ok(fence) => self.outstanding.push_back((fence, mark)),
            Err(error) => tracing::debug!(device, %error, "no fence for idle pages"),
        }
    }

    /// Pages with an idle order below the returned one need no wait, fences seen passed so far.
    pub(crate) fn cleared_below(&mut self, backend: &dyn DeviceBackend, device: usize) -> u64 {
        self.prune(backend, device);
        self.cleared_below
    }

    /// Waits until the pages idle before order `newest + 1` are past the work that touched
    /// them: for the oldest fence recorded after they went idle, or, with none, for the stream.
    /// Pages of the shared pools are past it when they go idle: a block comes back to them only
    /// once the fence its stream recorded at the free has passed (`Pool::free_fenced`).
    pub(crate) fn wait_past(
        &mut self,
        backend: &dyn DeviceBackend,
        device: usize,
        stream: StreamId,
        newest: u64,
    ) -> Result<(), BackendError> {
        if stream == StreamId::SHARED {
            return Ok(());
        }
        if newest < self.cleared_below(backend, device) {
            return Ok(());
        }
        let covering = self.outstanding.iter().position(|&(_, mark)| mark > newest);
        let Some(index) = covering else {
            let mark_now = self.outstanding.back().map_or(newest + 1, |&(_, m)| m);
            backend.synchronize_stream(device, stream)?;
            // Every fence recorded before the wait has passed: query each once, which lets
            // the driver drop it.
            self.prune(backend, device);
            self.cleared_below = self.cleared_below.max(mark_now.max(newest + 1));
            return Ok(());
        };
        // The fences before it passed first (one stream runs in order): those queries end
        // them, then the wait ends the covering one.
        let (fence, mark) = self.outstanding[index];
        self.outstanding.remove(index);
        let waited = backend.wait_fence(device, fence);
        self.prune(backend, device);
        waited?;
        self.cleared_below = self.cleared_below.max(mark);
        Ok(())
    }

    /// Drops the fences at the front that have passed (or whose query failed: the fence is
    /// gone either way), raising `cleared_below` to the newest passed one's mark.
    fn prune(&mut self, backend: &dyn DeviceBackend, device: usize) {
        while let Some(&(fence, mark)) = self.outstanding.front() {
            match backend.fence_passed(device, fence) {
                Ok(false) => break,
                Ok(true) => self.cleared_below = self.cleared_below.max(mark),
                Err(error) => tracing::debug!(device, %error, "fence query failed"),
            }
            self.outstanding.pop_front();
        }
    }

    /// Waits for every outstanding fence (the arena is going away: none may be left with the
    /// driver).
    pub(crate) fn drain(&mut self, backend: &dyn DeviceBackend, device: usize) {
        for (fence, _) in self.outstanding.drain(..) {
            if let Err(error) = backend.wait_fence(device, fence) {
                tracing::debug!(device, %error, "fence wait failed");
            }
        }
    }
}
