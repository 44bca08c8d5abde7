//! The simulated driver's address space: ranges handed out first-fit and merged when given
//! back, so addresses are unique while live and reused afterwards.

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
