//! MemoryManager behaviour: errors, reuse, giving memory back, OOM retry, threads, streams,
//! faults, and property tests of its invariants — on the simulated device, and on CUDA when a
//! GPU is present.

use crate::support::{all_backends, sim_backend};
use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec};
use gpumem::units::{GIB, MIB};
use gpumem::{
    AllocError, AllocOptions, DeviceBackend, DeviceBuffer, ManagerConfig, MemoryManager, Strategy,
    StreamId, Tag,
};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

fn manager_on(backend: Arc<dyn DeviceBackend>) -> MemoryManager {
    let config = ManagerConfig {
        devices: Some(vec![0]),
        ..ManagerConfig::default()
    };
    MemoryManager::new(backend, config).unwrap()
}

pub(crate) fn small_sim(total: u64) -> Arc<SimBackend> {
    Arc::new(SimBackend::new(SimConfig {
        devices: vec![SimDeviceSpec {
            name: "small".into(),
            total_bytes: total,
            used_by_others: 0,
        }],
        granularity: 2 * MIB,
        ..SimConfig::default()
    }))
}

/// Bytes the pools hold according to the device itself.
fn device_used(manager: &MemoryManager) -> u64 {
    manager.backend().mem_info(0).unwrap().used()
}

#[test]
fn zero_too_large_and_bad_alignment_are_distinct_errors() {
    for backend in all_backends() {
        let m = manager_on(backend);
        let total = m.backend().properties(0).unwrap().total_memory_bytes;
        assert_eq!(
            m.alloc(0, 0, &AllocOptions::default()).unwrap_err(),
            AllocError::ZeroSize
        );
        let too_large = m.alloc(0, total + 1, &AllocOptions::default()).unwrap_err();
        assert!(
            matches!(too_large, AllocError::TooLarge { .. }),
            "{too_large}"
        );
        assert!(!too_large.is_out_of_memory());
        let odd = AllocOptions::default().with_alignment(3);
        assert_eq!(
            m.alloc(0, 1, &odd).unwrap_err(),
            AllocError::InvalidAlignment(3)
        );
        assert!(m.alloc(7, 1, &AllocOptions::default()).is_err());
    }
}

#[test]
fn out_of_memory_is_not_too_large_and_explains_itself() {
    let sim = small_sim(GIB);
    // The whole device, so the driver (not the pool cap) is what refuses.
    let config = ManagerConfig {
        gpu_memory_fraction: 1.0,
        ..ManagerConfig::default()
    };
    let m = MemoryManager::new(sim.clone(), config).unwrap();
    let _held = m.alloc(0, 800 * MIB, &AllocOptions::default()).unwrap();
    let err = m.alloc(0, 400 * MIB, &AllocOptions::default()).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let text = err.to_string();
    assert!(text.contains("requested 400.00 MiB"), "{text}");
    assert!(text.contains("Try:"), "{text}");
    let stats = m.device_stats(0).unwrap();
    assert_eq!((stats.ooms, stats.oom_retries), (1, 1));
}

#[test]
fn buffers_free_on_drop_and_memory_is_reused_without_the_driver() {
    for backend in all_backends() {
        let m = manager_on(backend);
        let first = m.alloc(0, 4096, &AllocOptions::default()).unwrap();
        let ptr = first.ptr();
        drop(first);
        let stats = m.device_stats(0).unwrap().counters;
        assert_eq!(stats.in_use_bytes, 0);
        let again = m.alloc(0, 4096, &AllocOptions::default()).unwrap();
        assert_eq!(
            again.ptr(),
            ptr,
            "a freed block is reused at once on its stream"
        );
        let stats = m.device_stats(0).unwrap().counters;
        assert_eq!(stats.driver_allocs, 1);
        assert_eq!(stats.hits, 1);
        m.free(again).unwrap();
    }
}

#[test]
fn empty_cache_and_trim_give_memory_back() {
    for backend in all_backends() {
        let m = manager_on(backend);
        let base_used = device_used(&m);
        let buffers: Vec<DeviceBuffer> = (0..8)
            .map(|_| m.alloc(0, 6 * MIB, &AllocOptions::default()).unwrap())
            .collect();
        assert!(m.reserved_bytes() >= 48 * MIB);
        drop(buffers);
        let cached = m.reserved_bytes();
        assert!(cached > 0, "idle pages stay cached");
        let released = m.trim(cached / 2);
        assert!(released > 0 && m.reserved_bytes() <= cached / 2);
        m.empty_cache();
        assert_eq!(m.reserved_bytes(), 0);
        assert_eq!(device_used(&m), base_used, "the device got every byte back");
    }
}

