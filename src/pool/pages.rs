//! Which pages of an arena are backed by device memory, how many live blocks touch each, and
//! which mapped pages sit idle (in the order they went idle, so the oldest are released first).

use std::collections::VecDeque;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PageState {
    Unmapped,
    /// Mapped, with at least one live block on it.
    Live,
    /// Mapped, no live block: cached memory that can be reused or released.
    Idle,
}

#[derive(Clone, Copy, Debug)]
struct IdleEntry {
    page: u32,
    generation: u32,
    since: Instant,
}

/// Per-page state of one arena. Pages are numbered from the arena's base.
#[derive(Debug, Default)]
pub struct PageTable {
    state: Vec<PageState>,
    live_blocks: Vec<u32>,
    /// Bumped each time a page goes idle, so stale queue entries can be told apart.
    generation: Vec<u32>,
    idle_queue: VecDeque<IdleEntry>,
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
            self.generation.resize(needed, 0);
        }
    }

    /// Appends to `runs` the unmapped pages among `first..=last`, merged into runs.
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
    pub fn mark_mapped(&mut self, run: PageRun, now: Instant) {
        for page in run.first..run.first + run.count {
            self.state[page as usize] = PageState::Idle;
            self.mapped_pages += 1;
            self.push_idle(page, now);
        }
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
    pub fn release(&mut self, first: u32, last: u32, now: impl FnOnce() -> Instant) {
        let mut now = Some(now);
        let mut since = None;
        for page in first..=last {
            let p = page as usize;
            self.live_blocks[p] -= 1;
            if self.live_blocks[p] == 0 {
                self.state[p] = PageState::Idle;
                // Read the clock only when a page actually goes idle, not on every free.
                let at =
                    *since.get_or_insert_with(|| now.take().map_or_else(Instant::now, |f| f()));
                self.push_idle(page, at);
            }
        }
    }

    fn push_idle(&mut self, page: u32, since: Instant) {
        let p = page as usize;
        self.generation[p] = self.generation[p].wrapping_add(1);
        self.idle_pages += 1;
        self.idle_queue.push_back(IdleEntry {
            page,
            generation: self.generation[p],
            since,
        });
        // Pages that went live again leave stale entries behind; drop them before they pile up.
        if self.idle_queue.len() > 4 * self.idle_pages + 1024 {
            let (state, generation) = (&self.state, &self.generation);
            self.idle_queue.retain(|e| {
                state[e.page as usize] == PageState::Idle
                    && generation[e.page as usize] == e.generation
            });
        }
    }

    /// Takes idle pages, oldest first, while `keep_going(count_taken, idle_since)` says so,
    /// passing over pages for which `spare(page)` is true; they are marked unmapped, and the
    /// caller must unmap them (or hand them back with `restore_idle`).
    pub fn take_idle(
        &mut self,
        mut keep_going: impl FnMut(usize, Instant) -> bool,
        spare: impl Fn(u32) -> bool,
    ) -> Vec<u32> {
        let mut taken = Vec::new();
        let mut spared = Vec::new();
        while let Some(entry) = self.idle_queue.front().copied() {
            let p = entry.page as usize;
            let current =
                self.state[p] == PageState::Idle && self.generation[p] == entry.generation;
            if current && !keep_going(taken.len(), entry.since) {
                break;
            }
            self.idle_queue.pop_front();
            if !current {
                continue;
            }
            if spare(entry.page) {
                spared.push(entry);
                continue;
            }
            self.state[p] = PageState::Unmapped;
            self.idle_pages -= 1;
            self.mapped_pages -= 1;
            taken.push(entry.page);
        }
        // Spared pages keep their place at the front: they are still the oldest.
        for entry in spared.into_iter().rev() {
            self.idle_queue.push_front(entry);
        }
        taken
    }

    /// Puts back pages from `take_idle` that the driver failed to unmap.
    pub fn restore_idle(&mut self, pages: &[u32], now: Instant) {
        for &page in pages {
            self.state[page as usize] = PageState::Idle;
            self.mapped_pages += 1;
            self.push_idle(page, now);
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
        let now = Instant::now();
        let mut table = PageTable::default();
        let mut runs = Vec::new();
        table.unmapped_runs(0, 3, &mut runs);
        assert_eq!(runs, vec![PageRun { first: 0, count: 4 }]);
        table.mark_mapped(runs[0], now);
        table.acquire(0, 1);
        table.acquire(1, 3);
        assert_eq!((table.mapped_pages(), table.idle_pages()), (4, 0));
        table.release(1, 3, || now);
        assert_eq!(table.idle_pages(), 2, "page 1 still holds the first block");
        table.release(0, 1, || now);
        let taken = table.take_idle(|n, _| n < 3, |_| false);
        assert_eq!(taken, vec![2, 3, 0]);
        assert_eq!((table.mapped_pages(), table.idle_pages()), (1, 1));
    }

    #[test]
    fn stale_idle_entries_are_skipped() {
        let now = Instant::now();
        let mut table = PageTable::default();
        let mut runs = Vec::new();
        table.unmapped_runs(0, 0, &mut runs);
        table.mark_mapped(runs[0], now);
        table.acquire(0, 0);
        table.release(0, 0, || now);
        table.acquire(0, 0);
        assert!(table.take_idle(|_, _| true, |_| false).is_empty());
        assert_eq!(runs_of(vec![5, 1, 2, 7, 6]).len(), 2);
    }
}
