//! Waiting for another thread's driver calls to end (an unmapping under way): a few calls of
//! tens of microseconds at most, so a short spin first, then naps that leave the core free.

use std::time::Duration;

/// Spins before the first nap: about a microsecond.
const SPINS: u32 = 64;
const NAP: Duration = Duration::from_micros(20);

/// Returns once `done()` is true.
pub(crate) fn until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < SPINS {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::sleep(NAP);
        }
    }
}
