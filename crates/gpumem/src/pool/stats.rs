//! Per-pool counters: written only by the holder of the pool's lock (plain relaxed loads and
//! stores, no read-modify-write), read lock-free by snapshots.

use super::atomic::AtomicU64;
pub use gpumem_wire::CounterValues;
use std::sync::atomic::Ordering::Relaxed;

#[derive(Debug, Default)]
pub struct PoolCounters {
    pub requested_bytes: AtomicU64,
    pub in_use_bytes: AtomicU64,
    pub reserved_bytes: AtomicU64,
    pub peak_requested_bytes: AtomicU64,
    pub peak_in_use_bytes: AtomicU64,
    pub peak_reserved_bytes: AtomicU64,
    pub live_allocations: AtomicU64,
    pub allocations: AtomicU64,
    pub frees: AtomicU64,
    /// Allocation requests that reached this pool.
    pub requests: AtomicU64,
    /// Requests served without a driver call.
    pub hits: AtomicU64,
    pub driver_allocs: AtomicU64,
    pub driver_frees: AtomicU64,
    pub driver_errors: AtomicU64,
    /// Pages the arena has mapped, and those of them under a live block.
    pub mapped_pages: AtomicU64,
    pub live_pages: AtomicU64,
}

#[inline]
fn bump(counter: &AtomicU64, by: u64) {
    counter.store(counter.load(Relaxed) + by, Relaxed);
}

#[inline]
fn drop_by(counter: &AtomicU64, by: u64) {
    counter.store(counter.load(Relaxed).saturating_sub(by), Relaxed);
}

#[inline]
fn raise_peak(peak: &AtomicU64, value: u64) {
    if value > peak.load(Relaxed) {
        peak.store(value, Relaxed);
    }
}

impl PoolCounters {
    /// A request was served: `size` bytes of blocks holding `requested` bytes.
    #[inline]
    pub fn on_alloc(&self, requested: u64, size: u64, hit: bool) {
        bump(&self.requests, 1);
        bump(&self.allocations, 1);
        bump(&self.live_allocations, 1);
        if hit {
            bump(&self.hits, 1);
        }
        bump(&self.requested_bytes, requested);
        bump(&self.in_use_bytes, size);
        raise_peak(
            &self.peak_requested_bytes,
            self.requested_bytes.load(Relaxed),
        );
        raise_peak(&self.peak_in_use_bytes, self.in_use_bytes.load(Relaxed));
    }

    /// A request failed after reaching the pool.
    pub fn on_failed_request(&self) {
        bump(&self.requests, 1);
    }

    #[inline]
    pub fn on_free(&self, requested: u64, size: u64) {
        bump(&self.frees, 1);
        drop_by(&self.live_allocations, 1);
        drop_by(&self.requested_bytes, requested);
        drop_by(&self.in_use_bytes, size);
    }

    /// The driver gave the pool `bytes` more in `calls` calls.
    pub fn on_reserve(&self, bytes: u64, calls: u64) {
        bump(&self.driver_allocs, calls);
        bump(&self.reserved_bytes, bytes);
        raise_peak(&self.peak_reserved_bytes, self.reserved_bytes.load(Relaxed));
    }

    /// The pool returned `bytes` to the driver in `calls` calls.
    pub fn on_release(&self, bytes: u64, calls: u64) {
        bump(&self.driver_frees, calls);
        drop_by(&self.reserved_bytes, bytes);
    }

    #[inline]
    pub fn set_pages(&self, mapped: u64, live: u64) {
        self.mapped_pages.store(mapped, Relaxed);
        self.live_pages.store(live, Relaxed);
    }

    pub fn pages(&self) -> (u64, u64) {
        (
            self.mapped_pages.load(Relaxed),
            self.live_pages.load(Relaxed),
        )
    }

    pub fn on_driver_error(&self) {
        bump(&self.driver_errors, 1);
    }

    /// Peaks restart from the current values (call with the pool's lock held).
    pub fn reset_peaks(&self) {
        for (peak, current) in [
            (&self.peak_requested_bytes, &self.requested_bytes),
            (&self.peak_in_use_bytes, &self.in_use_bytes),
            (&self.peak_reserved_bytes, &self.reserved_bytes),
        ] {
            peak.store(current.load(Relaxed), Relaxed);
        }
    }

    /// Counts of events (requests, hits, allocations, frees, driver calls and errors) restart
    /// from zero; the state (bytes in use and reserved, live allocations, pages) is kept. Call
    /// with the pool's lock held.
    pub fn reset_counts(&self) {
        for count in [
            &self.allocations,
            &self.frees,
            &self.requests,
            &self.hits,
            &self.driver_allocs,
            &self.driver_frees,
            &self.driver_errors,
        ] {
            count.store(0, Relaxed);
        }
    }

    /// The counters now. Read while the owner writes, a value may already be raised and its
    /// peak not yet: each peak is at least its value as read.
    pub fn read(&self) -> CounterValues {
        let requested_bytes = self.requested_bytes.load(Relaxed);
        let in_use_bytes = self.in_use_bytes.load(Relaxed);
        let reserved_bytes = self.reserved_bytes.load(Relaxed);
        CounterValues {
            requested_bytes,
            in_use_bytes,
            reserved_bytes,
            peak_requested_bytes: self.peak_requested_bytes.load(Relaxed).max(requested_bytes),
            peak_in_use_bytes: self.peak_in_use_bytes.load(Relaxed).max(in_use_bytes),
            peak_reserved_bytes: self.peak_reserved_bytes.load(Relaxed).max(reserved_bytes),
            live_allocations: self.live_allocations.load(Relaxed),
            allocations: self.allocations.load(Relaxed),
            frees: self.frees.load(Relaxed),
            requests: self.requests.load(Relaxed),
            hits: self.hits.load(Relaxed),
            driver_allocs: self.driver_allocs.load(Relaxed),
            driver_frees: self.driver_frees.load(Relaxed),
            driver_errors: self.driver_errors.load(Relaxed),
        }
    }
}
