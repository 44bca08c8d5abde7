//! Allocation latency, measured side by side in one process on one device: a gpumem pool hit,
//! a pool miss (kept pages mapped again, or with the reserve empty new pages created), the
//! driver's `cuMemAlloc`/`cuMemFree`, and on CUDA the driver's stream-ordered pool, caching or
//! trimmed after every free (its own miss) — each as a distribution (median and p99 per
//! alloc + free pair), on one thread or several at once, and for gpumem how much of that time
//! was spent inside driver calls. `gpumem bench` prints it.

use gpumem::backend::timed::{CallKind, CallTotals, TimedBackend};
use gpumem::backend::DeviceBackend;
use gpumem::manager::{AllocOptions, MemoryConfig, MemoryManager};
use serde::Serialize;
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// What is being timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Allocator {
    /// gpumem, memory already cached: no driver call.
    PoolHit,
    /// gpumem missing after a release, as a pool does when its cache budget is full: the freed
    /// pages are unmapped into the page reserve after every free, and the next allocation maps
    /// them again (`cuMemMap` + `cuMemSetAccess`, no `cuMemCreate`); the unmapping is timed too.
    PoolMiss,
    /// gpumem with its cache emptied after every free: pages created, mapped, unmapped and
    /// released each time (a miss with the page reserve empty).
    PoolMissCold,
    /// `cuMemAlloc` + `cuMemFree` (on sim: the simulator's bookkeeping).
    Driver,
    /// `cuMemAllocAsync` + `cuMemFreeAsync` on the device's default pool (CUDA only).
    DriverAsync,
    /// The same pool trimmed after every free (`cuMemPoolTrimTo` to zero, after the stream
    /// drains), so that each allocation grows it again: the driver pool's own miss, what
    /// `pool-miss-cold` is to gpumem (CUDA only).
    DriverAsyncMiss,
}

impl Allocator {
    /// Whether this is the driver's stream-ordered pool, which only the CUDA backend has.
    /// gpumem's pools, not one of the driver's allocators.
    pub(crate) fn is_gpumem(self) -> bool {
        matches!(
            self,
            Allocator::PoolHit | Allocator::PoolMiss | Allocator::PoolMissCold
        )
    }

    /// Whether each pair ends by giving its memory back (so that the next one misses again),
    /// timed apart from the miss.
    fn is_round_trip(self) -> bool {
        matches!(
            self,
            Allocator::PoolMiss | Allocator::PoolMissCold | Allocator::DriverAsyncMiss
        )
    }

    pub(crate) fn is_stream_ordered(self) -> bool {
        matches!(self, Allocator::DriverAsync | Allocator::DriverAsyncMiss)
    }
}

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct BenchResult {
    pub allocator: Allocator,
    pub backend: String,
    pub size_bytes: u64,
    pub threads: usize,
    pub operations: u64,
    /// Pairs timed together per sample: one for slow allocators, more where a pair takes less
    /// than a microsecond, so that the clock's own cost (30-45 ns a read on a busy host) does
    /// not swamp what is measured. Median and p99 are over these samples.
    pub pairs_per_sample: u32,
    /// Per alloc + free pair, with the clock's own cost taken off.
    pub median_ns: f64,
    pub p99_ns: f64,
    /// gpumem only: the time its timed pairs spent inside driver calls, per pair (all threads
    /// together; a call that waits for another thread's in the driver counts its wait). What
    /// is left of the median is the allocator's own work.
    pub driver_ns_per_pair: Option<f64>,
    /// gpumem only: that time by kind of call, for the kinds it made.
    pub driver_calls: Vec<DriverCallShare>,
    /// Round trips only (`pool-miss`, `pool-miss-cold`, `driver-async-miss`): the median of
    /// the miss itself (the allocation and its free, what the allocating thread pays)...
    pub miss_median_ns: Option<f64>,
    /// ...and of giving the memory back after it (gpumem: unmapping into the reserve or
    /// releasing to the driver, as the pools' upkeep does off the allocating thread; the
    /// driver pool: its trim). Each pair's two parts are timed apart, so the two medians need
    /// not add up to `median_ns`.
    pub give_back_median_ns: Option<f64>,
}

