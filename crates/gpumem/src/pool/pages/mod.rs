//! Which pages of an arena are backed by device memory and by which chunk, which are under a
//! live block, and since when each mapped page without a live block has been idle (chunks whose
//! pages are all idle are released, oldest first) — kept as runs of pages, so that a block of
//! thousands of pages costs what a block of one does.

mod page_set;
mod runs;

use runs::{RunMap, RunValue};

/// Mapped pages: one run however many chunks mapped them (the table keeps the chunks apart),
/// so the unmapped pages of a block are the gaps between runs.
#[derive(Clone, Copy, Debug, Default)]
struct Mapped;

impl RunValue for Mapped {
    fn advanced(self, _offset: u32) -> Self {
        self
    }
    fn continues_into(self, _len: u32, _next: Self) -> bool {
        true
    }
}

/// A chunk the driver mapped as one and unmaps as one: never joined with its neighbours.
/// `whole`: sized for the one block over it (cut whole for it, or a kept chunk larger than an
/// ordinary cut mapped again under it; `Mapped::whole_at`): cut again when a smaller block lands.
#[derive(Clone, Copy, Debug, Default)]
struct Chunk {
    whole: bool,
}

impl RunValue for Chunk {
    fn advanced(self, _offset: u32) -> Self {
        self
    }
    fn continues_into(self, _len: u32, _next: Self) -> bool {
        false
    }
}

/// Idle pages that went idle together: when, in [`crate::clock`] ticks (for age-based
/// release), and in which order the run's first page did (the coarse clock ties within
/// milliseconds; orders never do). The page `k` pages in has order `order + k`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct IdleSince {
    since: u64,
    order: u64,
}

impl RunValue for IdleSince {
    fn advanced(self, offset: u32) -> Self {
        IdleSince {
            order: self.order + offset as u64,
            ..self
        }
    }
    fn continues_into(self, len: u32, next: Self) -> bool {
        next.since == self.since && next.order == self.order + len as u64
    }
}

/// The pages of one arena, numbered from the arena's base. Blocks never overlap, so a page
/// is shared by several live blocks only at a block's first or last page and every page
/// between is under that block alone: live pages need no runs of their own (they are the
/// mapped pages that are not idle), only a count of the blocks that begin or end on each page.
/// Every call costs a few word operations plus one per run or chunk it meets, never one per
/// page; finding idle chunks looks at idle pages' runs only.
#[derive(Debug, Default)]
pub(crate) struct PageTable {
    mapped: RunMap<Mapped>,
    chunks: RunMap<Chunk>,
    idle: RunMap<IdleSince>,
    /// Per page: the live blocks whose first or last page it is.
    block_ends: Vec<u32>,
    /// Per chunk, at its first page: the idle order of its newest page when `take_idle` took it
    /// (what unmapping it must wait past, asked after the pages have left `idle`).
    taken_order: Vec<u64>,
    next_order: u64,
    idle_pages: usize,
    mapped_pages: usize,
}

/// Which chunks [`PageTable::chunks_a_block_would_pin`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pinned {
    /// Chunks of more than this many pages that the block would cover less than half of.
    UnderHalfOfLargerThan(u32),
    /// Chunks cut whole for another block that the block would cover in part.
    WholeInPart,
}

/// A run of consecutive pages `[first, first + count)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageRun {
    pub first: u32,
    pub count: u32,
}

impl PageRun {
    /// The page after the run.
    pub(crate) fn end(self) -> u32 {
        self.first + self.count
    }

    /// Whether any of `first..=last` is in the run.
    pub(crate) fn overlaps(self, first: u32, last: u32) -> bool {
        first <= last && self.first <= last && first < self.end()
    }
}

impl PageTable {
    pub(crate) fn mapped_pages(&self) -> usize {
        self.mapped_pages
    }

    pub(crate) fn idle_pages(&self) -> usize {
        self.idle_pages
    }

