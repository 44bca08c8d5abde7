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

/// Per-page state of one arena. Pages are numbered from the arena's base. Finding idle pages
/// scans the table: that happens only when memory goes back to the driver, so the hot path
/// keeps no queue, only a counter and a timestamp per page.
#[derive(Debug, Default)]
pub struct PageTable {
    state: Vec<PageState>,
    live_blocks: Vec<u32>,
    /// When each idle page went idle, in [`crate::clock`] ticks (for age-based release)...
    idle_since: Vec<u64>,
    /// ...and in which order (the coarse clock ties within milliseconds; this never does).
    idle_order: Vec<u64>,
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
        self.state
            .get(page as usize)
            .is_some_and(|s| *s != PageState::Unmapped)
    }

    fn grow_to(&mut self, last: u32) {
        let needed = last as usize + 1;
        if self.state.len() < needed {
            self.state.resize(needed, PageState::Unmapped);
            self.live_blocks.resize(needed, 0);
            self.idle_since.resize(needed, 0);
            self.idle_order.resize(needed, 0);
        }
    }

    /// Appends to `runs` the unmapped pages among `first..=last`, merged into runs.
    #[inline]
    pub fn unmapped_runs(&mut self, first: u32, last: u32, runs: &mut Vec<PageRun>) {
        self.grow_to(last);
        for page in first..=last {
            if self.state[page as usize] != PageState::Unmapped {
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
            self.set_idle(page, now);
            self.mapped_pages += 1;
        }
    }

    fn set_idle(&mut self, page: u32, now: u64) {
        self.state[page as usize] = PageState::Idle;
        self.idle_since[page as usize] = now;
        self.idle_order[page as usize] = self.next_order;
        self.next_order += 1;
        self.idle_pages += 1;
    }

    /// A block now lives on `first..=last`, all of which are mapped.
    #[inline]
    pub fn acquire(&mut self, first: u32, last: u32) {
        for page in first..=last {
            let p = page as usize;
            debug_assert_ne!(self.state[p], PageState::Unmapped);
            if self.live_blocks[p] == 0 {
                self.state[p] = PageState::Live;
                self.idle_pages -= 1;
            }
            self.live_blocks[p] += 1;
        }
    }

    /// A block on `first..=last` was freed; pages left with no live block go idle.
    #[inline]
    pub fn release(&mut self, first: u32, last: u32, now: impl FnOnce() -> u64) {
        let mut now = Some(now);
        let mut at = 0;
        for page in first..=last {
            let p = page as usize;
            self.live_blocks[p] -= 1;
            if self.live_blocks[p] == 0 {
                // Read the clock only when a page actually goes idle, not on every free.
                if let Some(read) = now.take() {
                    at = read();
                }
                self.set_idle(page, at);
            }
        }
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
        let mut idle: Vec<(u64, u32)> = (0..self.state.len() as u32)
            .filter(|&p| self.state[p as usize] == PageState::Idle && !spare(p))
            .map(|p| (self.idle_order[p as usize], p))
            .collect();
        idle.sort_unstable();
        let mut taken = Vec::new();
        for (_, page) in idle {
            if !keep_going(taken.len(), self.idle_since[page as usize]) {
                break;
            }
            self.state[page as usize] = PageState::Unmapped;
            self.idle_pages -= 1;
            self.mapped_pages -= 1;
            taken.push(page);
        }
        taken
    }

    /// Puts back pages from `take_idle` that the driver failed to unmap.
    pub fn restore_idle(&mut self, pages: &[u32], now: u64) {
        for &page in pages {
            self.set_idle(page, now);
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
