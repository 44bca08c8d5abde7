//! A set of page numbers that finds its nearest member before or after any page in a few word
//! operations: the index under the page table's runs.

/// Pages as bits, and above them a bit per word telling whether that word has a member, level
/// on level up to a single word. The nearest member climbs until a word holds one and descends
/// along the highest (or lowest) bits: three levels cover 2^18 pages, half a terabyte of 2 MiB
/// pages, so a search is a handful of word operations whatever the arena's size.
#[derive(Debug, Default)]
pub(super) struct PageSet {
    /// `levels[0]` has a bit per page; `levels[k + 1]` a bit per word of `levels[k]`, set while
    /// that word is not zero. The last level is one word.
    levels: Vec<Vec<u64>>,
    pages: u32,
}

impl PageSet {
    /// The pages it can hold: `0..capacity`.
    pub(super) fn capacity(&self) -> u32 {
        self.pages
    }

    /// Makes room for pages `0..pages` (it never shrinks).
    pub(super) fn grow(&mut self, pages: u32) {
        if pages <= self.pages {
            return;
        }
        self.pages = pages;
        let mut words = (pages as usize).div_ceil(64);
        for level in 0.. {
            if level == self.levels.len() {
                // A new top level sums up the one below, which may hold members already.
                let summary = match level.checked_sub(1) {
                    Some(below) => summarize(&self.levels[below]),
                    None => Vec::new(),
                };
                self.levels.push(summary);
            }
            self.levels[level].resize(words, 0);
            if words == 1 {
                break;
            }
            words = words.div_ceil(64);
        }
    }

    pub(super) fn contains(&self, page: u32) -> bool {
        page < self.pages && self.levels[0][page as usize / 64] & (1 << (page % 64)) != 0
    }

    pub(super) fn insert(&mut self, page: u32) {
        debug_assert!(page < self.pages);
        let mut index = page as usize;
        for words in &mut self.levels {
            let word = &mut words[index / 64];
            let was_empty = *word == 0;
            *word |= 1 << (index % 64);
            if !was_empty {
                break;
            }
            index /= 64;
        }
    }

    pub(super) fn remove(&mut self, page: u32) {
        debug_assert!(page < self.pages);
        let mut index = page as usize;
        for words in &mut self.levels {
            let word = &mut words[index / 64];
            *word &= !(1 << (index % 64));
            if *word != 0 {
                break;
            }
            index /= 64;
        }
    }

    /// The largest member not above `page`.
    pub(super) fn last_at_or_before(&self, page: u32) -> Option<u32> {
        let mut index = page.min(self.pages.checked_sub(1)?) as usize;
        let mut level = 0;
        let mut found = loop {
            let words = self.levels.get(level)?;
            let at_or_below = words[index / 64] & (u64::MAX >> (63 - index % 64));
            if at_or_below != 0 {
                break index / 64 * 64 + 63 - at_or_below.leading_zeros() as usize;
            }
            // Nothing here: ask the level above for an earlier word with a member.
            index = (index / 64).checked_sub(1)?;
            level += 1;
        };
        for words in self.levels[..level].iter().rev() {
            found = found * 64 + 63 - words[found].leading_zeros() as usize;
        }
        Some(found as u32)
    }

    /// The smallest member not below `page`.
    pub(super) fn first_at_or_after(&self, page: u32) -> Option<u32> {
        let mut index = page as usize;
        let mut level = 0;
        let mut found = loop {
            let word = *self.levels.get(level)?.get(index / 64)?;
            let at_or_above = word & (u64::MAX << (index % 64));
            if at_or_above != 0 {
                break index / 64 * 64 + at_or_above.trailing_zeros() as usize;
            }
            // Nothing here: ask the level above for a later word with a member.
            index = index / 64 + 1;
            level += 1;
        };
        for words in self.levels[..level].iter().rev() {
            found = found * 64 + words[found].trailing_zeros() as usize;
        }
        Some(found as u32)
    }
}

/// A bit per word of `words`, set where the word is not zero.
fn summarize(words: &[u64]) -> Vec<u64> {
    let mut summary = vec![0; words.len().div_ceil(64)];
    for (index, _) in words.iter().enumerate().filter(|(_, word)| **word != 0) {
        summary[index / 64] |= 1 << (index % 64);
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_members_are_found_across_levels_and_growth() {
        let mut set = PageSet::default();
        assert_eq!(set.last_at_or_before(5), None);
        assert_eq!(set.first_at_or_after(0), None);
        set.grow(100);
        set.insert(3);
        set.insert(70);
        // Growing past one word, then past 64 words, adds levels over the members already in.
        set.grow(5_000);
        set.grow(300_000);
        set.insert(4_999);
        set.insert(299_999);
        assert_eq!(set.last_at_or_before(2), None);
        assert_eq!(set.last_at_or_before(69), Some(3));
        assert_eq!(set.last_at_or_before(4_998), Some(70));
        assert_eq!(set.last_at_or_before(u32::MAX), Some(299_999));
        assert_eq!(set.first_at_or_after(4), Some(70));
        assert_eq!(set.first_at_or_after(71), Some(4_999));
        assert_eq!(set.first_at_or_after(5_000), Some(299_999));
        assert_eq!(set.first_at_or_after(300_000), None);
        set.remove(70);
        set.remove(4_999);
        assert!(!set.contains(70) && set.contains(3));
        assert_eq!(set.first_at_or_after(4), Some(299_999));
        assert_eq!(set.last_at_or_before(299_998), Some(3));
    }

    #[test]
    fn every_page_agrees_with_a_plain_scan() {
        let mut set = PageSet::default();
        set.grow(9_000);
        let members: Vec<u32> = (0..9_000)
            .filter(|p| p % 611 == 7 || p % 4_096 == 0)
            .collect();
        for &page in &members {
            set.insert(page);
        }
        for page in 0..9_000 {
            let before = members.iter().rev().find(|&&m| m <= page).copied();
            let after = members.iter().find(|&&m| m >= page).copied();
            assert_eq!(set.last_at_or_before(page), before, "before {page}");
            assert_eq!(set.first_at_or_after(page), after, "after {page}");
        }
    }
}
