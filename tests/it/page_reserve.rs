//! The page reserve: physical chunks unmapped but kept count as reserved memory, are mapped
//! again by the next miss without the driver creating memory, and go back to the driver whenever
//! memory must be freed (emptying the cache, an out-of-memory retry, a run they cannot back).

use crate::support::{all_backends, sim_backend, tight_manager};
use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec};
use gpumem::manager::CacheMode;
use gpumem::units::MIB;
use gpumem::{AllocError, AllocOptions, ManagerConfig, MemoryManager, StreamId};
use std::sync::Arc;

fn on_stream(stream: u64) -> AllocOptions {
    AllocOptions {
        stream: StreamId(stream),
        ..AllocOptions::default()
    }
}

/// Reserved bytes as the manager counts them, and as the device reports them (memory this
/// process gained since `baseline`).
fn held(m: &MemoryManager, baseline: u64) -> (u64, u64) {
    let used = m.backend().mem_info(0).unwrap().used();
    (m.reserved_bytes(), used - baseline)
}

#[test]
fn kept_pages_are_reserved_and_mapped_again_without_creating_memory() {
    for backend in all_backends() {
        let baseline = backend.mem_info(0).unwrap().used();
        let m = tight_manager(backend, 4);
        // 6 MiB: three pages, one chunk under the default cap.
        let first = m.alloc(0, 6 * MIB, &AllocOptions::default()).unwrap();
        drop(first);
        assert_eq!(m.unmap_cached(), 6 * MIB);
        let stats = m.device_stats(0).unwrap();
        assert_eq!(stats.page_reserve_bytes, 6 * MIB);
        assert_eq!(
            held(&m, baseline),
            (6 * MIB, 6 * MIB),
            "kept pages are held"
        );
        // The next miss maps the kept chunk: nothing new from the driver. (The default stream:
        // on CUDA a stream must be a real CUstream, which the budget test below uses on sim.)
        let second = m.alloc(0, 6 * MIB, &AllocOptions::default()).unwrap();
        let stats = m.device_stats(0).unwrap();
        assert_eq!((stats.pages_created, stats.pages_reused), (3, 3));
        assert_eq!(stats.page_reserve_bytes, 0);
        assert_eq!(held(&m, baseline), (6 * MIB, 6 * MIB));
        drop(second);
        assert_eq!(m.unmap_cached(), 6 * MIB);
        // A chunk is mapped whole: kept, it cannot back a smaller run, so it goes back to the
        // driver before new pages are created, and the device never holds both.
        let third = m.alloc(0, 4 * MIB, &AllocOptions::default()).unwrap();
        let stats = m.device_stats(0).unwrap();
        assert_eq!((stats.pages_created, stats.pages_released), (5, 3));
        assert_eq!(stats.page_reserve_bytes, 0);
        assert_eq!(held(&m, baseline), (4 * MIB, 4 * MIB));
        assert_eq!(stats.counters.peak_reserved_bytes, 6 * MIB);
        drop(third);
        m.empty_cache();
        let stats = m.device_stats(0).unwrap();
        assert_eq!((stats.page_reserve_bytes, stats.pages_released), (0, 5));
        assert_eq!(held(&m, baseline), (0, 0));
    }
}

#[test]
fn a_full_cache_budget_moves_idle_pages_instead_of_creating_new_ones() {
    let sim = sim_backend();
    let m = tight_manager(sim.clone(), 0);
    let page = 2 * MIB;
    for stream in 0..6 {
        // Four pages for one buffer and a fifth under a small one; the small one is freed
        // first (and stays parked for reuse), the large one's pages go idle. The budget allows
        // no idle page beyond the peak, so the next stream's pool takes them over: they are
        // unmapped into the reserve and mapped there, not created anew.
        let large = m.alloc(0, 4 * page, &on_stream(stream)).unwrap();
        let small = m.alloc(0, 128 * 1024, &on_stream(stream)).unwrap();
        let (ours, device) = held(&m, 0);
        assert_eq!(ours, device, "stream {stream}");
        drop(small);
        drop(large);
    }
    let stats = m.device_stats(0).unwrap();
    assert!(stats.pages_reused >= 20, "{stats:?}");
    assert!(
        stats.pages_created <= 11,
        "without the reserve 30 pages are created: {stats:?}"
    );
    assert_eq!(stats.misses, 12);
    assert!(stats.miss_p50_ns > 0 && stats.miss_p99_ns >= stats.miss_p50_ns);
    m.empty_cache();
    assert_eq!(held(&m, 0), (0, 0));
}

