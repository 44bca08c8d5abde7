//! Which pages of an arena are backed by device memory and by which chunk, how many live blocks
//! touch each, and since when each mapped page without a live block has been idle (chunks whose
//! pages are all idle are released, oldest first).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PageState {
    Unmapped,
    /// Mapped, with at least one live block on it.
    Live,
    /// Mapped, no live block: cached memory that can be reused or released.
    Idle,
}

/// One page: its state, the live blocks on it and, while idle, since when. Kept together so
/// that a block spanning many pages touches one cache line per few pages, not four arrays.
#[derive(Clone, Copy, Debug)]
struct Page {
    state: PageState,
    live_blocks: u32,
    /// When the page went idle, in [`crate::clock`] ticks (for age-based release)...
    idle_since: u64,
    /// ...and in which order (the coarse clock ties within milliseconds; this never does).
    idle_order: u64,
    /// While mapped: the first page of the chunk behind this page, and the chunk's length (the
    /// driver unmaps chunks whole).
    chunk_first: u32,
    chunk_pages: u32,
}

const UNMAPPED: Page = Page {
    state: PageState::Unmapped,
    live_blocks: 0,
    idle_since: 0,
    idle_order: 0,
    chunk_first: 0,
    chunk_pages: 0,
};

/// Per-page state of one arena. Pages are numbered from the arena's base. Finding idle pages
/// scans the table: that happens only when memory goes back to the driver, so the hot path
/// keeps no queue, only a counter and a timestamp per page.
#[derive(Debug, Default)]
pub(crate) struct PageTable {
    pages: Vec<Page>,
    next_order: u64,
    idle_pages: usize,
    mapped_pages: usize,
}

/// A run of consecutive pages `[first, first + count)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageRun {
    pub first: u32,
    pub count: u32,
}

impl PageTable {
    pub(crate) fn mapped_pages(&self) -> usize {
        self.mapped_pages
    }

    pub(crate) fn idle_pages(&self) -> usize {
        self.idle_pages
    }

    pub(crate) fn is_mapped(&self, page: u32) -> bool {
        self.pages
            .get(page as usize)
            .is_some_and(|p| p.state != PageState::Unmapped)
    }

    fn grow_to(&mut self, last: u32) {
        let needed = last as usize + 1;
        if self.pages.len() < needed {
            self.pages.resize(needed, UNMAPPED);
        }
    }

    /// Appends to `runs` the unmapped pages among `first..=last`, merged into runs.
    #[inline]
    pub(crate) fn unmapped_runs(&mut self, first: u32, last: u32, runs: &mut Vec<PageRun>) {
        self.grow_to(last);
        for page in first..=last {
            if self.pages[page as usize].state != PageState::Unmapped {
                continue;
            }
            match runs.last_mut() {
                Some(run) if run.first + run.count == page => run.count += 1,
                _ => runs.push(PageRun {
                    first: page,
                    count: 1,
                }),
            }
        }
    }

    /// Records that the driver has mapped `run` with `chunks` (their lengths in pages, in
    /// address order, adding up to the run); its pages are idle until acquired.
    pub(crate) fn mark_mapped(&mut self, run: PageRun, chunks: &[u32], now: u64) {
        debug_assert_eq!(chunks.iter().sum::<u32>(), run.count);
        let mut first = run.first;
        for &pages in chunks {
            for page in first..first + pages {
                let entry = &mut self.pages[page as usize];
                entry.chunk_first = first;
                entry.chunk_pages = pages;
                self.set_idle(page as usize, now);
                self.mapped_pages += 1;
            }
            first += pages;
        }
    }

    #[inline]
    fn set_idle(&mut self, page: usize, now: u64) {
        let page = &mut self.pages[page];
        page.state = PageState::Idle;
        page.idle_since = now;
        page.idle_order = self.next_order;
        self.next_order += 1;
        self.idle_pages += 1;
    }

    /// A block now lives on `first..=last`, all of which are mapped.
    #[inline]
    pub(crate) fn acquire(&mut self, first: u32, last: u32) {
        for page in &mut self.pages[first as usize..=last as usize] {
            debug_assert_ne!(page.state, PageState::Unmapped);
            if page.live_blocks == 0 {
                page.state = PageState::Live;
                self.idle_pages -= 1;
            }
            page.live_blocks += 1;
        }
    }

    /// A block on `first..=last` was freed; pages left with no live block go idle.
    #[inline]
    pub(crate) fn release(&mut self, first: u32, last: u32, now: impl FnOnce() -> u64) {
        let mut now = Some(now);
        let mut at = 0;
        for (page, entry) in (first as usize..).zip(&mut self.pages[first as usize..=last as usize])
        {
            entry.live_blocks -= 1;
            if entry.live_blocks == 0 {
                // Read the clock only when a page actually goes idle, not on every free.
                if let Some(read) = now.take() {
                    at = read();
                }
                entry.state = PageState::Idle;
                entry.idle_since = at;
                entry.idle_order = self.next_order + (page - first as usize) as u64;
                self.idle_pages += 1;
            }
        }
        // Orders are handed out by page position: unique, and increasing from call to call.
        self.next_order += (last - first) as u64 + 1;
    }

    /// The idle order the next page to go idle will get: every page idle now is below it.
    pub(crate) fn next_order(&self) -> u64 {
        self.next_order
    }

    /// The idle order of the most recently idled page of `runs` (taken by `take_idle`).
    pub(crate) fn newest_order(&self, runs: &[PageRun]) -> u64 {
        runs.iter()
            .flat_map(|run| &self.pages[run.first as usize..(run.first + run.count) as usize])
            .map(|page| page.idle_order)
            .max()
            .unwrap_or(0)
    }

