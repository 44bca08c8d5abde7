//! CUDA graph pools: memory a graph captured stays mapped and out of every other allocation's
//! reach until the pool is released, and nothing done for a capture waits on a capturing
//! stream (which would break the capture on CUDA).

use crate::support::{all_backends, sim_backend, tight_manager};
use gpumem::backend::StreamOrder;
use gpumem::units::MIB;
use gpumem::{AllocOptions, DeviceBackend, GraphPoolId, StreamId};
use std::sync::Arc;

const POOL: GraphPoolId = GraphPoolId(7);

fn in_graph() -> AllocOptions {
    AllocOptions::default().in_graph_pool(POOL)
}

#[test]
fn a_graph_pool_keeps_freed_memory_from_other_allocations_until_released() {
    for backend in all_backends() {
        let m = tight_manager(backend, 0);
        let graph_block = m.alloc(0, 3 * MIB, &in_graph()).unwrap();
        let graph_ptr = graph_block.ptr();
        drop(graph_block);

        // An ordinary request of the same size gets other memory: the graph replays into
        // `graph_ptr` whether or not its tensor is still alive.
        let ordinary = m.alloc(0, 3 * MIB, &AllocOptions::default()).unwrap();
        assert_ne!(ordinary.ptr(), graph_ptr);
        drop(ordinary);

        // Emptying the cache leaves the graph's pages mapped (and counted).
        m.empty_cache();
        let pools = m.graph_pools(0).unwrap();
        assert_eq!(pools.len(), 1);
        assert!(pools[0].pinned);
        assert_eq!(pools[0].in_use_bytes, 0);
        assert_eq!(
            pools[0].mapped_bytes,
            4 * MIB,
            "two 2 MiB pages stay mapped"
        );
        assert_eq!(m.reserved_bytes(), 4 * MIB);

        // The next capture into the same pool reuses the block at once.
        let again = m.alloc(0, 3 * MIB, &in_graph()).unwrap();
        assert_eq!(again.ptr(), graph_ptr);
        drop(again);

        // Released, its pages are ordinary cache: unmapped now, back to the driver on empty.
        assert_eq!(m.release_graph_pool(0, POOL).unwrap(), 4 * MIB);
        assert!(!m.graph_pools(0).unwrap()[0].pinned);
        m.empty_cache();
        assert_eq!(m.reserved_bytes(), 0);
        assert_eq!(
            m.release_graph_pool(0, GraphPoolId(99)).unwrap(),
            0,
            "unknown pool"
        );
    }
}

#[test]
fn a_released_pool_captured_into_again_is_held_again() {
    let m = tight_manager(sim_backend(), 0);
    drop(m.alloc(0, 3 * MIB, &in_graph()).unwrap());
    assert_eq!(m.release_graph_pool(0, POOL).unwrap(), 4 * MIB);
    // A new graph captured into the same pool: its freed block must survive emptying.
    drop(m.alloc(0, 3 * MIB, &in_graph()).unwrap());
    m.empty_cache();
    let pools = m.graph_pools(0).unwrap();
    assert!(pools[0].pinned);
    assert_eq!(pools[0].mapped_bytes, 4 * MIB);
}

#[test]
fn a_buffer_still_live_when_its_pool_is_released_is_freed_as_ordinary_memory() {
    let m = tight_manager(sim_backend(), 0);
    let output = m.alloc(0, 5 * MIB, &in_graph()).unwrap();
    assert_eq!(
        m.release_graph_pool(0, POOL).unwrap(),
        0,
        "nothing idle yet"
    );
    assert_eq!(m.device_stats(0).unwrap().counters.in_use_bytes, 5 * MIB);
    drop(output);
    m.empty_cache();
    assert_eq!(m.reserved_bytes(), 0);
}

#[test]
fn a_graphs_free_space_is_not_reported_as_cache() {
    // Cached free bytes and fragmentation describe memory other requests could use: a graph's
    // free blocks are its replays' memory, so they stay out (while its pages stay reserved).
    let m = tight_manager(sim_backend(), 0);
    let graph_block = m.alloc(0, 3 * MIB, &in_graph()).unwrap();
    let output = m.alloc(0, 5 * MIB, &in_graph()).unwrap();
    drop(graph_block);
    let large = m
        .pool_views()
        .into_iter()
        .find(|view| view.pool.name() == "large")
        .unwrap();
    assert_eq!(large.counters.reserved_bytes, 8 * MIB);
    assert_eq!(large.counters.in_use_bytes, 5 * MIB);
    assert_eq!(large.cached_free_bytes, 0);
    assert_eq!(large.fragmentation_ratio, 0.0);
    drop(output);
}

#[test]
fn graph_pages_count_as_in_use_in_the_cache_budget() {
    // With no idle pages allowed, an ordinary miss must make room from idle pages: a graph
    // pool's free pages are not idle, so they are not what it takes.
    let m = tight_manager(sim_backend(), 0);
    let graph_block = m.alloc(0, 6 * MIB, &in_graph()).unwrap();
    drop(graph_block);
    let ordinary = m.alloc(0, 6 * MIB, &AllocOptions::default()).unwrap();
    drop(ordinary);
    let stats = m.device_stats(0).unwrap();
    assert_eq!(stats.pages_reused, 0, "no graph page was moved");
    assert_eq!(m.graph_pools(0).unwrap()[0].mapped_bytes, 6 * MIB);
}

#[test]
fn nothing_waits_on_a_capturing_stream() {
    let sim = sim_backend();
    let m = tight_manager(Arc::clone(&sim) as Arc<dyn DeviceBackend>, 0);
    let capturing = StreamId(0x5000);
    // Cached pages of the stream's ordinary pool, from before the capture.
    let before = m
        .alloc(0, 4 * MIB, &AllocOptions::default().on_stream(capturing))
        .unwrap();
    drop(before);
    let capture = sim.begin_capture(0, capturing).unwrap();
    assert_eq!(sim.capture_of(0, capturing).unwrap(), Some(capture));

    // The capture's own allocations and frees, misses included.
    let during = AllocOptions::default()
        .on_stream(capturing)
        .in_graph_pool(POOL);
    for size in [MIB, 9 * MIB, 3 * MIB] {
        drop(m.alloc(0, size, &during).unwrap());
    }
    assert_eq!(
        sim.refused_syncs(),
        0,
        "a graph pool never waits for a stream"
    );

    // Emptying the cache mid-capture skips the capturing stream's pages instead of waiting.
    m.empty_cache();
    assert!(sim.refused_syncs() > 0);
    sim.end_capture(0, capturing).unwrap();
    m.empty_cache();
    assert_eq!(
        m.reserved_bytes(),
        m.graph_pools(0).unwrap()[0].mapped_bytes,
        "after the capture only the graph's pages are held"
    );
}
