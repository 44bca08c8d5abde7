//! The manager beyond allocation: pressure levels and what they trigger, leak queries, the CPU
//! fallback, multi-device placement, presets and upkeep — on simulated devices, and the parts
//! that need a driver on CUDA too when a GPU is present.

use crate::support::cuda_backend;
use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec};
use gpumem::manager::{FallbackBuffer, MemoryConfig, PressureLevel};
use gpumem::units::{GIB, MIB};
use gpumem::{AllocError, AllocOptions, MemoryManager, Tag};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn sims(totals: &[u64]) -> Arc<SimBackend> {
    Arc::new(SimBackend::new(SimConfig {
        devices: totals
            .iter()
            .enumerate()
            .map(|(i, &total)| SimDeviceSpec {
                name: format!("sim {i}"),
                total_bytes: total,
                used_by_others: 0,
            })
            .collect(),
        granularity: 2 * MIB,
        ..SimConfig::default()
    }))
}

#[test]
fn pressure_levels_follow_the_device_and_call_back_once_per_change() {
    let sim = sims(&[10 * GIB]);
    let m = MemoryManager::new(sim.clone(), MemoryConfig::default()).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    m.on_pressure_change(move |change| log.lock().unwrap().push((change.from, change.to)));
    // Usable = 10 GiB - (600 MiB + 1 GiB) = 8.4 GiB.
    m.update_pressure();
    assert_eq!(m.pressure(0), Some(PressureLevel::Low));
    sim.set_used_by_others(0, 6 * GIB).unwrap();
    m.update_pressure();
    m.update_pressure();
    assert_eq!(m.pressure(0), Some(PressureLevel::Medium));
    sim.set_used_by_others(0, 8200 * MIB).unwrap();
    m.update_pressure();
    assert_eq!(m.pressure(0), Some(PressureLevel::Critical));
    sim.set_used_by_others(0, 0).unwrap();
    m.update_pressure();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (PressureLevel::Low, PressureLevel::Medium),
            (PressureLevel::Medium, PressureLevel::Critical),
            (PressureLevel::Critical, PressureLevel::Low),
        ]
    );
}

#[test]
fn high_pressure_trims_the_cache() {
    let sim = sims(&[10 * GIB]);
    let m = MemoryManager::new(sim.clone(), MemoryConfig::default()).unwrap();
    drop(m.alloc(0, 256 * MIB, &AllocOptions::default()).unwrap());
    assert!(m.reserved_bytes() >= 256 * MIB, "freed pages stay cached");
    sim.set_used_by_others(0, 7 * GIB).unwrap();
    let released = m.update_pressure();
    assert_eq!(m.pressure(0), Some(PressureLevel::High));
    assert!(released >= 256 * MIB);
    assert_eq!(m.reserved_bytes(), 0);
}

#[test]
fn critical_pressure_fails_fast_below_min_free_or_falls_back_to_the_host() {
    let sim = sims(&[10 * GIB]);
    let strict =
        MemoryManager::new(sim.clone(), MemoryConfig::default().min_free_bytes(GIB)).unwrap();
    sim.set_used_by_others(0, 8300 * MIB).unwrap();
    strict.update_pressure();
    assert_eq!(strict.pressure(0), Some(PressureLevel::Critical));
    // 1.9 GiB free: a 1 GiB request would leave less than the 1 GiB kept free.
    let err = strict.alloc(0, GIB, &AllocOptions::default()).unwrap_err();
    assert!(matches!(err, AllocError::PressureCritical { .. }), "{err}");
    assert!(err.to_string().contains("min_free_bytes"), "{err}");
    assert!(strict.alloc(0, 256 * MIB, &AllocOptions::default()).is_ok());

    let spilling = MemoryManager::new(
        sim.clone(),
        MemoryConfig::default()
            .min_free_bytes(GIB)
            .cpu_fallback(true),
    )
    .unwrap();
    spilling.update_pressure();
    let buffer = spilling
        .alloc_or_host(0, GIB, &AllocOptions::default())
        .unwrap();
    let FallbackBuffer::Host(host) = &buffer else {
        panic!("expected host memory, got {buffer:?}");
    };
    assert_eq!(host.size(), GIB);
    let stats = spilling.device_stats(0).unwrap();
    assert_eq!((stats.cpu_fallbacks, stats.host_fallback_bytes), (1, GIB));
    drop(buffer);
    assert_eq!(spilling.device_stats(0).unwrap().host_fallback_bytes, 0);
    let on_device = spilling
        .alloc_or_host(0, MIB, &AllocOptions::default())
        .unwrap();
    assert!(on_device.is_on_device());
}

#[test]
fn without_fallback_out_of_memory_stays_an_error() {
    let m = MemoryManager::new(sims(&[GIB]), MemoryConfig::default()).unwrap();
    let _held = m.alloc(0, 900 * MIB, &AllocOptions::default()).unwrap();
    let err = m
        .alloc_or_host(0, 200 * MIB, &AllocOptions::default())
        .unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
}

