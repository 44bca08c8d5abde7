//! Thousands of distinct stream values (a host that creates a stream per request, or passes a
//! new value each time): memory must follow what the streams hold, not how many there have been.
//! Every stream with pools of its own keeps at least a page (2 MiB) mapped for its few hundred
//! bytes, so those pools are few, and streams beyond them share.

use gpumem::backend::sim::{SimBackend, SimConfig};
use gpumem::units::MIB;
use gpumem::{AllocOptions, ManagerConfig, MemoryManager, StreamId};
use std::sync::Arc;

const STREAMS: u64 = 5_000;
/// What the tests allow the pools to hold for 5,000 small blocks: a few dozen pages, not 5,000.
const RESERVED_LIMIT: u64 = 128 * MIB;

fn manager() -> (Arc<SimBackend>, MemoryManager) {
    let sim = Arc::new(SimBackend::new(SimConfig::default()));
    let config = ManagerConfig {
        devices: Some(vec![0]),
        cleanup_interval: None,
        shards: 2,
        ..ManagerConfig::default()
    };
    let manager = MemoryManager::new(sim.clone(), config).expect("manager");
    (sim, manager)
}

fn on(stream: u64) -> AllocOptions {
    AllocOptions::default().on_stream(StreamId(0x7000_0000 + stream * 0x100))
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
        "{STREAMS} streams holding 512 bytes each: {} MiB in use, {} MiB reserved",
        in_use as f64 / MIB as f64,
        reserved / MIB
    );
    assert!(
        reserved <= RESERVED_LIMIT,
        "{STREAMS} streams of 512 bytes reserved {} MiB",
        reserved / MIB
    );
    drop(buffers);
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
}
