//! Allocator speed, every baseline measured in the same run: a gpumem pool hit (alloc + free),
//! a pool miss (pages mapped and unmapped each time), the driver's `cuMemAlloc`/`cuMemFree` and,
//! on CUDA, `cuMemAllocAsync`/`cuMemFreeAsync`; one and eight threads; 100 vs 100,000 live
//! allocations; a miss with and without the walk `place_on_mapped_pages` adds; and a pool hit
//! through the C ABI PyTorch calls (`gpumem_alloc`/`gpumem_free`) beside the same manager called
//! from Rust. `GPUMEM_BENCH_BACKEND=cuda|sim|auto` (default
//! auto) picks the device.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpumem::backend::{open_backend_or_simulate, sim::SimConfig, BackendChoice};
use gpumem::units::{KIB, MIB};
use gpumem::{AllocOptions, DeviceBackend, ManagerConfig, MemoryManager};
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const SIZES: [u64; 5] = [256, 64 * KIB, MIB, 16 * MIB, 256 * MIB];

fn backend() -> Arc<dyn DeviceBackend> {
    let choice = match std::env::var("GPUMEM_BENCH_BACKEND").as_deref() {
        Ok("cuda") => BackendChoice::Cuda,
        Ok("sim") => BackendChoice::Sim,
        _ => BackendChoice::Auto,
    };
    let opened = open_backend_or_simulate(choice, SimConfig::default()).expect("bench backend");
    eprintln!("{}", opened.reason);
    opened.backend
}

fn manager(backend: &Arc<dyn DeviceBackend>, config: ManagerConfig) -> MemoryManager {
    let config = ManagerConfig {
        devices: Some(vec![0]),
        ..config
    };
    MemoryManager::new(Arc::clone(backend), config).expect("manager")
}

fn label(size: u64) -> String {
    gpumem::units::Bytes(size).to_string().replace(' ', "")
}

