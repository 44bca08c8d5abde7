//! Giving an arena's idle pages back: which go (the oldest first, or those asked for), and
//! waiting only for the stream work that went before them, into the device's page reserve.

use super::{Arena, ReleaseError, Released};
use crate::backend::DeviceBackend;
use crate::pool::lending::Lending;
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

    /// Makes room for a miss as [`release_idle_sparing`](Self::release_idle_sparing) does,
    /// waiting for nothing where the stream may still be using the pages: their chunks are
    /// detached, still mapped at their old addresses, and lent to the miss's mapping
    /// (`pool/lending.rs`), which then maps them at its block's address. Only chunks of at most
    /// `fits_in` pages (the block's longest unmapped run) are lent: a larger one could not be
    /// mapped under the block and would sit unused until the GPU passed its old address, while
    /// the mapping created pages in its place (the simulated GPU kept behind held vae_decode at
    /// 1.20 of its peak, against 1.01 waiting). Returns the room made and the lending, if the
    /// pages had to be lent (else they were unmapped as usual); the caller makes the rest of
    /// the room the usual way.
    pub(super) fn lend_idle_sparing(
        &mut self,
        reserve: &PageReserve,
        bytes: u64,
        spare: impl Fn(PageRun) -> bool,
        fits_in: u32,
    ) -> (Result<Released, ReleaseError>, Option<Lending>) {
        let pages = bytes.div_ceil(self.page_size) as usize;
        let spare_or_too_large = |chunk: PageRun| spare(chunk) || chunk.count > fits_in;
        let unmapping =
            self.take_for_unmapping(reserve, |taken, _| taken < pages, spare_or_too_large, true);
        if unmapping.is_empty() {
            return (Ok(Released::default()), None);
        }
        match unmapping.lend(reserve) {
            Ok(lending) => {
                // Out of the arena now, as if unmapped; the driver unmaps the old addresses
                // once the GPU has passed them.
                let room = Released {
                    bytes: lending.bytes(),
                    calls: lending.ranges.len() as u64,
                };
                (Ok(room), Some(lending))
            }
            Err(unmapping) => {
                let (released, cleared) = unmapping.finish(reserve);
                self.unmapped(reserve, cleared);
                (released, None)
            }
        }
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

    /// Unmaps idle pages now, holding the arena (a miss making room, a pool winding down):
    /// what [`take_for_unmapping`](Self::take_for_unmapping) and [`Unmapping::finish`](super::unmapping::Unmapping::finish) do
    /// apart for a pool giving pages back without its lock.
    pub(super) fn release_pages(
        &mut self,
        reserve: &PageReserve,
        keep_going: impl FnMut(usize, u64) -> bool,
        spare: impl Fn(PageRun) -> bool,
        busy: BusyStreams,
    ) -> Result<Released, ReleaseError> {
        let unmapping =
            self.take_for_unmapping(reserve, keep_going, spare, busy == BusyStreams::Wait);
        if unmapping.is_empty() {
            return Ok(Released::default());
        }
        let (released, cleared) = unmapping.finish(reserve);
        self.unmapped(reserve, cleared);
        released
    }
}
