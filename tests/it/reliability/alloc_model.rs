//! The allocator model shared by the fault-injection tests, the property tests and the
//! `allocator` fuzz target (which includes this file with `#[path]`): bytes decoded into a
//! manager configuration and a sequence of operations (allocate, free, trim, empty the cache,
//! upkeep, arm a driver fault, change what other processes hold) run against a
//! `MemoryManager` over simulated devices, with the manager's invariants checked after every
//! operation against a simple model of what the caller holds.

use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec, SimFaults};
use gpumem::manager::{AllocOptions, DeviceBuffer, MemoryConfig, MemoryManager, Strategy};
use gpumem::{AllocError, BackendError, DeviceBackend, StreamId};
use std::collections::HashMap;
use std::sync::Arc;
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

/// A manager over simulated devices, what the caller holds, and the faults armed.
pub(super) struct Harness {
    sim: Arc<SimBackend>,
    faults: Arc<SimFaults>,
    manager: MemoryManager,
    setup: Setup,
    held: Vec<DeviceBuffer>,
    /// Direct buffers dropped while frees failed: the driver still holds them, so the
    /// manager keeps them as live (with no owner left to free them).
    stranded: Vec<(usize, u64)>,
    others: [u64; DEVICES],
    alloc_fault_armed: bool,
    /// A `FailNthFree` was armed (it may or may not have fired yet).
    free_fault_armed: bool,
    frees_failing: bool,
    mem_info_failing: bool,
}

fn align_up(value: u64, align: u64) -> u64 {
    value.div_ceil(align) * align
}

impl Harness {
    pub(super) fn new(setup: Setup) -> Harness {
        let spec = SimDeviceSpec {
            total_bytes: DEVICE_BYTES,
            ..SimDeviceSpec::default()
        };
        let sim = Arc::new(SimBackend::new(SimConfig {
            devices: vec![spec; DEVICES],
            ..SimConfig::default()
        }));
        let config = MemoryConfig {
            strategy: setup.strategy,
            shards: setup.shards,
            idle_pages_kept: setup.idle_pages_kept,
            max_pool_bytes: setup.max_pool_bytes,
            max_cached_bytes: setup.max_cached_bytes,
            release_idle_after: setup.release_idle_after,
            cleanup_interval: None,
            gpu_memory_fraction: 1.0,
            ..MemoryConfig::default()
        };
        let manager =
            MemoryManager::new(sim.clone(), config).expect("a valid configuration is accepted");
        Harness {
            faults: sim.faults(),
            sim,
            manager,
            setup,
            held: Vec::new(),
            stranded: Vec::new(),
            others: [0; DEVICES],
            alloc_fault_armed: false,
            free_fault_armed: false,
            frees_failing: false,
            mem_info_failing: false,
        }
    }

    pub(super) fn manager(&self) -> &MemoryManager {
        &self.manager
    }

    pub(super) fn held(&self) -> usize {
        self.held.len()
    }

