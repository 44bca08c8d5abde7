//! The allocator model shared by the fault-injection tests, the property tests and the
//! `allocator` fuzz target (which includes this file with `#[path]`): bytes decoded into a
//! manager configuration and a sequence of operations (allocate, free, trim, empty the cache,
//! upkeep, arm a driver fault, change what other processes hold) run against a
//! `MemoryManager` over simulated devices (`alloc_model_harness.rs`), with the manager's
//! invariants (`alloc_model_invariants.rs`) checked after every operation against a simple
//! model of what the caller holds. Both parts sit beside this file and are included by
//! `#[path]`, which resolves the same here and in the fuzz targets.

#[path = "alloc_model_harness.rs"]
mod harness;
#[path = "alloc_model_invariants.rs"]
mod invariants;

pub(super) use harness::Harness;
pub(super) use invariants::{check_state, State};

use gpumem::manager::Strategy;
use std::time::Duration;

/// Simulated devices, each this large: small enough that random sequences run out of memory.
pub(super) const DEVICES: usize = 2;
pub(super) const DEVICE_BYTES: u64 = 1 << 30;
const PAGE: u64 = 2 << 20;
/// Operations decoded from one input, at most (keeps a fuzz run fast).
pub(super) const MAX_OPS: usize = 400;

/// How the manager under test is configured.
#[derive(Clone, Debug)]
pub(super) struct Setup {
    pub strategy: Strategy,
    pub shards: usize,
    pub idle_pages_kept: usize,
    pub max_pool_bytes: Option<u64>,
    pub max_cached_bytes: Option<u64>,
    pub release_idle_after: Option<Duration>,
}

/// One step of a sequence.
#[derive(Clone, Debug)]
pub(super) enum Op {
    /// Device indices past `DEVICES` and bad alignments are part of the input space.
    Alloc {
        device: usize,
        size: u64,
        align: u64,
        stream: u64,
    },
    /// Frees the held buffer at `index % held`, by `DeviceBuffer::free` or by dropping it.
    Free {
        index: usize,
        explicit: bool,
    },
    Trim {
        target: u64,
    },
    EmptyCache,
    /// Idle pages unmapped into each device's page reserve (still held).
    UnmapCached,
    ReleaseIdle,
    Maintain,
    ResetPeaks,
    FailNthAlloc(u64),
    /// The k-th call from now that gives memory back fails: a release failing part-way.
    FailNthFree(u64),
    FailFrees(bool),
    FailMemInfo(bool),
    UsedByOthers {
        device: usize,
        bytes: u64,
    },
}

/// Reads bytes as little numbers; past the end every read is 0.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&first, rest)) => {
                self.0 = rest;
                first
            }
            None => 0,
        }
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
}

/// A request size: mostly small or a few pages, now and then huge or zero.
fn size_from(cursor: &mut Cursor) -> u64 {
    let raw = u64::from(cursor.u32());
    match cursor.byte() % 8 {
        0 => raw % (64 << 10) + 1,
        1 | 2 => raw % (4 << 20) + 1,
        3 | 4 => raw % (64 << 20) + 1,
        5 => raw % (512 << 20) + 1,
        6 => raw % 3 * (DEVICE_BYTES / 2), // 0, half the device, the whole device
        _ => (raw % 4 + 1) * PAGE,
    }
}

/// Decodes a setup and a sequence of operations from arbitrary bytes (any input is valid).
pub(super) fn decode(data: &[u8]) -> (Setup, Vec<Op>) {
    let mut cursor = Cursor(data);
    let flags = cursor.byte();
    let setup = Setup {
        strategy: if flags & 1 == 0 {
            Strategy::Pooled
        } else {
            Strategy::Direct
        },
        shards: 1 << ((flags >> 1) % 3),
        idle_pages_kept: usize::from(cursor.byte() % 8),
        max_pool_bytes: (flags & 8 != 0).then(|| (u64::from(cursor.byte()) + 1) * 4 * PAGE),
        max_cached_bytes: (flags & 16 != 0).then(|| u64::from(cursor.byte()) * PAGE),
        release_idle_after: (flags & 32 != 0).then_some(Duration::ZERO),
    };
    let mut ops = Vec::new();
    while !cursor.0.is_empty() && ops.len() < MAX_OPS {
        let op = match cursor.byte() % 33 {
            0..=13 => Op::Alloc {
                device: match cursor.byte() {
                    255 => DEVICES + 3,
                    b => usize::from(b) % DEVICES,
                },
                size: size_from(&mut cursor),
                align: match cursor.byte() % 16 {
                    0 => 512,
                    1 => 4096,
                    2 => 1 << 20,
                    3 => PAGE,
                    4 => 3,
                    5 => PAGE * 2,
                    _ => 256,
                },
                stream: u64::from(cursor.byte() % 4),
            },
            22 => Op::UnmapCached,
            14..=21 => Op::Free {
                index: usize::from(cursor.byte()),
                explicit: cursor.byte() % 2 == 0,
            },
            23 => Op::Trim {
                target: u64::from(cursor.byte()) * PAGE,
            },
            24 => Op::EmptyCache,
            25 => Op::ReleaseIdle,
            26 => Op::Maintain,
            27 => Op::ResetPeaks,
            28 => Op::FailNthAlloc(u64::from(cursor.byte() % 8) + 1),
            29 => Op::FailFrees(cursor.byte() % 2 == 0),
            30 => Op::FailMemInfo(cursor.byte() % 2 == 0),
            31 => Op::UsedByOthers {
                device: usize::from(cursor.byte()) % DEVICES,
                bytes: u64::from(cursor.byte() % 9) * (DEVICE_BYTES / 8),
            },
            _ => Op::FailNthFree(u64::from(cursor.byte() % 8) + 1),
        };
        ops.push(op);
    }
    (setup, ops)
}

/// Runs `data` as a setup and operations, checking after each; `Err` names the step.
pub(super) fn run(data: &[u8]) -> Result<(), String> {
    let (setup, ops) = decode(data);
    let mut harness = Harness::new(setup.clone());
    for (step, op) in ops.iter().enumerate() {
        harness
            .apply(op)
            .and_then(|()| harness.check())
            .map_err(|e| format!("{setup:?}, step {step} ({op:?}): {e}"))?;
    }
    harness
        .finish()
        .map_err(|e| format!("{setup:?}, at the end: {e}"))
}
