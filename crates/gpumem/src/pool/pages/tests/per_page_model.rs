//! The page table as it was kept before runs, one entry per page: the reference the run table
//! must agree with, call for call.

use super::PageRun;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PageState {
    Unmapped,
    Live,
    Idle,
}

#[derive(Clone, Copy, Debug)]
struct Page {
    state: PageState,
    live_blocks: u32,
    idle_since: u64,
    idle_order: u64,
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

#[derive(Debug, Default)]
pub(super) struct PerPageModel {
    pages: Vec<Page>,
    next_order: u64,
    idle_pages: usize,
    mapped_pages: usize,
}

impl PerPageModel {
    pub(super) fn mapped_pages(&self) -> usize {
        self.mapped_pages
    }

    pub(super) fn idle_pages(&self) -> usize {
        self.idle_pages
    }

    pub(super) fn next_order(&self) -> u64 {
        self.next_order
    }

    fn is_mapped(&self, page: u32) -> bool {
        self.pages
            .get(page as usize)
            .is_some_and(|p| p.state != PageState::Unmapped)
    }

    /// The mapped pages among `first..=last`, merged into runs.
    pub(super) fn mapped_runs(&self, first: u32, last: u32) -> Vec<PageRun> {
        let mut runs: Vec<PageRun> = Vec::new();
        for page in (first..=last).filter(|&page| self.is_mapped(page)) {
            match runs.last_mut() {
                Some(run) if run.end() == page => run.count += 1,
                _ => runs.push(PageRun {
                    first: page,
                    count: 1,
                }),
            }
        }
        runs
    }

    pub(super) fn unmapped_runs(&mut self, first: u32, last: u32, runs: &mut Vec<PageRun>) {
        if self.pages.len() <= last as usize {
            self.pages.resize(last as usize + 1, UNMAPPED);
        }
        for page in first..=last {
            if self.pages[page as usize].state != PageState::Unmapped {
                continue;
            }
            match runs.last_mut() {
                Some(run) if run.end() == page => run.count += 1,
                _ => runs.push(PageRun {
                    first: page,
                    count: 1,
                }),
            }
        }
    }

    pub(super) fn mark_mapped(&mut self, run: PageRun, chunks: &[u32], now: u64) {
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

    fn set_idle(&mut self, page: usize, now: u64) {
        let page = &mut self.pages[page];
        page.state = PageState::Idle;
        page.idle_since = now;
        page.idle_order = self.next_order;
        self.next_order += 1;
        self.idle_pages += 1;
    }

    pub(super) fn acquire(&mut self, first: u32, last: u32) {
        for page in &mut self.pages[first as usize..=last as usize] {
            assert_ne!(page.state, PageState::Unmapped);
            if page.live_blocks == 0 {
                page.state = PageState::Live;
                self.idle_pages -= 1;
            }
            page.live_blocks += 1;
        }
    }

    pub(super) fn release(&mut self, first: u32, last: u32, now: impl FnOnce() -> u64) {
        let mut now = Some(now);
        let mut at = 0;
        for page in first..=last {
            let entry = &mut self.pages[page as usize];
            entry.live_blocks -= 1;
            if entry.live_blocks == 0 {
                if let Some(read) = now.take() {
                    at = read();
                }
                entry.state = PageState::Idle;
                entry.idle_since = at;
                entry.idle_order = self.next_order + (page - first) as u64;
                self.idle_pages += 1;
            }
        }
        self.next_order += (last - first) as u64 + 1;
    }

    pub(super) fn newest_order(&self, runs: &[PageRun]) -> u64 {
        runs.iter()
            .flat_map(|run| &self.pages[run.first as usize..run.end() as usize])
            .map(|page| page.idle_order)
            .max()
            .unwrap_or(0)
    }

    pub(super) fn take_idle(
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
            assert_eq!(entry.chunk_first as usize, page);
            let chunk = PageRun {
                first: entry.chunk_first,
                count: entry.chunk_pages,
            };
            let pages = &self.pages[page..chunk.end() as usize];
            if pages.iter().all(|p| p.state == PageState::Idle)
                && !(chunk.first..chunk.end()).any(&spare)
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
            for entry in &mut self.pages[chunk.first as usize..chunk.end() as usize] {
                entry.state = PageState::Unmapped;
            }
            self.idle_pages -= chunk.count as usize;
            self.mapped_pages -= chunk.count as usize;
            pages_taken += chunk.count as usize;
            taken.push(chunk);
        }
        taken
    }

    pub(super) fn restore_idle(&mut self, chunk: PageRun, now: u64) {
        for page in chunk.first..chunk.end() {
            self.set_idle(page as usize, now);
            self.mapped_pages += 1;
        }
    }
}