    /// The mapped pages among `first..=last`, as maximal runs cut to that range, in order.
    pub(crate) fn mapped_runs(&self, first: u32, last: u32) -> impl Iterator<Item = PageRun> + '_ {
        let end = last + 1;
        self.mapped.overlapping(first, end).map(move |run| {
            let from = run.first.max(first);
            PageRun {
                first: from,
                count: run.end.min(end) - from,
            }
        })
    }

    /// Every run of mapped pages, in order (snapshot time only).
    pub(crate) fn all_mapped_runs(&self) -> impl Iterator<Item = PageRun> + '_ {
        let pages = u32::try_from(self.block_ends.len()).unwrap_or(u32::MAX);
        self.mapped.overlapping(0, pages).map(|run| PageRun {
            first: run.first,
            count: run.end - run.first,
        })
    }

    /// Makes room for pages `0..=last`: the per-page counts are sized to the highest page
    /// used, as the arena's address space is reserved far beyond what is ever mapped.
    fn grow_to(&mut self, last: u32) {
        let needed = last + 1;
        if self.block_ends.len() < needed as usize {
            self.mapped.grow(needed);
            self.chunks.grow(needed);
            self.idle.grow(needed);
            self.block_ends.resize(needed as usize, 0);
            self.taken_order.resize(needed as usize, 0);
        }
    }

    /// Appends to `runs` the unmapped pages among `first..=last`, merged into runs.
    #[inline]
    pub(crate) fn unmapped_runs(&mut self, first: u32, last: u32, runs: &mut Vec<PageRun>) {
        self.grow_to(last);
        let mut gap_from = first;
        let mut push_gap = |from: u32, to: u32| match runs.last_mut() {
            Some(run) if run.end() == from => run.count += to - from,
            _ => runs.push(PageRun {
                first: from,
                count: to - from,
            }),
        };
        for run in self.mapped.overlapping(first, last + 1) {
            if run.first > gap_from {
                push_gap(gap_from, run.first);
            }
            gap_from = gap_from.max(run.end);
        }
        if gap_from <= last {
            push_gap(gap_from, last + 1);
        }
    }

    /// Records that the driver has mapped `run` with `chunks` (their lengths in pages, in
    /// address order, adding up to the run); its pages are idle until acquired.
    pub(crate) fn mark_mapped(&mut self, run: PageRun, chunks: &[u32], now: u64) {
        debug_assert_eq!(chunks.iter().sum::<u32>(), run.count);
        self.grow_to(run.end() - 1);
        let mut first = run.first;
        for &pages in chunks {
            self.chunks.insert(first, first + pages, Chunk::default());
            first += pages;
        }
        self.map_idle(run, now);
    }

    /// Pages `run`, unmapped until now, are mapped and idle since `now`, in page order.
    fn map_idle(&mut self, run: PageRun, now: u64) {
        self.mapped.insert(run.first, run.end(), Mapped);
        let idle = IdleSince {
            since: now,
            order: self.next_order,
        };
        self.idle.insert(run.first, run.end(), idle);
        self.next_order += run.count as u64;
        self.idle_pages += run.count as usize;
        self.mapped_pages += run.count as usize;
    }

    /// A block now lives on `first..=last`, all of which are mapped. Blocks never overlap: a
    /// live block may share only its first or last page with others.
    #[inline]
    pub(crate) fn acquire(&mut self, first: u32, last: u32) {
        // Pages between are the block's alone, so were idle; an end page was idle unless
        // another block begins or ends on it.
        let first_was_idle = self.add_block_end(first);
        let last_was_idle = if last == first {
            first_was_idle
        } else {
            self.add_block_end(last)
        };
        let from = if first_was_idle { first } else { first + 1 };
        let to = if last_was_idle { last + 1 } else { last };
        if from < to {
            let went_live = self.idle.remove(from, to, |_| {});
            debug_assert_eq!(
                went_live,
                to - from,
                "a live block's page was idle or unmapped"
            );
            self.idle_pages -= went_live as usize;
        }
    }

    /// Counts a block beginning or ending on `page`; true if it was the only one.
    #[inline]
    fn add_block_end(&mut self, page: u32) -> bool {
        let ends = &mut self.block_ends[page as usize];
        *ends += 1;
        *ends == 1
    }

    /// The block that `acquire(first, last)` put on `first..=last` was freed; pages left with
    /// no live block go idle.
    #[inline]
    pub(crate) fn release(&mut self, first: u32, last: u32, now: impl FnOnce() -> u64) {
        let first_goes_idle = self.drop_block_end(first);
        let last_goes_idle = if last == first {
            first_goes_idle
        } else {
            self.drop_block_end(last)
        };
        let from = if first_goes_idle { first } else { first + 1 };
        let to = if last_goes_idle { last + 1 } else { last };
        if from < to {
            debug_assert!(self.idle.overlapping(from, to).next().is_none());
            // Read the clock only when a page actually goes idle, not on every free.
            let idle = IdleSince {
                since: now(),
                order: self.next_order + (from - first) as u64,
            };
            self.idle.insert(from, to, idle);
            self.idle_pages += (to - from) as usize;
        }
        // Orders are handed out by page position: unique, and increasing from call to call.
        self.next_order += (last - first) as u64 + 1;
    }

    /// Counts a block beginning or ending on `page` gone; true if it was the last one.
    #[inline]
    fn drop_block_end(&mut self, page: u32) -> bool {
        let ends = &mut self.block_ends[page as usize];
        *ends -= 1;
        *ends == 0
    }

    /// The idle order the next page to go idle will get: every page idle now is below it.
    pub(crate) fn next_order(&self) -> u64 {
        self.next_order
    }

    /// The idle order of the most recently idled page of `runs`, chunks the latest `take_idle`
    /// returned.
    pub(crate) fn newest_order(&self, runs: &[PageRun]) -> u64 {
        runs.iter()
            .filter_map(|run| self.taken_order.get(run.first as usize))
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Appends to `found` the wholly idle chunks at either end of `first..=last` that
    /// `pinned` names: chunks a block there would keep mapped, partly idle, for as long as it
    /// lives (a chunk is unmapped whole or not at all).
    pub(crate) fn chunks_a_block_would_pin(
        &self,
        first: u32,
        last: u32,
        pinned: Pinned,
        found: &mut Vec<PageRun>,
    ) {
        for page in [first, last] {
            let Some(chunk) = self.chunks.containing(page) else {
                continue;
            };
            let whole = chunk.value.whole;
            let chunk = PageRun {
                first: chunk.first,
                count: chunk.end - chunk.first,
            };
            let covered = chunk.end().min(last + 1) - chunk.first.max(first);
            let named = match pinned {
                Pinned::UnderHalfOfLargerThan(pages) => {
                    chunk.count > pages && covered * 2 < chunk.count
                }
                Pinned::WholeInPart => whole && covered < chunk.count,
            };
            if named && !found.contains(&chunk) && self.newest_if_all_idle(chunk).is_some() {
                found.push(chunk);
            }
        }
    }

    /// Takes chunks whose pages are all idle, the longest idle first (a chunk is as recent as
    /// its most recently idled page), while `keep_going(pages_taken, idle_since)` says so and
    /// the chunk went idle before idle order `before_order`, passing over chunks for which
    /// `spare(chunk)` is true; their pages are marked unmapped, and the caller must unmap them
    /// (or hand them back with `restore_idle`).
    pub(crate) fn take_idle(
        &mut self,
        mut keep_going: impl FnMut(usize, u64) -> bool,
        spare: impl Fn(PageRun) -> bool,
        before_order: u64,
    ) -> Vec<PageRun> {
        if self.idle_pages == 0 {
            return Vec::new();
        }
        let mut idle = self.idle_chunks(spare);
        idle.sort_unstable_by_key(|chunk| chunk.order);
        let mut taken = Vec::new();
        let mut pages_taken = 0;
        for IdleChunk {
            chunk,
            order,
            since,
        } in idle
        {
            if order >= before_order || !keep_going(pages_taken, since) {
                break;
            }
            let (first, end) = (chunk.first, chunk.end());
            self.idle.remove(first, end, |_| {});
            self.mapped.remove(first, end, |_| {});
            self.chunks.remove(first, end, |_| {});
            self.taken_order[first as usize] = order;
            self.idle_pages -= chunk.count as usize;
            self.mapped_pages -= chunk.count as usize;
            pages_taken += chunk.count as usize;
            taken.push(chunk);
        }
        taken
    }

    /// The chunks whose pages are all idle and that are not spared, in address order. Only
    /// chunks that meet an idle run are looked at.
    fn idle_chunks(&self, spare: impl Fn(PageRun) -> bool) -> Vec<IdleChunk> {
        let mut found = Vec::new();
        // Chunks before this page were looked at (a chunk may meet several idle runs).
        let mut looked_to = 0;
        while let Some(idle) = self.idle.overlapping(looked_to, u32::MAX).next() {
            for chunk in self.chunks.overlapping(idle.first.max(looked_to), idle.end) {
                looked_to = chunk.end;
                let chunk = PageRun {
                    first: chunk.first,
                    count: chunk.end - chunk.first,
                };
                if spare(chunk) {
                    continue;
                }
                if let Some((order, since)) = self.newest_if_all_idle(chunk) {
                    found.push(IdleChunk {
                        chunk,
                        order,
                        since,
                    });
                }
            }
            looked_to = looked_to.max(idle.end);
        }
        found
    }

    /// The largest idle order and idle time among `pages`, if every one of them is idle.
    fn newest_if_all_idle(&self, pages: PageRun) -> Option<(u64, u64)> {
        let (mut order, mut since) = (0, 0);
        let mut idle_to = pages.first;
        for run in self.idle.overlapping(pages.first, pages.end()) {
            if run.first > idle_to {
                return None;
            }
            let last_inside = run.end.min(pages.end()) - 1;
            order = order.max(run.value.order + (last_inside - run.first) as u64);
            since = since.max(run.value.since);
            idle_to = run.end;
        }
        (idle_to >= pages.end()).then_some((order, since))
    }

    /// Marks the chunk beginning at page `first` as cut whole for one block (`Cut::Whole`).
    pub(crate) fn mark_whole(&mut self, first: u32) {
        if let Some(chunk) = self.chunks.containing(first).filter(|c| c.first == first) {
            self.chunks.remove(chunk.first, chunk.end, |_| {});
            self.chunks
                .insert(chunk.first, chunk.end, Chunk { whole: true });
        }
    }

    /// Puts back a chunk from `take_idle` that the driver failed to unmap (as an ordinary one).
    pub(crate) fn restore_idle(&mut self, chunk: PageRun, now: u64) {
        self.chunks
            .insert(chunk.first, chunk.end(), Chunk::default());
        self.map_idle(chunk, now);
    }
}

/// A chunk all of whose pages are idle, with its newest page's idle order and idle time.
struct IdleChunk {
    chunk: PageRun,
    order: u64,
    since: u64,
}

#[cfg(test)]
mod tests;
