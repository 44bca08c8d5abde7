//! Tests of `pages`: worked cases, and random sequences checked against a page-by-page model.

use super::*;

mod per_page_model;

use per_page_model::PerPageModel;

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
    let taken = table.take_idle(|_, _| true, |chunk| chunk.overlaps(5, 5), u64::MAX);
    assert_eq!(taken, vec![PageRun { first: 0, count: 4 }]);
    table.restore_idle(taken[0], 4);
    assert_eq!((table.mapped_pages(), table.idle_pages()), (4, 4));
}

#[test]
fn pages_idle_since_an_order_are_left_and_the_newest_taken_is_known() {
    let mut table = PageTable::default();
    mapped(&mut table, 0, 2, &[1, 1, 1]);
    table.acquire(0, 0);
    table.acquire(1, 2);
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
    let taken = table.take_idle(|_, _| true, |chunk| chunk.overlaps(1, 1), u64::MAX);
    assert_eq!(taken, vec![PageRun { first: 2, count: 1 }]);
}

#[test]
fn a_block_of_many_pages_costs_a_few_runs() {
    let mut table = PageTable::default();
    let pages = 99_999;
    mapped(&mut table, 0, pages - 1, &[3; 33_333]);
    table.acquire(0, pages - 1);
    table.release(0, pages - 1, || 2);
    assert_eq!(table.idle.overlapping(0, pages).count(), 1);
    assert_eq!(table.mapped_runs(0, pages - 1).count(), 1);
    table.acquire(10, pages - 11);
    assert_eq!(table.idle.overlapping(0, pages).count(), 2);
    assert_eq!(table.idle_pages(), 20);
}

/// splitmix64: a fixed, dependency-free stream of numbers, so a failing seed replays.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    fn percent(&mut self, chance: u64) -> bool {
        self.below(100) < chance
    }
}

/// Two stretches of pages far apart, so that runs meet across words and levels of the index.
const REGIONS: [u32; 2] = [0, 4_100];
const REGION_PAGES: u32 = 160;

/// A block placed at random where byte ranges could put it: it may share its first or last
/// page with other blocks, never a page between.
fn random_block(random: &mut Random, live: &[(u32, u32)]) -> Option<(u32, u32)> {
    let pages = match random.below(8) {
        0 => 1 + random.below(REGION_PAGES as u64 / 2) as u32,
        1 | 2 => 2 + random.below(4) as u32,
        _ => 1,
    };
    let region = REGIONS[random.below(REGIONS.len() as u64) as usize];
    let first = region + random.below((REGION_PAGES - pages + 1) as u64) as u32;
    let last = first + pages - 1;
    live.iter()
        .all(|&(f, l)| l <= first || last <= f)
        .then_some((first, last))
}

/// Chunk lengths for a run: the driver's up to three pages at a time, or the run whole.
fn random_chunks(random: &mut Random, pages: u32) -> Vec<u32> {
    if random.percent(20) {
        return vec![pages];
    }
    let mut chunks = Vec::new();
    let mut left = pages;
    while left > 0 {
        let chunk = (1 + random.below(3) as u32).min(left);
        chunks.push(chunk);
        left -= chunk;
    }
    chunks
}

/// The run table and the per-page model side by side, with the blocks live on them.
struct Pair {
    table: PageTable,
    model: PerPageModel,
    live: Vec<(u32, u32)>,
    now: u64,
}

impl Pair {
    fn alloc(&mut self, random: &mut Random) {
        let Some((first, last)) = random_block(random, &self.live) else {
            return;
        };
        let (mut runs, mut expected) = (Vec::new(), Vec::new());
        self.table.unmapped_runs(first, last, &mut runs);
        self.model.unmapped_runs(first, last, &mut expected);
        assert_eq!(runs, expected, "unmapped pages of {first}..={last}");
        for run in runs {
            let chunks = random_chunks(random, run.count);
            self.table.mark_mapped(run, &chunks, self.now);
            self.model.mark_mapped(run, &chunks, self.now);
        }
        // Now and then the mapping counts but the block fails, as when the driver refuses a
        // later run and cannot unmap an earlier one: its pages stay idle.
        if random.percent(90) {
            self.table.acquire(first, last);
            self.model.acquire(first, last);
            self.live.push((first, last));
        }
    }

