//! The adaptive cache default's decision, and nothing else: a pure function from what a
//! device's pools saw over a window of misses (how many, how long they took, how many
//! operations they served, the pressure level, the room left) to the cache setting they use
//! next — chunk sizes, idle pages kept, placement. `adapting.rs` gathers the observations on
//! the miss path and applies the answer; this file reads no clock, atomic or device.
//!
//! The settings form a ladder. Level 0 is memory-first (2 MiB chunks cut whole when growing,
//! no idle pages: at or under 1.03 of the peak on every trace of the corpus); level 1 is the
//! configured setting (the fixed default); each level above keeps more idle pages and cuts
//! larger chunks, the trades `replay --sweep` names for workloads whose misses cost time. A
//! device starts at level 2 ([`START_LEVEL`]); its pools climb one level while misses cost more
//! than [`GROW_NS_PER_OP`] per operation and the device has room, and fall to memory-first as
//! pressure rises. Whatever the level, the idle slack stays under [`ceiling_slack_bytes`] of the
//! live peak and a chunk never exceeds [`inside_chunk_cap_bytes`]. A device that has mapped a
//! gigabyte block places nothing and stops at level 3, unless its misses cost more than
//! [`SETTLING_CLIMB_NS_PER_OP`] per operation there: then it climbs on and places, keeping no
//! more idle pages than level 3. At the top a miss that grows an arena also maps the free pages
//! after its block, up to the end of its chunk ([`CacheSetting::map_ahead_when_growing`]).
//!
//! The simulated device has no driver pool of its own: where a figure below puts a simulated
//! H100 replay beside "the driver pool", the pool's figure is an H200's from a GPU call of the
//! same day. What holds on a GPU, both replayed in the same rounds, is in docs/gpu-results.md.

use super::pressure::PressureLevel;
use crate::units::MIB;
use serde::Serialize;

/// What a device's pools keep cached and how a miss cuts its pages: the knobs the ladder moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CacheSetting {
    pub max_chunk_bytes: u64,
    pub inside_chunk_bytes: u64,
    pub idle_pages_kept: usize,
    pub idle_per_mille: usize,
    pub whole_chunks_when_growing: bool,
    pub place_on_mapped_pages: bool,
    /// Whether a miss at a new high of an arena's pages also maps the free pages after its
    /// block up to the end of an ordinary chunk, within the idle pages kept and the cache
    /// budget (the ladder's top only; no configuration key).
    pub map_ahead_when_growing: bool,
}

impl CacheSetting {
    /// The least memory: chunks of one page, a growing arena's block cut as one chunk, nothing
    /// idle kept. Every trace of the corpus stays at or under 1.03 of its peak with it.
    pub const MEMORY_FIRST: CacheSetting = CacheSetting {
        max_chunk_bytes: 2 * MIB,
        inside_chunk_bytes: 16 * MIB,
        idle_pages_kept: 0,
        idle_per_mille: 0,
        whole_chunks_when_growing: true,
        place_on_mapped_pages: false,
        map_ahead_when_growing: false,
    };
}

/// The levels above the configured one: (largest chunk, inside chunk, idle pages kept, placed
/// on mapped pages). On the simulated H100 these are where the sweep's fastest settings within
/// the driver pool's memory cluster: 32 MiB chunks with 16 idle pages; placed on mapped pages
/// with 64 (under the pool on both axes on every trace of the corpus that misses often, but the
/// one whose blocks are gigabytes); 64 MiB chunks with 256 for the traces whose layout changes
/// most every step (128 MiB chunks, the sweep's, held vae_decode at 1.062 of its peak where the
/// driver's pool holds 1.054: one block pins a chunk, and each pinned chunk's free part is
/// held beside the idle slack; 64 MiB held 1.041 at the same time per operation). The inside
/// chunk (a long miss's) applies where blocks are not placed; placed levels cut long misses in
/// their ordinary chunks ([`setting_at`]).
const ABOVE_BASE: [(u64, u64, usize, bool); 3] = [
    (32 * MIB, 64 * MIB, 16, false),
    (32 * MIB, 64 * MIB, 64, true),
    (64 * MIB, 128 * MIB, 256, true),
];

