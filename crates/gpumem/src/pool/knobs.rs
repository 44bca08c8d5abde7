//! The cache settings a device's pools read on the miss path (how a miss cuts its pages, how
//! many idle pages the budget keeps, where a block is placed), as relaxed atomics, so that the
//! adaptive default (`manager/adapting.rs`) can move them while the pools run. A fixed setting
//! stores them once. The hot path never reads them: a hit maps nothing.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed};

/// One device's cache settings, in pages where the pools count pages.
#[derive(Debug, Default)]
pub struct CacheKnobs {
    max_chunk_pages: AtomicU32,
    inside_chunk_pages: AtomicU32,
    whole_when_growing: AtomicBool,
    place_on_mapped_pages: AtomicBool,
    map_ahead_when_growing: AtomicBool,
    idle_pages_kept: AtomicUsize,
    idle_per_mille: AtomicUsize,
}

/// The same settings as plain values (what the adaptive decision hands over).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnobValues {
    pub max_chunk_bytes: u64,
    pub inside_chunk_bytes: u64,
    pub whole_when_growing: bool,
    pub place_on_mapped_pages: bool,
    pub map_ahead_when_growing: bool,
    pub idle_pages_kept: usize,
    pub idle_per_mille: usize,
}

impl CacheKnobs {
    /// Stores `values`, with chunk sizes in pages of `page_size` bytes (at least one page for
    /// the largest chunk).
    pub fn store(&self, values: &KnobValues, page_size: u64) {
        let pages = |bytes: u64| (bytes / page_size.max(1)).min(u32::MAX as u64) as u32;
        self.max_chunk_pages
            .store(pages(values.max_chunk_bytes).max(1), Relaxed);
        self.inside_chunk_pages
            .store(pages(values.inside_chunk_bytes), Relaxed);
        self.whole_when_growing
            .store(values.whole_when_growing, Relaxed);
        self.place_on_mapped_pages
            .store(values.place_on_mapped_pages, Relaxed);
        self.map_ahead_when_growing
            .store(values.map_ahead_when_growing, Relaxed);
        self.idle_pages_kept.store(values.idle_pages_kept, Relaxed);
        self.idle_per_mille.store(values.idle_per_mille, Relaxed);
    }

    pub fn max_chunk_pages(&self) -> u32 {
        self.max_chunk_pages.load(Relaxed)
    }

    pub fn inside_chunk_pages(&self) -> u32 {
        self.inside_chunk_pages.load(Relaxed)
    }

    pub fn whole_when_growing(&self) -> bool {
        self.whole_when_growing.load(Relaxed)
    }

    pub fn place_on_mapped_pages(&self) -> bool {
        self.place_on_mapped_pages.load(Relaxed)
    }

    pub fn map_ahead_when_growing(&self) -> bool {
        self.map_ahead_when_growing.load(Relaxed)
    }

    pub fn idle_pages_kept(&self) -> usize {
        self.idle_pages_kept.load(Relaxed)
    }

    pub fn idle_per_mille(&self) -> usize {
        self.idle_per_mille.load(Relaxed)
    }
}