#[test]
fn the_pool_never_holds_more_than_its_fraction_of_the_device() {
    let m = MemoryManager::new(
        sims(&[GIB]),
        MemoryConfig::default().gpu_memory_fraction(0.5),
    )
    .unwrap();
    let _a = m.alloc(0, 500 * MIB, &AllocOptions::default()).unwrap();
    let err = m.alloc(0, 100 * MIB, &AllocOptions::default()).unwrap_err();
    assert!(matches!(err, AllocError::PoolLimit { .. }), "{err}");
}

#[test]
fn leak_queries_group_old_allocations_by_tag() {
    let config = MemoryConfig::default().leak_age(Duration::from_millis(100));
    let m = MemoryManager::new(sims(&[GIB]), config).unwrap();
    let leaky = Tag::new("leaky_cache");
    let old: Vec<_> = (0..3)
        .map(|_| {
            m.alloc(0, 4096, &AllocOptions::tagged(leaky.clone()))
                .unwrap()
        })
        .collect();
    let _untagged_old = m.alloc(0, 1000, &AllocOptions::default()).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let _young = m
        .alloc(0, MIB, &AllocOptions::tagged(Tag::new("kv_cache")))
        .unwrap();
    assert_eq!(m.live_summary(), (5, 3 * 4096 + 1000 + MIB));
    let report = m.check_leaks();
    assert_eq!((report.count, report.bytes), (4, 3 * 4096 + 1000));
    assert_eq!(report.by_tag[0].tag.as_deref(), Some("leaky_cache"));
    assert_eq!(report.by_tag[0].count, 3);
    assert!(report.by_tag[0].oldest_age >= Duration::from_millis(100));
    assert_eq!(m.oldest(2).len(), 2);
    assert_eq!(m.oldest(2)[0].tag.as_deref(), Some("leaky_cache"));
    assert_eq!(m.older_than(Duration::from_secs(3600)), vec![]);
    drop(old);
    assert_eq!(m.check_leaks().count, 1);
}

#[test]
fn backtraces_are_kept_only_while_the_allocation_lives() {
    let m = MemoryManager::new(
        sims(&[GIB]),
        MemoryConfig::default().capture_backtraces(true),
    )
    .unwrap();
    let buffer = std::thread::Builder::new()
        .name("loader".into())
        .spawn({
            let m = m.clone();
            move || m.alloc(0, 4096, &AllocOptions::default()).unwrap()
        })
        .unwrap()
        .join()
        .unwrap();
    let origin = m.origin_of(buffer.id()).expect("origin recorded");
    assert_eq!(origin.thread, "loader");
    let id = buffer.id();
    drop(buffer);
    assert!(m.origin_of(id).is_none());
}

#[test]
fn placement_prefers_headroom_and_sticks_to_an_affinity_key() {
    let sim = sims(&[8 * GIB, 8 * GIB]);
    let m = MemoryManager::new(sim.clone(), MemoryConfig::default()).unwrap();
    sim.set_used_by_others(0, 4 * GIB).unwrap();
    let first = m
        .allocate_on_best_device(GIB, Some("llama"), &AllocOptions::default())
        .unwrap();
    assert_eq!(first.device(), 1, "device 1 has more headroom");
    sim.set_used_by_others(0, 0).unwrap();
    sim.set_used_by_others(1, 6 * GIB).unwrap();
    let second = m
        .allocate_on_best_device(GIB, Some("llama"), &AllocOptions::default())
        .unwrap();
    assert_eq!(second.device(), 1, "the key sticks to its device");
    let other = m
        .allocate_on_best_device(GIB, Some("mistral"), &AllocOptions::default())
        .unwrap();
    assert_eq!(other.device(), 0);
    assert_eq!(m.device_stats(1).unwrap().counters.live_allocations, 2);
    assert!(m.headroom(0).unwrap() > m.headroom(1).unwrap());
}

#[test]
fn preallocation_makes_the_first_requests_hits_and_stays_cached() {
    let config = MemoryConfig {
        preallocate_bytes: 64 * MIB,
        ..MemoryConfig::default()
    };
    let m = MemoryManager::new(sims(&[GIB]), config).unwrap();
    assert_eq!(m.reserved_bytes(), 64 * MIB);
    drop(m.alloc(0, 32 * MIB, &AllocOptions::default()).unwrap());
    let stats = m.device_stats(0).unwrap().counters;
    assert_eq!(stats.hits, 1, "served from the preallocated pages");
    m.release_idle_older_than(Duration::ZERO);
    assert_eq!(
        m.reserved_bytes(),
        64 * MIB,
        "age release keeps the preallocation"
    );
}