#[test]
fn a_block_freed_by_the_allocating_call_does_not_raise_the_cache_budget() {
    // A (ten pages) is freed last and parked; C keeps A's hole bounded. D does not fit there:
    // completing A's free leaves its ten pages idle and D needs thirty new ones. The budget
    // (no slack) is the peak of pages under live blocks, 31 (C's page and D's thirty): D must
    // take A's pages, not map beside them. Counting A's pages as still live made the budget
    // 41 and the device held 82 MiB.
    let m = tight_manager(sim_backend(), 0);
    let a = m.alloc(0, 20 * MIB, &AllocOptions::default()).unwrap();
    let c = m.alloc(0, MIB, &AllocOptions::default()).unwrap();
    drop(a);
    let d = m.alloc(0, 60 * MIB, &AllocOptions::default()).unwrap();
    let stats = m.device_stats(0).unwrap();
    assert_eq!(stats.counters.peak_reserved_bytes, 62 * MIB, "{stats:?}");
    assert_eq!(held(&m, 0), (62 * MIB, 62 * MIB));
    drop((c, d));
}

#[test]
fn upkeep_never_waits_for_a_busy_stream() {
    // The upkeep thread's rounds leave a pool whose stream still has work queued for a later
    // round rather than hold its lock (and its allocating threads) while the stream drains.
    let sim = sim_backend();
    let config = ManagerConfig {
        devices: Some(vec![0]),
        max_cached_bytes: Some(0),
        cleanup_interval: None,
        release_idle_after: None,
        ..ManagerConfig::default()
    };
    let m = MemoryManager::new(sim.clone(), config).unwrap();
    let large = m.alloc(0, 8 * MIB, &on_stream(1)).unwrap();
    let small = m.alloc(0, 128 * 1024, &on_stream(1)).unwrap();
    drop(small); // parked; the large block's four pages go idle
    drop(large);
    let syncs = sim.syncs();
    sim.hold_fences(true);
    assert_eq!(
        m.maintain(),
        0,
        "a busy stream's pages wait for a later round"
    );
    assert_eq!(sim.syncs(), syncs, "and nothing waited");
    sim.hold_fences(false);
    // All five pages: the release completes the parked block's free first.
    assert_eq!(
        m.maintain(),
        10 * MIB,
        "the stream is idle: released without a wait"
    );
    assert_eq!(sim.syncs(), syncs);
    // Emptying the cache is asked for: it waits for a busy stream (for the stream, or for the
    // fence the pool recorded on it when the pages went idle).
    drop(m.alloc(0, 8 * MIB, &on_stream(1)).unwrap());
    sim.hold_fences(true);
    let fence_waits = sim.fence_waits();
    m.empty_cache();
    assert!(sim.syncs() + sim.fence_waits() > syncs + fence_waits);
    sim.hold_fences(false);
    assert_eq!(m.reserved_bytes(), 0);
}

#[test]
fn an_out_of_memory_retry_releases_the_kept_pages_too() {
    let sim = Arc::new(SimBackend::new(SimConfig {
        devices: vec![SimDeviceSpec {
            name: "small".into(),
            total_bytes: 64 * MIB,
            used_by_others: 0,
        }],
        granularity: 2 * MIB,
        ..SimConfig::default()
    }));
    let m = tight_manager(sim.clone(), 64);
    drop(m.alloc(0, 40 * MIB, &AllocOptions::default()).unwrap());
    m.unmap_cached();
    sim.set_used_by_others(0, 24 * MIB).unwrap();
    assert_eq!(m.backend().mem_info(0).unwrap().free, 0);
    // 20 kept pages and 10 new ones would be needed; the device has none free, and even with
    // the kept pages given back 60 MiB cannot fit in the 40 MiB left.
    let err = m.alloc(0, 60 * MIB, &on_stream(3)).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory { .. }), "{err}");
    let stats = m.device_stats(0).unwrap();
    assert_eq!(stats.oom_retries, 1);
    assert_eq!(
        stats.page_reserve_bytes, 0,
        "the retry gave the kept pages back"
    );
    assert_eq!(held(&m, 24 * MIB), (0, 0));
    // With the kept pages gone, what fits is served.
    let fits = m.alloc(0, 40 * MIB, &on_stream(3)).unwrap();
    assert_eq!(held(&m, 24 * MIB), (40 * MIB, 40 * MIB));
    drop(fits);
}

