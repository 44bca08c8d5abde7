//! Concurrency stress: many threads allocating and freeing on several devices, streams (more
//! than may have pools of their own) and shards while others trim, empty the cache, reset peaks, run upkeep and take snapshots — with
//! and without driver faults. During the run no two buffers handed out at once overlap, and
//! every snapshot is self-consistent; at the end the full invariants of `alloc_model` hold and
//! every byte goes back to the device. A third run lends busy pages in stream order
//! (`stream_ordered_reuse`) on a tight cache while the simulated GPU falls behind and catches
//! up, under driver faults.

use super::alloc_model::{check_state, State};
use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec};
use gpumem::manager::{AllocOptions, DeviceBuffer, MemoryConfig, MemoryManager, Tag};
use gpumem::snapshot::{capture, CaptureSettings};
use gpumem::units::{GIB, MIB};
use gpumem::{AllocError, BackendError, DeviceBackend, StreamId};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEVICES: usize = 2;
const ALLOCATING_THREADS: u64 = 6;
const RUN_FOR: Duration = Duration::from_secs(3);
/// Streams in use at once: more than may have pools of their own, so the rest share pools.
const STREAMS_AT_ONCE: u64 = gpumem::manager::MAX_STREAMS_WITH_OWN_POOLS as u64 + 8;

/// Every buffer handed out and not yet freed, by (device, start) -> end: a new one must not
/// overlap any of them.
#[derive(Default)]
struct Handed(Mutex<BTreeMap<(usize, u64), u64>>);

impl Handed {
    fn insert(&self, buffer: &DeviceBuffer) {
        let (device, start, end) = (buffer.device(), buffer.ptr(), buffer.ptr() + buffer.size());
        let mut map = self.0.lock();
        if let Some((&(d, s), &e)) = map.range(..(device, end)).next_back() {
            assert!(
                d != device || e <= start,
                "{buffer:?} overlaps a live buffer at {s:#x}..{e:#x} on device {d}"
            );
        }
        map.insert((device, start), end);
    }

    fn remove(&self, buffer: &DeviceBuffer) {
        self.0.lock().remove(&(buffer.device(), buffer.ptr()));
    }
}

/// A small deterministic generator per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn sim() -> Arc<SimBackend> {
    let spec = SimDeviceSpec {
        total_bytes: 4 * GIB,
        ..SimDeviceSpec::default()
    };
    Arc::new(SimBackend::new(SimConfig {
        devices: vec![spec; DEVICES],
        ..SimConfig::default()
    }))
}

/// A stream for the next allocation: one of the streams of the current phase, which moves on
/// by a few streams every 2,000 allocation rounds of all threads (about 30 ms), so that streams
/// go unused for a while, lose their pools to upkeep while a thread may be about to allocate
/// from them, and come back.
fn stream(rng: &mut Rng, rounds: u64) -> StreamId {
    let phase = rounds / 2000;
    StreamId((phase * 5 + rng.below(STREAMS_AT_ONCE)) % 64)
}