/// The highest level.
pub const TOP_LEVEL: u8 = 1 + ABOVE_BASE.len() as u8;
/// Memory-first.
pub const MEMORY_FIRST_LEVEL: u8 = 0;
/// The configured setting.
pub const BASE_LEVEL: u8 = 1;
/// Where a device starts: the first rung above the configured setting. A window closes only
/// after [`WINDOW_MISSES`] misses that do not take the device to a new high, so a workload that
/// grows for most of its run spent it where it started: graph_message_passing, started at the
/// configured setting, made most of its misses there and took 1.58x the driver pool's time on
/// the simulated H100 (1.62x on an H200). Started here it took 0.96x (1.06x on the H200), and
/// the corpus and the recorded sets stayed under the pool's memory (t5_generate closest: 1.1279
/// of its peak against 1.1472, where it held 1.0534 started at the configured setting).
pub const START_LEVEL: u8 = BASE_LEVEL + 1;
/// The highest level of a device that has mapped a [`LARGE_BLOCK_BYTES`] block while its
/// misses cost up to [`SETTLING_CLIMB_NS_PER_OP`] per operation: the first placed rung, without
/// placing (see [`setting_at`]). Above that cost it climbs on ([`top_level`]). vae_decode, whose
/// misses cost 5 to 35 µs per operation at this level on the simulated H100, took 1.84x the
/// driver pool's time here (1.91x on an H200); cnn_serve_large, whose windows cost at most 1.5
/// µs, is the trace that placing beside gigabyte blocks held past the pool's memory.
pub const LARGE_BLOCKS_TOP_LEVEL: u8 = 3;
/// The most idle pages a device that has mapped a [`LARGE_BLOCK_BYTES`] block keeps at any
/// level: those of [`LARGE_BLOCKS_TOP_LEVEL`], the highest it reaches while its misses are cheap.
const LARGE_BLOCKS_IDLE_PAGES: usize = ABOVE_BASE[(LARGE_BLOCKS_TOP_LEVEL - 2) as usize].2;
/// A block of twice the largest slack ([`MAX_SLACK_BYTES`]) or more: its freed pages are more
/// than the cache may keep idle twice over, and small blocks placed on them pin its chunks. On
/// the corpus a trace's largest block is under 800 MiB or 1.5 GiB and more (bert_mlm_dynpad,
/// cnn_serve_large, gpt2_train_large, vae_decode).
pub const LARGE_BLOCK_BYTES: u64 = 2 * MAX_SLACK_BYTES;

/// A wait for the GPU this long or longer says the host runs far ahead of its GPU: that much
/// work was queued. The GPU paces such a process, and a wait costs it only the moment the host
/// takes to queue work again, so the room past the cache budget buys it little time and holds
/// memory. Under PyTorch on an H100 a long-convolution trainer (steps of 1.9 s, no block over
/// 512 MiB) made 13 to 43 misses a round, waiting 30 to 60 ms a miss even with the room: with it
/// the process held 12,164-12,264 MiB at 1.012 of the default allocator's round, waiting
/// always 11,994-12,156 MiB at 1.000 (docs/gpu-results.md). The room is for host-paced steps,
/// where a wait drains a queue of a few milliseconds (a small CNN server's batch-128 step is
/// 11 ms of GPU work in all; of ten more workloads on an H200, only that trainer and one with
/// gigabyte blocks waited longer than GPT-2 training's 1.2 ms). Such a wait also starts
/// `stream_ordered_reuse` where it is left to the adaptive default (`cache.rs`).
pub const LONG_GPU_WAIT_NS: u64 = 20_000_000;

/// Misses costing more than this per operation served (in the window) are worth memory: the
/// driver's own pool answers an allocation and its free in about a microsecond.
pub const GROW_NS_PER_OP: u64 = 250;
/// A window settling a climb whose misses cost more than this per operation (sixteen times
/// [`GROW_NS_PER_OP`]) climbs on instead of only settling. Most traces close a handful of
/// windows in all (graph_message_passing and gpt2_train three), so a climb that waits a whole
/// window to settle spends a third of the trace a level lower. The settling window pays for the
/// move and is not what judges it, but at this cost it still says the level is too low: on the
/// simulated H100 such windows cost 6 to 11 µs per operation (vae_decode,
/// graph_message_passing, gpt2_train); the corpus's other settling windows cost 3.2 µs or less,
/// and climbing on from those did harm (convnext_multires, climbing on at 1.9 µs, held 1.13 of
/// its peak instead of 1.08 and took 10 % longer).
pub const SETTLING_CLIMB_NS_PER_OP: u64 = 16 * GROW_NS_PER_OP;
/// A miss that took less than this talked to no driver worth the name (the simulated device
/// without costs): it does not count as a cost. The cheapest miss on an H100 maps a chunk and
/// grants access to it, 45 µs or more.
pub const COSTLY_MISS_NS: u64 = 20_000;
/// A settling window whose misses mapped this much on average (twice level 3's chunk) climbs on
/// at any cost above [`GROW_NS_PER_OP`]: the driver charges creating, mapping, granting and
/// unmapping per chunk, so misses that large gain from the larger chunks and the idle pages of
/// the levels above. graph_message_passing's window settling level 3 mapped about 85 MiB a miss
/// at 1.8 µs per operation; stopped there it took 1.01x the driver pool's time on an H200
/// (median of fifteen runs) and 1.12x on an H100. At level 4 it took 0.96x on an H200 (median
/// of ten more runs 0.985x) at 1.0377 of its peak instead of 1.0414, and 4 % less time than at
/// level 3 on the simulated H100. Small misses keep the cost rule alone:
/// convnext_multires, climbing on at 1.9 µs, held more and took longer. At 16, 32 or 64 MiB the
/// corpus and the recorded sets change in the same two traces (graph_message_passing and
/// fft_longconv_train, which climbs earlier: 7 % less time at 1.0613 of its peak, the pool
/// 1.0947).
pub const LARGE_MISS_BYTES: u64 = 64 * MIB;
/// Costly misses per decision: enough that one slow call does not move the setting, few enough
/// that a trace of a few hundred misses climbs within its first rounds.
pub const WINDOW_MISSES: u64 = 8;
/// After pressure dropped the device to memory-first, this many windows pass before a climb.
pub const HOLD_WINDOWS: u8 = 16;

