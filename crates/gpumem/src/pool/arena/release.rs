//! Giving an arena's idle pages back: which go (the oldest first, or those asked for), and
//! waiting only for the stream work that went before them, into the device's page reserve.

use super::{Arena, ReleaseError, Released};
use crate::backend::DeviceBackend;
use crate::pool::pages::PageRun;
use crate::pool::reserve::PageReserve;
use crate::pool::BusyStreams;

impl Arena {
    /// Pages went idle since the last fence: mark the work queued before them on the stream
    /// (at most once per clock tick), so that unmapping them later waits for that work only.
    #[inline]
    pub(crate) fn fence_idle_pages(&mut self, backend: &dyn DeviceBackend) {
        if self.fences.wants_fence() {
            let mark = self.pages.next_order();
            self.fences.record(backend, self.device, self.stream, mark);
        }
    }

    /// Pages [`alloc`](Self::alloc) unmapped to stay within the cache budget (reset by
    /// [`take_released_while_allocating`](Self::take_released_while_allocating)).
    pub(crate) fn take_released_while_allocating(&mut self) -> Released {
        std::mem::take(&mut self.released_while_allocating)
    }

    /// Pages a failed [`alloc`](Self::alloc) mapped and could not unmap: still held from the
    /// driver, as idle pages (reset by this call).
    pub(crate) fn take_kept_after_failed_map(&mut self) -> Released {
        std::mem::take(&mut self.kept_after_failed_map)
    }

    /// Unmaps at least `bytes` of idle pages, oldest first, passing over the chunks `spare`
    /// names (those a block is about to reuse): room within the cache budget for a miss.
    pub(super) fn release_idle_sparing(
        &mut self,
        reserve: &PageReserve,
        bytes: u64,
        spare: impl Fn(PageRun) -> bool,
        busy: BusyStreams,
    ) -> Result<Released, ReleaseError> {
        let pages = bytes.div_ceil(self.page_size) as usize;
        self.release_pages(reserve, |taken, _| taken < pages, spare, busy)
    }

    /// Unmaps idle pages, oldest first, while `keep_going(pages_taken, idle_since)` says so,
    /// into the device's page reserve (held until the reserve is trimmed). The arena's stream
    /// may still have work queued that touches them: `busy` says whether to wait for it or to
    /// release only the pages that work is done with.
    pub(crate) fn release_idle(
        &mut self,
        reserve: &PageReserve,
        keep_going: impl FnMut(usize, u64) -> bool,
        busy: BusyStreams,
    ) -> Result<Released, ReleaseError> {
        self.release_pages(reserve, keep_going, |_| false, busy)
    }

    pub(super) fn release_pages(
        &mut self,
        reserve: &PageReserve,
        keep_going: impl FnMut(usize, u64) -> bool,
        spare: impl Fn(PageRun) -> bool,
        busy: BusyStreams,
    ) -> Result<Released, ReleaseError> {
        let backend = reserve.backend();
        // Skipping a busy stream leaves it unwaited for: only the pages that went idle before a
        // fence it has passed may go.
        let mut idle_before = u64::MAX;
        if busy == BusyStreams::Skip
            && !backend
                .stream_idle(self.device, self.stream)
                .unwrap_or(false)
        {
            idle_before = self.fences.cleared_below(backend, self.device);
            if idle_before == 0 {
                return Ok(Released::default());
            }
        }
        // Complete a parked block's free first: its pages can then go idle and be released
        // (a cache being emptied must reach them), and it is never handed out again after.
        self.unpark();
        self.fence_idle_pages(backend);
        let chunks = self.pages.take_idle(keep_going, spare, idle_before);
        if chunks.is_empty() {
            return Ok(Released::default());
        }
        // An idle stream has nothing queued that could touch the pages; a busy one has nothing
        // that touches these (they went idle before a fence that has passed), unless asked to
        // wait, when this waits for the oldest fence after them or else the stream.
        let waited = match busy {
            BusyStreams::Wait => {
                let newest = self.pages.newest_order(&chunks);
                self.fences
                    .wait_past(backend, self.device, self.stream, newest)
            }
            BusyStreams::Skip => Ok(()),
        };
        if let Err(error) = waited {
            let now = crate::clock::now();
            for chunk in chunks {
                self.pages.restore_idle(chunk, now);
            }
            return Err(ReleaseError {
                released: Released::default(),
                error,
            });
        }
        let mut released = Released::default();
        for (index, chunk) in chunks.iter().enumerate() {
            let (addr, bytes) = self.run_range(*chunk);
            if let Err(error) = reserve.unmap(addr, bytes) {
                let now = crate::clock::now();
                for left in &chunks[index..] {
                    self.pages.restore_idle(*left, now);
                }
                return Err(ReleaseError { released, error });
            }
            released.bytes += bytes;
            released.calls += 1;
        }
        if self.pages.mapped_pages() == 0 {
            // Holding nothing, the arena is as new: growing again is growth (`pinning.rs`).
            self.mapped_high = 0;
        }
        Ok(released)
    }
}
