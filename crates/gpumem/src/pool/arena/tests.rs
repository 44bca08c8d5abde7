//! Tests of `arena`.

use super::*;
use crate::backend::sim::{SimBackend, SimConfig};
use crate::pool::DeviceReserve;
use crate::units::MIB;
use std::sync::Arc;

fn setup() -> (PageReserve, Arena) {
    let backend = Arc::new(SimBackend::new(SimConfig::default()));
    let arena = Arena::new(&*backend, 0, StreamId::DEFAULT, 64 * MIB).unwrap();
    let reserve = PageReserve::new(
        backend,
        0,
        Arc::new(DeviceReserve::default()),
        crate::pool::ChunkSizes::new(64 * MIB, 0),
    )
    .unwrap();
    (reserve, arena)
}

fn live(id: u64) -> LiveInfo {
    LiveInfo {
        id,
        requested: 4096,
        ..LiveInfo::default()
    }
}

fn alloc(backend: &PageReserve, arena: &mut Arena, size: u64, id: u64) -> Placed {
    arena
        .alloc(backend, size, 256, &live(id), |_, _| MapDecision::Allow)
        .unwrap()
}

#[test]
fn a_parked_block_is_reused_by_the_same_size_and_is_not_live_meanwhile() {
    let (backend, mut arena) = setup();
    let first = alloc(&backend, &mut arena, 4096, 1);
    arena.free(first.block);
    assert_eq!(arena.live_block_count(), 0);
    assert_eq!(arena.live_blocks().count(), 0);
    let again = alloc(&backend, &mut arena, 4096, 2);
    assert_eq!((again.ptr, again.map_calls), (first.ptr, 0));
    let live: Vec<_> = arena.live_blocks().collect();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].2.id, 2, "the new owner is recorded");
    arena.free(again.block);
    arena.destroy(&backend).unwrap();
}

#[test]
fn another_size_merges_the_parked_block_back_first() {
    let (backend, mut arena) = setup();
    let small = alloc(&backend, &mut arena, 4096, 1);
    arena.free(small.block);
    // Placement is what it would be without parking: the freed space is whole again.
    let larger = alloc(&backend, &mut arena, 8192, 2);
    assert_eq!(larger.ptr, small.ptr);
    arena.free(larger.block);
    assert_eq!(arena.largest_cached_free_block(), 2 * MIB);
    arena.destroy(&backend).unwrap();
}

#[test]
fn a_parked_block_keeps_its_pages_live_until_its_free_completes() {
    let (backend, mut arena) = setup();
    let big = alloc(&backend, &mut arena, 6 * MIB, 1);
    arena.free(big.block);
    assert_eq!((arena.mapped_pages(), arena.idle_pages()), (3, 0));
    let again = alloc(&backend, &mut arena, 6 * MIB, 2);
    assert_eq!((again.ptr, again.map_calls), (big.ptr, 0));
    arena.free(again.block);
    arena.unpark();
    assert_eq!(arena.idle_pages(), 3, "the completed free idles its pages");
    arena.destroy(&backend).unwrap();
}

#[test]
fn releasing_pages_never_leaves_a_parked_block_on_unmapped_memory() {
    let (backend, mut arena) = setup();
    let first = alloc(&backend, &mut arena, 4096, 1);
    arena.free(first.block);
    let released = arena
        .release_idle(&backend, |_, _| true, BusyStreams::Wait)
        .unwrap();
    assert_eq!((released.bytes, arena.mapped_pages()), (2 * MIB, 0));
    let again = alloc(&backend, &mut arena, 4096, 2);
    assert_eq!(again.map_calls, 1, "the page is mapped again, not assumed");
    assert_eq!(
        backend
            .pages_reused
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        backend
            .pages_created
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    arena.free(again.block);
    arena.destroy(&backend).unwrap();
}
