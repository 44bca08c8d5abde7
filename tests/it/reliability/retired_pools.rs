//! A retired pool (a stream's pools retired at upkeep, or every pool when its manager goes)
//! whose pages the driver will not unmap keeps them, counted, and gives them back on a later
//! try — before, it dropped its arena and the pages stayed mapped with no pool counting them
//! (the stress test under driver faults saw the device hold up to 38 MiB more than the pools).

use gpumem::backend::sim::{SimBackend, SimConfig};
use gpumem::pool::{
    ChunkSizes, DeviceReserve, LiveInfo, MapDecision, PageReserve, Pool, PoolSettings,
};
use gpumem::units::{KIB, MIB};
use gpumem::{DeviceBackend, StreamId};
use std::sync::Arc;

#[test]
fn a_retired_pool_keeps_the_pages_the_driver_would_not_unmap_until_it_can() {
    let sim = Arc::new(SimBackend::new(SimConfig::default()));
    let backend: Arc<dyn DeviceBackend> = sim.clone();
    let held = Arc::new(DeviceReserve::new(1));
    let chunks = ChunkSizes::new(6 * MIB, 16 * MIB);
    let reserve = Arc::new(PageReserve::new(backend, 0, held, chunks).unwrap());
    let settings = PoolSettings {
        small_max: 64 * KIB,
        span: 1 << 32,
        place_on_mapped_pages: false,
    };
    let pool = Pool::new(reserve, StreamId(1), settings);
    let kind = pool.kind_for(4 * MIB);
    let live = LiveInfo {
        id: 1,
        requested: 4 * MIB,
        created_ticks: 0,
        tag: 0,
    };
    let placed = pool
        .alloc(kind, 4 * MIB, 512, &live, |_| MapDecision::Allow)
        .unwrap();
    let used = || sim.mem_info(0).unwrap().used();
    let reserved = || pool.slot(kind).counters.read().reserved_bytes;
    assert_eq!((used(), reserved()), (4 * MIB, 4 * MIB));

    // Retired with a block live: it winds down at that block's free, which the driver refuses.
    pool.retire();
    sim.faults().set_fail_frees(true);
    pool.free(kind, placed.block());
    assert!(!pool.is_wound_down(), "the pool still holds mapped pages");
    assert_eq!(
        (used(), reserved()),
        (4 * MIB, 4 * MIB),
        "the pages the driver kept are still the pool's, and counted"
    );

    // The next try (upkeep's) gives them back.
    sim.faults().clear();
    pool.wind_down();
    assert!(pool.is_wound_down());
    assert_eq!(reserved(), 0);
    drop(pool);
    assert_eq!(used(), 0, "the device got every page back");
}