    /// Runs one operation; an error names the broken expectation.
    pub(super) fn apply(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Alloc {
                device,
                size,
                align,
                stream,
            } => self.alloc(device, size, align, stream)?,
            Op::Free { index, explicit } => {
                if self.held.is_empty() {
                    return Ok(());
                }
                let buffer = self.held.swap_remove(index % self.held.len());
                let (device, size, ptr) = (buffer.device(), buffer.size(), buffer.ptr());
                // Only the direct strategy calls the driver on a free.
                let may_fail = self.setup.strategy == Strategy::Direct
                    && (self.frees_failing || self.free_fault_armed);
                if explicit {
                    match buffer.free() {
                        Ok(()) => {}
                        Err(BackendError::Injected(_)) if may_fail => {}
                        Err(other) => return Err(format!("free failed unexpectedly: {other}")),
                    }
                } else {
                    drop(buffer);
                }
                let still_live = || {
                    self.manager
                        .live_allocations()
                        .iter()
                        .any(|a| a.device == device && a.ptr == ptr)
                };
                if may_fail && still_live() {
                    self.stranded.push((device, size));
                }
            }
            Op::Trim { target } => {
                self.manager.trim(target);
            }
            Op::EmptyCache => {
                self.manager.empty_cache();
            }
            Op::UnmapCached => {
                self.manager.unmap_cached();
            }
            Op::ReleaseIdle => {
                self.manager.release_idle_older_than(Duration::ZERO);
            }
            Op::Maintain => {
                self.manager.maintain();
            }
            Op::ResetPeaks => self.manager.reset_peaks(),
            Op::FailNthAlloc(k) => {
                self.faults.fail_nth_alloc_from_now(k);
                self.alloc_fault_armed = true;
            }
            Op::FailNthFree(k) => {
                self.faults.fail_nth_free_from_now(k);
                self.free_fault_armed = true;
            }
            Op::FailFrees(on) => {
                self.faults.set_fail_frees(on);
                self.frees_failing = on;
            }
            Op::FailMemInfo(on) => {
                self.faults.set_fail_mem_info(on);
                self.mem_info_failing = on;
            }
            Op::UsedByOthers { device, bytes } => {
                self.sim
                    .set_used_by_others(device, bytes)
                    .map_err(|e| format!("set_used_by_others: {e}"))?;
                self.others[device] = bytes;
            }
        }
        Ok(())
    }

    fn alloc(&mut self, device: usize, size: u64, align: u64, stream: u64) -> Result<(), String> {
        let options = AllocOptions::default()
            .with_alignment(align)
            .on_stream(StreamId(stream));
        match self.manager.alloc(device, size, &options) {
            Ok(buffer) => {
                if device >= DEVICES || size == 0 || !align.is_power_of_two() || align > PAGE {
                    return Err(format!(
                        "alloc(device {device}, {size} bytes, align {align}) should have failed"
                    ));
                }
                if buffer.ptr() % align != 0 || buffer.size() != size || buffer.device() != device {
                    return Err(format!("alloc returned a wrong buffer: {buffer:?}"));
                }
                self.held.push(buffer);
                Ok(())
            }
            Err(error) => self.expected_failure(device, size, align, &error),
        }
    }

    /// Whether an allocation failure is one the input allows.
    fn expected_failure(
        &self,
        device: usize,
        size: u64,
        align: u64,
        error: &AllocError,
    ) -> Result<(), String> {
        let allowed = match error {
            AllocError::ZeroSize => size == 0,
            AllocError::InvalidAlignment(_) => !align.is_power_of_two() || align > PAGE,
            AllocError::Backend(BackendError::InvalidDevice { .. }) => device >= DEVICES,
            AllocError::TooLarge { .. } => size > DEVICE_BYTES,
            AllocError::Backend(BackendError::Injected(_)) => self.alloc_fault_armed,
            AllocError::OutOfMemory { .. }
            | AllocError::PoolLimit { .. }
            | AllocError::PressureCritical { .. } => true,
            AllocError::Backend(_) => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "alloc(device {device}, {size} bytes, align {align}) failed unexpectedly: {error}"
            ))
        }
    }

    /// Checks every invariant; the error names the first one broken.
    pub(super) fn check(&self) -> Result<(), String> {
        check_state(&State {
            manager: &self.manager,
            sim: &self.sim,
            held: &self.held,
            stranded: &self.stranded,
            others: &self.others,
            mem_info_failing: self.mem_info_failing,
        })
    }

    /// Frees everything, clears the faults and empties the cache: every byte goes back to the
    /// device except what stranded direct buffers still hold.
    pub(super) fn finish(mut self) -> Result<(), String> {
        self.faults.clear();
        self.frees_failing = false;
        self.free_fault_armed = false;
        self.mem_info_failing = false;
        self.held.clear();
        for device in 0..DEVICES {
            self.apply(&Op::UsedByOthers { device, bytes: 0 })?;
        }
        self.manager.empty_cache();
        self.check()?;
        for device in 0..DEVICES {
            let stranded: u64 = self
                .stranded
                .iter()
                .filter(|(d, _)| *d == device)
                .map(|(_, size)| align_up(align_up(*size, 512), PAGE))
                .sum();
            let reserved = self
                .manager
                .device_stats(device)
                .map_err(|e| e.to_string())?
                .counters
                .reserved_bytes;
            if reserved != stranded {
                return Err(format!(
                    "device {device}: {reserved} bytes still reserved after freeing everything and emptying the cache (expected {stranded})"
                ));
            }
        }
        Ok(())
    }
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

/// What the invariants are checked against: the manager, its simulated device, and what the
/// caller knows it holds.
pub(super) struct State<'a> {
    pub manager: &'a MemoryManager,
    pub sim: &'a SimBackend,
    pub held: &'a [DeviceBuffer],
    /// (device, requested bytes) of buffers dropped while the driver refused to free them.
    pub stranded: &'a [(usize, u64)],
    /// Bytes other processes hold on each device.
    pub others: &'a [u64],
    /// Whether `mem_info` faults are armed (they are lifted for the check, then re-armed).
    pub mem_info_failing: bool,
}

/// Checks every invariant of a quiet manager (no call in flight); the error names the first
/// one broken: live blocks never overlap and are exactly what the caller holds; the counters
/// agree with the live blocks and with each other; in use + cached = reserved in every pool;
/// the pools' reserved bytes add up to the device's; and the device itself says this process
/// holds exactly the reserved bytes.
pub(super) fn check_state(state: &State) -> Result<(), String> {
    let live = state.manager.live_allocations();
    let mut ranges: Vec<(usize, u64, u64)> = live
        .iter()
        .map(|a| (a.device, a.ptr, a.ptr + a.block_bytes.max(1)))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        if pair[0].0 == pair[1].0 && pair[0].2 > pair[1].1 {
            return Err(format!(
                "live blocks overlap: {:?} and {:?}",
                pair[0], pair[1]
            ));
        }
    }
    let by_ptr: HashMap<(usize, u64), (u64, u64)> = live
        .iter()
        .map(|a| ((a.device, a.ptr), (a.requested_bytes, a.block_bytes)))
        .collect();
    for buffer in state.held {
        match by_ptr.get(&(buffer.device(), buffer.ptr())) {
            Some(&(requested, block)) if requested == buffer.size() && block >= requested => {}
            other => return Err(format!("{buffer:?} is not live as held: {other:?}")),
        }
    }
    if live.len() != state.held.len() + state.stranded.len() {
        return Err(format!(
            "{} live allocations, but {} held and {} stranded",
            live.len(),
            state.held.len(),
            state.stranded.len()
        ));
    }
    for device in state.manager.device_indices() {
        check_device(state, device, &live)?;
    }
    check_pool_views(state)
}