    /// Takes chunks whose pages are all idle, the longest idle first (a chunk is as recent as
    /// its most recently idled page), while `keep_going(pages_taken, idle_since)` says so and
    /// the chunk went idle before idle order `before_order`, passing over chunks with a page
    /// for which `spare(page)` is true; their pages are marked unmapped, and the caller must
    /// unmap them (or hand them back with `restore_idle`).
    pub(crate) fn take_idle(
        &mut self,
        mut keep_going: impl FnMut(usize, u64) -> bool,
        spare: impl Fn(u32) -> bool,
        before_order: u64,
    ) -> Vec<PageRun> {
        if self.idle_pages == 0 {
            return Vec::new();
        }
        // (idle order, chunk, idle since)
        let mut idle: Vec<(u64, PageRun, u64)> = Vec::new();
        let mut page = 0;
        while page < self.pages.len() {
            let entry = self.pages[page];
            if entry.state == PageState::Unmapped {
                page += 1;
                continue;
            }
            debug_assert_eq!(entry.chunk_first as usize, page);
            let chunk = PageRun {
                first: entry.chunk_first,
                count: entry.chunk_pages,
            };
            let pages = &self.pages[page..page + chunk.count as usize];
            if pages.iter().all(|p| p.state == PageState::Idle)
                && !(chunk.first..chunk.first + chunk.count).any(&spare)
            {
                let order = pages.iter().map(|p| p.idle_order).max().unwrap_or(0);
                let since = pages.iter().map(|p| p.idle_since).max().unwrap_or(0);
                idle.push((order, chunk, since));
            }
            page += chunk.count as usize;
        }
        idle.sort_unstable_by_key(|&(order, _, _)| order);
        let mut taken = Vec::new();
        let mut pages_taken = 0;
        for (order, chunk, since) in idle {
            if order >= before_order || !keep_going(pages_taken, since) {
                break;
            }
            for entry in &mut self.pages[chunk.first as usize..(chunk.first + chunk.count) as usize]
            {
                entry.state = PageState::Unmapped;
            }
            self.idle_pages -= chunk.count as usize;
            self.mapped_pages -= chunk.count as usize;
            pages_taken += chunk.count as usize;
            taken.push(chunk);
        }
        taken
    }

    /// Puts back a chunk from `take_idle` that the driver failed to unmap.
    pub(crate) fn restore_idle(&mut self, chunk: PageRun, now: u64) {
        for page in chunk.first..chunk.first + chunk.count {
            self.set_idle(page as usize, now);
            self.mapped_pages += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(table: &mut PageTable, first: u32, last: u32, chunks: &[u32]) {
        let mut runs = Vec::new();
        table.unmapped_runs(first, last, &mut runs);
        assert_eq!(runs.len(), 1);
        table.mark_mapped(runs[0], chunks, 1);
    }

    #[test]
    fn pages_go_idle_when_the_last_block_leaves_and_chunks_are_released_oldest_first() {
        let mut table = PageTable::default();
        mapped(&mut table, 0, 3, &[1, 1, 1, 1]);
        table.acquire(0, 1);
        table.acquire(1, 3);
        assert_eq!((table.mapped_pages(), table.idle_pages()), (4, 0));
        table.release(1, 3, || 5);
        assert_eq!(table.idle_pages(), 2, "page 1 still holds the first block");
        table.release(0, 1, || 7);
        let taken = table.take_idle(|n, _| n < 3, |_| false, u64::MAX);
        let first: Vec<u32> = taken.iter().map(|c| c.first).collect();
        assert_eq!(first, vec![2, 3, 0]);
        assert_eq!((table.mapped_pages(), table.idle_pages()), (1, 1));
    }

    #[test]
    fn a_chunk_goes_only_when_every_page_of_it_is_idle() {
        let mut table = PageTable::default();
        mapped(&mut table, 0, 5, &[4, 2]);
        table.acquire(0, 5);
        table.release(0, 5, || 2);
        table.acquire(3, 3);
        let taken = table.take_idle(|_, _| true, |_| false, u64::MAX);
        assert_eq!(taken, vec![PageRun { first: 4, count: 2 }]);
        assert_eq!((table.mapped_pages(), table.idle_pages()), (4, 3));
        table.release(3, 3, || 3);
        let taken = table.take_idle(|_, _| true, |page| page == 5, u64::MAX);
        assert_eq!(taken, vec![PageRun { first: 0, count: 4 }]);
        table.restore_idle(taken[0], 4);
        assert_eq!((table.mapped_pages(), table.idle_pages()), (4, 4));
    }

    #[test]
    fn pages_idle_since_an_order_are_left_and_the_newest_taken_is_known() {
        let mut table = PageTable::default();
        mapped(&mut table, 0, 2, &[1, 1, 1]);
        table.acquire(0, 2);
        table.release(0, 0, || 1);
        let fence_mark = table.next_order();
        table.release(1, 2, || 1);
        let taken = table.take_idle(|_, _| true, |_| false, fence_mark);
        assert_eq!(taken, vec![PageRun { first: 0, count: 1 }]);
        assert!(table.newest_order(&taken) < fence_mark);
        let rest = table.take_idle(|_, _| true, |_| false, u64::MAX);
        assert_eq!(rest.len(), 2);
        assert!(table.newest_order(&rest) >= fence_mark);
    }

    #[test]
    fn spared_and_live_pages_are_not_taken() {
        let mut table = PageTable::default();
        mapped(&mut table, 0, 2, &[1, 1, 1]);
        table.acquire(0, 0);
        let taken = table.take_idle(|_, _| true, |page| page == 1, u64::MAX);
        assert_eq!(taken, vec![PageRun { first: 2, count: 1 }]);
    }
}