/// One kind of driver call in a [`BenchResult`].
#[derive(Clone, Debug, Serialize)]
pub(crate) struct DriverCallShare {
    pub call: &'static str,
    pub calls_per_pair: f64,
    pub ns_per_call: f64,
}

impl BenchResult {
    /// "map 45.6 µs + unmap 23.3 µs": where the driver time of one pair went, largest first,
    /// the kinds under a microsecond a pair left out.
    pub(crate) fn driver_breakdown(&self) -> String {
        let mut shares: Vec<(f64, &str)> = self
            .driver_calls
            .iter()
            .map(|s| (s.calls_per_pair * s.ns_per_call, s.call))
            .filter(|(ns, _)| *ns >= 1_000.0)
            .collect();
        shares.sort_by(|a, b| b.0.total_cmp(&a.0));
        let calls = shares
            .iter()
            .map(|(ns, call)| format!("{call} {:.1} µs", ns / 1_000.0))
            .collect::<Vec<_>>()
            .join(" + ");
        match (self.miss_median_ns, self.give_back_median_ns) {
            (Some(miss), Some(give_back)) => format!(
                "miss {:.1} µs, give-back {:.1} µs{}{calls}",
                miss / 1_000.0,
                give_back / 1_000.0,
                if calls.is_empty() { "" } else { "; " }
            ),
            _ => calls,
        }
    }
}

/// The two timed parts of a round trip: the miss (an allocation and its free) and what gives
/// the memory back after it.
#[derive(Clone, Copy, Debug, Default)]
struct RoundTrip {
    miss_ns: u32,
    give_back_ns: u32,
}

/// Per pair, from the driver calls `pairs` timed pairs made.
fn driver_shares(spent: &CallTotals, pairs: u64) -> (f64, Vec<DriverCallShare>) {
    let pairs = pairs.max(1) as f64;
    let shares = CallKind::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| spent.calls[*i] > 0)
        .map(|(i, kind)| DriverCallShare {
            call: kind.name(),
            calls_per_pair: spent.calls[i] as f64 / pairs,
            ns_per_call: spent.nanos[i] as f64 / spent.calls[i] as f64,
        })
        .collect();
    (spent.total_nanos() as f64 / pairs, shares)
}

/// The devices and allocators a run uses.
pub(crate) struct BenchTarget {
    pub backend: Arc<dyn DeviceBackend>,
    pub device: usize,
    /// The backend again, when it has the driver's stream-ordered pool (`DriverPool`).
    pub stream_ordered: Option<Arc<dyn DeviceBackend>>,
    /// The managers' configuration (`--config`); the device is set per run.
    pub config: MemoryConfig,
}

impl BenchTarget {
    pub(crate) fn new(backend: Arc<dyn DeviceBackend>, device: usize) -> Self {
        let stream_ordered = backend
            .driver_pool()
            .is_some_and(|pool| pool.prepare_stream_ordered_pool(device).is_ok())
            .then(|| Arc::clone(&backend));
        BenchTarget {
            backend,
            device,
            stream_ordered,
            config: MemoryConfig::default(),
        }
    }
}

/// Longest untimed run of pairs before the timed ones (a twentieth of the budget if shorter).
const WARM_UP: Duration = Duration::from_millis(100);

/// A sample should last about this long: long against the clock's cost, short against the
/// things a percentile should still see (a page mapped, a thread preempted).
const SAMPLE_TARGET_NS: u128 = 1_000;
/// Most pairs per sample.
const MAX_BATCH: u32 = 64;

