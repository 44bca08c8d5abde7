//! The counters of a pool, or of a device's pools added up, as the snapshot carries them.

use serde::{Deserialize, Serialize};

/// A pool's counters at one instant (the core's `PoolCounters`, copied); adds up across pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterValues {
    pub requested_bytes: u64,
    pub in_use_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_requested_bytes: u64,
    pub peak_in_use_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub live_allocations: u64,
    pub allocations: u64,
    pub frees: u64,
    pub requests: u64,
    pub hits: u64,
    pub driver_allocs: u64,
    pub driver_frees: u64,
    pub driver_errors: u64,
}

impl CounterValues {
    /// Sums counters; peaks add up too, which is exact when one pool was active and an upper
    /// bound otherwise (pools peak at different moments).
    pub fn add(&mut self, other: &CounterValues) {
        self.requested_bytes += other.requested_bytes;
        self.in_use_bytes += other.in_use_bytes;
        self.reserved_bytes += other.reserved_bytes;
        self.peak_requested_bytes += other.peak_requested_bytes;
        self.peak_in_use_bytes += other.peak_in_use_bytes;
        self.peak_reserved_bytes += other.peak_reserved_bytes;
        self.live_allocations += other.live_allocations;
        self.allocations += other.allocations;
        self.frees += other.frees;
        self.requests += other.requests;
        self.hits += other.hits;
        self.driver_allocs += other.driver_allocs;
        self.driver_frees += other.driver_frees;
        self.driver_errors += other.driver_errors;
    }

    pub fn hit_ratio(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }
}
