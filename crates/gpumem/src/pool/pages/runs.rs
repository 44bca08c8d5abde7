//! Runs of consecutive pages that share a value, found from any page they cover: how the page
//! table keeps its mapped pages, its chunks and its idle pages without an entry per page.

use super::page_set::PageSet;

/// What the pages of one run share.
pub(super) trait RunValue: Copy + Default {
    /// The value of the part of a run that starts `offset` pages into it.
    fn advanced(self, offset: u32) -> Self;
    /// Whether a run of `len` pages with this value, followed at once by a run with `next`,
    /// reads as one run (they are then kept as one).
    fn continues_into(self, len: u32, next: Self) -> bool;
}

/// Pages `first..end` and their value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run<V> {
    pub(super) first: u32,
    pub(super) end: u32,
    pub(super) value: V,
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot<V> {
    end: u32,
    value: V,
}

/// Disjoint runs over pages `0..capacity`. A run is found from any of its pages through the
/// set of first pages; its end and value sit in a slot indexed by its first page, so lookups
/// and edits cost a few word operations and no allocation.
#[derive(Debug, Default)]
pub(super) struct RunMap<V> {
    firsts: PageSet,
    /// Meaningful only at a page in `firsts`.
    slots: Vec<Slot<V>>,
}

impl<V: RunValue> RunMap<V> {
    /// Makes room for runs on pages `0..pages`.
    pub(super) fn grow(&mut self, pages: u32) {
        self.firsts.grow(pages);
        if self.slots.len() < pages as usize {
            self.slots.resize(pages as usize, Slot::default());
        }
    }

    fn run_from(&self, first: u32) -> Run<V> {
        let Slot { end, value } = self.slots[first as usize];
        Run { first, end, value }
    }

    /// The run covering `page`, if any.
    pub(super) fn containing(&self, page: u32) -> Option<Run<V>> {
        let run = self.run_from(self.firsts.last_at_or_before(page)?);
        (run.end > page).then_some(run)
    }

    /// The runs with a page in `first..end`, whole (not cut to the range), in page order.
    pub(super) fn overlapping(&self, first: u32, end: u32) -> impl Iterator<Item = Run<V>> + '_ {
        let mut next = None;
        if first < end {
            next = self
                .containing(first)
                .or_else(|| self.starting_at_or_after(first));
        }
        std::iter::from_fn(move || {
            let run = next.filter(|run| run.first < end)?;
            next = self.starting_at_or_after(run.end);
            Some(run)
        })
    }

    fn starting_at_or_after(&self, page: u32) -> Option<Run<V>> {
        Some(self.run_from(self.firsts.first_at_or_after(page)?))
    }

    /// Adds pages `first..end`, which no run may cover yet, joining the run just before or
    /// after when the value continues it.
    pub(super) fn insert(&mut self, first: u32, end: u32, value: V) {
        debug_assert!(first < end && end <= self.firsts.capacity());
        debug_assert!(self.overlapping(first, end).next().is_none());
        let (mut first, mut end, mut value) = (first, end, value);
        if let Some(before) = first.checked_sub(1).and_then(|page| self.containing(page)) {
            if before.value.continues_into(first - before.first, value) {
                first = before.first;
                value = before.value;
            }
        }
        if self.firsts.contains(end) {
            let after = self.run_from(end);
            if value.continues_into(end - first, after.value) {
                self.firsts.remove(end);
                end = after.end;
            }
        }
        self.firsts.insert(first);
        self.slots[first as usize] = Slot { end, value };
    }

    /// Takes pages `first..end` out of the runs, cutting those that reach past either side;
    /// hands `taken` each part taken out (cut to the range). Returns the pages taken out.
    pub(super) fn remove(&mut self, first: u32, end: u32, mut taken: impl FnMut(Run<V>)) -> u32 {
        self.split_at(first);
        self.split_at(end);
        let mut pages = 0;
        while let Some(run) = self
            .starting_at_or_after(first)
            .filter(|run| run.first < end)
        {
            self.firsts.remove(run.first);
            pages += run.end - run.first;
            taken(run);
        }
        pages
    }

    /// Makes `page` the first page of a run, if a run covers it and pages before it.
    fn split_at(&mut self, page: u32) {
        if let Some(run) = self.containing(page).filter(|run| run.first < page) {
            self.slots[run.first as usize].end = page;
            self.firsts.insert(page);
            let value = run.value.advanced(page - run.first);
            self.slots[page as usize] = Slot {
                end: run.end,
                value,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value that continues only into the next number, like idle orders do.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    struct Counting(u32);

    impl RunValue for Counting {
        fn advanced(self, offset: u32) -> Self {
            Counting(self.0 + offset)
        }
        fn continues_into(self, len: u32, next: Self) -> bool {
            self.0 + len == next.0
        }
    }

    fn runs(map: &RunMap<Counting>) -> Vec<(u32, u32, u32)> {
        map.overlapping(0, u32::MAX)
            .map(|run| (run.first, run.end, run.value.0))
            .collect()
    }

    #[test]
    fn runs_join_when_their_values_continue_and_split_when_cut() {
        let mut map = RunMap::default();
        map.grow(100);
        map.insert(10, 20, Counting(0));
        map.insert(30, 40, Counting(20));
        map.insert(20, 30, Counting(10));
        assert_eq!(runs(&map), vec![(10, 40, 0)]);
        map.insert(40, 45, Counting(99));
        assert_eq!(runs(&map), vec![(10, 40, 0), (40, 45, 99)]);
        let mut taken = Vec::new();
        let pages = map.remove(15, 42, |run| taken.push((run.first, run.end, run.value.0)));
        assert_eq!(pages, 27);
        assert_eq!(taken, vec![(15, 40, 5), (40, 42, 99)]);
        assert_eq!(runs(&map), vec![(10, 15, 0), (42, 45, 101)]);
        assert_eq!(map.containing(14).map(|run| run.first), Some(10));
        assert_eq!(map.containing(15), None);
        let around: Vec<u32> = map.overlapping(12, 43).map(|run| run.first).collect();
        assert_eq!(around, vec![10, 42]);
        assert_eq!(map.overlapping(15, 42).count(), 0);
        assert_eq!(map.overlapping(44, 44).count(), 0);
    }
}