#[test]
fn the_device_peak_in_use_is_exact_across_pools_with_one_shard() {
    // Two streams, two pools: each peaks at 10 MiB, at different times. The device peaked at
    // 10 MiB, not at the 20 MiB the pools' peaks add up to.
    let config = ManagerConfig {
        devices: Some(vec![0]),
        shards: 1,
        cleanup_interval: None,
        ..ManagerConfig::default()
    };
    let m = MemoryManager::new(sim_backend(), config).unwrap();
    for stream in [1, 2] {
        let buffer = m.alloc(0, 10 * MIB, &on_stream(stream)).unwrap();
        drop(buffer);
    }
    let stats = m.device_stats(0).unwrap();
    assert_eq!(stats.counters.peak_in_use_bytes, 10 * MIB);
    assert_eq!(stats.counters.peak_requested_bytes, 10 * MIB);
    assert_eq!(stats.counters.in_use_bytes, 0);
    let held = m.alloc(0, 4 * MIB, &on_stream(1)).unwrap();
    m.reset_peaks();
    let stats = m.device_stats(0).unwrap();
    assert_eq!(
        stats.counters.peak_in_use_bytes,
        4 * MIB,
        "a reset restarts from now"
    );
    drop(held);
}

/// One miss of `size` bytes under `config` on the simulated device, freed and unmapped again:
/// how many chunks it was mapped with (the driver unmaps chunks whole, one call each).
fn chunks_of_one_miss(config: ManagerConfig, size: u64) -> (MemoryManager, u64) {
    let config = ManagerConfig {
        devices: Some(vec![0]),
        cleanup_interval: None,
        ..config
    };
    let m = MemoryManager::new(sim_backend(), config).unwrap();
    drop(m.alloc(0, size, &AllocOptions::default()).unwrap());
    let before = m.device_stats(0).unwrap().counters.driver_frees;
    assert_eq!(m.unmap_cached(), size);
    let after = m.device_stats(0).unwrap().counters.driver_frees;
    (m, after - before)
}

#[test]
fn a_miss_maps_chunks_no_larger_than_max_chunk_bytes() {
    // 20 MiB on the simulated device: ten pages, mapped as chunks of 4, 4 and 2 under an 8 MiB
    // cap, and as one chunk under a 32 MiB cap.
    for (cap, chunks) in [(8 * MIB, 3), (32 * MIB, 1)] {
        let config = ManagerConfig {
            max_chunk_bytes: cap,
            cache_mode: CacheMode::Fixed,
            ..ManagerConfig::default()
        };
        assert_eq!(chunks_of_one_miss(config, 20 * MIB).1, chunks, "cap {cap}");
    }
}

#[test]
fn a_long_miss_is_cut_into_inside_chunks_between_two_ordinary_ones() {
    // 6 MiB chunks are three pages, 16 MiB inside chunks eight. 128 MiB (64 pages): 22
    // ordinary chunks with no inside size; with 16 MiB, a 6 MiB chunk at each end and 58 pages
    // between in eight inside chunks (the last of two pages); with 32 MiB, the run holds fewer
    // than four of them between its ends and is cut as an ordinary one. 76 MiB (38 pages) is
    // the shortest run cut with 16 MiB inside chunks (four of them); 74 MiB is not.
    for (inside, size, chunks) in [
        (0, 128 * MIB, 22),
        (16 * MIB, 128 * MIB, 10),
        (32 * MIB, 128 * MIB, 22),
        (16 * MIB, 76 * MIB, 6),
        (16 * MIB, 74 * MIB, 13),
    ] {
        let config = ManagerConfig {
            max_chunk_bytes: 6 * MIB,
            inside_chunk_bytes: inside,
            cache_mode: CacheMode::Fixed,
            ..ManagerConfig::default()
        };
        let (m, unmapped) = chunks_of_one_miss(config, size);
        assert_eq!(
            unmapped, chunks,
            "inside chunks of {inside} bytes, {size} bytes"
        );
        // Kept chunks are mapped again whatever their size: nothing new is created.
        drop(m.alloc(0, size, &AllocOptions::default()).unwrap());
        let stats = m.device_stats(0).unwrap();
        assert_eq!(stats.pages_reused * 2 * MIB, size);
        assert_eq!(stats.pages_created * 2 * MIB, size);
    }
}

