//! Timestamps cheap enough for the allocator's hot path: the kernel's coarse monotonic clock
//! (read through the vDSO in a few nanoseconds, where `Instant::now` costs 25–45 ns), with a
//! resolution of a few milliseconds — ample for leak ages and idle times measured in seconds.

use std::time::Duration;

/// Now, in ticks of the coarse monotonic clock (only meaningful to [`between`] and [`since`]).
/// `coarsetime` calls `clock_gettime` directly: about half the cost of going through `nix`,
/// which matters at two reads per allocation. Its shared "recent" cache is left alone, so
/// threads reading the clock never write to a common cache line.
#[inline]
pub fn now() -> u64 {
    coarsetime::Instant::now_without_cache_update().as_ticks()
}

/// Time from tick `start` to tick `end` (zero if `end` is earlier).
pub fn between(start: u64, end: u64) -> Duration {
    let ticks = coarsetime::Duration::from_ticks(end.saturating_sub(start));
    Duration::from_nanos(ticks.as_nanos())
}

/// Time since tick `start`.
pub fn since(start: u64) -> Duration {
    between(start, now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_measure_real_time() {
        let start = now();
        std::thread::sleep(Duration::from_millis(50));
        let elapsed = since(start);
        assert!(elapsed >= Duration::from_millis(30), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
        assert_eq!(between(now(), start), Duration::ZERO);
    }
}