/// One allocating thread: random sizes, devices, streams, alignments and tags; holds up to 48
/// buffers and frees them in random order. Returns what it still holds.
fn allocate(
    manager: &MemoryManager,
    handed: &Handed,
    seed: u64,
    stop: &AtomicBool,
    faults_on: bool,
    done: &AtomicU64,
) -> Vec<DeviceBuffer> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let tags = [
        Tag::new("kv_cache"),
        Tag::new("activations"),
        Tag::new("weights"),
    ];
    let mut held: Vec<DeviceBuffer> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let size = match rng.below(4) {
            0 => 1 + rng.below(64 << 10),
            1 | 2 => 1 + rng.below(6 * MIB),
            _ => 1 + rng.below(48 * MIB),
        };
        let options = AllocOptions::tagged(tags[rng.below(3) as usize].clone())
            .on_stream(stream(&mut rng, done.load(Ordering::Relaxed)))
            .with_alignment(1 << (8 + rng.below(8)));
        let device = rng.below(DEVICES as u64) as usize;
        match manager.alloc(device, size, &options) {
            Ok(buffer) => {
                assert_eq!(buffer.ptr() % options.alignment, 0, "{buffer:?}");
                handed.insert(&buffer);
                held.push(buffer);
            }
            Err(error) if error.is_out_of_memory() => {}
            Err(AllocError::Backend(BackendError::Injected(_))) if faults_on => {}
            Err(error) => panic!("allocation failed unexpectedly: {error}"),
        }
        while held.len() > 48 || (!held.is_empty() && rng.below(2) == 0) {
            let buffer = held.swap_remove(rng.below(held.len() as u64) as usize);
            handed.remove(&buffer);
            if rng.below(2) == 0 {
                drop(buffer);
            } else {
                // Pooled frees never call the driver, so they cannot fail.
                buffer.free().expect("a pooled free");
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    held
}

/// Trims, empties, releases, resets peaks and runs upkeep, as fast as it can.
fn maintain(manager: &MemoryManager, stop: &AtomicBool, seed: u64) {
    let mut rng = Rng(seed | 1);
    while !stop.load(Ordering::Relaxed) {
        match rng.below(5) {
            0 => drop(manager.trim(rng.below(2 * GIB))),
            1 => drop(manager.empty_cache()),
            2 => drop(manager.release_idle_older_than(Duration::ZERO)),
            3 => manager.reset_peaks(),
            _ => drop(manager.maintain()),
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Takes every kind of snapshot and checks what holds even while others allocate: no two
/// live blocks overlap, peaks are never below their values, in use never exceeds reserved.
fn observe(manager: &MemoryManager, stop: &AtomicBool) -> u64 {
    let mut snapshots = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut live = manager.live_allocations();
        live.sort_by_key(|a| (a.device, a.ptr));
        for pair in live.windows(2) {
            if pair[0].device == pair[1].device {
                assert!(
                    pair[0].ptr + pair[0].block_bytes <= pair[1].ptr,
                    "a snapshot shows overlapping blocks: {:?} {:?}",
                    pair[0],
                    pair[1]
                );
            }
        }
        for view in manager.pool_views() {
            let c = view.counters;
            assert!(c.peak_in_use_bytes >= c.in_use_bytes, "{view:?}");
            assert!(c.peak_requested_bytes >= c.requested_bytes, "{view:?}");
            assert!(c.peak_reserved_bytes >= c.reserved_bytes, "{view:?}");
            assert!((0.0..=1.0).contains(&view.fragmentation_ratio), "{view:?}");
        }
        for device in 0..DEVICES {
            // Counters are read one by one while pools count: a hit may be seen before the
            // request it belongs to, at most one per pool.
            let stats = manager.device_stats(device).expect("device stats");
            assert!(stats.counters.hits <= stats.counters.requests + 64);
            let c = stats.counters;
            assert!(c.peak_reserved_bytes >= c.reserved_bytes, "{c:?}");
            assert!(c.peak_in_use_bytes >= c.in_use_bytes, "{c:?}");
        }
        let snapshot = capture(std::slice::from_ref(manager), &CaptureSettings::default());
        assert_eq!(snapshot.devices.len(), DEVICES);
        snapshots += 1;
    }
    snapshots
}

/// What runs beside the allocating threads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Beside {
    Nothing,
    DriverFaults,
    /// Misses make room by lending their streams' busy pages: no room past a small cache
    /// budget, and the GPU held behind (no fence passes) for a random while, again and again;
    /// with the driver faults too, so that some old addresses are refused their unmap.
    LendingWhileTheGpuLags,
}

fn stress(beside: Beside) {
    let faults_on = matches!(
        beside,
        Beside::DriverFaults | Beside::LendingWhileTheGpuLags
    );
    let sim = sim();
    let faults = sim.faults();
    let mut config = MemoryConfig {
        shards: 2,
        // Upkeep runs from the maintaining thread (what the upkeep thread would do), so that
        // once the threads stop, the manager is quiet for the final check.
        cleanup_interval: None,
        release_idle_after: Some(Duration::from_millis(20)),
        ..MemoryConfig::default()
    };
    if beside == Beside::LendingWhileTheGpuLags {
        config.stream_ordered_reuse = Some(true);
        config.room_without_waiting_bytes = 0;
        config.max_cached_bytes = Some(16 * MIB);
    }
    let manager = MemoryManager::new(sim.clone(), config).expect("manager");
    let handed = Handed::default();
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let started = Instant::now();
    let (held, snapshots) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..ALLOCATING_THREADS)
            .map(|seed| {
                let (manager, handed, stop, done) = (&manager, &handed, &stop, &done);
                scope.spawn(move || allocate(manager, handed, seed + 1, stop, faults_on, done))
            })
            .collect();
        scope.spawn(|| maintain(&manager, &stop, 77));
        let observer = scope.spawn(|| observe(&manager, &stop));
        if faults_on {
            scope.spawn(|| {
                let mut rng = Rng(99);
                while !stop.load(Ordering::Relaxed) {
                    faults.fail_nth_alloc_from_now(1 + rng.below(20));
                    faults.set_fail_frees(rng.below(4) == 0);
                    faults.set_fail_mem_info(rng.below(4) == 0);
                    std::thread::sleep(Duration::from_millis(2));
                }
                faults.clear();
            });
        }
        if beside == Beside::LendingWhileTheGpuLags {
            scope.spawn(|| {
                let mut rng = Rng(7);
                while !stop.load(Ordering::Relaxed) {
                    sim.hold_fences(rng.below(3) > 0);
                    std::thread::sleep(Duration::from_micros(200 + rng.below(3000)));
                }
                sim.hold_fences(false);
            });
        }
        std::thread::sleep(RUN_FOR);
        stop.store(true, Ordering::Relaxed);
        let held: Vec<DeviceBuffer> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("an allocating thread panicked"))
            .collect();
        (held, observer.join().expect("the observer panicked"))
    });
    faults.clear();
    sim.hold_fences(false);
    let operations = done.load(Ordering::Relaxed);
    let lendings: u64 = (0..DEVICES)
        .map(|device| manager.stream_ordered_reuse(device).expect("device").1)
        .sum();
    eprintln!(
        "stress (faults {faults_on}): {operations} allocation rounds, {snapshots} snapshots and {lendings} lendings in {:.1?}",
        started.elapsed()
    );
    if beside == Beside::LendingWhileTheGpuLags {
        assert!(lendings > 0, "no miss lent: the run did not test lending");
        // Blocks freed into the pools that streams share wait, counted live, for fences the
        // GPU was holding: they come back at the next release of idle memory (none is this
        // old, so nothing is released).
        manager.release_idle_older_than(Duration::from_secs(3600));
    }
    assert!(
        operations > 1000 && snapshots > 10,
        "the threads made progress"
    );
    let state = State {
        manager: &manager,
        sim: &sim,
        held: &held,
        stranded: &[],
        others: &[0; DEVICES],
        mem_info_failing: false,
    };
    if let Err(broken) = check_state(&state) {
        panic!("after the stress run: {broken}");
    }
    drop(held);
    manager.empty_cache();
    for device in 0..DEVICES {
        let stats = manager.device_stats(device).expect("stats").counters;
        assert_eq!((stats.live_allocations, stats.in_use_bytes), (0, 0));
        assert_eq!(
            stats.reserved_bytes, 0,
            "device {device} got every byte back"
        );
        assert_eq!(sim.mem_info(device).expect("mem_info").used(), 0);
    }
}

#[test]
fn many_threads_allocate_free_trim_and_snapshot_at_once() {
    stress(Beside::Nothing);
}

#[test]
fn many_threads_under_driver_faults() {
    stress(Beside::DriverFaults);
}

#[test]
fn many_threads_lending_busy_pages_while_the_gpu_lags_under_driver_faults() {
    stress(Beside::LendingWhileTheGpuLags);
}
