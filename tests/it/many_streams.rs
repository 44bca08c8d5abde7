//! Thousands of distinct stream values (a host that creates a stream per request, or passes a
//! new value each time): memory must follow what the streams hold, not how many there have been.
//! A stream with pools of its own keeps at least a page (2 MiB) mapped for its few hundred bytes,
//! so such streams are few ([`MAX_STREAMS_WITH_OWN_POOLS`]); the rest share pools in which a
//! block freed on one stream reaches another only after a fence on the first has passed.

use gpumem::backend::sim::{SimBackend, SimConfig};
use gpumem::manager::MAX_STREAMS_WITH_OWN_POOLS;
use gpumem::units::MIB;
use gpumem::{AllocOptions, DeviceBuffer, ManagerConfig, MemoryManager, StreamId};
use std::sync::Arc;
use std::time::Duration;

const STREAMS: u64 = 5_000;
/// What the tests allow the pools to hold for 5,000 small blocks: a few dozen pages, not 5,000.
const RESERVED_LIMIT: u64 = 128 * MIB;

/// Two shards, no upkeep thread (the tests run `maintain` themselves), and unused streams'
/// pools dropped at the first round that finds them unused.
fn manager() -> (Arc<SimBackend>, MemoryManager) {
    let sim = Arc::new(SimBackend::new(SimConfig::default()));
    let config = ManagerConfig {
        devices: Some(vec![0]),
        cleanup_interval: None,
        release_idle_after: Some(Duration::ZERO),
        shards: 2,
        ..ManagerConfig::default()
    };
    let manager = MemoryManager::new(sim.clone(), config).expect("manager");
    (sim, manager)
}

fn on(stream: u64) -> AllocOptions {
    AllocOptions::default().on_stream(StreamId(0x7000_0000 + stream * 0x100))
}

fn own_pools(m: &MemoryManager) -> usize {
    m.streams_with_own_pools(0).expect("device 0")
}

fn live(m: &MemoryManager) -> u64 {
    m.device_stats(0).expect("stats").counters.live_allocations
}

/// Takes every place for a stream's own pools, each stream holding a block: the streams after
/// these share.
fn take_every_place(m: &MemoryManager) -> Vec<DeviceBuffer> {
    (0..MAX_STREAMS_WITH_OWN_POOLS as u64)
        .map(|s| m.alloc(0, 4096, &on(s)).expect("a block"))
        .collect()
}

/// Two rounds of upkeep: the first notes what each stream has done, the second finds the
/// streams unused since.
fn upkeep(m: &MemoryManager) {
    m.maintain();
    m.maintain();
}

#[test]
fn thousands_of_streams_each_holding_a_small_block_share_pages() {
    let (_sim, m) = manager();
    let buffers: Vec<_> = (0..STREAMS)
        .map(|s| m.alloc(0, 512, &on(s)).expect("a small block"))
        .collect();
    let reserved = m.reserved_bytes();
    let in_use = m.device_stats(0).expect("stats").counters.in_use_bytes;
    eprintln!(
        "{STREAMS} streams holding 512 bytes each: {:.2} MiB in use, {} MiB reserved, {} streams \
         with pools of their own",
        in_use as f64 / MIB as f64,
        reserved / MIB,
        own_pools(&m)
    );
    assert!(
        reserved <= RESERVED_LIMIT,
        "{STREAMS} streams of 512 bytes reserved {} MiB",
        reserved / MIB
    );
    assert_eq!(own_pools(&m), MAX_STREAMS_WITH_OWN_POOLS);
    drop(buffers);
    upkeep(&m);
    assert_eq!(own_pools(&m), 0, "streams unused since give their pools up");
    m.empty_cache();
    assert_eq!(m.reserved_bytes(), 0, "everything goes back");
}

#[test]
fn streams_used_once_each_leave_no_pages_behind() {
    let (_sim, m) = manager();
    for s in 0..STREAMS {
        let buffer = m.alloc(0, 300, &on(s)).expect("a small block");
        drop(buffer);
    }
    let reserved = m.reserved_bytes();
    eprintln!(
        "{STREAMS} streams each allocating and freeing 300 bytes: {} MiB reserved",
        reserved / MIB
    );
    assert!(
        reserved <= RESERVED_LIMIT,
        "{STREAMS} streams used once reserved {} MiB",
        reserved / MIB
    );
    upkeep(&m);
    assert_eq!(own_pools(&m), 0);
    assert_eq!(
        m.reserved_bytes(),
        0,
        "upkeep returned the unused streams' pages"
    );
    // New streams get pools of their own again.
    let again = m.alloc(0, 300, &on(STREAMS)).expect("a small block");
    assert_eq!(own_pools(&m), 1);
    drop(again);
}

#[test]
fn a_stream_in_use_keeps_its_pools() {
    let (_sim, m) = manager();
    let held = m.alloc(0, 4096, &on(1)).expect("a block");
    upkeep(&m);
    assert_eq!(own_pools(&m), 1, "a live block keeps its stream's pools");
    drop(held);
    m.maintain();
    let _busy = m.alloc(0, 4096, &on(1)).expect("a block");
    m.maintain();
    assert_eq!(own_pools(&m), 1, "used since the last round");
}

#[test]
fn a_block_freed_on_a_sharing_stream_reaches_another_only_after_its_fence() {
    let (sim, m) = manager();
    let _holders = take_every_place(&m);
    let (a, b) = (on(1000), on(1001));
    let first = m.alloc(0, 4096, &a).expect("a block on a sharing stream");
    let freed = first.ptr();
    sim.hold_fences(true); // the GPU lags: stream a's work at the free has not run
    let live_before = live(&m);
    drop(first);
    assert_eq!(live(&m), live_before, "its memory waits for stream a");
    let on_b: Vec<_> = (0..64)
        .map(|_| m.alloc(0, 4096, &b).expect("a block on stream b"))
        .collect();
    assert!(
        on_b.iter().all(|buffer| buffer.ptr() != freed),
        "stream b was handed memory stream a may still use"
    );
    sim.hold_fences(false);
    drop(on_b); // each free looks at what waits: the fence has passed
    assert_eq!(live(&m), live_before - 1, "back once stream a is past it");
    assert_eq!(own_pools(&m), MAX_STREAMS_WITH_OWN_POOLS);
}

#[test]
fn a_block_freed_on_a_capturing_sharing_stream_waits_for_the_capture_to_end() {
    let (sim, m) = manager();
    let _holders = take_every_place(&m);
    let capturing = on(2000);
    let block = m.alloc(0, 4096, &capturing).expect("a block");
    let live_before = live(&m);
    // No fence can be recorded on a capturing stream: its memory waits until the stream is idle.
    sim.begin_capture(0, capturing.stream).expect("capture");
    drop(block);
    m.alloc(0, 4096, &on(2001))
        .map(drop)
        .expect("another stream");
    assert_eq!(live(&m), live_before, "waits while the stream captures");
    sim.end_capture(0, capturing.stream).expect("capture ends");
    m.alloc(0, 4096, &on(2001))
        .map(drop)
        .expect("another stream");
    assert_eq!(live(&m), live_before - 1, "back once the stream is idle");
}
