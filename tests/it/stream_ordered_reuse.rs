//! `stream_ordered_reuse`: a miss that must make room from its own stream's idle pages while
//! the GPU has not reached them maps them at its block's address at once instead of waiting;
//! their old address stays mapped until the GPU has passed it, and nothing else on the device
//! gets those chunks, or gives them back to the driver, before.

use crate::fenced_release::{
    adaptive_manager, miss_past_the_budget_while_the_gpu_lags, on_stream, NEXT_TICK,
};
use crate::support::{sim_backend, tight_config};
use gpumem::backend::sim::SimBackend;
use gpumem::units::{GIB, MIB};
use gpumem::MemoryManager;
use std::sync::Arc;
use std::time::Duration;

/// A manager that may keep no idle page and has no room past its budget (a miss making room
/// would wait for the GPU), with `stream_ordered_reuse`.
fn lending_manager(sim: &Arc<SimBackend>) -> MemoryManager {
    let config = gpumem::ManagerConfig {
        room_without_waiting_bytes: 0,
        stream_ordered_reuse: Some(true),
        trim_on_high_pressure: false,
        ..tight_config(0)
    };
    MemoryManager::new(sim.clone(), config).unwrap()
}

#[test]
fn a_miss_maps_its_streams_busy_idle_pages_at_once_and_holds_no_more_than_waiting() {
    let sim = sim_backend();
    let m = lending_manager(&sim);
    let ((syncs, fence_waits), reserved) = miss_past_the_budget_while_the_gpu_lags(&sim, &m);
    assert_eq!((syncs, fence_waits), (0, 0), "nothing waited for the GPU");
    assert_eq!(
        reserved,
        12 * MIB,
        "the idle pages were mapped again under the new block, as when waiting: none created"
    );
    assert!(
        sim.detached_mappings(0) > 0,
        "their old address stays mapped until the GPU has passed it"
    );
    // The GPU has caught up (the helper let the fences pass): the next miss ends the lending.
    let next = m.alloc(0, 14 * MIB, &on_stream()).unwrap();
    assert_eq!(sim.detached_mappings(0), 0, "the old address went");
    drop(next);
    m.empty_cache();
    assert_eq!(m.reserved_bytes(), 0);
}

#[test]
fn emptying_the_cache_waits_for_the_gpu_to_pass_what_a_miss_lent_and_returns_everything() {
    let sim = sim_backend();
    let m = lending_manager(&sim);
    sim.hold_fences(true);
    let freed = m.alloc(0, 8 * MIB, &on_stream()).unwrap();
    let kept = m.alloc(0, 2 * MIB, &on_stream()).unwrap();
    drop(freed);
    let grown = m.alloc(0, 10 * MIB, &on_stream()).unwrap();
    assert!(sim.detached_mappings(0) > 0, "the miss lent the idle pages");
    drop((kept, grown));
    // The GPU still has not passed the old address: emptying the cache waits for it.
    let before = sim.fence_waits() + sim.syncs();
    m.empty_cache();
    assert!(sim.fence_waits() + sim.syncs() > before, "it waited");
    assert_eq!(sim.detached_mappings(0), 0);
    assert_eq!(m.reserved_bytes(), 0, "everything went back to the driver");
    sim.hold_fences(false);
    drop(m);
    assert_eq!(sim.outstanding_fences(), 0, "no fence outlives the manager");
}

/// Left to the adaptive default (`stream_ordered_reuse = "auto"`), lending starts once a wait
/// for the GPU has lasted `LONG_GPU_WAIT_NS` (the room past the budget went with it): the miss
/// that would then wait lends instead, holding what waiting holds. After short waits it keeps
/// the room; beside a gigabyte block it waits.
#[test]
fn the_adaptive_default_lends_once_a_wait_for_the_gpu_was_long_unless_blocks_are_gigabytes() {
    let long = Duration::from_nanos(gpumem::manager::adaptive::LONG_GPU_WAIT_NS);
    for (backlog, gigabyte) in [
        (Duration::ZERO, false),
        (long + NEXT_TICK, false),
        (long + NEXT_TICK, true),
    ] {
        let sim = sim_backend();
        let m = adaptive_manager(&sim);
        assert_eq!(m.config().stream_ordered_reuse, None, "auto by default");
        let large = gigabyte.then(|| m.alloc(0, GIB, &on_stream()).unwrap());
        let held_for_it = if gigabyte { GIB } else { 0 };
        // Something cached for emptying the cache to wait for.
        miss_past_the_budget_while_the_gpu_lags(&sim, &m);
        sim.set_gpu_backlog(backlog);
        sim.hold_fences(true);
        m.empty_cache();
        sim.hold_fences(false);
        sim.set_gpu_backlog(Duration::ZERO);
        let ((syncs, fence_waits), reserved) = miss_past_the_budget_while_the_gpu_lags(&sim, &m);
        let lent = sim.detached_mappings(0) > 0;
        let (lending, lendings) = m.stream_ordered_reuse(0).unwrap();
        assert_eq!(
            (lending, lendings > 0),
            (lent, lent),
            "the statistics say so"
        );
        let outcome = (syncs + fence_waits, (reserved - held_for_it) / MIB, lent);
        let case = format!("after {backlog:?}, gigabyte block {gigabyte}");
        if gigabyte {
            assert_eq!(outcome, (1, 12, false), "waited, {case}");
        } else if backlog > long {
            assert_eq!(outcome, (0, 12, true), "lent, {case}: none created");
        } else {
            assert_eq!(outcome, (0, 20, false), "the room, {case}: pages created");
        }
        drop(large);
    }
}
