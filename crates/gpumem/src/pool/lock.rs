//! The lock around each arena: a spin lock whose release is a plain store, where a sleeping
//! mutex spends a second atomic read-modify-write to check for sleepers. On a pool hit the lock
//! is taken twice per allocation and free, so that second instruction is a tenth of the cost.
//!
//! Each thread allocates from its own shard, so the lock is almost never contended. When it
//! is (more threads than shards, or a snapshot walking the arena, or a miss mapping pages), a
//! waiter spins briefly, then yields its core, then sleeps in short naps, so a holder that waits
//! on the driver for milliseconds does not cost a waiting thread a whole core.

use spin::mutex::{SpinMutex, SpinMutexGuard};
use std::time::Duration;

/// Spins before the first yield: about a microsecond, longer than any hot-path hold.
const SPINS: u32 = 128;
/// Yields before napping.
const YIELDS: u32 = 64;
const NAP: Duration = Duration::from_micros(20);

pub(super) struct ArenaLock<T>(SpinMutex<T>);

impl<T> ArenaLock<T> {
    pub(super) fn new(value: T) -> Self {
        ArenaLock(SpinMutex::new(value))
    }

    #[inline]
    pub(super) fn lock(&self) -> SpinMutexGuard<'_, T> {
        match self.0.try_lock() {
            Some(guard) => guard,
            None => self.lock_contended(),
        }
    }

    #[cold]
    fn lock_contended(&self) -> SpinMutexGuard<'_, T> {
        let mut attempt = 0u32;
        loop {
            // Wait on a plain load, not on repeated read-modify-writes that steal the line.
            while self.0.is_locked() {
                if attempt < SPINS {
                    std::hint::spin_loop();
                } else if attempt < SPINS + YIELDS {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(NAP);
                }
                attempt = attempt.saturating_add(1);
            }
            if let Some(guard) = self.0.try_lock() {
                return guard;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waiters_get_the_lock_once_it_is_released() {
        let lock = Arc::new(ArenaLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        let held = lock.lock();
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(*lock.lock(), 40_000);
    }
}