/// The idle slack (bytes beyond the live peak the cache may hold) never exceeds a sixteenth of
/// the live peak, at least [`MIN_SLACK_BYTES`] and at most [`MAX_SLACK_BYTES`]: the adaptive
/// default holds at most the memory-first reserve plus this. An eighth held a trace recorded
/// after it was chosen (wav2vec2-style CTC training) at 1.1160 of its peak where the driver's
/// pool held 1.0731; a sixteenth keeps it at 1.0510, and every trace of the corpus under the
/// pool's memory.
pub fn ceiling_slack_bytes(live_peak_bytes: u64) -> u64 {
    (live_peak_bytes / 16).clamp(MIN_SLACK_BYTES, MAX_SLACK_BYTES)
}

/// The least idle slack the ceiling allows, whatever the peak: about a thousandth of an 80 GB
/// device. A sixteenth of a small peak left workloads whose layout changes every
/// step remapping the same pages: a GAN trained at a resolution drawn per step (live peak 636
/// MiB, so 40 MiB of slack; recorded after the sixteenth was chosen) took 1.20x the driver
/// pool's time on the simulated H100 while holding 1.087 of its peak to the pool's 1.911;
/// convnext_multires (287 MiB) took 1.12x and lstm_seq2seq 1.11x. With 128 MiB they took 1.06x,
/// 0.52x and 0.72x, and every trace stayed under the pool's memory (the closest, gpt2_train,
/// 1.0452 to 1.0725). Above 128 MiB nothing changed: the ladder's third rung keeps 128 MiB.
pub const MIN_SLACK_BYTES: u64 = 128 * MIB;

/// The largest chunk inside a long miss at the adaptive default: an eighth of the live peak, 64
/// to 512 MiB. Such a chunk lies under one block, whose pages are freed together, and pins
/// memory beside live blocks only where smaller blocks land on its pages later; a sixteenth of
/// the peak doubled the chunks of a cold miss of 256 MiB (8 to 16), and with them its time. The
/// floor is twice the chunk of the rung a device starts at ([`START_LEVEL`]), so that a long miss
/// before any peak is known still gets inside chunks larger than its ordinary ones (at 32 MiB,
/// a cold miss of 1 GiB was cut in 32 chunks instead of 10).
pub fn inside_chunk_cap_bytes(live_peak_bytes: u64) -> u64 {
    (live_peak_bytes / 8).clamp(64 * MIB, MAX_SLACK_BYTES)
}

/// Whether a miss of `ns` nanoseconds that mapped `mapped_bytes` is a cost the cache could
/// have saved: it took as long as a driver call ([`COSTLY_MISS_NS`]) and mapped no more than
/// the largest idle slack any ceiling allows (a block larger than that misses whatever is kept;
/// only its chunks, which grow inside long runs anyway, change what it costs).
pub fn counts_as_cost(ns: u64, mapped_bytes: u64) -> bool {
    ns >= COSTLY_MISS_NS && mapped_bytes <= MAX_SLACK_BYTES
}

/// The most idle slack any process keeps.
pub const MAX_SLACK_BYTES: u64 = 512 * MIB;

/// Whether a miss that mapped `mapped_bytes` mapped a [`LARGE_BLOCK_BYTES`] block.
pub fn maps_a_large_block(mapped_bytes: u64) -> bool {
    mapped_bytes >= LARGE_BLOCK_BYTES
}

/// What a device's pools saw over one window of misses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    /// Allocations served (hits and misses).
    pub ops: u64,
    /// Misses that cost the driver's time ([`COSTLY_MISS_NS`] or more) without taking the
    /// device's held memory to a new high: misses that keeping more would have saved.
    pub misses: u64,
    /// Their time, in nanoseconds.
    pub miss_ns: u64,
    /// The bytes they mapped, together.
    pub mapped_bytes: u64,
    pub pressure: PressureLevel,
    /// The most bytes under live blocks lately.
    pub live_peak_bytes: u64,
    /// What the pools may still take from the device (their cap less what they hold).
    pub room_bytes: u64,
    /// Whether the device has mapped a [`LARGE_BLOCK_BYTES`] block.
    pub large_blocks: bool,
}