#[test]
fn dropping_the_manager_gives_memory_back_though_this_thread_kept_pool_handles() {
    for backend in all_backends() {
        let base_used = backend.mem_info(0).unwrap().used();
        let m = manager_on(Arc::clone(&backend));
        // Freed buffers park their pool handles with this thread for the next allocation.
        for size in [4096, 6 * MIB, 512] {
            drop(m.alloc(0, size, &AllocOptions::default()).unwrap());
        }
        assert!(device_used(&m) > base_used, "the pools hold cached pages");
        drop(m);
        assert_eq!(backend.mem_info(0).unwrap().used(), base_used);
    }
}

#[test]
fn handles_parked_by_a_thread_that_lives_on_keep_no_memory_after_the_manager_goes() {
    for backend in all_backends() {
        let base_used = backend.mem_info(0).unwrap().used();
        let m = manager_on(Arc::clone(&backend));
        let (give, take) = std::sync::mpsc::channel::<DeviceBuffer>();
        let (done, wait_done) = std::sync::mpsc::channel::<()>();
        let (finish, wait_finish) = std::sync::mpsc::channel::<()>();
        // Frees buffers it did not allocate (parking their pools' handles), then stays alive.
        let freer = std::thread::spawn(move || {
            for buffer in take {
                drop(buffer);
            }
            done.send(()).unwrap();
            wait_finish.recv().unwrap();
        });
        for size in [4096, 6 * MIB] {
            give.send(m.alloc(0, size, &AllocOptions::default()).unwrap())
                .unwrap();
        }
        drop(give);
        wait_done.recv().unwrap();
        drop(m);
        assert_eq!(backend.mem_info(0).unwrap().used(), base_used);
        finish.send(()).unwrap();
        freer.join().unwrap();
    }
}

#[test]
fn a_buffer_outliving_its_manager_keeps_its_memory_until_it_is_freed() {
    for backend in all_backends() {
        let base_used = backend.mem_info(0).unwrap().used();
        let m = manager_on(Arc::clone(&backend));
        let survivor = m.alloc(0, 6 * MIB, &AllocOptions::default()).unwrap();
        drop(m.alloc(0, 4096, &AllocOptions::default()).unwrap());
        drop(m);
        assert!(
            backend.mem_info(0).unwrap().used() >= base_used + 6 * MIB,
            "a live buffer's pages stay mapped"
        );
        drop(survivor);
        assert_eq!(backend.mem_info(0).unwrap().used(), base_used);
    }
}

#[test]
fn idle_pages_are_released_after_their_age() {
    let m = manager_on(sim_backend());
    drop(m.alloc(0, 8 * MIB, &AllocOptions::default()).unwrap());
    assert!(m.reserved_bytes() > 0);
    assert_eq!(m.release_idle_older_than(Duration::from_secs(3600)), 0);
    assert!(m.release_idle_older_than(Duration::ZERO) > 0);
    assert_eq!(m.reserved_bytes(), 0);
}

#[test]
fn driver_out_of_memory_releases_the_cache_and_retries_once() {
    let sim = small_sim(GIB);
    let config = ManagerConfig {
        idle_pages_kept: 1000,
        small_max_bytes: MIB,
        gpu_memory_fraction: 1.0,
        ..ManagerConfig::default()
    };
    let m = MemoryManager::new(sim.clone(), config).unwrap();
    // Fill the small pool's cache with idle pages, then ask the large pool for most of the device:
    // only the driver's refusal and the retry can move the small pool's pages to the large one.
    let small: Vec<_> = (0..600)
        .map(|_| m.alloc(0, MIB, &AllocOptions::default()).unwrap())
        .collect();
    drop(small);
    assert!(m.reserved_bytes() >= 600 * MIB);
    let big = m.alloc(0, 900 * MIB, &AllocOptions::default()).unwrap();
    let stats = m.device_stats(0).unwrap();
    assert_eq!((stats.oom_retries, stats.ooms), (1, 0));
    drop(big);
}

#[test]
fn pool_cap_is_enforced() {
    let config = ManagerConfig {
        max_pool_bytes: Some(64 * MIB),
        ..ManagerConfig::default()
    };
    let m = MemoryManager::new(sim_backend(), config).unwrap();
    let _a = m.alloc(0, 60 * MIB, &AllocOptions::default()).unwrap();
    let err = m.alloc(0, 10 * MIB, &AllocOptions::default()).unwrap_err();
    assert!(matches!(err, AllocError::PoolLimit { .. }), "{err}");
}

#[test]
fn direct_strategy_calls_the_driver_every_time() {
    for backend in all_backends() {
        let config = ManagerConfig {
            strategy: Strategy::Direct,
            devices: Some(vec![0]),
            ..ManagerConfig::default()
        };
        let m = MemoryManager::new(backend, config).unwrap();
        for _ in 0..3 {
            drop(m.alloc(0, MIB, &AllocOptions::default()).unwrap());
        }
        let stats = m.device_stats(0).unwrap().counters;
        assert_eq!(
            (stats.driver_allocs, stats.driver_frees, stats.hits),
            (3, 3, 0)
        );
        assert_eq!(m.reserved_bytes(), 0);
    }
}

