//! Tests of `arena`.

use super::*;
use crate::backend::sim::{SimBackend, SimConfig};
use crate::pool::{BusyStreams, Cut, DeviceReserve};
use crate::units::MIB;
use std::sync::Arc;

fn setup() -> (PageReserve, Arena) {
    setup_with(64 * MIB, crate::pool::ChunkSizes::new(64 * MIB, 0))
}

/// An arena over `span` bytes of a simulated device, whose misses cut pages as `chunks` says.
fn setup_with(span: u64, chunks: crate::pool::ChunkSizes) -> (PageReserve, Arena) {
    let backend = Arc::new(SimBackend::new(SimConfig::default()));
    let arena = Arena::new(&*backend, 0, StreamId::DEFAULT, span).unwrap();
    let reserve = PageReserve::new(backend, 0, Arc::new(DeviceReserve::default()), chunks).unwrap();
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
    alloc_in(backend, arena, size, id, true)
}

/// [`alloc`] in a pool whose idle pages may (or, a graph's, may not) be unmapped.
fn alloc_in(
    backend: &PageReserve,
    arena: &mut Arena,
    size: u64,
    id: u64,
    may_unmap: bool,
) -> Placed {
    arena
        .alloc(backend, size, 256, &live(id), may_unmap, |_, _| {
            MapDecision::Allow
        })
        .unwrap()
}

#[test]
fn a_parked_block_is_reused_by_the_same_size_and_is_not_live_meanwhile() {
    let (backend, mut arena) = setup();
    let first = alloc(&backend, &mut arena, 4096, 1);
    arena.free(first.block());
    assert_eq!(arena.live_block_count(), 0);
    assert_eq!(arena.live_blocks().count(), 0);
    let again = alloc(&backend, &mut arena, 4096, 2);
    assert_eq!((again.ptr, again.map_calls), (first.ptr, 0));
    let live: Vec<_> = arena.live_blocks().collect();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].2.id, 2, "the new owner is recorded");
    arena.free(again.block());
    arena.destroy(&backend).unwrap();
}

#[test]
fn another_size_merges_the_parked_block_back_first() {
    let (backend, mut arena) = setup();
    let small = alloc(&backend, &mut arena, 4096, 1);
    arena.free(small.block());
    // Placement is what it would be without parking: the freed space is whole again.
    let larger = alloc(&backend, &mut arena, 8192, 2);
    assert_eq!(larger.ptr, small.ptr);
    arena.free(larger.block());
    assert_eq!(arena.largest_cached_free_block(), 2 * MIB);
    arena.destroy(&backend).unwrap();
}

#[test]
fn a_parked_block_keeps_its_pages_live_until_its_free_completes() {
    let (backend, mut arena) = setup();
    let big = alloc(&backend, &mut arena, 6 * MIB, 1);
    arena.free(big.block());
    assert_eq!((arena.mapped_pages(), arena.idle_pages()), (3, 0));
    let again = alloc(&backend, &mut arena, 6 * MIB, 2);
    assert_eq!((again.ptr, again.map_calls), (big.ptr, 0));
    arena.free(again.block());
    arena.unpark();
    assert_eq!(arena.idle_pages(), 3, "the completed free idles its pages");
    arena.destroy(&backend).unwrap();
}

#[test]
fn releasing_pages_never_leaves_a_parked_block_on_unmapped_memory() {
    let (backend, mut arena) = setup();
    let first = alloc(&backend, &mut arena, 4096, 1);
    arena.free(first.block());
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
    arena.free(again.block());
    arena.destroy(&backend).unwrap();
}

/// An arena over 256 MiB whose misses map 2 MiB chunks, and 8 MiB chunks inside runs of 18
/// pages or more: small enough to lay out by hand which chunks a block would pin.
fn setup_with_inside_chunks() -> (PageReserve, Arena) {
    setup_with(256 * MIB, crate::pool::ChunkSizes::new(2 * MIB, 8 * MIB))
}