#[test]
fn the_upkeep_thread_runs_and_stops_with_the_manager() {
    let sim = sims(&[10 * GIB]);
    let config = MemoryConfig::default().cleanup_interval(Some(Duration::from_millis(20)));
    let m = MemoryManager::new(sim.clone(), config).unwrap();
    sim.set_used_by_others(0, 6 * GIB).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while m.pressure(0) != Some(PressureLevel::Medium) {
        assert!(
            std::time::Instant::now() < deadline,
            "upkeep never updated the pressure"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(m);
}

#[test]
fn invalid_configuration_is_refused_naming_the_key() {
    let err = MemoryManager::new(
        sims(&[GIB]),
        MemoryConfig::default().gpu_memory_fraction(0.0),
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("gpu_memory_fraction"), "{err}");
}

#[test]
fn pressure_and_fallback_work_on_cuda() {
    let Some(cuda) = cuda_backend() else {
        return;
    };
    let m = MemoryManager::new(
        cuda,
        MemoryConfig::default().devices(vec![0]).cpu_fallback(true),
    )
    .unwrap();
    m.update_pressure();
    assert!(m.pressure(0).is_some());
    let too_much = m.backend().mem_info(0).unwrap().total;
    // Larger than the device: TooLarge is not an out-of-memory, so no fallback either.
    assert!(m
        .alloc_or_host(0, too_much + 1, &AllocOptions::default())
        .is_err());
    let pinned = m.backend().alloc_pinned_host(0, 64 * MIB).unwrap();
    m.backend().free_pinned_host(0, pinned).unwrap();
}

/// On a host with two or more GPUs (set `GPUMEM_REQUIRE_GPUS=2` to make their absence a failure).
#[test]
fn placement_across_real_gpus() {
    let required: usize = std::env::var("GPUMEM_REQUIRE_GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let Some(cuda) = cuda_backend() else {
        assert_eq!(
            required, 0,
            "GPUMEM_REQUIRE_GPUS={required} but CUDA is unusable"
        );
        return;
    };
    let count = cuda.device_count();
    if count < 2 {
        assert!(
            required < 2,
            "GPUMEM_REQUIRE_GPUS={required} but only {count} GPU(s)"
        );
        eprintln!("skipping: one GPU");
        return;
    }
    let m = MemoryManager::new(cuda, MemoryConfig::default()).unwrap();
    // Fill device 0 so device 1 has the most headroom.
    let ballast = m
        .alloc(0, m.headroom(0).unwrap() / 2, &AllocOptions::default())
        .unwrap();
    let first = m
        .allocate_on_best_device(256 * MIB, Some("model-a"), &AllocOptions::default())
        .unwrap();
    assert_ne!(first.device(), 0, "device 0 is half full");
    drop(ballast);
    m.empty_cache();
    let again = m
        .allocate_on_best_device(256 * MIB, Some("model-a"), &AllocOptions::default())
        .unwrap();
    assert_eq!(again.device(), first.device(), "the key sticks");
    for device in 0..count {
        let buffer = m.alloc(device, 64 * MIB, &AllocOptions::default()).unwrap();
        assert_eq!(buffer.device(), device);
        let stats = m.device_stats(device).unwrap();
        assert!(stats.counters.live_allocations >= 1);
        assert!(m.backend().mem_info(device).unwrap().used() >= stats.counters.reserved_bytes);
    }
}

/// At critical pressure a mapping that would eat into `min_free_bytes` first gives back the
/// idle pages other pools cache, then tries again (counted in `oom_retries`); only when that
/// is not enough is it refused, and the refusal is recorded with its size, tag and reason.
#[test]
fn critical_pressure_releases_cached_pages_and_retries_before_refusing() {
    let sim = sims(&[10 * GIB]);
    let config = MemoryConfig {
        trim_on_high_pressure: false,
        release_idle_after: None,
        ..MemoryConfig::default()
    };
    let m = MemoryManager::new(sim.clone(), config).unwrap();
    let other_stream = AllocOptions::default().on_stream(gpumem::backend::StreamId(7));
    drop(m.alloc(0, 2 * GIB, &other_stream).unwrap());
    let cached = m.device_stats(0).unwrap().counters.reserved_bytes;
    assert!(cached >= 2 * GIB, "the freed buffer stays cached");
    // Leave 1 GiB free: critical, and 1 GiB more would go below min_free (512 MiB).
    sim.set_used_by_others(0, 10 * GIB - cached - GIB).unwrap();
    m.update_pressure();
    assert_eq!(m.pressure(0), Some(PressureLevel::Critical));
    let tag = AllocOptions::tagged(Tag::new("kv_cache"));
    let served = m.alloc(0, GIB, &tag).expect("the cached pages made room");
    let stats = m.device_stats(0).unwrap();
    assert_eq!((stats.oom_retries, stats.ooms), (1, 0));
    drop(served);
    let refused = m.alloc(0, 3 * GIB, &tag).unwrap_err();
    assert!(refused.is_out_of_memory(), "{refused}");
    let recorded = m.recent_ooms(0);
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].seq, 1);
    assert_eq!(recorded[0].requested_bytes, 3 * GIB);
    assert_eq!(recorded[0].tag.as_deref(), Some("kv_cache"));
    assert_eq!(recorded[0].message, refused.to_string());
}
