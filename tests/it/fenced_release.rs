//! Unmapping idle pages waits only for the work queued before they went idle — a fence the pool
//! recorded on its stream when they did — not for the whole stream: `cuStreamSynchronize` would
//! stall a host running ahead of its GPU at the very allocation that had to make room.

use crate::support::{sim_backend, tight_manager};
use gpumem::backend::sim::SimBackend;
use gpumem::units::{GIB, MIB};
use gpumem::{AllocOptions, MemoryManager, StreamId};
use std::sync::Arc;
use std::time::Duration;

pub(crate) fn on_stream() -> AllocOptions {
    AllocOptions {
        stream: StreamId(0x5100),
        ..AllocOptions::default()
    }
}

/// Longer than a tick of the coarse clock, which paces the fences (one per tick at most).
pub(crate) const NEXT_TICK: Duration = Duration::from_millis(25);

/// Waits for queued work so far: stream synchronisations and fence waits.
fn waits(sim: &SimBackend) -> (u64, u64) {
    (sim.syncs(), sim.fence_waits())
}

/// Two blocks freed a tick apart, one left live: the idle pages went idle behind fences, which
/// have passed unless `gpu_lags` (then none passes until the test says so).
fn pages_idle_behind_fences(
    sim: &Arc<SimBackend>,
    gpu_lags: bool,
) -> (MemoryManager, gpumem::DeviceBuffer) {
    let m = tight_manager(sim.clone(), 64);
    sim.hold_fences(gpu_lags);
    let first = m.alloc(0, 8 * MIB, &on_stream()).unwrap();
    let second = m.alloc(0, 4 * MIB, &on_stream()).unwrap();
    drop(first); // parked: its pages stay live until another free completes it
    drop(second); // completes the first's free: its pages go idle, a fence follows
    std::thread::sleep(NEXT_TICK);
    // A request of another size completes the second's free too: a fence a tick later.
    let live = m.alloc(0, 2 * MIB, &on_stream()).unwrap();
    (m, live)
}

#[test]
fn pages_whose_fence_has_passed_are_unmapped_without_waiting() {
    let sim = sim_backend();
    let (m, live) = pages_idle_behind_fences(&sim, false);
    let before = waits(&sim);
    let unmapped = m.unmap_cached();
    // The chunk under the live block stays; the second block's goes.
    assert!(unmapped >= 4 * MIB, "idle pages unmapped: {unmapped}");
    assert_eq!(
        waits(&sim),
        before,
        "the fences behind the pages had passed: nothing to wait for"
    );
    drop(live);
}

#[test]
fn pages_behind_a_fence_still_running_wait_for_that_fence_not_the_stream() {
    let sim = sim_backend();
    let (m, live) = pages_idle_behind_fences(&sim, true); // the GPU is behind the fences
    let (syncs, fence_waits) = waits(&sim);
    assert!(m.unmap_cached() >= 4 * MIB);
    assert_eq!(sim.syncs(), syncs, "the stream was not synchronised");
    assert_eq!(
        sim.fence_waits(),
        fence_waits + 1,
        "one wait, for the fence after the newest idle page"
    );
    sim.hold_fences(false);
    drop(live);
}

#[test]
fn pages_idle_after_the_last_fence_are_waited_for_all_the_same() {
    let sim = sim_backend();
    let (m, live) = pages_idle_behind_fences(&sim, true);
    drop(live); // parked; the release below completes it and waits for what it may touch
    let before = waits(&sim);
    assert!(m.unmap_cached() >= 12 * MIB);
    let after = waits(&sim);
    assert!(
        after.0 + after.1 > before.0 + before.1,
        "something waited: {before:?} -> {after:?}"
    );
    sim.hold_fences(false);
}

#[test]
fn fences_stay_few_while_the_gpu_lags_and_none_outlive_the_manager() {
    let sim = sim_backend();
    let m = tight_manager(sim.clone(), 64);
    sim.hold_fences(true); // no fence ever passes: the pool must stop adding more
    for _ in 0..40 {
        let a = m.alloc(0, 4 * MIB, &on_stream()).unwrap();
        let b = m.alloc(0, 6 * MIB, &on_stream()).unwrap();
        drop(a);
        drop(b);
        std::thread::sleep(Duration::from_millis(5));
    }
    let outstanding = sim.outstanding_fences();
    assert!(
        (1..=32).contains(&outstanding),
        "fences recorded, and bounded per arena: {outstanding}"
    );
    sim.hold_fences(false);
    drop(m);
    assert_eq!(sim.outstanding_fences(), 0, "every fence was waited for");
}