/// Leaves one wholly idle inside chunk, pages 13..17, with nothing mapped before it; then places
/// a block on pages 0..=13, which needs 13 pages mapped and touches one page of that chunk.
/// `grow_first` first maps 30 more pages elsewhere, so that the block's pages take the arena past
/// the most it has had mapped; `may_unmap` is false in a graph's pool. Returns (mapped, idle)
/// pages after the block is placed.
fn place_on_a_corner_of_an_idle_inside_chunk(grow_first: bool, may_unmap: bool) -> (usize, usize) {
    let (reserve, mut arena) = setup_with_inside_chunks();
    // Pages 0..18 as chunks of 1, 4, 4, 4, 4 and 1 pages; a live page after them.
    let long = alloc(&reserve, &mut arena, 36 * MIB, 1);
    assert_eq!(long.map_calls, 1);
    let _after = alloc(&reserve, &mut arena, MIB, 2);
    arena.free(long.block());
    let keep = |chunk: PageRun| chunk.first == 13;
    arena
        .release_pages(&reserve, |_, _| true, keep, BusyStreams::Wait)
        .unwrap();
    assert_eq!((arena.mapped_pages(), arena.idle_pages()), (5, 4));
    if grow_first {
        let _far = alloc(&reserve, &mut arena, 60 * MIB, 3);
        assert_eq!(arena.mapped_pages(), 35);
    }
    let block = alloc_in(&reserve, &mut arena, 26 * MIB + 512, 4, may_unmap);
    assert_eq!(block.ptr, arena.base, "the block starts at page 0");
    (arena.mapped_pages(), arena.idle_pages())
}

#[test]
fn a_block_setting_a_new_high_gives_back_the_idle_inside_chunk_it_would_pin() {
    // 35 mapped, less the chunk's 4, plus the block's 14 pages: nothing idle.
    assert_eq!(
        place_on_a_corner_of_an_idle_inside_chunk(true, true),
        (45, 0)
    );
}

#[test]
fn a_graph_pool_keeps_the_chunk_even_at_a_new_high() {
    // A captured graph may still use the chunk's addresses: nothing is unmapped.
    assert_eq!(
        place_on_a_corner_of_an_idle_inside_chunk(true, false),
        (48, 3)
    );
}

#[test]
fn below_the_arena_s_high_a_block_keeps_the_chunk_it_lands_on() {
    // 18 pages as before: the chunk's other three pages stay mapped, idle, ready for reuse.
    assert_eq!(
        place_on_a_corner_of_an_idle_inside_chunk(false, true),
        (18, 3)
    );
}

/// An arena over 256 MiB whose misses map 2 MiB chunks, and cut a growing block's pages whole.
fn setup_cutting_whole_when_growing() -> (PageReserve, Arena) {
    let chunks = crate::pool::ChunkSizes::new(2 * MIB, 8 * MIB).whole_when_growing(true);
    setup_with(256 * MIB, chunks)
}

/// Frees every idle page; returns how many chunks went (the driver unmaps one per call).
fn release_all_idle(reserve: &PageReserve, arena: &mut Arena) -> u64 {
    let released = arena.release_idle(reserve, |_, _| true, BusyStreams::Wait);
    released.unwrap().calls
}

#[test]
fn a_growing_block_is_mapped_as_one_chunk_only_when_asked() {
    for (whole, chunks) in [(true, 1), (false, 8)] {
        let chunk_sizes = crate::pool::ChunkSizes::new(2 * MIB, 8 * MIB).whole_when_growing(whole);
        let (reserve, mut arena) = setup_with(256 * MIB, chunk_sizes);
        let block = alloc(&reserve, &mut arena, 16 * MIB, 1);
        arena.free(block.block());
        assert_eq!(
            release_all_idle(&reserve, &mut arena),
            chunks,
            "whole: {whole}"
        );
    }
}

#[test]
fn a_growing_block_keeps_the_end_page_it_may_share_in_a_chunk_of_its_own() {
    let (reserve, mut arena) = setup_cutting_whole_when_growing();
    let _before = alloc(&reserve, &mut arena, MIB, 1);
    // Pages 0..=8: page 0 is the first block's already, page 8 is shared with whatever comes
    // next (the block ends 1 MiB into it), pages 1..=7 are the block's alone.
    let block = alloc(&reserve, &mut arena, 16 * MIB, 2);
    assert_eq!(arena.mapped_pages(), 9);
    arena.free(block.block());
    assert_eq!(
        release_all_idle(&reserve, &mut arena),
        2,
        "pages 1..=7, then page 8"
    );
    assert_eq!(arena.mapped_pages(), 1);
}

