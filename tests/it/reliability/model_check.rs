//! Model check (loom) of the allocator's lock-free statistics: every interleaving and every
//! weak-memory outcome loom can produce, over the real `PoolCounters` and `DeviceReserve`
//! code (their atomics become loom's under `--cfg gpumem_loom`; see `crates/gpumem/src/pool/atomic.rs`).
//! The patterns checked: pool counters written only by the holder of the pool's lock with
//! plain relaxed load + store and read lock-free by snapshots; the device's reserved bytes
//! shared by all pools (`fetch_add`/`fetch_sub`), its peak (`fetch_max`), and a peak reset
//! racing both.
//!
//! loom 0.7 remembers one last access per atomic, so a thread's own load hides an earlier load
//! of another thread from its later store, and that interleaving is never tried. Writers
//! therefore run on the model's first thread (scheduled first), readers in spawned ones —
//! arranged so, loom explores ~1,200 executions of one `on_alloc` against one `read`. It found
//! the bug fixed here: a snapshot could show a peak below its value (read between a pool's
//! raise of the value and of its peak, or after a peak reset overwrote a concurrent raise);
//! the readers now report the peak as at least the value.
//!
//! Built only with the flag, so CI's `cargo test` skips it:
//! `RUSTFLAGS="--cfg gpumem_loom" CARGO_TARGET_DIR=target/loom cargo test --release --test it reliability::model_check`

#![cfg(gpumem_loom)]

use gpumem::pool::{CounterValues, DeviceReserve, PoolCounters};
use loom::sync::{Arc, Mutex};
use loom::thread;
use std::sync::atomic::Ordering::SeqCst;

/// Runs `test` under loom with at most 3 preemptions unless LOOM_MAX_PREEMPTIONS says
/// otherwise (3 is where loom's authors stop seeing new bugs; these models have 3 threads).
fn model(test: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(test);
}

/// Two pools growing at once: the peak is the exact sum, never one of the partial values.
#[test]
fn concurrent_grows_record_the_exact_peak() {
    model(|| {
        let reserve = Arc::new(DeviceReserve::default());
        let other = Arc::clone(&reserve);
        let grower = thread::spawn(move || other.grow(3));
        reserve.grow(5);
        grower.join().expect("join");
        assert_eq!(reserve.reserved_bytes.load(SeqCst), 8);
        assert_eq!(reserve.peak_reserved_bytes.load(SeqCst), 8);
    });
}

fn check_reserve_after_reset(reserve: &DeviceReserve) {
    let (reserved, peak) = reserve.read();
    assert_eq!(reserved, 5);
    assert!(peak >= reserved, "peak {peak} below reserved {reserved}");
    assert!(peak <= 6, "peak {peak} above anything ever reserved");
}

/// `reset_peaks` (a replay starting, a user resetting) while pools grow and shrink: the peak
/// as read is never below what is reserved, nor above what ever was — while it happens (a
/// reader thread) and after. Run both ways round (resetting thread first, growing first).
/// Reading the stored peak instead fails: a reset can overwrite a concurrent grow's raise.
#[test]
fn a_peak_reset_racing_a_grow_never_leaves_the_peak_below_the_value() {
    model(|| {
        let reserve = Arc::new(DeviceReserve::default());
        let (first, second) = (Arc::clone(&reserve), Arc::clone(&reserve));
        let a = thread::spawn(move || {
            first.grow(2);
            first.shrink(1);
        });
        let b = thread::spawn(move || second.grow(4));
        reserve.reset_peak();
        a.join().expect("join");
        b.join().expect("join");
        check_reserve_after_reset(&reserve);
    });
    model(|| {
        let reserve = Arc::new(DeviceReserve::default());
        let (resetter, reader) = (Arc::clone(&reserve), Arc::clone(&reserve));
        let reset = thread::spawn(move || resetter.reset_peak());
        let read = thread::spawn(move || {
            let (reserved, peak) = reader.read();
            assert!(
                peak >= reserved && peak <= 6,
                "read {reserved} with peak {peak}"
            );
        });
        reserve.grow(2);
        reserve.shrink(1);
        reserve.grow(4);
        reset.join().expect("join");
        read.join().expect("join");
        check_reserve_after_reset(&reserve);
    });
}

/// What any snapshot of the counters below may show: peaks at least their values, and
/// nothing beyond what the two writers ever did.
fn check_snapshot(seen: &CounterValues) {
    assert!(seen.peak_in_use_bytes >= seen.in_use_bytes, "{seen:?}");
    assert!(
        seen.peak_requested_bytes >= seen.requested_bytes,
        "{seen:?}"
    );
    assert!(seen.peak_reserved_bytes >= seen.reserved_bytes, "{seen:?}");
    assert!(seen.allocations <= 2 && seen.frees <= 1, "{seen:?}");
    assert!(seen.hits <= 1 && seen.requests <= 2, "{seen:?}");
    assert!(
        seen.in_use_bytes <= 1536 && seen.requested_bytes <= 107,
        "{seen:?}"
    );
    assert!(
        seen.peak_in_use_bytes <= 1536 && seen.reserved_bytes <= 2048,
        "{seen:?}"
    );
}

/// Two threads allocate and free on one pool, taking turns on its lock (as the arena's mutex
/// makes them): plain load + store under the lock loses no update.
#[test]
fn owner_written_counters_lose_no_update() {
    model(|| {
        let counters = Arc::new(PoolCounters::default());
        let lock = Arc::new(Mutex::new(()));
        let (c2, l2) = (Arc::clone(&counters), Arc::clone(&lock));
        let second = thread::spawn(move || {
            let _pool = l2.lock().expect("lock");
            c2.on_alloc(7, 1024, true);
        });
        {
            let _pool = lock.lock().expect("lock");
            counters.on_alloc(100, 512, false);
        }
        {
            let _pool = lock.lock().expect("lock");
            counters.on_free(100, 512);
        }
        second.join().expect("join");
        let done = counters.read();
        check_snapshot(&done);
        assert_eq!(
            (
                done.allocations,
                done.frees,
                done.live_allocations,
                done.hits
            ),
            (2, 1, 1, 1)
        );
        assert_eq!((done.requested_bytes, done.in_use_bytes), (7, 1024));
        assert!(
            done.peak_in_use_bytes == 1024 || done.peak_in_use_bytes == 1536,
            "{done:?}"
        );
    });
}

/// A snapshot read with no lock while the owner allocates: every interleaving of the two
/// shows peaks at least their values.
#[test]
fn a_snapshot_during_an_allocation_is_consistent() {
    model(|| {
        let counters = Arc::new(PoolCounters::default());
        let reader_counters = Arc::clone(&counters);
        let reader = thread::spawn(move || check_snapshot(&reader_counters.read()));
        counters.on_alloc(100, 512, false);
        reader.join().expect("join");
    });
}

/// The same while the owner frees, then gives pages back to the driver.
#[test]
fn a_snapshot_during_a_free_and_release_is_consistent() {
    model(|| {
        let counters = Arc::new(PoolCounters::default());
        counters.on_reserve(2048, 1);
        counters.on_alloc(100, 512, false);
        let reader_counters = Arc::clone(&counters);
        let reader = thread::spawn(move || {
            let seen = reader_counters.read();
            check_snapshot(&seen);
            assert!(seen.frees <= seen.allocations, "{seen:?}");
        });
        counters.on_free(100, 512);
        counters.on_release(2048, 1);
        reader.join().expect("join");
    });
}