#[test]
fn tags_and_ages_reach_the_leak_view() {
    let m = manager_on(sim_backend());
    let kv = Tag::new("kv_cache");
    let _a = m.alloc(0, 3 * MIB, &AllocOptions::tagged(kv)).unwrap();
    // Ages come from the coarse monotonic clock (a few ms resolution).
    std::thread::sleep(Duration::from_millis(60));
    let _b = m.alloc(0, 1000, &AllocOptions::default()).unwrap();
    let live = m.live_allocations();
    assert_eq!(live.len(), 2);
    assert_eq!(live[0].tag.as_deref(), Some("kv_cache"), "oldest first");
    assert_eq!(live[0].requested_bytes, 3 * MIB);
    assert!(
        live[0].age >= Duration::from_millis(40),
        "{:?}",
        live[0].age
    );
    assert!(live[0].age > live[1].age);
    assert_eq!(live[1].tag, None);
}

#[test]
fn streams_get_their_own_memory() {
    let m = manager_on(sim_backend());
    let on_default = m.alloc(0, 4096, &AllocOptions::default()).unwrap();
    let ptr = on_default.ptr();
    drop(on_default);
    let other = AllocOptions::default().on_stream(StreamId(42));
    let on_other = m.alloc(0, 4096, &other).unwrap();
    assert_ne!(
        on_other.ptr(),
        ptr,
        "another stream must not reuse it without waiting"
    );
    assert_eq!(on_other.stream(), StreamId(42));
}

#[test]
fn a_failed_map_leaves_the_pool_consistent() {
    let sim = sim_backend();
    let m = manager_on(sim.clone());
    sim.faults().fail_nth_alloc_from_now(1);
    let err = m.alloc(0, 4 * MIB, &AllocOptions::default()).unwrap_err();
    assert!(matches!(err, AllocError::Backend(_)), "{err}");
    let ok = m.alloc(0, 4 * MIB, &AllocOptions::default()).unwrap();
    assert_eq!(m.reserved_bytes(), device_used(&m));
    drop(ok);
    sim.faults().set_fail_frees(true);
    assert_eq!(
        m.empty_cache(),
        0,
        "unmapping fails, so nothing is released"
    );
    sim.faults().clear();
    m.empty_cache();
    assert_eq!((m.reserved_bytes(), device_used(&m)), (0, 0));
}

#[test]
fn many_threads_allocate_and_free_at_once() {
    let sim = sim_backend();
    let m = manager_on(sim.clone());
    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            let m = m.clone();
            scope.spawn(move || {
                let mut held = Vec::new();
                for i in 0..2000u64 {
                    let size = 1 + (i * 7919 + thread * 104_729) % (3 * MIB);
                    held.push(m.alloc(0, size, &AllocOptions::default()).unwrap());
                    if held.len() > 16 {
                        held.swap_remove(((i * 31) % 17) as usize);
                    }
                }
            });
        }
    });
    let stats = m.device_stats(0).unwrap().counters;
    assert_eq!(stats.in_use_bytes, 0);
    assert_eq!(stats.allocations, 16_000);
    assert_eq!(m.reserved_bytes(), device_used(&m));
    m.empty_cache();
    assert_eq!(device_used(&m), 0);
}

fn check_invariants(m: &MemoryManager, live: &[DeviceBuffer]) {
    let mut spans: Vec<(u64, u64)> = live.iter().map(|b| (b.ptr(), b.ptr() + b.size())).collect();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "live buffers overlap: {pair:?}");
    }
    let stats = m.device_stats(0).unwrap().counters;
    let requested: u64 = live.iter().map(|b| b.size()).sum();
    let blocks: u64 = live.iter().map(|b| b.size().div_ceil(512) * 512).sum();
    assert_eq!(stats.requested_bytes, requested);
    assert_eq!(stats.in_use_bytes, blocks);
    assert_eq!(
        stats.reserved_bytes,
        device_used(m),
        "reserved = what the device says we hold"
    );
    let cached: u64 = m.pool_views().iter().map(|v| v.cached_free_bytes).sum();
    assert_eq!(stats.in_use_bytes + cached, stats.reserved_bytes);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_over_any_sequence(
        ops in prop::collection::vec((any::<bool>(), 1u64..6_000_000, any::<prop::sample::Index>()), 1..200)
    ) {
        let m = manager_on(sim_backend());
        let mut live: Vec<DeviceBuffer> = Vec::new();
        for (allocate, size, pick) in ops {
            if allocate || live.is_empty() {
                live.push(m.alloc(0, size, &AllocOptions::default()).unwrap());
            } else {
                let index = pick.index(live.len());
                live.swap_remove(index);
            }
            check_invariants(&m, &live);
        }
        live.clear();
        m.empty_cache();
        prop_assert_eq!(m.reserved_bytes(), 0);
        prop_assert_eq!(device_used(&m), 0);
    }
}
