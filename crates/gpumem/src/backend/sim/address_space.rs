//! The simulated driver's address space: ranges handed out first-fit and merged when given
//! back, so addresses are unique while live and reused afterwards.

use super::super::{DevicePtr, PhysicalChunk};
use std::collections::BTreeMap;

/// First-fit allocator over a device's address space, so addresses are unique while live and
/// reused after release, as the driver's are.
#[derive(Debug)]
pub(super) struct AddressSpace {
    free: BTreeMap<u64, u64>,
}

impl AddressSpace {
    pub(super) fn new(base: u64, size: u64) -> Self {
        AddressSpace {
            free: BTreeMap::from([(base, size)]),
        }
    }

    pub(super) fn take(&mut self, size: u64) -> Option<u64> {
        let (&start, &len) = self.free.iter().find(|(_, &len)| len >= size)?;
        self.free.remove(&start);
        if len > size {
            self.free.insert(start + size, len - size);
        }
        Some(start)
    }

    pub(super) fn give_back(&mut self, mut start: u64, mut size: u64) {
        if let Some((&prev, &prev_len)) = self.free.range(..start).next_back() {
            if prev + prev_len == start {
                self.free.remove(&prev);
                start = prev;
                size += prev_len;
            }
        }
        if let Some(next_len) = self.free.remove(&(start + size)) {
            size += next_len;
        }
        self.free.insert(start, size);
    }
}

/// The chunks mapped into a device's address space, by the address each mapping starts at.
/// Mappings never overlap, so the one starting last before a range's end is the only one that
/// can reach into it: every question is one ordered lookup, whatever the range's page count.
#[derive(Debug, Default)]
pub(super) struct Mappings {
    by_start: BTreeMap<DevicePtr, PhysicalChunk>,
}

impl Mappings {
    /// Whether any mapping overlaps `[addr, addr + size)`.
    pub(super) fn overlaps(&self, addr: DevicePtr, size: u64, page: u64) -> bool {
        self.by_start
            .range(..addr + size)
            .next_back()
            .is_some_and(|(&start, chunk)| start + chunk.pages as u64 * page > addr)
    }

    /// The mapping that covers `at`, and where it starts.
    pub(super) fn covering(&self, at: DevicePtr, page: u64) -> Option<(DevicePtr, PhysicalChunk)> {
        self.by_start
            .range(..=at)
            .next_back()
            .filter(|(&start, chunk)| start + chunk.pages as u64 * page > at)
            .map(|(&start, &chunk)| (start, chunk))
    }

    pub(super) fn insert(&mut self, start: DevicePtr, chunk: PhysicalChunk) {
        self.by_start.insert(start, chunk);
    }

    pub(super) fn remove(&mut self, start: DevicePtr) {
        self.by_start.remove(&start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_and_covering_find_only_the_mapping_in_reach() {
        let mut mappings = Mappings::default();
        let chunk = |pages| PhysicalChunk { handle: 1, pages };
        mappings.insert(0, chunk(10));
        mappings.insert(20, chunk(5));
        assert!(mappings.overlaps(5, 10, 1), "[5, 15) reaches into [0, 10)");
        assert!(!mappings.overlaps(10, 10, 1), "[10, 20) lies between them");
        assert!(
            mappings.overlaps(19, 2, 1),
            "[19, 21) reaches into [20, 25)"
        );
        assert!(!mappings.overlaps(25, 100, 1));
        assert_eq!(mappings.covering(9, 1).map(|(s, _)| s), Some(0));
        assert_eq!(mappings.covering(10, 1), None);
        assert_eq!(mappings.covering(24, 1).map(|(s, _)| s), Some(20));
        mappings.remove(0);
        assert!(!mappings.overlaps(0, 20, 1));
    }
}