impl Observation {
    /// Nanoseconds of avoidable misses per operation served.
    pub fn cost_ns_per_op(&self) -> u64 {
        self.miss_ns / self.ops.max(1)
    }

    /// Bytes the avoidable misses mapped, on average.
    pub fn mapped_bytes_per_miss(&self) -> u64 {
        self.mapped_bytes / self.misses.max(1)
    }
}

/// Where a device stands on the ladder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Tuning {
    pub level: u8,
    /// Windows left before another climb.
    pub hold: u8,
    /// Whether the window now open is the first after a climb: it pays for the move (pages
    /// cut again into the new chunks, idle pages not yet kept), so it only settles the climb.
    pub settling: bool,
}

impl Default for Tuning {
    /// At the configured setting, nothing to settle or hold.
    fn default() -> Self {
        Tuning {
            level: BASE_LEVEL,
            hold: 0,
            settling: false,
        }
    }
}

impl Tuning {
    /// Where a device starts: [`START_LEVEL`].
    pub fn starting() -> Self {
        Tuning {
            level: START_LEVEL,
            ..Tuning::default()
        }
    }
}

/// The next tuning after a window observed as `seen`. High pressure (and above) drops to
/// memory-first at once and holds off climbing for [`HOLD_WINDOWS`]; medium caps at the
/// configured setting; otherwise the window after a climb settles it (or, above
/// [`SETTLING_CLIMB_NS_PER_OP`] or with misses of [`LARGE_MISS_BYTES`], climbs on), and a cost
/// above [`GROW_NS_PER_OP`] climbs one level where the device has room for the next level's
/// slack twice over.
///
/// A climb is never undone for its cost. Judged against the window before it (undone where
/// the cost more than doubled), climbs were undone where the workload's own cost rose: on an
/// H100, recsys_embedding_train's windows cost 324, 617 and 1,926 ns per operation around its
/// first climb, so it went back to level 1 and stayed there while its windows cost 1,491 to
/// 5,632 (on an H200 it ended at level 1, 1.39x the driver pool's time). On the simulated H100
/// the rule undid one climb on the corpus and the recorded sets, gan_train_multires's (1.06x
/// the pool's time with it, 0.36x without), and changed nothing else. The ceiling bounds what
/// any level holds, and pressure takes it back.
pub fn decide(now: Tuning, seen: &Observation) -> Tuning {
    let cost = seen.cost_ns_per_op();
    if seen.pressure >= PressureLevel::High {
        return Tuning {
            level: MEMORY_FIRST_LEVEL,
            hold: HOLD_WINDOWS,
            settling: false,
        };
    }
    let cap = if seen.pressure == PressureLevel::Medium {
        BASE_LEVEL
    } else {
        TOP_LEVEL
    };
    let level = now.level.min(cap);
    let next = level + 1;
    let room_for_next =
        ceiling_slack_bytes(seen.live_peak_bytes).saturating_mul(2) <= seen.room_bytes;
    let climbs = cost > GROW_NS_PER_OP
        && next <= cap.min(top_level(seen.large_blocks, cost))
        && room_for_next;
    let stays = Tuning {
        level,
        hold: now.hold.saturating_sub(1),
        settling: false,
    };
    if now.settling && level == now.level {
        // Too dear to wait a window, or misses too large for this level's chunks: the next
        // level, which the window after settles.
        let large_misses = seen.mapped_bytes_per_miss() >= LARGE_MISS_BYTES;
        return if climbs && (cost > SETTLING_CLIMB_NS_PER_OP || large_misses) {
            climb_to(next)
        } else {
            stays
        };
    }
    if climbs && now.hold == 0 {
        return climb_to(next);
    }
    stays
}

/// The highest level a window costing `cost_ns_per_op` climbs to: [`LARGE_BLOCKS_TOP_LEVEL`]
/// once the device has mapped a [`LARGE_BLOCK_BYTES`] block, unless the window cost more than
/// [`SETTLING_CLIMB_NS_PER_OP`]; [`TOP_LEVEL`] otherwise. A level reached is kept when the cost
/// falls: the ceiling bounds what it holds, and pressure takes it back.
pub fn top_level(large_blocks: bool, cost_ns_per_op: u64) -> u8 {
    if large_blocks && cost_ns_per_op <= SETTLING_CLIMB_NS_PER_OP {
        LARGE_BLOCKS_TOP_LEVEL
    } else {
        TOP_LEVEL
    }
}