#[test]
fn inside_chunks_grow_with_the_cache_slack_up_to_a_quarter_of_the_run() {
    // 1 GiB is 512 pages: a 6 MiB chunk (three pages) at each end and 506 between. The slack
    // is the share `idle_per_mille` of the live peak (512 pages with this miss): 4 pages at 8
    // per mille, twice which is no more than 16 MiB, so inside chunks stay 8 pages (64 of
    // them); 32 pages at 64 per mille, so inside chunks of 64 pages (eight); at 1024 per mille
    // twice the slack passes a quarter of the run, which bounds them at 126 pages (five).
    // That is a fixed setting's rule.
    for (per_mille, chunks) in [(8, 2 + 64), (64, 2 + 8), (1024, 2 + 5)] {
        let config = ManagerConfig {
            max_chunk_bytes: 6 * MIB,
            inside_chunk_bytes: 16 * MIB,
            idle_per_mille: per_mille,
            cache_mode: CacheMode::Fixed,
            ..ManagerConfig::default()
        };
        let (_, unmapped) = chunks_of_one_miss(config, 1024 * MIB);
        assert_eq!(unmapped, chunks, "idle_per_mille {per_mille}");
    }
}

#[test]
fn the_adaptive_default_grows_inside_chunks_to_an_eighth_of_the_peak() {
    // The same 1 GiB miss at the adaptive default, which starts a rung up (32 MiB chunks, 64 MiB
    // inside ones): its largest chunk at a 1 GiB peak is an eighth, 64 pages, so the 480 pages
    // between its two 16-page ends go in eight chunks (seven of 64, one of 32) whatever the
    // slack; a 128 MiB miss (64 pages) is too short for inside chunks and is cut in four
    // ordinary ones.
    for (size, chunks) in [(1024 * MIB, 2 + 8), (128 * MIB, 4)] {
        let config = ManagerConfig {
            max_chunk_bytes: 6 * MIB,
            inside_chunk_bytes: 16 * MIB,
            ..ManagerConfig::default()
        };
        assert_eq!(config.cache_mode, CacheMode::Adaptive);
        let (_, unmapped) = chunks_of_one_miss(config, size);
        assert_eq!(unmapped, chunks, "{size} bytes");
    }
}

#[test]
fn a_run_with_grown_inside_chunks_releases_small_kept_chunks_instead_of_mapping_them() {
    // A 6 MiB chunk is kept; a 1 GiB miss then follows. With inside chunks of 16 MiB (slack 8
    // per mille) it maps the kept chunk again; with inside chunks grown to 126 pages (slack
    // 1024 per mille) a three-page chunk would cost a grant for little: it is released and the
    // whole run created in large chunks, the device holding no more than before.
    for (per_mille, reused) in [(8, 3), (1024, 0)] {
        let config = ManagerConfig {
            devices: Some(vec![0]),
            cleanup_interval: None,
            max_chunk_bytes: 6 * MIB,
            inside_chunk_bytes: 16 * MIB,
            idle_per_mille: per_mille,
            cache_mode: CacheMode::Fixed,
            ..ManagerConfig::default()
        };
        let m = MemoryManager::new(sim_backend(), config).unwrap();
        drop(m.alloc(0, 6 * MIB, &AllocOptions::default()).unwrap());
        assert_eq!(m.unmap_cached(), 6 * MIB);
        let big = m.alloc(0, 1024 * MIB, &AllocOptions::default()).unwrap();
        let stats = m.device_stats(0).unwrap();
        assert_eq!(stats.pages_reused, reused, "idle_per_mille {per_mille}");
        assert_eq!(stats.page_reserve_bytes, 0, "idle_per_mille {per_mille}");
        assert_eq!(m.reserved_bytes(), 1024 * MIB, "idle_per_mille {per_mille}");
        drop(big);
    }
}

#[test]
fn a_fixed_setting_maps_ahead_of_a_growing_arena_only_when_told() {
    // 32 MiB chunks: after a first block (an empty arena maps nothing ahead), each 4 MiB block
    // at a new high misses; told to map ahead, the first of them maps the rest of its chunk and
    // the next ones are hits. The pages ahead are idle pages the budget keeps (64 of them).
    for (ahead, misses) in [(false, 6), (true, 2)] {
        let config = ManagerConfig {
            max_chunk_bytes: 32 * MIB,
            idle_pages_kept: 64,
            map_ahead_when_growing: ahead,
            cache_mode: CacheMode::Fixed,
            ..ManagerConfig::default()
        };
        let m = MemoryManager::new(sim_backend(), config).unwrap();
        let mut live = vec![m.alloc(0, MIB, &AllocOptions::default()).unwrap()];
        for _ in 0..5 {
            live.push(m.alloc(0, 4 * MIB, &AllocOptions::default()).unwrap());
        }
        let stats = m.device_stats(0).unwrap();
        assert_eq!(stats.misses, misses, "mapping ahead {ahead}: {stats:?}");
        drop(live);
    }
}