    fn free(&mut self, random: &mut Random) {
        if self.live.is_empty() {
            return;
        }
        let (first, last) = self
            .live
            .swap_remove(random.below(self.live.len() as u64) as usize);
        let (mut read, mut expected_read) = (false, false);
        self.table.release(first, last, || {
            read = true;
            self.now
        });
        self.model.release(first, last, || {
            expected_read = true;
            self.now
        });
        assert_eq!(
            read, expected_read,
            "the clock is read only when a page goes idle"
        );
    }

    fn take(&mut self, random: &mut Random) {
        let pages_wanted = match random.below(3) {
            0 => usize::MAX,
            _ => random.below(12) as usize,
        };
        let since_limit = self.now.saturating_sub(random.below(4));
        let before_order = match random.below(3) {
            0 => random.below(self.table.next_order() + 1),
            _ => u64::MAX,
        };
        // Pages a block is about to take, when there is one.
        let spared = random
            .percent(30)
            .then(|| random_block(random, &[]).unwrap());
        let (mut asked, mut expected_asked) = (Vec::new(), Vec::new());
        let taken = self.table.take_idle(
            |pages, since| {
                asked.push((pages, since));
                pages < pages_wanted && since <= since_limit
            },
            |chunk| spared.is_some_and(|(first, last)| chunk.overlaps(first, last)),
            before_order,
        );
        let expected = self.model.take_idle(
            |pages, since| {
                expected_asked.push((pages, since));
                pages < pages_wanted && since <= since_limit
            },
            |page| spared.is_some_and(|(first, last)| (first..=last).contains(&page)),
            before_order,
        );
        assert_eq!(taken, expected, "chunks taken");
        assert_eq!(asked, expected_asked, "what keep_going was asked");
        let newest = self.table.newest_order(&taken);
        assert_eq!(
            newest,
            self.model.newest_order(&taken),
            "newest of all taken"
        );
        if !taken.is_empty() {
            let some = &taken[random.below(taken.len() as u64) as usize..];
            let expected = self.model.newest_order(some);
            assert_eq!(self.table.newest_order(some), expected, "newest of some");
        }
        // The driver refusing to unmap hands the chunks from one onwards back.
        if random.percent(30) && !taken.is_empty() {
            for &chunk in &taken[random.below(taken.len() as u64) as usize..] {
                self.table.restore_idle(chunk, self.now);
                self.model.restore_idle(chunk, self.now);
            }
        }
    }

    fn assert_same(&self) {
        let table = &self.table;
        let counts = (table.mapped_pages(), table.idle_pages(), table.next_order());
        let model = &self.model;
        let expected = (model.mapped_pages(), model.idle_pages(), model.next_order());
        assert_eq!(counts, expected, "mapped pages, idle pages, next order");
        for region in REGIONS {
            let last = region + REGION_PAGES - 1;
            let runs: Vec<PageRun> = table.mapped_runs(region, last).collect();
            assert_eq!(runs, model.mapped_runs(region, last), "mapped pages");
        }
    }
}

#[test]
fn random_sequences_match_the_per_page_model() {
    for seed in 0..16 {
        let mut random = Random(seed);
        let mut pair = Pair {
            table: PageTable::default(),
            model: PerPageModel::default(),
            live: Vec::new(),
            now: 0,
        };
        for _ in 0..2_000 {
            // The coarse clock: consecutive events often share a tick.
            pair.now += random.below(2);
            match random.below(20) {
                0..=7 => pair.alloc(&mut random),
                8..=15 => pair.free(&mut random),
                _ => pair.take(&mut random),
            }
            pair.assert_same();
        }
        while !pair.live.is_empty() {
            pair.free(&mut random);
        }
        let everything = pair.table.take_idle(|_, _| true, |_| false, u64::MAX);
        let expected = pair.model.take_idle(|_, _| true, |_| false, u64::MAX);
        assert_eq!(everything, expected, "seed {seed}: the rest");
        pair.assert_same();
        assert_eq!(pair.table.mapped_pages(), 0);
    }
}