/// The tuning once the device has mapped its first [`LARGE_BLOCK_BYTES`] block: at most
/// [`LARGE_BLOCKS_TOP_LEVEL`], at once (the climbs that took it higher were made at a smaller
/// peak, and no window may come before that peak's misses pin chunks).
pub fn with_large_blocks(now: Tuning) -> Tuning {
    if now.level <= LARGE_BLOCKS_TOP_LEVEL {
        return now;
    }
    Tuning {
        level: LARGE_BLOCKS_TOP_LEVEL,
        settling: false,
        ..now
    }
}

/// A climb to `level`: the window after it settles it.
fn climb_to(level: u8) -> Tuning {
    Tuning {
        level,
        hold: 0,
        settling: true,
    }
}

/// The setting at `level`, from the configured one (`base`, level 1), bounded by the ceiling:
/// idle pages kept at most [`ceiling_slack_bytes`] of the live peak, and no chunk, a long
/// miss's inside chunk included, larger than [`inside_chunk_cap_bytes`]. Where blocks are
/// placed on mapped pages, a long miss's inside chunk is no larger than an ordinary one: a
/// small block placed on a freed long block's pages pins the inside chunk under it, and with
/// 128 MiB inside chunks beside its idle pages segment_multiscale held 1.1304 of its peak where
/// the driver's pool holds 1.1209. With `large_blocks` (the device has mapped a
/// [`LARGE_BLOCK_BYTES`] block) the ladder places nothing up to [`LARGE_BLOCKS_TOP_LEVEL`]: at a
/// peak of tens of gigabytes the chunks small blocks pinned on gigabyte blocks' freed pages held
/// cnn_serve_large at 1.0172 of its peak where the driver's pool holds 1.0071. Above it (misses
/// that dear) it places, with no more idle pages than that level keeps: vae_decode, whose live
/// peak allows 83 idle pages, held 1.0490 of its peak with them against the pool's 1.0541, and
/// 1.0259 with 64, at 0.79x and 0.80x the pool's time on the simulated H100.
///
/// The top maps ahead of a growing arena. A workload whose memory grows through its first
/// steps in blocks of a few pages (audio_ctc_train: 360 of its 399 misses at new highs, of 2 to
/// 10 MiB) pays one miss per block otherwise: it took 1.12x the driver pool's time on an H200
/// with every one of its misses costing most of its driver time. Mapped ahead, on the simulated
/// H100 it took 0.21x instead of 0.55x at 1.0655 of its peak (the pool 1.0731), and
/// segment_multiscale 0.52x instead of 0.65x at the same peak. Below the top it cost memory:
/// mapping ahead at every level from 2 held llama_generate at 1.0266 of its peak, over the
/// pool's 1.0235, and took vae_decode and cnn_serve_large within 0.4 % and 0.1 % of the pool's.
/// Counted towards the budget's peak instead of its slack, the pages ahead held vae_decode and
/// audio_ctc_train over the pool's memory even at the top alone.
pub fn setting_at(
    level: u8,
    base: &CacheSetting,
    live_peak_bytes: u64,
    page: u64,
    large_blocks: bool,
) -> CacheSetting {
    let page = page.max(1);
    let ceiling_pages = (ceiling_slack_bytes(live_peak_bytes) / page) as usize;
    let largest_chunk = inside_chunk_cap_bytes(live_peak_bytes);
    match level {
        MEMORY_FIRST_LEVEL => CacheSetting::MEMORY_FIRST,
        BASE_LEVEL => *base,
        _ => {
            let (chunk, inside, idle, placed) = ABOVE_BASE[(level.min(TOP_LEVEL) - 2) as usize];
            let idle = if large_blocks {
                idle.min(LARGE_BLOCKS_IDLE_PAGES)
            } else {
                idle
            };
            let placed = placed && (!large_blocks || level > LARGE_BLOCKS_TOP_LEVEL);
            let chunk = chunk.min(largest_chunk).max(base.max_chunk_bytes) / page * page;
            let inside = if placed {
                chunk
            } else {
                inside.min(largest_chunk)
            };
            CacheSetting {
                max_chunk_bytes: chunk,
                inside_chunk_bytes: inside.max(base.inside_chunk_bytes) / page * page,
                idle_pages_kept: idle.min(ceiling_pages).max(base.idle_pages_kept),
                idle_per_mille: 0,
                whole_chunks_when_growing: base.whole_chunks_when_growing,
                place_on_mapped_pages: placed || base.place_on_mapped_pages,
                map_ahead_when_growing: level >= TOP_LEVEL || base.map_ahead_when_growing,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::GIB;

    const PAGE: u64 = 2 * MIB;

    fn base() -> CacheSetting {
        CacheSetting {
            max_chunk_bytes: 6 * MIB,
            inside_chunk_bytes: 16 * MIB,
            idle_pages_kept: 4,
            idle_per_mille: 8,
            whole_chunks_when_growing: false,
            place_on_mapped_pages: false,
            map_ahead_when_growing: false,
        }
    }

    fn seen(ops: u64, miss_ns: u64) -> Observation {
        Observation {
            ops,
            misses: 8,
            miss_ns,
            mapped_bytes: 8 * 2 * MIB,
            pressure: PressureLevel::Low,
            live_peak_bytes: GIB,
            room_bytes: 40 * GIB,
            large_blocks: false,
        }
    }

    #[test]
    fn costly_misses_with_room_climb_one_level() {
        let next = decide(Tuning::default(), &seen(1_000, 1_000_000));
        assert_eq!((next.level, next.settling), (BASE_LEVEL + 1, true));
    }

    #[test]
    fn cheap_misses_stay_where_they_are() {
        let next = decide(Tuning::default(), &seen(10_000, 1_000_000));
        assert_eq!(next, Tuning::default());
    }

    /// A climb, and the window after it, which settles.
    fn climbed() -> Tuning {
        let climbed = decide(Tuning::default(), &seen(1_000, 1_000_000));
        assert!(climbed.settling);
        // Dearer than the window before, but under what would climb on.
        let settled = decide(climbed, &seen(1_000, 3_000_000));
        assert_eq!((settled.level, settled.settling), (BASE_LEVEL + 1, false));
        settled
    }

    /// A settling window below [`SETTLING_CLIMB_NS_PER_OP`] only settles; above, it climbs on,
    /// and the window after that settles the new climb.
    #[test]
    fn a_settling_window_climbs_on_only_when_dear() {
        let climbed = decide(Tuning::default(), &seen(1_000, 1_000_000));
        let cheap = SETTLING_CLIMB_NS_PER_OP * 1_000;
        let settled = decide(climbed, &seen(1_000, cheap));
        assert_eq!((settled.level, settled.settling), (BASE_LEVEL + 1, false));
        let dear = cheap + 1_000;
        let on = decide(climbed, &seen(1_000, dear));
        assert_eq!((on.level, on.settling), (BASE_LEVEL + 2, true), "{on:?}");
        // Neither past the top nor without room.
        let at_top = Tuning {
            level: TOP_LEVEL,
            ..climbed
        };
        let stays = decide(at_top, &seen(1_000, dear));
        assert_eq!((stays.level, stays.settling), (TOP_LEVEL, false));
        let tight = Observation {
            room_bytes: 0,
            ..seen(1_000, dear)
        };
        assert_eq!(decide(climbed, &tight).level, BASE_LEVEL + 1);
    }

    /// A settling window whose misses mapped [`LARGE_MISS_BYTES`] each on average climbs on at
    /// a cost that small misses would only settle at; not at a cost no window climbs for.
    #[test]
    fn a_settling_window_of_large_misses_climbs_on() {
        let climbed = decide(Tuning::default(), &seen(1_000, 1_000_000));
        let large = |miss_ns| Observation {
            mapped_bytes: 8 * LARGE_MISS_BYTES,
            ..seen(1_000, miss_ns)
        };
        let small = |miss_ns| Observation {
            mapped_bytes: 8 * LARGE_MISS_BYTES - 1,
            ..seen(1_000, miss_ns)
        };
        let cost = 1_800 * 1_000;
        let on = decide(climbed, &large(cost));
        assert_eq!((on.level, on.settling), (BASE_LEVEL + 2, true), "{on:?}");
        let settled = decide(climbed, &small(cost));
        assert_eq!((settled.level, settled.settling), (BASE_LEVEL + 1, false));
        let cheap = decide(climbed, &large(GROW_NS_PER_OP * 1_000));
        assert_eq!((cheap.level, cheap.settling), (BASE_LEVEL + 1, false));
    }

    #[test]
    fn a_settled_climb_whose_misses_still_cost_climbs_again() {
        let next = decide(climbed(), &seen(1_000, 400_000));
        assert_eq!(next.level, BASE_LEVEL + 2);
    }

    /// The windows recsys_embedding_train closed on an H100 around its first climb, in ns per
    /// operation: its cost rose with its layout whatever the level, and judged against the
    /// window before the climb (324) the climb was undone at the third. Now the ladder climbs
    /// on while the cost stays above [`GROW_NS_PER_OP`].
    #[test]
    fn a_cost_that_rises_after_a_climb_climbs_on() {
        let mut tuning = Tuning::default();
        let mut levels = Vec::new();
        for cost in [324, 617, 1_926, 1_491, 3_487, 5_632] {
            tuning = decide(tuning, &seen(1_000, cost * 1_000));
            levels.push(tuning.level);
        }
        assert_eq!(levels, [2, 2, 3, 3, 4, 4]);
    }

    /// After high pressure the device stays at memory-first or below the configured setting
    /// for [`HOLD_WINDOWS`] windows, however dear its misses, then climbs again.
    #[test]
    fn pressure_holds_off_climbing_for_a_while() {
        let high = Observation {
            pressure: PressureLevel::High,
            ..seen(1_000, 2_100_000)
        };
        let mut tuning = decide(climbed(), &high);
        assert_eq!(
            (tuning.level, tuning.hold),
            (MEMORY_FIRST_LEVEL, HOLD_WINDOWS)
        );
        for _ in 0..HOLD_WINDOWS {
            tuning = decide(tuning, &seen(1_000, 2_100_000));
            assert_eq!(tuning.level, MEMORY_FIRST_LEVEL);
        }
        assert_eq!(decide(tuning, &seen(1_000, 2_100_000)).level, BASE_LEVEL);
    }

    #[test]
    fn the_top_level_is_never_passed() {
        let mut tuning = Tuning::default();
        let mut cost = 100_000_000;
        for _ in 0..20 {
            tuning = decide(tuning, &seen(1_000, cost));
            cost /= 2;
            assert!(tuning.level <= TOP_LEVEL);
        }
        assert_eq!(tuning.level, TOP_LEVEL);
    }

    #[test]
    fn pressure_falls_back_to_memory_first_and_medium_caps_at_the_base() {
        let top = Tuning {
            level: TOP_LEVEL,
            ..Tuning::default()
        };
        let high = Observation {
            pressure: PressureLevel::High,
            ..seen(1_000, 1_000_000)
        };
        assert_eq!(decide(top, &high).level, MEMORY_FIRST_LEVEL);
        let medium = Observation {
            pressure: PressureLevel::Medium,
            ..seen(1_000, 1_000_000)
        };
        assert_eq!(decide(top, &medium).level, BASE_LEVEL);
        // Medium pressure never climbs past the configured setting.
        assert_eq!(decide(Tuning::default(), &medium).level, BASE_LEVEL);
    }

    #[test]
    fn no_climb_without_room_for_twice_the_next_slack() {
        let tight = Observation {
            room_bytes: ceiling_slack_bytes(GIB) * 2 - 1,
            ..seen(1_000, 1_000_000)
        };
        assert_eq!(decide(Tuning::default(), &tight).level, BASE_LEVEL);
    }

    #[test]
    fn only_driver_priced_misses_the_slack_could_hold_are_costs() {
        assert!(counts_as_cost(COSTLY_MISS_NS, 64 * MIB));
        assert!(!counts_as_cost(COSTLY_MISS_NS - 1, 64 * MIB));
        // A block of a gigabyte misses whatever the cache keeps.
        assert!(!counts_as_cost(COSTLY_MISS_NS, GIB));
    }

    #[test]
    fn a_large_block_is_a_gigabyte_or_more() {
        assert!(!maps_a_large_block(800 * MIB));
        assert!(maps_a_large_block(GIB));
        assert!(maps_a_large_block(3 * GIB / 2));
    }

    #[test]
    fn the_ceiling_is_a_sixteenth_of_the_peak_between_128_and_512_mib() {
        assert_eq!(ceiling_slack_bytes(0), 128 * MIB);
        assert_eq!(ceiling_slack_bytes(GIB), 128 * MIB);
        assert_eq!(ceiling_slack_bytes(4 * GIB), 256 * MIB);
        assert_eq!(ceiling_slack_bytes(64 * GIB), 512 * MIB);
    }

    #[test]
    fn every_level_keeps_idle_pages_and_chunks_under_the_ceiling() {
        for peak in [0, 100 * MIB, GIB, 8 * GIB, 80 * GIB] {
            let ceiling = ceiling_slack_bytes(peak);
            let largest_chunk = inside_chunk_cap_bytes(peak);
            for level in BASE_LEVEL + 1..=TOP_LEVEL {
                for large_blocks in [false, true] {
                    let s = setting_at(level, &base(), peak, PAGE, large_blocks);
                    let at = format!("{level} {peak} {large_blocks}: {s:?}");
                    assert!(s.idle_pages_kept as u64 * PAGE <= ceiling, "{at}");
                    assert!(s.max_chunk_bytes <= largest_chunk, "{at}");
                    // The configured inside chunk (16 MiB) is the floor.
                    assert!(s.inside_chunk_bytes <= largest_chunk.max(16 * MIB), "{at}");
                    assert_eq!(s.max_chunk_bytes % PAGE, 0);
                    assert_eq!(s.inside_chunk_bytes % PAGE, 0);
                }
            }
        }
    }

    /// A small block placed on a freed long block's pages pins the inside chunk under it: where
    /// blocks are placed, inside chunks are no larger than ordinary ones.
    #[test]
    fn placed_levels_cut_inside_chunks_no_larger_than_their_chunks() {
        for level in BASE_LEVEL + 1..=TOP_LEVEL {
            let s = setting_at(level, &base(), 8 * GIB, PAGE, false);
            if s.place_on_mapped_pages {
                assert_eq!(s.inside_chunk_bytes, s.max_chunk_bytes, "{level}: {s:?}");
            } else {
                assert!(s.inside_chunk_bytes > s.max_chunk_bytes, "{level}: {s:?}");
            }
        }
        // At least one level places, and one does not.
        assert!(!setting_at(BASE_LEVEL + 1, &base(), 8 * GIB, PAGE, false).place_on_mapped_pages);
        assert!(setting_at(TOP_LEVEL, &base(), 8 * GIB, PAGE, false).place_on_mapped_pages);
    }

    /// Once a gigabyte block was mapped the ladder places nothing and stops at
    /// [`LARGE_BLOCKS_TOP_LEVEL`], keeping the long misses' large inside chunks, while its misses
    /// cost up to [`SETTLING_CLIMB_NS_PER_OP`] per operation.
    #[test]
    fn large_blocks_stop_the_ladder_below_the_top_and_place_nothing() {
        let large = |ops, ns| Observation {
            large_blocks: true,
            ..seen(ops, ns)
        };
        let mut tuning = Tuning::default();
        for _ in 0..20 {
            tuning = decide(tuning, &large(1_000, SETTLING_CLIMB_NS_PER_OP * 1_000));
            assert!(tuning.level <= LARGE_BLOCKS_TOP_LEVEL, "{tuning:?}");
        }
        assert_eq!(tuning.level, LARGE_BLOCKS_TOP_LEVEL);
        // A device at the top when its first gigabyte block comes is lowered at once.
        let top = Tuning {
            level: TOP_LEVEL,
            settling: true,
            hold: 0,
        };
        let lowered = with_large_blocks(top);
        assert_eq!(
            (lowered.level, lowered.settling),
            (LARGE_BLOCKS_TOP_LEVEL, false)
        );
        // Below it nothing changes.
        assert_eq!(with_large_blocks(climbed()), climbed());
        for level in BASE_LEVEL + 1..=LARGE_BLOCKS_TOP_LEVEL {
            let s = setting_at(level, &base(), 8 * GIB, PAGE, true);
            assert!(!s.place_on_mapped_pages, "{level}: {s:?}");
        }
        let s = setting_at(LARGE_BLOCKS_TOP_LEVEL, &base(), 8 * GIB, PAGE, true);
        assert_eq!(
            (s.max_chunk_bytes, s.inside_chunk_bytes),
            (32 * MIB, 64 * MIB)
        );
    }

    /// Dearer misses beside gigabyte blocks climb on to the top, which places blocks and keeps
    /// no more idle pages than [`LARGE_BLOCKS_TOP_LEVEL`]; a level reached stays when the cost
    /// falls.
    #[test]
    fn dear_misses_beside_large_blocks_climb_on_and_place() {
        let large = |ns_per_op: u64| Observation {
            large_blocks: true,
            ..seen(1_000, ns_per_op * 1_000)
        };
        let at_cap = Tuning {
            level: LARGE_BLOCKS_TOP_LEVEL,
            ..Tuning::default()
        };
        let on = decide(at_cap, &large(SETTLING_CLIMB_NS_PER_OP + 1));
        assert_eq!((on.level, on.settling), (TOP_LEVEL, true));
        let settled = decide(on, &large(GROW_NS_PER_OP + 1));
        assert_eq!((settled.level, settled.settling), (TOP_LEVEL, false));
        let s = setting_at(TOP_LEVEL, &base(), 8 * GIB, PAGE, true);
        let below = setting_at(LARGE_BLOCKS_TOP_LEVEL, &base(), 8 * GIB, PAGE, true);
        assert!(s.place_on_mapped_pages, "{s:?}");
        assert_eq!(s.idle_pages_kept, below.idle_pages_kept);
        assert_eq!(s.inside_chunk_bytes, s.max_chunk_bytes);
    }

    #[test]
    fn the_ends_of_the_ladder_are_memory_first_and_the_configured_setting() {
        assert_eq!(
            setting_at(MEMORY_FIRST_LEVEL, &base(), GIB, PAGE, false),
            CacheSetting::MEMORY_FIRST
        );
        assert_eq!(setting_at(BASE_LEVEL, &base(), GIB, PAGE, true), base());
        let top = setting_at(TOP_LEVEL, &base(), 8 * GIB, PAGE, false);
        assert_eq!((top.max_chunk_bytes, top.idle_pages_kept), (64 * MIB, 256));
        assert_eq!(top.inside_chunk_bytes, 64 * MIB);
        assert!(top.place_on_mapped_pages);
        // Only the top maps ahead of a growing arena.
        assert!(top.map_ahead_when_growing);
        for level in MEMORY_FIRST_LEVEL..TOP_LEVEL {
            assert!(!setting_at(level, &base(), 8 * GIB, PAGE, false).map_ahead_when_growing);
        }
    }
}
