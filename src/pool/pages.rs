//! Which pages of an arena are backed by device memory, how many live blocks touch each, and
//! since when each mapped page without a live block has been idle (oldest are released first).

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
}

const UNMAPPED: Page = Page {
    state: PageState::Unmapped,
    live_blocks: 0,
    idle_since: 0,
    idle_order: 0,
};

/// Per-page state of one arena. Pages are numbered from the arena's base. Finding idle pages
/// scans the table: that happens only when memory goes back to the driver, so the hot path
/// keeps no queue, only a counter and a timestamp per page.
#[derive(Debug, Default)]
pub struct PageTable {
    pages: Vec<Page>,
    next_order: u64,
    idle_pages: usize,
    mapped_pages: usize,
}

/// A run of consecutive pages `[first, first + count)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRun {
    pub first: u32,
    pub count: u32,
}

impl PageTable {
    pub fn mapped_pages(&self) -> usize {
        self.mapped_pages
    }

    pub fn idle_pages(&self) -> usize {
        self.idle_pages
    }

    pub fn is_mapped(&self, page: u32) -> bool {
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
    pub fn unmapped_runs(&mut self, first: u32, last: u32, runs: &mut Vec<PageRun>) {
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

    /// Records that the driver has mapped `run` (its pages are idle until acquired).
    pub fn mark_mapped(&mut self, run: PageRun, now: u64) {
        for page in run.first..run.first + run.count {
            self.set_idle(page as usize, now);
            self.mapped_pages += 1;
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
    pub fn acquire(&mut self, first: u32, last: u32) {
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
    pub fn release(&mut self, first: u32, last: u32, now: impl FnOnce() -> u64) {
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

    /// Takes idle pages, oldest first, while `keep_going(count_taken, idle_since)` says so,
    /// passing over pages for which `spare(page)` is true; they are marked unmapped, and the
    /// caller must unmap them (or hand them back with `restore_idle`).
    pub fn take_idle(
        &mut self,
        mut keep_going: impl FnMut(usize, u64) -> bool,
        spare: impl Fn(u32) -> bool,
    ) -> Vec<u32> {
        if self.idle_pages == 0 {
            return Vec::new();
        }
        let mut idle: Vec<(u64, u32)> = (0..self.pages.len() as u32)
            .filter(|&p| self.pages[p as usize].state == PageState::Idle && !spare(p))
            .map(|p| (self.pages[p as usize].idle_order, p))
            .collect();
        idle.sort_unstable();
        let mut taken = Vec::new();
        for (_, page) in idle {
            let entry = &mut self.pages[page as usize];
            if !keep_going(taken.len(), entry.idle_since) {
                break;
            }
            entry.state = PageState::Unmapped;
            self.idle_pages -= 1;
            self.mapped_pages -= 1;
            taken.push(page);
        }
        taken
    }

    /// Puts back pages from `take_idle` that the driver failed to unmap.
    pub fn restore_idle(&mut self, pages: &[u32], now: u64) {
        for &page in pages {
            self.set_idle(page as usize, now);
            self.mapped_pages += 1;
        }
    }
}

/// Merges sorted page numbers into runs of consecutive pages.
pub fn runs_of(mut pages: Vec<u32>) -> Vec<PageRun> {
    pages.sort_unstable();
    let mut runs: Vec<PageRun> = Vec::new();
    for page in pages {
        match runs.last_mut() {
            Some(run) if run.first + run.count == page => run.count += 1,
            _ => runs.push(PageRun {
                first: page,
                count: 1,
            }),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_go_idle_when_the_last_block_leaves_and_are_released_oldest_first() {
        let mut table = PageTable::default();
        let mut runs = Vec::new();
        table.unmapped_runs(0, 3, &mut runs);
        assert_eq!(runs, vec![PageRun { first: 0, count: 4 }]);
        table.mark_mapped(runs[0], 1);
        table.acquire(0, 1);
        table.acquire(1, 3);
        assert_eq!((table.mapped_pages(), table.idle_pages()), (4, 0));
        table.release(1, 3, || 5);
        assert_eq!(table.idle_pages(), 2, "page 1 still holds the first block");
        table.release(0, 1, || 7);
        let taken = table.take_idle(|n, _| n < 3, |_| false);
        assert_eq!(taken, vec![2, 3, 0]);
        assert_eq!((table.mapped_pages(), table.idle_pages()), (1, 1));
    }

    #[test]
    fn spared_and_live_pages_are_not_taken() {
        let mut table = PageTable::default();
        let mut runs = Vec::new();
        table.unmapped_runs(0, 2, &mut runs);
        table.mark_mapped(runs[0], 0);
        table.acquire(0, 0);
        let taken = table.take_idle(|_, _| true, |page| page == 1);
        assert_eq!(taken, vec![2]);
        assert_eq!(runs_of(vec![5, 1, 2, 7, 6]).len(), 2);
    }
}