/// A miss that must make room within the cache budget while the GPU has not reached the
/// fence behind the idle pages, going four pages (8 MiB) past a budget of six: `(waits for
/// queued work, bytes reserved after)`, with `make_room_without_waiting`, the room it may take
/// past the budget without waiting, and the pressure `others_use` of the device puts on it.
fn make_room_while_the_gpu_lags(
    without_waiting: bool,
    room: u64,
    others_use: f64,
) -> ((u64, u64), u64) {
    let sim = sim_backend();
    let config = gpumem::ManagerConfig {
        make_room_without_waiting: without_waiting,
        room_without_waiting_bytes: room,
        trim_on_high_pressure: false,
        ..crate::support::tight_config(0)
    };
    let m = MemoryManager::new(sim.clone(), config).unwrap();
    let total = m.backend().properties(0).unwrap().total_memory_bytes;
    sim.set_used_by_others(0, (total as f64 * others_use) as u64)
        .unwrap();
    m.update_pressure();
    miss_past_the_budget_while_the_gpu_lags(&sim, &m)
}

/// The miss of [`make_room_while_the_gpu_lags`] on `m`, whose cache may keep no idle page.
pub(crate) fn miss_past_the_budget_while_the_gpu_lags(
    sim: &SimBackend,
    m: &MemoryManager,
) -> ((u64, u64), u64) {
    sim.hold_fences(true);
    let freed = m.alloc(0, 8 * MIB, &on_stream()).unwrap();
    let kept = m.alloc(0, 2 * MIB, &on_stream()).unwrap();
    drop(freed); // parked: the next request of another size completes its free
    let before = waits(sim);
    let counted_before = m.device_stats(0).unwrap().gpu_waits;
    // Too large for the 8 MiB hole: five pages beyond the live block, against a budget of
    // six pages in all, so the four idle ones must go first.
    let grown = m.alloc(0, 10 * MIB, &on_stream()).unwrap();
    let waited = (sim.syncs() - before.0, sim.fence_waits() - before.1);
    assert_eq!(
        m.device_stats(0).unwrap().gpu_waits - counted_before,
        waited.0 + waited.1,
        "the statistics count every wait for the GPU"
    );
    let reserved = m.reserved_bytes();
    sim.hold_fences(false);
    drop((kept, grown));
    (waited, reserved)
}

#[test]
fn making_room_waits_for_the_gpu_without_room_past_the_budget_as_when_constrained() {
    let room = gpumem::ManagerConfig::for_constrained().room_without_waiting_bytes;
    let ((syncs, fence_waits), reserved) = make_room_while_the_gpu_lags(false, room, 0.0);
    assert_eq!(
        syncs + fence_waits,
        1,
        "one wait, for the fence behind the idle pages"
    );
    assert_eq!(
        reserved,
        12 * MIB,
        "the idle pages were mapped again under the new block"
    );
}

#[test]
fn making_room_without_waiting_creates_pages_instead() {
    let ((syncs, fence_waits), reserved) = make_room_while_the_gpu_lags(true, 0, 0.0);
    assert_eq!((syncs, fence_waits), (0, 0), "nothing waited for the GPU");
    assert_eq!(
        reserved,
        20 * MIB,
        "the idle pages stay, and five are created"
    );
}

#[test]
fn making_room_within_the_room_past_the_budget_does_not_wait() {
    let default_room = gpumem::ManagerConfig::default().room_without_waiting_bytes;
    for room in [default_room, 8 * MIB] {
        let ((syncs, fence_waits), reserved) = make_room_while_the_gpu_lags(false, room, 0.0);
        assert_eq!((syncs, fence_waits), (0, 0), "within {room} bytes: no wait");
        assert_eq!(reserved, 20 * MIB);
    }
    let ((syncs, fence_waits), reserved) = make_room_while_the_gpu_lags(false, 6 * MIB, 0.0);
    assert_eq!(
        syncs + fence_waits,
        1,
        "three pages of room for four past the budget: it waits"
    );
    assert_eq!(reserved, 12 * MIB);
}