/// How many pairs to time per sample, from the average of a few untimed ones.
fn pairs_per_sample(
    mut one_pair: impl FnMut() -> Result<(), String>,
    budget: Duration,
) -> Result<u32, String> {
    one_pair()?; // the first may map pages: not typical
    let probe_until = Instant::now() + (budget / 100).min(Duration::from_millis(20));
    let began = Instant::now();
    let mut pairs = 0u128;
    while pairs == 0 || Instant::now() < probe_until {
        one_pair()?;
        pairs += 1;
    }
    let average = (began.elapsed().as_nanos() / pairs).max(1);
    Ok((SAMPLE_TARGET_NS / average).clamp(1, MAX_BATCH as u128) as u32)
}

/// The cost of reading the clock twice, taken off every sample.
fn clock_overhead() -> f64 {
    let mut samples: Vec<u64> = (0..10_000)
        .map(|_| {
            let start = Instant::now();
            black_box(start.elapsed().as_nanos() as u64)
        })
        .collect();
    samples.sort_unstable();
    samples[samples.len() / 2] as f64
}

/// Times `allocator` at `size` on `threads` threads, each for at most `iterations` pairs or
/// `budget` of wall time, whichever comes first.
pub(crate) fn measure(
    target: &BenchTarget,
    allocator: Allocator,
    size: u64,
    threads: usize,
    iterations: u64,
    budget: Duration,
) -> Result<BenchResult, String> {
    let device = target.device;
    let config = target.config.clone().devices(vec![device]);
    // gpumem's pools reach the driver through a backend that times every call; the driver's
    // own allocators are all driver time, and are left untimed (timing adds ~50 ns a call).
    let timed = matches!(
        allocator,
        Allocator::PoolHit | Allocator::PoolMiss | Allocator::PoolMissCold
    )
    .then(|| Arc::new(TimedBackend::new(Arc::clone(&target.backend))));
    let backend: Arc<dyn DeviceBackend> = match &timed {
        Some(timed) => timed.clone(),
        None => Arc::clone(&target.backend),
    };
    let manager = MemoryManager::new(backend, config).map_err(|e| e.to_string())?;
    let async_pool = target.stream_ordered.clone();
    if allocator.is_stream_ordered() && async_pool.is_none() {
        return Err(
            "the driver's stream-ordered pool needs the CUDA backend and a driver with cuMemAllocAsync"
                .to_string(),
        );
    }
    let stream_pool = || {
        async_pool
            .as_deref()
            .and_then(|backend| backend.driver_pool())
            .ok_or("no stream-ordered pool")
    };
    // An allocation and its free: the whole pair, or a round trip's miss.
    let alloc_free = |m: &MemoryManager| -> Result<(), String> {
        match allocator {
            Allocator::PoolHit | Allocator::PoolMiss | Allocator::PoolMissCold => m
                .alloc(device, size, &AllocOptions::default())
                .map(drop)
                .map_err(|e| e.to_string()),
            Allocator::Driver => {
                let backend = m.backend();
                let ptr = backend.alloc(device, size).map_err(|e| e.to_string())?;
                backend.free(device, ptr).map_err(|e| e.to_string())
            }
            Allocator::DriverAsync | Allocator::DriverAsyncMiss => {
                let cuda = stream_pool()?;
                let ptr = cuda
                    .alloc_stream_ordered(device, size)
                    .map_err(|e| e.to_string())?;
                cuda.free_stream_ordered(device, ptr)
                    .map_err(|e| e.to_string())
            }
        }
    };
    // What a round trip does after its free, so that the next allocation misses again.
    let give_back = |m: &MemoryManager| -> Result<(), String> {
        match allocator {
            Allocator::PoolMiss => drop(m.unmap_cached()),
            Allocator::PoolMissCold => drop(m.empty_cache()),
            Allocator::DriverAsyncMiss => stream_pool()?
                .trim_stream_ordered_pool(device)
                .map_err(|e| e.to_string())?,
            _ => {}
        }
        Ok(())
    };
    let one_pair = |m: &MemoryManager| -> Result<(), String> {
        alloc_free(m)?;
        give_back(m)
    };
    let overhead = clock_overhead();
    let batch = pairs_per_sample(|| one_pair(&manager), budget)?;
    // A round trip's two parts are timed one pair at a time (each takes tens of microseconds
    // at least, so the clock's cost is lost in them).
    let batch = if allocator.is_round_trip() { 1 } else { batch };
    // Every thread warms up, then one takes the driver totals while the others wait, so that
    // only the timed pairs' calls count.
    let (warmed, start) = (Barrier::new(threads), Barrier::new(threads));
    let before_timed = std::sync::Mutex::new(CallTotals::default());
    type ThreadTimes = (Vec<u32>, Vec<RoundTrip>, u64);
    let per_thread: Vec<Result<ThreadTimes, String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (manager, warmed, start, one_pair) = (&manager, &warmed, &start, &one_pair);
                let (alloc_free, give_back) = (&alloc_free, &give_back);
                let (timed, before_timed) = (&timed, &before_timed);
                scope.spawn(move || -> Result<ThreadTimes, String> {
                    // Warm up: the first pair maps what later hits reuse; the rest bring the
                    // caches and the core's clock speed to where the timed pairs will run.
                    let warm_until = Instant::now() + (budget / 20).min(WARM_UP);
                    one_pair(manager)?;
                    while Instant::now() < warm_until {
                        one_pair(manager)?;
                    }
                    if warmed.wait().is_leader() {
                        if let (Some(timed), Ok(mut totals)) = (timed, before_timed.lock()) {
                            *totals = timed.totals();
                        }
                    }
                    start.wait();
                    let began = Instant::now();
                    let mut samples =
                        Vec::with_capacity(iterations.div_ceil(batch as u64).min(1 << 20) as usize);
                    let mut trips = Vec::new();
                    let mut pairs = 0u64;
                    while pairs < iterations && began.elapsed() < budget {
                        if allocator.is_round_trip() {
                            let t = Instant::now();
                            alloc_free(manager)?;
                            let missed = t.elapsed();
                            give_back(manager)?;
                            let trip = RoundTrip {
                                miss_ns: saturate_ns(missed),
                                give_back_ns: saturate_ns(t.elapsed() - missed),
                            };
                            samples.push(trip.miss_ns.saturating_add(trip.give_back_ns));
                            trips.push(trip);
                            pairs += 1;
                            continue;
                        }
                        let this_batch = (iterations - pairs).min(batch as u64);
                        let t = Instant::now();
                        for _ in 0..this_batch {
                            one_pair(manager)?;
                        }
                        let per_pair = t.elapsed() / this_batch as u32;
                        samples.push(saturate_ns(per_pair));
                        pairs += this_batch;
                    }
                    Ok((samples, trips, pairs))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("a benchmark thread panicked".to_string()))
            })
            .collect()
    });
    let (mut samples, mut trips, mut operations) = (Vec::new(), Vec::new(), 0);
    for result in per_thread {
        let (thread_samples, thread_trips, pairs) = result?;
        samples.extend(thread_samples);
        trips.extend(thread_trips);
        operations += pairs;
    }
    let (driver_ns_per_pair, driver_calls) = match &timed {
        Some(timed) => {
            let before = *before_timed
                .lock()
                .map_err(|_| "a benchmark thread panicked")?;
            let (per_pair, shares) = driver_shares(&timed.totals().since(&before), operations);
            (Some(per_pair), shares)
        }
        None => (None, Vec::new()),
    };
    let pick_from = |samples: &mut Vec<u32>, q: f64| {
        samples.sort_unstable();
        let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
        (samples.get(index).copied().unwrap_or(0) as f64 - overhead / batch as f64).max(0.0)
    };
    let part_median = |part: fn(&RoundTrip) -> u32| {
        let mut part_samples: Vec<u32> = trips.iter().map(part).collect();
        (!part_samples.is_empty()).then(|| pick_from(&mut part_samples, 0.5))
    };
    let (miss_median_ns, give_back_median_ns) = (
        part_median(|trip| trip.miss_ns),
        part_median(|trip| trip.give_back_ns),
    );
    let mut pick = |q: f64| pick_from(&mut samples, q);
    Ok(BenchResult {
        allocator,
        backend: target.backend.kind().to_string(),
        size_bytes: size,
        threads,
        operations,
        pairs_per_sample: batch,
        median_ns: pick(0.5),
        p99_ns: pick(0.99),
        driver_ns_per_pair,
        driver_calls,
        miss_median_ns,
        give_back_median_ns,
    })
}

