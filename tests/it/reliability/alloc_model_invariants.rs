//! The allocator model's invariants: what must hold of a quiet manager, its simulated device
//! and what the caller holds, checked after every operation (and by the stress tests at the end).

use gpumem::backend::sim::SimBackend;
use gpumem::manager::{DeviceBuffer, MemoryManager};
use gpumem::DeviceBackend;
use std::collections::HashMap;

/// What the invariants are checked against: the manager, its simulated device, and what the
/// caller knows it holds.
pub(crate) struct State<'a> {
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
pub(crate) fn check_state(state: &State) -> Result<(), String> {
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
