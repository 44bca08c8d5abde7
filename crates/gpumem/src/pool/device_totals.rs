//! [`DeviceReserve`]: the totals all pools of one device share (bytes held from the driver, and
//! with one shard the bytes of live blocks), with exact peaks.

use super::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// Device-wide totals of all pools of one device, with exact peaks: bytes held from the driver
/// (mapped pages, pages kept in the [`PageReserve`](super::PageReserve), direct allocations),
/// changed only when the driver creates or releases memory (the miss path); and, when the device
/// has one shard, bytes of live blocks and requested by them, changed on every allocation and free.
/// Summing the pools' own peaks instead overstates the device's peak whenever pools peak at
/// different times (PyTorch's main and autograd threads, with a shard each, read 25 % high); with a
/// shard per thread the shared line would cost every allocation (eight threads at once: ~1 µs a
/// pool hit on an H100 host), so there the pools' sum stands, an upper bound.
#[derive(Debug, Default)]
pub struct DeviceReserve {
    pub reserved_bytes: AtomicU64,
    pub peak_reserved_bytes: AtomicU64,
    /// Whether `in_use` and `requested` are kept (one shard per stream).
    exact_usage: bool,
    in_use: Gauge,
    requested: Gauge,
}

/// A device-wide amount and its peak.
#[derive(Debug, Default)]
struct Gauge {
    now: AtomicU64,
    peak: AtomicU64,
}

impl Gauge {
    #[inline]
    fn add(&self, bytes: u64) {
        let now = self.now.fetch_add(bytes, Relaxed) + bytes;
        // A plain load first: the peak's line is written only when it moves.
        if now > self.peak.load(Relaxed) {
            self.peak.fetch_max(now, Relaxed);
        }
    }

    #[inline]
    fn sub(&self, bytes: u64) {
        self.now.fetch_sub(bytes, Relaxed);
    }

    fn read(&self) -> (u64, u64) {
        let now = self.now.load(Relaxed);
        (now, self.peak.load(Relaxed).max(now))
    }

    fn reset_peak(&self) {
        self.peak.store(self.now.load(Relaxed), Relaxed);
    }
}

impl DeviceReserve {
    /// Totals for a device whose pools are `shards` per stream.
    pub fn new(shards: usize) -> Self {
        DeviceReserve {
            exact_usage: shards == 1,
            ..Self::default()
        }
    }

    pub fn grow(&self, bytes: u64) {
        let now = self.reserved_bytes.fetch_add(bytes, Relaxed) + bytes;
        self.peak_reserved_bytes.fetch_max(now, Relaxed);
    }

    pub fn shrink(&self, bytes: u64) {
        self.reserved_bytes.fetch_sub(bytes, Relaxed);
    }

    /// A block of `size` bytes for a request of `requested` is live.
    #[inline]
    pub fn on_alloc(&self, requested: u64, size: u64) {
        if self.exact_usage {
            self.in_use.add(size);
            self.requested.add(requested);
        }
    }

    #[inline]
    pub fn on_free(&self, requested: u64, size: u64) {
        if self.exact_usage {
            self.in_use.sub(size);
            self.requested.sub(requested);
        }
    }

    /// Bytes of live blocks on the device and their peak, and bytes requested by them and
    /// their peak, where the device keeps them (one shard).
    pub fn usage(&self) -> Option<((u64, u64), (u64, u64))> {
        self.exact_usage
            .then(|| (self.in_use.read(), self.requested.read()))
    }

    pub fn reset_peak(&self) {
        self.peak_reserved_bytes
            .store(self.reserved_bytes.load(Relaxed), Relaxed);
        self.in_use.reset_peak();
        self.requested.reset_peak();
    }

    /// The reserved bytes and their peak. Read while a pool grows (between its add and its
    /// raise of the peak) or while the peak is reset (which may overwrite a concurrent raise),
    /// the stored peak can be below the value: the peak returned never is (the loom model in
    /// tests/it/reliability/model_check.rs checks every interleaving).
    pub fn read(&self) -> (u64, u64) {
        let reserved = self.reserved_bytes.load(Relaxed);
        (
            reserved,
            self.peak_reserved_bytes.load(Relaxed).max(reserved),
        )
    }
}
