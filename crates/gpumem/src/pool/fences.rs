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

    /// What unmapping the pages idle before order `newest + 1` must wait for: the oldest fence
    /// recorded after they went idle (taken out of the trail: the wait ends it), or, with none,
    /// the stream; nothing where they are past it already. Pages of the shared pools are past
    /// it when they go idle: a block comes back to them only once the fence its stream
    /// recorded at the free has passed (`Pool::free_fenced`). The wait itself needs no arena:
    /// [`WaitFor::wait`], then [`cleared`](Self::cleared) if the arena is still at hand.
    pub(crate) fn wait_target(
        &mut self,
        backend: &dyn DeviceBackend,
        device: usize,
        stream: StreamId,
        newest: u64,
    ) -> WaitFor {
        if stream == StreamId::SHARED || newest < self.cleared_below(backend, device) {
            return WaitFor::Nothing;
        }
        let covering = self.outstanding.iter().position(|&(_, mark)| mark > newest);
        let Some(index) = covering else {
            let mark_now = self.outstanding.back().map_or(newest + 1, |&(_, m)| m);
            return WaitFor::Stream {
                clears: mark_now.max(newest + 1),
            };
        };
        // The fences before it pass first (one stream runs in order): the next prune ends them.
        let (fence, mark) = self.outstanding[index];
        self.outstanding.remove(index);
        WaitFor::Fence {
            fence,
            clears: mark,
        }
    }

    /// A [`WaitFor`] came back: every page idle before order `clears` is past its work.
    pub(crate) fn cleared(&mut self, backend: &dyn DeviceBackend, device: usize, clears: u64) {
        // Fences recorded before a stream's wait have passed too: querying each once lets the
        // driver drop it.
        self.prune(backend, device);
        self.cleared_below = self.cleared_below.max(clears);
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

/// What idle pages wait for before they are unmapped (see [`FenceTrail::wait_target`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitFor {
    Nothing,
    /// The fence, which the wait ends; every page idle before order `clears` is past it then.
    Fence {
        fence: Fence,
        clears: u64,
    },
    /// The whole stream (`cuStreamSynchronize`).
    Stream {
        clears: u64,
    },
}

impl WaitFor {
    /// Waits (no arena lock needed); returns the order below which pages are then clear.
    pub(crate) fn wait(
        self,
        backend: &dyn DeviceBackend,
        device: usize,
        stream: StreamId,
    ) -> Result<u64, BackendError> {
        match self {
            WaitFor::Nothing => Ok(0),
            WaitFor::Fence { fence, clears } => backend.wait_fence(device, fence).map(|()| clears),
            WaitFor::Stream { clears } => {
                backend.synchronize_stream(device, stream).map(|()| clears)
            }
        }
    }
}