#[test]
fn making_room_waits_again_at_high_pressure_whatever_the_setting() {
    let ((syncs, fence_waits), reserved) = make_room_while_the_gpu_lags(true, 256 * MIB, 0.85);
    assert_eq!(syncs + fence_waits, 1);
    assert_eq!(reserved, 12 * MIB);
}

/// The adaptive default on `sim`, with no idle page kept at any rung: the budget is the live peak.
pub(crate) fn adaptive_manager(sim: &Arc<SimBackend>) -> MemoryManager {
    MemoryManager::new(sim.clone(), adaptive_config()).unwrap()
}

fn adaptive_config() -> gpumem::ManagerConfig {
    gpumem::ManagerConfig {
        cache_mode: gpumem::manager::CacheMode::Adaptive,
        max_cached_bytes: Some(0),
        trim_on_high_pressure: false,
        ..crate::support::tight_config(0)
    }
}

/// The adaptive default keeps the room past the budget until the device maps a gigabyte block:
/// from then on a miss that must make room waits for the GPU, as with no room at all.
#[test]
fn beside_a_gigabyte_block_the_adaptive_default_waits_to_make_room() {
    for large_block in [false, true] {
        let sim = sim_backend();
        let m = adaptive_manager(&sim);
        let gigabyte = large_block.then(|| m.alloc(0, GIB, &on_stream()).unwrap());
        let held_for_it = if large_block { GIB } else { 0 };
        let ((syncs, fence_waits), reserved) = miss_past_the_budget_while_the_gpu_lags(&sim, &m);
        if large_block {
            assert_eq!(
                syncs + fence_waits,
                1,
                "it waited, for the fence behind the idle pages"
            );
            assert_eq!(
                reserved - held_for_it,
                12 * MIB,
                "the idle pages were mapped again"
            );
        } else {
            assert_eq!(
                (syncs, fence_waits),
                (0, 0),
                "within the default room: no wait"
            );
            assert_eq!(
                reserved,
                20 * MIB,
                "the idle pages stay, and five are created"
            );
        }
        drop(gigabyte);
    }
}

/// It gives the room up too once a wait for the GPU has lasted `LONG_GPU_WAIT_NS`: a host that
/// far ahead of its GPU loses little by waiting, and the room only holds memory. (Left to the
/// default, the miss then lends instead of waiting: `stream_ordered_reuse.rs`.)
#[test]
fn after_a_long_wait_for_the_gpu_the_adaptive_default_waits_to_make_room() {
    let long = Duration::from_nanos(gpumem::manager::adaptive::LONG_GPU_WAIT_NS);
    for backlog in [Duration::ZERO, long + NEXT_TICK] {
        let sim = sim_backend();
        let config = gpumem::ManagerConfig {
            stream_ordered_reuse: Some(false),
            ..adaptive_config()
        };
        let m = MemoryManager::new(sim.clone(), config).unwrap();
        let (first, _) = miss_past_the_budget_while_the_gpu_lags(&sim, &m);
        assert_eq!(first, (0, 0), "within the default room: no wait");
        // The cache emptied while the GPU is `backlog` behind: one wait of that long.
        sim.set_gpu_backlog(backlog);
        sim.hold_fences(true);
        m.empty_cache();
        sim.hold_fences(false);
        let stats = m.device_stats(0).unwrap();
        assert!(stats.gpu_waits > 0, "emptying the cache waited for the GPU");
        assert!(stats.gpu_wait_ns_longest >= backlog.as_nanos() as u64);
        let far_ahead = backlog > long;
        let room = m.room_without_waiting(0).unwrap();
        let default_room = gpumem::ManagerConfig::default().room_without_waiting_bytes;
        assert_eq!(room, Some(if far_ahead { 0 } else { default_room }));
        // The same miss again: the live peak, and so the budget, are the first one's.
        let ((syncs, fence_waits), reserved) = miss_past_the_budget_while_the_gpu_lags(&sim, &m);
        if far_ahead {
            assert_eq!(syncs + fence_waits, 1, "it waited, after {backlog:?}");
            assert_eq!(reserved, 12 * MIB, "the idle pages were mapped again");
        } else {
            assert_eq!((syncs, fence_waits), (0, 0), "a short wait keeps the room");
            assert_eq!(reserved, 20 * MIB);
        }
    }
}
