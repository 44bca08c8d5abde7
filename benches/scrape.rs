//! What a scrape and a sample cost at scale: 8 simulated devices, each with small, large and
//! direct pools, and 100,000 live tracked allocations. Measures `/metrics` rendering from a
//! snapshot (target: 2 ms median), the page and JSON renderings, taking the snapshot itself, and
//! the allocation hot path with and without a sampler snapshotting every second beside it.

use criterion::{criterion_group, criterion_main, Criterion};
use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec};
use gpumem::snapshot::{capture, CaptureSettings};
use gpumem::units::{GIB, KIB, MIB};
use gpumem::{AllocOptions, DeviceBuffer, ManagerConfig, MemoryManager, Strategy, Tag};
use gpumem_observe::web::{metrics, page::IndexPage};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const DEVICES: usize = 8;
const LIVE: usize = 100_000;
const TAGS: [&str; 6] = [
    "weights",
    "kv_cache",
    "activations",
    "workspace",
    "leaky_cache",
    "lora",
];

/// Managers (pooled and direct, one backend) holding `LIVE` allocations across `DEVICES`.
struct Loaded {
    managers: Vec<MemoryManager>,
    _buffers: Vec<DeviceBuffer>,
}

fn loaded() -> Loaded {
    let spec = SimDeviceSpec {
        total_bytes: 80 * GIB,
        ..SimDeviceSpec::default()
    };
    let backend = Arc::new(SimBackend::new(SimConfig {
        devices: vec![spec; DEVICES],
        ..SimConfig::default()
    }));
    let pooled = MemoryManager::new(backend.clone(), ManagerConfig::default()).expect("manager");
    let direct = MemoryManager::new(
        backend,
        ManagerConfig {
            strategy: Strategy::Direct,
            ..ManagerConfig::default()
        },
    )
    .expect("direct manager");
    let tags: Vec<Tag> = TAGS.iter().map(|t| Tag::new(t)).collect();
    let mut buffers = Vec::with_capacity(LIVE);
    for i in 0..LIVE {
        let device = i % DEVICES;
        let options = AllocOptions::tagged(tags[i % tags.len()].clone());
        // Mostly small, some large (own pool), a few straight from the driver (direct pool).
        let (manager, size) = match (i / DEVICES) % 50 {
            0 => (&direct, 4 * MIB),
            1..=9 => (&pooled, 2 * MIB + (i as u64 % 7) * 256 * KIB),
            _ => (&pooled, 4 * KIB + (i as u64 % 128) * KIB),
        };
        buffers.push(manager.alloc(device, size, &options).expect("alloc"));
    }
    Loaded {
        managers: vec![pooled, direct],
        _buffers: buffers,
    }
}

fn scrape(c: &mut Criterion) {
    let state = loaded();
    let settings = CaptureSettings::default();
    let snapshot = capture(&state.managers, &settings);
    let pools: usize = snapshot.devices.iter().map(|d| d.pools.len()).sum();
    let live: u64 = snapshot.devices.iter().map(|d| d.live.count).sum();
    eprintln!(
        "state: {} devices, {pools} pools, {live} live allocations",
        snapshot.devices.len()
    );
    let text = metrics::render(&snapshot, true).expect("renders");
    eprintln!(
        "/metrics: {} bytes, {} lines",
        text.len(),
        text.lines().count()
    );

    let mut group = c.benchmark_group("scrape");
    group.bench_function("metrics_render", |b| {
        b.iter(|| metrics::render(black_box(&snapshot), true).expect("renders"))
    });
    group.bench_function("page_render", |b| {
        b.iter(|| {
            askama::Template::render(&IndexPage::new(black_box(&snapshot), true)).expect("renders")
        })
    });
    group.bench_function("snapshot_json", |b| {
        b.iter(|| serde_json::to_vec(black_box(&snapshot)).expect("encodes"))
    });
    group.finish();

    let mut group = c.benchmark_group("sample");
    group.sample_size(20);
    group.bench_function("snapshot_capture_100k_live", |b| {
        b.iter(|| capture(black_box(&state.managers), &settings))
    });
    group.finish();
}

/// The allocation hot path (alloc + free of a cached block) with 100,000 live allocations, alone
/// and with a sampler snapshotting every second on another thread.
fn hot_path(c: &mut Criterion) {
    let state = loaded();
    let manager = state.managers[0].clone();
    let options = AllocOptions::tagged(Tag::new("activations"));
    let mut alloc_free = || {
        let buffer = manager.alloc(0, 64 * KIB, &options).expect("alloc");
        drop(black_box(buffer));
    };
    let mut group = c.benchmark_group("hot_path");
    group.bench_function("alloc_free_without_sampler", |b| b.iter(&mut alloc_free));

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = Arc::clone(&stop);
        let managers = state.managers.clone();
        std::thread::spawn(move || {
            let settings = CaptureSettings::default();
            while !stop.load(Ordering::Relaxed) {
                black_box(capture(&managers, &settings));
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    group.bench_function("alloc_free_with_sampler_1s", |b| b.iter(&mut alloc_free));
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    group.finish();
}

criterion_group!(benches, scrape, hot_path);
criterion_main!(benches);