/// Nanoseconds, at most `u32::MAX` (4.3 s, far past any allocation).
fn saturate_ns(elapsed: Duration) -> u32 {
    elapsed.as_nanos().min(u32::MAX as u128) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem::backend::sim::{SimBackend, SimConfig};

    #[test]
    fn measures_every_allocator_the_sim_has() {
        let target = BenchTarget::new(Arc::new(SimBackend::new(SimConfig::default())), 0);
        for allocator in [
            Allocator::PoolHit,
            Allocator::PoolMiss,
            Allocator::PoolMissCold,
            Allocator::Driver,
        ] {
            let result = measure(&target, allocator, 4096, 2, 200, Duration::from_secs(5)).unwrap();
            assert_eq!(result.operations, 400);
            assert!(result.median_ns <= result.p99_ns);
            let timed = allocator != Allocator::Driver;
            assert_eq!(result.driver_ns_per_pair.is_some(), timed, "{allocator:?}");
        }
        for allocator in [Allocator::DriverAsync, Allocator::DriverAsyncMiss] {
            let err = measure(&target, allocator, 4096, 1, 10, Duration::from_secs(1)).unwrap_err();
            assert!(err.contains("CUDA"), "{allocator:?}: {err}");
        }
    }

    #[test]
    fn a_pool_miss_says_how_much_of_it_the_driver_took() {
        let sim = SimBackend::new(SimConfig {
            driver_costs: gpumem::backend::sim::DriverCosts::H100,
            ..SimConfig::default()
        });
        let target = BenchTarget::new(Arc::new(sim), 0);
        let miss = measure(
            &target,
            Allocator::PoolMiss,
            1 << 20,
            1,
            40,
            Duration::from_secs(5),
        )
        .unwrap();
        // The simulated H100 charges 34.6 µs to map one kept chunk and 18 µs to unmap it.
        let in_driver = miss.driver_ns_per_pair.unwrap();
        assert!(
            (52_000.0..=miss.p99_ns).contains(&in_driver),
            "{in_driver} ns in the driver, p99 {} ns",
            miss.p99_ns
        );
        // Lower bounds only: the simulated driver spins for at least its costs, and a busy
        // host can only make a call take longer.
        let per_pair = |call: &str| {
            let share = miss.driver_calls.iter().find(|c| c.call == call);
            share.map_or(0.0, |c| c.calls_per_pair * c.ns_per_call)
        };
        assert!(per_pair("map") >= 34_000.0, "{:?}", miss.driver_calls);
        assert!(per_pair("unmap") >= 18_000.0, "{:?}", miss.driver_calls);
        // The round trip's two parts, timed apart: the map is the miss's, the unmap the
        // give-back's.
        let (Some(in_miss), Some(giving_back)) = (miss.miss_median_ns, miss.give_back_median_ns)
        else {
            panic!("a round trip without its parts: {miss:?}");
        };
        assert!(in_miss >= 34_000.0 && giving_back >= 18_000.0, "{miss:?}");
        let breakdown = miss.driver_breakdown();
        assert!(
            breakdown.contains("map ")
                && breakdown.contains(" + ")
                && breakdown.starts_with("miss "),
            "{breakdown}"
        );
        let hit = measure(
            &target,
            Allocator::PoolHit,
            1 << 20,
            1,
            400,
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(hit.driver_ns_per_pair, Some(0.0), "a hit calls no driver");
        assert_eq!((hit.miss_median_ns, hit.give_back_median_ns), (None, None));
    }
}