fn check_device(
    state: &State,
    device: usize,
    live: &[gpumem::manager::views::LiveAllocation],
) -> Result<(), String> {
    let stats = state
        .manager
        .device_stats(device)
        .map_err(|e| format!("device_stats({device}): {e}"))?;
    let c = &stats.counters;
    let held = state.held.iter().filter(|b| b.device() == device);
    let stranded = state.stranded.iter().filter(|(d, _)| *d == device);
    let count = (held.clone().count() + stranded.clone().count()) as u64;
    let requested: u64 =
        held.map(DeviceBuffer::size).sum::<u64>() + stranded.map(|(_, s)| s).sum::<u64>();
    let blocks: u64 = live
        .iter()
        .filter(|a| a.device == device)
        .map(|a| a.block_bytes)
        .sum();
    let wrong = |what: &str, got: u64, want: u64| {
        Err(format!("device {device}: {what} is {got}, expected {want}"))
    };
    if c.live_allocations != count {
        return wrong("live_allocations", c.live_allocations, count);
    }
    if c.allocations.checked_sub(c.frees) != Some(c.live_allocations) {
        return Err(format!(
            "device {device}: allocations - frees != live: {c:?}"
        ));
    }
    if c.requested_bytes != requested {
        return wrong("requested_bytes", c.requested_bytes, requested);
    }
    if c.in_use_bytes != blocks {
        return wrong("in_use_bytes", c.in_use_bytes, blocks);
    }
    if c.in_use_bytes > c.reserved_bytes {
        return wrong(
            "in_use_bytes (over reserved)",
            c.in_use_bytes,
            c.reserved_bytes,
        );
    }
    if c.hits > c.requests || c.peak_reserved_bytes < c.reserved_bytes {
        return Err(format!("device {device}: inconsistent counters {c:?}"));
    }
    if c.peak_in_use_bytes < c.in_use_bytes || c.peak_requested_bytes < c.requested_bytes {
        return Err(format!("device {device}: a peak below its value: {c:?}"));
    }
    // Every byte the pools hold is a byte the device says this process holds.
    if let Some(used) = used_on_device(state, device)? {
        if used != c.reserved_bytes {
            return wrong("reserved_bytes (the device says)", c.reserved_bytes, used);
        }
    }
    Ok(())
}

/// Bytes the simulated device says this process holds (`None` when it cannot tell, because
/// other processes' memory fills the device).
fn used_on_device(state: &State, device: usize) -> Result<Option<u64>, String> {
    let faults = state.sim.faults();
    faults.set_fail_mem_info(false);
    let info = state.sim.mem_info(device);
    faults.set_fail_mem_info(state.mem_info_failing);
    let info = info.map_err(|e| format!("mem_info({device}): {e}"))?;
    let others = state.others.get(device).copied().unwrap_or(0);
    if info.free == 0 {
        return Ok(None);
    }
    Ok(Some(info.total - others - info.free))
}

fn check_pool_views(state: &State) -> Result<(), String> {
    let mut reserved_by_views: HashMap<usize, u64> = HashMap::new();
    for view in state.manager.pool_views() {
        let c = &view.counters;
        if c.in_use_bytes > c.reserved_bytes
            || view.cached_free_bytes != c.reserved_bytes - c.in_use_bytes
            || view.largest_cached_free_block_bytes > view.cached_free_bytes
            || !(0.0..=1.0).contains(&view.fragmentation_ratio)
            || c.peak_in_use_bytes < c.in_use_bytes
            || c.peak_reserved_bytes < c.reserved_bytes
        {
            return Err(format!("inconsistent pool view: {view:?}"));
        }
        *reserved_by_views.entry(view.device).or_default() += c.reserved_bytes;
    }
    for device in state.manager.device_indices() {
        let by_views = reserved_by_views.get(&device).copied().unwrap_or(0);
        let stats = state
            .manager
            .device_stats(device)
            .map_err(|e| e.to_string())?;
        let total = stats.counters.reserved_bytes;
        // Pages kept in the reserve are held by no pool but counted in the device's total.
        if by_views + stats.page_reserve_bytes != total {
            return Err(format!(
                "device {device}: the pools map {by_views} bytes and the page reserve keeps {}, the device total says {total}",
                stats.page_reserve_bytes
            ));
        }
    }
    Ok(())
}