/// Bytes the device holds from the driver, mapped or kept.
fn held_bytes(reserve: &PageReserve) -> u64 {
    reserve
        .held()
        .reserved_bytes
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Grows `arena` by a block of `grown` bytes (one whole chunk), frees it, and places a 4 MiB
/// block at the start of its pages.
fn land_a_small_block_on_a_whole_chunk(
    reserve: &PageReserve,
    arena: &mut Arena,
    grown: u64,
) -> Placed {
    let block = alloc(reserve, arena, grown, 1);
    arena.free(block.block());
    let small = alloc(reserve, arena, 4 * MIB, 2);
    assert_eq!(small.ptr, arena.base);
    small
}

#[test]
fn a_smaller_block_landing_on_a_whole_chunk_cuts_it_again() {
    let (reserve, mut arena) = setup_cutting_whole_when_growing();
    // Two of the chunk's eight pages: kept whole, the chunk would stay mapped while this lives.
    let small = land_a_small_block_on_a_whole_chunk(&reserve, &mut arena, 16 * MIB);
    assert!(small.map_calls > 0, "cutting again calls the driver");
    assert_eq!((arena.mapped_pages(), arena.idle_pages()), (8, 6));
    assert_eq!(
        release_all_idle(&reserve, &mut arena),
        6,
        "six 2 MiB chunks"
    );
    assert_eq!(arena.mapped_pages(), 2);
    assert_eq!(
        held_bytes(&reserve),
        16 * MIB,
        "nothing created beyond the chunk's pages"
    );
}

#[test]
fn a_graph_pool_never_cuts_whole() {
    let (reserve, mut arena) = setup_cutting_whole_when_growing();
    let block = alloc_in(&reserve, &mut arena, 16 * MIB, 1, false);
    arena.free(block.block());
    assert_eq!(release_all_idle(&reserve, &mut arena), 8);
}

#[test]
fn a_recut_whose_chunk_another_pool_took_meanwhile_maps_nothing() {
    // No kept chunk of the range's size: mapping now would hold more than the budget allowed.
    let (reserve, _arena) = setup_cutting_whole_when_growing();
    assert!(!reserve.release_one_kept(8).unwrap());
    assert_eq!(held_bytes(&reserve), 0);
}

/// An arena over 256 MiB whose ordinary misses cut 6 MiB ends and 16 MiB inside chunks, and cut
/// a growing block's pages whole.
fn setup_with_inside_chunks_cutting_whole() -> (PageReserve, Arena) {
    let chunks = crate::pool::ChunkSizes::new(6 * MIB, 16 * MIB).whole_when_growing(true);
    setup_with(256 * MIB, chunks)
}

#[test]
fn a_recut_gives_the_landing_block_its_own_chunks_and_the_rest_small_ones() {
    let (reserve, mut arena) = setup_with_inside_chunks_cutting_whole();
    land_a_small_block_on_a_whole_chunk(&reserve, &mut arena, 128 * MIB);
    // Pages 0..=1 are the block's, in a chunk of their own; pages 2..64 go in 3-page chunks
    // (twenty, and one of two), not the 16 MiB inside chunks of an ordinary run, which the
    // smaller blocks landing there next would keep mapped. Cut as one ordinary run, the block
    // would keep a 6 MiB end chunk mapped.
    assert_eq!(release_all_idle(&reserve, &mut arena), 21);
    assert_eq!(
        arena.mapped_pages(),
        2,
        "only the block's own pages stay mapped"
    );
}

#[test]
fn a_whole_chunk_mapped_again_from_the_reserve_is_still_cut_again_under_a_smaller_block() {
    let (reserve, mut first) = setup_with_inside_chunks_cutting_whole();
    let grown = alloc(&reserve, &mut first, 64 * MIB, 1);
    first.free(grown.block());
    assert_eq!(
        release_all_idle(&reserve, &mut first),
        1,
        "one whole chunk kept"
    );
    // Another pool of the device maps the kept chunk for a block of its size.
    let mut second = Arena::new(reserve.backend(), 0, StreamId::DEFAULT, 256 * MIB).unwrap();
    let reused = alloc(&reserve, &mut second, 64 * MIB, 2);
    second.free(reused.block());
    let small = alloc(&reserve, &mut second, 4 * MIB, 3);
    assert!(small.map_calls > 0, "the chunk is cut again");
    release_all_idle(&reserve, &mut second);
    assert_eq!(
        second.mapped_pages(),
        2,
        "the small block keeps only its pages"
    );
}

/// An arena with 2 MiB chunks holding, from its base: 4 MiB free on mapped pages (a freed
/// block), 2 MiB live, 3 MiB free whose first page is unmapped and whose second is shared with
/// the 2 MiB live block after it, then the rest of the range. Blocks are laid end to end from
/// the base: [0, 4) [4, 6) [6, 9) [9, 11) MiB.
fn holes_on_mapped_and_unmapped_pages(place_on_mapped_pages: bool) -> (PageReserve, Arena) {
    let (reserve, arena) = setup_with(64 * MIB, crate::pool::ChunkSizes::new(2 * MIB, 0));
    let mut arena = arena.placing_on_mapped_pages(place_on_mapped_pages);
    let a = alloc(&reserve, &mut arena, 4 * MIB, 1);
    alloc(&reserve, &mut arena, 2 * MIB, 2);
    let h = alloc(&reserve, &mut arena, 3 * MIB, 3);
    alloc(&reserve, &mut arena, 2 * MIB, 4);
    arena.free(h.block());
    // Its one wholly idle page (6..8 MiB) goes; 8..10 MiB stays under the last block.
    let released = arena
        .release_idle(&reserve, |_, _| true, BusyStreams::Wait)
        .unwrap();
    assert_eq!(released.bytes, 2 * MIB);
    arena.free(a.block());
    (reserve, arena)
}

#[test]
fn a_block_the_fit_puts_on_unmapped_pages_goes_to_mapped_free_pages_when_asked() {
    // The index's best fit for 3 MiB is the 3 MiB hole, half unmapped: a miss.
    let (reserve, mut arena) = holes_on_mapped_and_unmapped_pages(false);
    let fit = alloc(&reserve, &mut arena, 3 * MIB, 5);
    assert_eq!((fit.ptr - arena.base, fit.map_calls), (6 * MIB, 1));

    // Asked to, the arena takes the freed 4 MiB on mapped pages instead: a hit.
    let (reserve, mut arena) = holes_on_mapped_and_unmapped_pages(true);
    let mapped_before = arena.mapped_pages();
    let placed = alloc(&reserve, &mut arena, 3 * MIB, 5);
    assert_eq!((placed.ptr - arena.base, placed.map_calls), (0, 0));
    assert_eq!(arena.mapped_pages(), mapped_before);
    assert_eq!(arena.live_block_count(), 3);
    arena.free(placed.block());
    // Everything merges back: the whole 4 MiB is free and cached again.
    assert_eq!(arena.largest_cached_free_block(), 4 * MIB);
}

#[test]
fn a_mapped_stretch_in_what_the_fit_leaves_over_is_taken_after_the_fit_merges_back() {
    // For 1 MiB the fit is the start of the 3 MiB hole (unmapped); the smallest mapped stretch
    // is that hole's own last MiB, in the free block split off the fit.
    let (reserve, mut arena) = holes_on_mapped_and_unmapped_pages(true);
    let placed = alloc(&reserve, &mut arena, MIB, 5);
    assert_eq!((placed.ptr - arena.base, placed.map_calls), (8 * MIB, 0));
    let live: Vec<_> = arena
        .live_blocks()
        .map(|(ptr, size, _)| (ptr - arena.base, size))
        .collect();
    assert!(live.contains(&(8 * MIB, MIB)), "{live:?}");
    arena.free(placed.block());
    arena.unpark();
    assert_eq!(arena.largest_cached_free_block(), 4 * MIB);
}

/// An arena whose misses cut 8 MiB chunks (four pages) and map ahead when growing, keeping up
/// to `kept` idle pages.
fn setup_mapping_ahead(kept: usize) -> (PageReserve, Arena) {
    let (reserve, arena) = setup_with(256 * MIB, crate::pool::ChunkSizes::new(8 * MIB, 0));
    let values = crate::pool::knobs::KnobValues {
        max_chunk_bytes: 8 * MIB,
        inside_chunk_bytes: 0,
        whole_when_growing: false,
        place_on_mapped_pages: false,
        map_ahead_when_growing: true,
        idle_pages_kept: kept,
        idle_per_mille: 0,
    };
    reserve.knobs().store(&values, reserve.page_size());
    (reserve, arena)
}

/// Allocates `size` bytes, answering the arena's question with `answer`; returns the block
/// and what was asked.
fn alloc_asking(
    reserve: &PageReserve,
    arena: &mut Arena,
    size: u64,
    answer: MapDecision,
) -> (Placed, Option<MapAsk>) {
    let mut asked = None;
    let placed = arena
        .alloc(reserve, size, 256, &live(1), true, |ask, _| {
            asked = Some(ask);
            answer
        })
        .unwrap();
    (placed, asked)
}

/// An arena mapping ahead after its first block, whose miss maps only its own page (an empty
/// arena is no sign of growth yet): one page mapped.
fn setup_mapping_ahead_with_a_first_block(kept: usize) -> (PageReserve, Arena) {
    let (reserve, mut arena) = setup_mapping_ahead(kept);
    let (first, asked) = alloc_asking(&reserve, &mut arena, 2 * MIB, MapDecision::Allow);
    let ahead = asked.map(|ask| ask.ahead_bytes);
    assert_eq!(ahead, Some(0), "an empty arena maps nothing ahead");
    assert_eq!((first.map_calls, arena.mapped_pages()), (1, 1));
    (reserve, arena)
}

#[test]
fn a_growing_arena_maps_the_rest_of_its_chunk_ahead_and_its_next_blocks_hit() {
    let (reserve, mut arena) = setup_mapping_ahead_with_a_first_block(16);
    let (_, asked) = alloc_asking(&reserve, &mut arena, 2 * MIB, MapDecision::Allow);
    let ask = asked.expect("a miss asks");
    assert_eq!((ask.bytes, ask.ahead_bytes), (2 * MIB, 6 * MIB));
    assert_eq!(arena.mapped_pages(), 5);
    for id in 3..=5 {
        let next = alloc(&reserve, &mut arena, 2 * MIB, id);
        assert_eq!(next.map_calls, 0, "block {id} lands on a page mapped ahead");
    }
    let sixth = alloc(&reserve, &mut arena, 2 * MIB, 6);
    assert!(
        sixth.map_calls > 0,
        "the chunk is full: the arena grows again"
    );
    assert_eq!(arena.mapped_pages(), 9);
}

#[test]
fn nothing_is_mapped_ahead_beyond_what_the_budget_allows_or_the_cache_keeps() {
    let (reserve, mut arena) = setup_mapping_ahead_with_a_first_block(16);
    let _ = alloc_asking(&reserve, &mut arena, 2 * MIB, MapDecision::AllowBlockOnly);
    assert_eq!(
        arena.mapped_pages(),
        2,
        "the budget allowed the block's page only"
    );
    let (reserve, mut arena) = setup_mapping_ahead_with_a_first_block(2);
    let (_, asked) = alloc_asking(&reserve, &mut arena, 2 * MIB, MapDecision::Allow);
    assert_eq!(asked.map(|ask| ask.ahead_bytes), Some(4 * MIB));
    assert_eq!(arena.mapped_pages(), 4, "two idle pages kept at most");
    let (reserve, mut arena) = setup_mapping_ahead_with_a_first_block(0);
    let _ = alloc_asking(&reserve, &mut arena, 2 * MIB, MapDecision::Allow);
    assert_eq!(
        arena.mapped_pages(),
        2,
        "a cache keeping nothing idle maps nothing ahead"
    );
}

#[test]
fn below_its_high_an_arena_maps_nothing_ahead() {
    let (reserve, mut arena) = setup_mapping_ahead(16);
    let first = alloc(&reserve, &mut arena, 8 * MIB, 1);
    let _second = alloc(&reserve, &mut arena, 8 * MIB, 2);
    arena.free(first.block());
    arena.unpark();
    assert_eq!(release_all_idle(&reserve, &mut arena), 1);
    // The first block's pages are below the arena's high: a block there maps only its own.
    let (_, asked) = alloc_asking(&reserve, &mut arena, 2 * MIB, MapDecision::Allow);
    assert_eq!(asked.map(|ask| ask.ahead_bytes), Some(0));
    assert_eq!(arena.mapped_pages(), 5);
}

#[test]
fn a_block_cut_whole_when_growing_gets_nothing_ahead() {
    let (reserve, mut arena) = setup_with(
        256 * MIB,
        crate::pool::ChunkSizes::new(8 * MIB, 0).whole_when_growing(true),
    );
    let values = crate::pool::knobs::KnobValues {
        max_chunk_bytes: 8 * MIB,
        inside_chunk_bytes: 0,
        whole_when_growing: true,
        place_on_mapped_pages: false,
        map_ahead_when_growing: true,
        idle_pages_kept: 16,
        idle_per_mille: 0,
    };
    reserve.knobs().store(&values, reserve.page_size());
    let _first = alloc(&reserve, &mut arena, 2 * MIB, 1);
    let (_, asked) = alloc_asking(&reserve, &mut arena, 2 * MIB, MapDecision::Allow);
    assert_eq!(asked.map(|ask| ask.ahead_bytes), Some(0));
    assert_eq!(arena.mapped_pages(), 2);
}

/// With `stream_ordered_reuse` on and the GPU behind every fence: a 4 MiB block freed, a 2 MiB
/// one kept after it, then an 8 MiB miss that must make room for two pages — too large for the
/// hole the first left, so it lands after the kept one and lends the first's pages (chunks of
/// one page) to itself. Returns the device, the arena, its reserve, the kept block, the grown
/// one, and the waits for the GPU made before the miss.
fn lent_to_a_miss() -> (
    Arc<SimBackend>,
    Arena,
    PageReserve,
    Placed,
    Placed,
    (u64, u64),
) {
    let sim = Arc::new(SimBackend::new(SimConfig::default()));
    let mut arena = Arena::new(&*sim, 0, StreamId(7), 64 * MIB).unwrap();
    let chunks = crate::pool::ChunkSizes::new(2 * MIB, 0);
    let reserve = PageReserve::new(sim.clone(), 0, Arc::new(DeviceReserve::default()), chunks);
    let reserve = reserve.unwrap();
    reserve.set_stream_ordered_reuse(true);
    sim.hold_fences(true); // the GPU has passed no fence
    let first = alloc(&reserve, &mut arena, 4 * MIB, 1);
    let kept = alloc(&reserve, &mut arena, 2 * MIB, 2);
    arena.free(first.block());
    let waits = (sim.syncs(), sim.fence_waits());
    let make_room = |_, _| MapDecision::NeedsRoom(4 * MIB, BusyStreams::Wait);
    let grown = arena.alloc(&reserve, 8 * MIB, 256, &live(3), true, make_room);
    (sim, arena, reserve, kept, grown.unwrap(), waits)
}

#[test]
fn with_stream_ordered_reuse_a_miss_lends_busy_idle_pages_to_itself_and_to_no_one_else() {
    let (sim, mut arena, reserve, kept, grown, waits) = lent_to_a_miss();
    assert_eq!((sim.syncs(), sim.fence_waits()), waits, "nothing waited");
    assert_eq!(sim.detached_mappings(0), 2, "the old addresses stay mapped");
    let reused = reserve
        .pages_reused
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(reused, 2, "the lent pages were mapped again");
    // Freed and unmapped (waiting for the stream), the lent chunks reach the reserve while
    // their old addresses are still mapped: no other mapping takes them, none goes back to
    // the driver.
    arena.free(grown.block());
    arena.free(kept.block()); // completes the parked free of `grown`
    arena
        .release_idle(&reserve, |_, _| true, BusyStreams::Wait)
        .unwrap();
    let elsewhere = sim.reserve_address_range(0, 8 * MIB).unwrap();
    let mapped = reserve.map(elsewhere, 8 * MIB, Cut::Ordinary);
    let mapped = mapped.unwrap();
    assert_eq!(
        (mapped.reused_pages, mapped.created_pages),
        (3, 1),
        "the two pages created for `grown` and `kept`'s are reused, the two lent ones are not"
    );
    assert_eq!(reserve.spare_pages(), 2);
    reserve.trim(0).unwrap();
    assert_eq!(reserve.spare_pages(), 2, "still lent: not released");
    sim.hold_fences(false);
    reserve.lendings.settle_passed(&reserve);
    assert_eq!(
        sim.detached_mappings(0),
        0,
        "the GPU passed them: the old addresses went"
    );
    reserve.trim(0).unwrap();
    assert_eq!(reserve.spare_pages(), 0);
    reserve.unmap(elsewhere, 8 * MIB).unwrap();
    reserve.trim(0).unwrap();
    sim.release_address_range(0, elsewhere, 8 * MIB).unwrap();
}

#[test]
fn blocks_stay_off_old_addresses_until_the_gpu_has_passed_them() {
    let (sim, mut arena, reserve, _kept, grown, waits) = lent_to_a_miss();
    let (old_start, old_end) = (arena.base, arena.base + 4 * MIB);
    // A block that fits the hole the lent pages left goes elsewhere, and waits for nothing.
    let beside = alloc(&reserve, &mut arena, 4 * MIB, 4);
    assert!(beside.ptr >= old_end || beside.ptr + 4 * MIB <= old_start);
    assert_eq!((sim.syncs(), sim.fence_waits()), waits, "nothing waited");
    assert_eq!(arena.live_block_count(), 3, "the holder is no one's block");
    assert_eq!(arena.live_blocks().count(), 3);
    // Once the GPU has passed them and they are unmapped, the old addresses serve again.
    sim.hold_fences(false);
    reserve.lendings.settle_passed(&reserve);
    let again = alloc(&reserve, &mut arena, 4 * MIB, 5);
    assert_eq!(again.ptr, old_start);
    let _ = grown;
}

#[test]
fn a_mapping_on_the_lenders_stream_takes_its_lent_chunks_and_another_streams_does_not() {
    let (_sim, mut arena, reserve, kept, grown, _) = lent_to_a_miss();
    arena.free(grown.block());
    arena.free(kept.block());
    arena
        .release_idle(&reserve, |_, _| true, BusyStreams::Wait)
        .unwrap();
    assert_eq!(reserve.spare_pages(), 5, "three created, two lent");
    let backend = reserve.backend();
    let elsewhere = backend.reserve_address_range(0, 12 * MIB).unwrap();
    // (pages reused, pages created) mapping `bytes` at `offset` for `stream`.
    let map_for = |offset: u64, bytes: u64, stream: u64| {
        let mapped = reserve.map_lending(
            elsewhere + offset,
            bytes,
            Cut::Ordinary,
            &mut Vec::new(),
            Some(StreamId(stream)),
        );
        let mapped = mapped.unwrap();
        (mapped.reused_pages, mapped.created_pages)
    };
    assert_eq!(map_for(0, 8 * MIB, 8), (3, 1), "the lent two are left");
    let own = map_for(8 * MIB, 4 * MIB, 7);
    assert_eq!(own, (2, 0), "its stream's work runs after");
    reserve.unmap(elsewhere, 12 * MIB).unwrap();
    backend
        .release_address_range(0, elsewhere, 12 * MIB)
        .unwrap();
}

#[test]
fn an_old_address_the_driver_will_not_unmap_is_held_off_and_tried_again() {
    let (sim, mut arena, reserve, _kept, _grown, _) = lent_to_a_miss();
    let (old_start, old_end) = (arena.base, arena.base + 4 * MIB);
    assert_eq!(sim.detached_mappings(0), 2);
    // The GPU passes the old addresses, but the driver refuses to unmap them: they stay
    // mapped, and no block lands there meanwhile (mapping over them would fail) — nor does a
    // miss wait for them.
    sim.faults().set_fail_frees(true);
    sim.hold_fences(false);
    reserve.lendings.settle_passed(&reserve);
    assert_eq!(sim.detached_mappings(0), 2);
    let waits = (sim.syncs(), sim.fence_waits());
    let beside = alloc(&reserve, &mut arena, 4 * MIB, 4);
    assert!(beside.ptr >= old_end || beside.ptr + 4 * MIB <= old_start);
    assert_eq!((sim.syncs(), sim.fence_waits()), waits, "nothing waited");
    // Once the driver unmaps them, they serve again.
    sim.faults().set_fail_frees(false);
    reserve.lendings.settle_passed(&reserve);
    assert_eq!(sim.detached_mappings(0), 0);
    let again = alloc(&reserve, &mut arena, 4 * MIB, 5);
    assert_eq!(again.ptr, old_start);
}
