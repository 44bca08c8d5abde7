//! A lock-free latency histogram for the miss path: log-linear buckets (four per power of two,
//! so any percentile read from it is within 12.5% of the true one), recorded with one relaxed
//! add and read at snapshot time. Bounded memory, however long the process runs.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Values below this are their own bucket.
const LINEAR: u64 = 16;
/// Sub-buckets per power of two (2^SUB_BITS).
const SUB_BITS: u32 = 2;
const BUCKETS: usize = LINEAR as usize + (64 - 4) * (1 << SUB_BITS);

pub struct LatencyHistogram {
    buckets: Box<[AtomicU64; BUCKETS]>,
    /// Every value recorded, added up: how long misses took in all.
    total: AtomicU64,
    /// The largest value recorded, exact (a bucket only bounds it within an eighth).
    longest: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
            total: AtomicU64::new(0),
            longest: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.count())
            .finish()
    }
}

fn bucket_of(value: u64) -> usize {
    if value < LINEAR {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros();
    let sub = (value >> (exponent - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    LINEAR as usize + ((exponent - 4) << SUB_BITS) as usize + sub as usize
}

/// The middle of a bucket's range: what a percentile falling in it reports.
fn middle_of(bucket: usize) -> u64 {
    if bucket < LINEAR as usize {
        return bucket as u64;
    }
    let index = bucket - LINEAR as usize;
    let exponent = (index >> SUB_BITS) as u32 + 4;
    let sub = (index & ((1 << SUB_BITS) - 1)) as u64;
    let width = 1u64 << (exponent - SUB_BITS);
    let low = (1u64 << exponent) + sub * width;
    low + width / 2
}

impl LatencyHistogram {
    pub fn record(&self, value: u64) {
        self.buckets[bucket_of(value)].fetch_add(1, Relaxed);
        // A sum past u64::MAX nanoseconds (584 years) wraps; nobody will see it.
        self.total.fetch_add(value, Relaxed);
        self.longest.fetch_max(value, Relaxed);
    }

    /// The largest value recorded, or 0 when nothing was.
    pub fn longest(&self) -> u64 {
        self.longest.load(Relaxed)
    }

    pub fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// The value at quantile `q` (0 to 1), or 0 when nothing was recorded.
    pub fn quantile(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64 * q.clamp(0.0, 1.0)).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, &count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return middle_of(bucket);
            }
        }
        middle_of(BUCKETS - 1)
    }

    pub fn clear(&self) {
        for bucket in self.buckets.iter() {
            bucket.store(0, Relaxed);
        }
        self.total.store(0, Relaxed);
        self.longest.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_an_eighth_of_the_truth() {
        let histogram = LatencyHistogram::default();
        assert_eq!(histogram.quantile(0.5), 0);
        for value in 1..=10_000u64 {
            histogram.record(value * 100);
        }
        for (q, truth) in [(0.5, 500_000.0), (0.99, 990_000.0)] {
            let got = histogram.quantile(q) as f64;
            assert!(
                (got - truth).abs() / truth <= 0.125,
                "q{q}: {got} vs {truth}"
            );
        }
        assert_eq!(histogram.count(), 10_000);
        assert_eq!(histogram.total(), 100 * 10_000 * 10_001 / 2);
        assert_eq!(histogram.longest(), 1_000_000);
        histogram.clear();
        assert_eq!(histogram.longest(), 0);
        histogram.record(u64::MAX);
        histogram.record(3);
        assert_eq!(histogram.quantile(0.0), 3);
        histogram.clear();
        assert_eq!((histogram.count(), histogram.total()), (0, 0));
    }
}
