//! A pool giving its idle pages back (upkeep's rounds, `empty_cache` on another thread) takes
//! them under the arena's lock and unmaps them after letting it go: the pool's allocating
//! threads go on while the driver unmaps, and a miss that wants those very pages waits until
//! they are unmapped before it maps them again.

use crate::support::{sim_backend, tight_manager};
use gpumem::backend::sim::SimBackend;
use gpumem::backend::DeviceBackend;
use gpumem::units::MIB;
use gpumem::{AllocOptions, MemoryManager};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Long enough for anything that is not stuck; only a failing test waits this long.
const STUCK: Duration = Duration::from_secs(30);

/// A manager with one live 4 MiB block (freed and taken back by every hit below) and 64 MiB of
/// idle pages beside it, whose unmapping the simulated driver holds back once asked.
fn idle_pages_beside_a_live_block(sim: &Arc<SimBackend>) -> (MemoryManager, gpumem::DeviceBuffer) {
    let m = tight_manager(sim.clone(), 64);
    let live = m.alloc(0, 4 * MIB, &AllocOptions::default()).unwrap();
    let idle = m.alloc(0, 64 * MIB, &AllocOptions::default()).unwrap();
    drop(idle);
    (m, live)
}

/// Waits until an unmap is held in the driver (the give-back has taken the pages and let the
/// arena go, or is holding it: what the tests tell apart).
fn until_an_unmap_is_held(sim: &SimBackend) {
    let began = Instant::now();
    while sim.faults().unmaps_held_now() == 0 {
        assert!(
            began.elapsed() < STUCK,
            "the give-back never reached the driver"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Lets the held unmaps go after `after`, or at once when told to (`Sender` dropped or sent to).
fn let_unmaps_go(sim: &SimBackend, after: Duration, early: mpsc::Receiver<()>) {
    let _ = early.recv_timeout(after);
    sim.faults().hold_unmaps(false);
}

// The pools are per thread (a shard each), so the allocations below run on the thread that
// made the pages: the one whose pool is being emptied by another.

#[test]
fn hits_go_on_while_another_thread_unmaps_the_pools_idle_pages() {
    let sim = sim_backend();
    let (m, live) = idle_pages_beside_a_live_block(&sim);
    let held_bytes = m.reserved_bytes();
    sim.faults().hold_unmaps(true);
    std::thread::scope(|scope| {
        let (done, early) = mpsc::channel();
        scope.spawn(|| let_unmaps_go(&sim, STUCK, early));
        let emptying = scope.spawn(|| m.empty_cache());
        until_an_unmap_is_held(&sim);
        drop(live); // parked: the next request of its size takes it back, a hit
        for _ in 0..1_000 {
            drop(m.alloc(0, 4 * MIB, &AllocOptions::default()).unwrap());
        }
        let still_held = sim.faults().unmaps_held_now();
        let _ = done.send(()); // gone already if it let the unmaps go itself
        assert!(
            still_held > 0,
            "the hits waited for the driver to unmap another thread's pages"
        );
        let released = emptying.join().unwrap();
        assert!(released >= 64 * MIB, "released {released} of {held_bytes}");
    });
    // The parked 4 MiB block is all that is left, and the driver agrees to the byte.
    let info = sim.mem_info(0).unwrap();
    assert_eq!(m.reserved_bytes(), info.used());
    assert!(m.reserved_bytes() < held_bytes);
}

#[test]
fn a_miss_over_pages_still_being_unmapped_waits_for_them() {
    let sim = sim_backend();
    let (m, live) = idle_pages_beside_a_live_block(&sim);
    let idle_at = live.ptr() + 4 * MIB;
    sim.faults().hold_unmaps(true);
    std::thread::scope(|scope| {
        let (_, early) = mpsc::channel();
        let emptying = scope.spawn(|| m.empty_cache());
        until_an_unmap_is_held(&sim);
        scope.spawn(|| let_unmaps_go(&sim, Duration::from_millis(50), early));
        // The same size lands where the idle block was: on pages taken and not yet unmapped.
        let buffer = m
            .alloc(0, 64 * MIB, &AllocOptions::default())
            .expect("the miss maps once they are unmapped");
        assert_eq!(
            buffer.ptr(),
            idle_at,
            "the block landed elsewhere: nothing tested"
        );
        emptying.join().unwrap();
        drop(buffer);
    });
    drop(live);
    m.empty_cache();
    assert_eq!(m.reserved_bytes(), 0);
    assert_eq!(sim.mem_info(0).unwrap().used(), 0);
}
