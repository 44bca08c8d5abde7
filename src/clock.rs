//! Timestamps cheap enough for the allocator's hot path: the kernel's coarse monotonic clock
//! (read through the vDSO in a few nanoseconds, where `Instant::now` costs 25–45 ns), with a
//! resolution of a few milliseconds — ample for leak ages and idle times measured in seconds.

use nix::time::{clock_gettime, ClockId};
use std::time::Duration;

/// Now, in nanoseconds of the coarse monotonic clock (only meaningful to [`between`]).
#[inline]
pub fn now() -> u64 {
    match clock_gettime(ClockId::CLOCK_MONOTONIC_COARSE) {
        Ok(time) => time.tv_sec() as u64 * 1_000_000_000 + time.tv_nsec() as u64,
        // Not expected on Linux; a zero timestamp only makes an age read as "since boot".
        Err(_) => 0,
    }
}

/// Time from tick `start` to tick `end` (zero if `end` is earlier).
pub fn between(start: u64, end: u64) -> Duration {
    Duration::from_nanos(end.saturating_sub(start))
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