fn single_thread(c: &mut Criterion) {
    let backend = backend();
    let options = AllocOptions::default();
    let tracked = manager(&backend, ManagerConfig::default());
    let untracked = manager(
        &backend,
        ManagerConfig {
            track_allocations: false,
            ..ManagerConfig::default()
        },
    );
    let with_backtraces = manager(
        &backend,
        ManagerConfig {
            capture_backtraces: true,
            ..ManagerConfig::default()
        },
    );
    // A miss: the cache is emptied after every free, so each allocation maps its pages.
    let no_cache = manager(&backend, ManagerConfig::default());
    let mut group = c.benchmark_group("alloc_free");
    for size in SIZES {
        group.bench_with_input(
            BenchmarkId::new("gpumem_pool_hit", label(size)),
            &size,
            |b, &size| b.iter(|| drop(black_box(tracked.alloc(0, size, &options).unwrap()))),
        );
        group.bench_with_input(
            BenchmarkId::new("gpumem_pool_hit_untracked", label(size)),
            &size,
            |b, &size| b.iter(|| drop(black_box(untracked.alloc(0, size, &options).unwrap()))),
        );
        group.bench_with_input(
            BenchmarkId::new("gpumem_pool_miss", label(size)),
            &size,
            |b, &size| {
                b.iter(|| {
                    drop(black_box(no_cache.alloc(0, size, &options).unwrap()));
                    no_cache.empty_cache();
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("driver_cuMemAlloc", label(size)),
            &size,
            |b, &size| {
                b.iter(|| {
                    let ptr = backend.alloc(0, size).unwrap();
                    backend.free(0, black_box(ptr)).unwrap();
                })
            },
        );
    }
    // The cost of recording the thread and a backtrace per allocation (off by default).
    group.bench_function("gpumem_pool_hit_backtraces/4.00KiB", |b| {
        b.iter(|| {
            drop(black_box(
                with_backtraces.alloc(0, 4 * KIB, &options).unwrap(),
            ))
        })
    });
    group.finish();
    stream_ordered_baseline(c);
}

/// `cuMemAllocAsync` + `cuMemFreeAsync` on the device's default pool, when the backend is CUDA.
fn stream_ordered_baseline(c: &mut Criterion) {
    let Ok(opened) = gpumem::backend::open_backend(gpumem::BackendChoice::Cuda, Default::default())
    else {
        eprintln!("no CUDA device: skipping the cuMemAllocAsync baseline");
        return;
    };
    let Some(cuda) = opened.backend.driver_pool() else {
        eprintln!("skipping the cuMemAllocAsync baseline: the backend has no driver pool");
        return;
    };
    if let Err(error) = cuda.prepare_stream_ordered_pool(0) {
        eprintln!("skipping the cuMemAllocAsync baseline: {error}");
        return;
    }
    let mut group = c.benchmark_group("alloc_free");
    for size in SIZES {
        group.bench_with_input(
            BenchmarkId::new("driver_cuMemAllocAsync", label(size)),
            &size,
            |b, &size| {
                b.iter(|| {
                    let ptr = cuda.alloc_stream_ordered(0, size).unwrap();
                    cuda.free_stream_ordered(0, black_box(ptr)).unwrap();
                })
            },
        );
    }
    group.finish();
}

/// Per-operation time of one thread while `threads` threads allocate and free at once.
fn threaded(c: &mut Criterion) {
    let backend = backend();
    let m = manager(&backend, ManagerConfig::default());
    let mut group = c.benchmark_group("threads");
    for threads in [1usize, 8] {
        group.bench_function(BenchmarkId::new("gpumem_pool_hit_4KiB", threads), |b| {
            b.iter_custom(|iterations| {
                let start = Arc::new(Barrier::new(threads));
                let per_thread: Vec<Duration> = std::thread::scope(|scope| {
                    let workers: Vec<_> = (0..threads)
                        .map(|_| {
                            let (m, start) = (m.clone(), Arc::clone(&start));
                            scope.spawn(move || {
                                let options = AllocOptions::default();
                                drop(m.alloc(0, 4 * KIB, &options).unwrap());
                                start.wait();
                                let began = Instant::now();
                                for _ in 0..iterations {
                                    drop(black_box(m.alloc(0, 4 * KIB, &options).unwrap()));
                                }
                                began.elapsed()
                            })
                        })
                        .collect();
                    workers.into_iter().map(|w| w.join().unwrap()).collect()
                });
                // The median thread: how long one thread's operations took under contention.
                let mut sorted = per_thread;
                sorted.sort();
                sorted[sorted.len() / 2]
            })
        });
    }
    group.finish();
}

/// A pool hit with 100 vs 100,000 other allocations live.
fn live_count(c: &mut Criterion) {
    let backend = backend();
    let mut group = c.benchmark_group("live_allocations");
    for live in [100u64, 100_000] {
        let m = manager(&backend, ManagerConfig::default());
        let options = AllocOptions::default();
        let held: Vec<_> = (0..live)
            .map(|i| m.alloc(0, 512 + (i * 7919) % (64 * KIB), &options).unwrap())
            .collect();
        group.bench_function(BenchmarkId::new("gpumem_pool_hit_4KiB", live), |b| {
            b.iter(|| drop(black_box(m.alloc(0, 4 * KIB, &options).unwrap())))
        });
        drop(held);
    }
    group.finish();
}

/// A miss with `place_on_mapped_pages` off and on, beside 1,000 and 20,000 free holes on mapped
/// pages too small for it: with the setting on, every would-be miss first walks the free blocks
/// of its arena and their mapped runs for a stretch that holds it (`pool/arena/block_placement.rs`);
/// this is what that walk costs when it finds none. The holes are 128 KiB blocks freed between
/// live ones (the large pool's), the request 8 MiB; the cache is emptied after each free so
/// that every request maps its pages.
fn placement_scan(c: &mut Criterion) {
    let backend = backend();
    let options = AllocOptions::default();
    let mut group = c.benchmark_group("placement_scan");
    for holes in [1_000usize, 20_000] {
        for placed in [false, true] {
            let m = manager(
                &backend,
                ManagerConfig {
                    place_on_mapped_pages: placed,
                    ..ManagerConfig::default()
                },
            );
            let mut blocks: Vec<_> = (0..2 * holes)
                .map(|_| m.alloc(0, 128 * KIB, &options).unwrap())
                .collect();
            // Every other block freed: holes between live neighbours, their pages still mapped.
            let mut index = 0;
            blocks.retain(|_| {
                index += 1;
                index % 2 == 0
            });
            let name = if placed { "miss_placed" } else { "miss_fit" };
            group.bench_function(BenchmarkId::new(name, holes), |b| {
                b.iter(|| {
                    drop(black_box(m.alloc(0, 8 * MIB, &options).unwrap()));
                    m.empty_cache();
                })
            });
            drop(blocks);
        }
    }
    group.finish();
}

/// What the C ABI adds to a pool hit: the live-buffer table keyed by address, the graph-capture
/// check (a driver call on CUDA), the host-context scope, and the check for frees waiting on
/// other streams. The C ABI has one manager per process: this bench installs it.
/// Allocations live at once in a small training step (GPT-2, 6 layers, AdamW: ~4,000 tensors).
const LIVE_IN_A_STEP: usize = 4000;

fn c_abi(c: &mut Criterion) {
    let backend = backend();
    let rust = manager(&backend, ManagerConfig::default());
    let abi = manager(&backend, ManagerConfig::default());
    capi::install(abi).expect("the bench installs the C ABI's manager first");
    let options = AllocOptions::default();
    let mut group = c.benchmark_group("c_abi");
    group.bench_function("rust_pool_hit/4.00KiB", |b| {
        b.iter(|| drop(black_box(rust.alloc(0, 4 * KIB, &options).unwrap())))
    });
    group.bench_function("c_abi_pool_hit/4.00KiB", |b| {
        b.iter(|| {
            let ptr = capi::gpumem_alloc(4 * KIB as isize, 0, std::ptr::null_mut());
            assert!(!ptr.is_null());
            capi::gpumem_free(black_box(ptr), 4 * KIB as isize, 0, std::ptr::null_mut());
        })
    });
    // As a training step has it: thousands of tensors live, and sizes that change from one
    // request to the next, so each takes a search of the index and a slot in the live table.
    let sizes: Vec<u64> = (0..64u64).map(|i| 512 * (1 + i * 37 % 200)).collect();
    let _held: Vec<_> = (0..LIVE_IN_A_STEP)
        .map(|i| rust.alloc(0, sizes[i % 64], &options).unwrap())
        .collect();
    group.bench_function("rust_churn_16_of_4000_live", |b| {
        b.iter(|| {
            let buffers: Vec<_> = sizes[..16]
                .iter()
                .map(|&size| rust.alloc(0, size, &options).unwrap())
                .collect();
            drop(black_box(buffers))
        })
    });
    let c_alloc = |size: u64| capi::gpumem_alloc(size as isize, 0, std::ptr::null_mut());
    let c_free = |ptr, size: u64| capi::gpumem_free(ptr, size as isize, 0, std::ptr::null_mut());
    let _c_held: Vec<_> = (0..LIVE_IN_A_STEP)
        .map(|i| c_alloc(sizes[i % 64]))
        .collect();
    group.bench_function("c_abi_churn_16_of_4000_live", |b| {
        b.iter(|| {
            let ptrs: Vec<_> = sizes[..16].iter().map(|&size| c_alloc(size)).collect();
            for (ptr, &size) in ptrs.into_iter().zip(&sizes) {
                assert!(!ptr.is_null());
                c_free(black_box(ptr), size);
            }
        })
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = single_thread, threaded, live_count, placement_scan, c_abi
}
criterion_main!(benches);
