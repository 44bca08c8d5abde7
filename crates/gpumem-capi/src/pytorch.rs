//! What PyTorch's allocator interface asks beyond alloc and free, for the C++ layer that
//! implements that interface over this library (`python/gpumem/torch_layer/`):
//! statistics under PyTorch's names, the memory fraction, the segments of a memory snapshot,
//! and the out-of-memory message. Safe Rust with `Result<_, String>`; `torch_entries.rs` holds
//! the entry points.

use super::runtime::{runtime, Runtime};
use gpumem::pool::CounterValues;
use std::fmt::Write as _;

/// One of PyTorch's `Stat`s: `current`, `peak`, `allocated` (events or bytes in, ever) and
/// `freed` (out, ever).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
    pub allocated: u64,
    pub freed: u64,
}

/// PyTorch's `DeviceStats`, each array indexed all, small pool, large pool
/// (`gpumem_device_stats_t` in the header; the layout is the header's).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub allocation: [Stat; 3],
    pub segment: [Stat; 3],
    pub active: [Stat; 3],
    pub inactive_split: [Stat; 3],
    pub allocated_bytes: [Stat; 3],
    pub reserved_bytes: [Stat; 3],
    pub active_bytes: [Stat; 3],
    pub inactive_split_bytes: [Stat; 3],
    pub requested_bytes: [Stat; 3],
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
}

/// The statistics of `device`: the `all` column from the device's own totals (exact peaks),
/// the small and large pools from their own counters.
pub(super) fn device_stats(device: usize) -> Result<DeviceStats, String> {
    let runtime = runtime()?;
    let manager = &runtime.manager;
    let totals = manager.device_stats(device).map_err(|e| e.to_string())?;
    let [small, large] = manager
        .counters_by_size(device)
        .map_err(|e| e.to_string())?;
    let mut stats = DeviceStats {
        num_alloc_retries: totals.oom_retries,
        num_ooms: totals.ooms,
        num_device_alloc: totals.counters.driver_allocs,
        num_device_free: totals.counters.driver_frees,
        ..DeviceStats::default()
    };
    for (column, counters) in [(0, &totals.counters), (1, &small), (2, &large)] {
        fill_column(&mut stats, column, counters);
    }
    Ok(stats)
}

/// One column of the statistics from gpumem's counters. gpumem has no record-stream state
/// apart from allocated (a block waiting for other streams is still allocated) and cuts no
/// blocks it cannot give back whole, so `active` is `allocated` and an "inactive split" block
/// is free space inside mapped pages; a segment is a mapped chunk.
fn fill_column(stats: &mut DeviceStats, column: usize, c: &CounterValues) {
    let count = Stat {
        current: c.live_allocations,
        peak: c.live_allocations,
        allocated: c.allocations,
        freed: c.frees,
    };
    let in_use = Stat {
        current: c.in_use_bytes,
        peak: c.peak_in_use_bytes,
        ..Stat::default()
    };
    stats.allocation[column] = count;
    stats.active[column] = count;
    stats.allocated_bytes[column] = in_use;
    stats.active_bytes[column] = in_use;
    stats.requested_bytes[column] = Stat {
        current: c.requested_bytes,
        peak: c.peak_requested_bytes,
        ..Stat::default()
    };
    stats.reserved_bytes[column] = Stat {
        current: c.reserved_bytes,
        peak: c.peak_reserved_bytes,
        ..Stat::default()
    };
    stats.inactive_split_bytes[column] = Stat {
        current: c.reserved_bytes.saturating_sub(c.in_use_bytes),
        ..Stat::default()
    };
    stats.segment[column] = Stat {
        current: c.driver_allocs.saturating_sub(c.driver_frees),
        allocated: c.driver_allocs,
        freed: c.driver_frees,
        ..Stat::default()
    };
}

pub(super) fn set_memory_fraction(device: usize, fraction: f64) -> Result<(), String> {
    runtime()?
        .manager
        .set_memory_fraction(device, fraction)
        .map_err(|e| e.to_string())
}

pub(super) fn memory_fraction(device: usize) -> Result<f64, String> {
    runtime()?
        .manager
        .memory_fraction(device)
        .map_err(|e| e.to_string())
}

/// The largest block `device` could hand out without calling the driver.
pub(super) fn largest_free_block(runtime: &Runtime, device: usize) -> u64 {
    runtime
        .manager
        .pool_views()
        .iter()
        .filter(|view| view.device == device)
        .map(|view| view.largest_cached_free_block_bytes)
        .max()
        .unwrap_or(0)
}

/// The chunks mapped under `[addr, addr + len)` on `device`, exported for another process
/// (CUDA IPC; the CUDA backend only): `C <address> <size> <fd>` a line, in address order,
/// decimal. The descriptors stay open until their chunks are released.
pub(super) fn export_chunks_text(device: usize, addr: u64, len: u64) -> Result<String, String> {
    let runtime = runtime()?;
    let backend = runtime.manager.backend();
    let cuda = backend.shareable().ok_or_else(|| {
        format!(
            "sharing memory with another process needs the CUDA backend; this one is {}",
            backend.kind()
        )
    })?;
    let chunks = runtime
        .keeping_host_context(|| cuda.export_chunks(device, addr, len))
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    for chunk in chunks {
        let _ = writeln!(text, "C {} {} {}", chunk.addr, chunk.bytes, chunk.fd);
    }
    Ok(text)
}

/// The segments of `device` as text, one line each, then a line per block:
/// `S <address> <size> <stream> <small|large|direct> <graph 0|1>` and
/// `B <address> <size> <requested> <allocated 0|1> <tag or ->`. Addresses and sizes in
/// decimal; a tag is cleaned text without spaces' meaning (it runs to the end of the line).
pub(super) fn segments_text(device: usize) -> Result<String, String> {
    let runtime = runtime()?;
    let segments = runtime
        .keeping_host_context(|| runtime.manager.segments(device))
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    for segment in segments {
        let _ = writeln!(
            text,
            "S {} {} {} {} {}",
            segment.address,
            segment.size,
            segment.stream.0,
            segment.pool.name(),
            u8::from(segment.graph_pool)
        );
        for block in segment.blocks {
            let tag = block.tag.as_deref().unwrap_or("-").replace('\n', " ");
            let _ = writeln!(
                text,
                "B {} {} {} {} {}",
                block.address,
                block.size,
                block.requested,
                u8::from(block.allocated),
                tag
            );
        }
    }
    Ok(text)
}

/// PyTorch's way of writing a size in an out-of-memory message: two decimals of the largest
/// binary unit up to GiB.
fn torch_size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes <= 1 << 20 {
        format!("{:.2} KiB", b / KIB)
    } else if bytes <= 1 << 30 {
        format!("{:.2} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

/// What other processes hold on `device`, from NVML: (total bytes, the largest holders as
/// "pid N: size"). `None` when NVML cannot say, or this build has no NVML.
#[cfg(not(feature = "exporter"))]
fn other_processes(_runtime: &Runtime, _device: usize) -> Option<(u64, Vec<String>)> {
    None // NVML comes with the exporter's crate
}

#[cfg(feature = "exporter")]
fn other_processes(runtime: &Runtime, device: usize) -> Option<(u64, Vec<String>)> {
    use gpumem_observe::nvml::NvmlReader;
    static NVML: std::sync::OnceLock<Option<NvmlReader>> = std::sync::OnceLock::new();
    let nvml = NVML.get_or_init(|| NvmlReader::open(None).ok()).as_ref()?;
    let uuid = runtime.manager.backend().properties(device).ok()?.uuid;
    let reading = nvml.read(None).ok()?;
    let ours = std::process::id();
    let mut others: Vec<(u32, u64)> = reading
        .into_iter()
        .find(|d| !uuid.is_empty() && d.uuid == uuid)?
        .processes
        .ok()?
        .into_iter()
        .filter(|p| p.pid != ours)
        .map(|p| (p.pid, p.used_bytes.unwrap_or(0)))
        .collect();
    others.sort_by_key(|&(_, bytes)| std::cmp::Reverse(bytes));
    let total = others.iter().map(|&(_, bytes)| bytes).sum();
    let named = others
        .iter()
        .take(3)
        .map(|&(pid, bytes)| format!("pid {pid}: {}", torch_size(bytes)))
        .collect();
    Some((total, named))
}

/// The message of the `torch.cuda.OutOfMemoryError` for a refused `size` bytes on `device`:
/// PyTorch's opening, then what gpumem knows — what it holds, its largest free block, what
/// other processes hold, this thread's tag — and `reason`, gpumem's own explanation.
pub(super) fn oom_message(device: usize, size: u64, reason: &str) -> Result<String, String> {
    let runtime = runtime()?;
    let manager = &runtime.manager;
    let mut text = format!(
        "CUDA out of memory. Tried to allocate {}.",
        torch_size(size)
    );
    if let Ok(info) = manager.backend().mem_info(device) {
        let _ = write!(
            text,
            " GPU {device} has a total capacity of {} of which {} is free.",
            torch_size(info.total),
            torch_size(info.free)
        );
    }
    if let Ok(stats) = manager.device_stats(device) {
        let c = stats.counters;
        let _ = write!(
            text,
            " Of the memory gpumem holds for this process, {} is allocated and {} is reserved \
             but unallocated (largest free block {}).",
            torch_size(c.in_use_bytes),
            torch_size(c.reserved_bytes.saturating_sub(c.in_use_bytes)),
            torch_size(largest_free_block(runtime, device))
        );
    }
    if let Some((total, named)) = other_processes(runtime, device) {
        if named.is_empty() {
            text.push_str(" No other process holds memory on it.");
        } else {
            let _ = write!(
                text,
                " Other processes hold {} ({}).",
                torch_size(total),
                named.join(", ")
            );
        }
    }
    let tag = super::tags::with_options(|options| options.tag.as_ref().map(|t| t.name()));
    if let Some(tag) = tag {
        let _ = write!(text, " The allocation's tag: {tag}.");
    }
    let _ = write!(text, " gpumem: {reason}.");
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_written_as_pytorch_writes_them() {
        assert_eq!(torch_size(512), "0.50 KiB");
        assert_eq!(torch_size(1 << 20), "1024.00 KiB");
        assert_eq!(torch_size(20 << 20), "20.00 MiB");
        assert_eq!(torch_size(3 << 30), "3.00 GiB");
    }

    #[test]
    fn a_column_reads_gpumem_counters_under_pytorch_names() {
        let counters = CounterValues {
            in_use_bytes: 100,
            peak_in_use_bytes: 300,
            reserved_bytes: 400,
            requested_bytes: 90,
            live_allocations: 2,
            allocations: 7,
            frees: 5,
            driver_allocs: 3,
            driver_frees: 1,
            ..CounterValues::default()
        };
        let mut stats = DeviceStats::default();
        fill_column(&mut stats, 2, &counters);
        assert_eq!(stats.allocated_bytes[2].peak, 300);
        assert_eq!(stats.inactive_split_bytes[2].current, 300);
        assert_eq!(stats.allocation[2].allocated - stats.allocation[2].freed, 2);
        assert_eq!(stats.segment[2].current, 2);
        assert_eq!(
            stats.allocation[0],
            Stat::default(),
            "other columns untouched"
        );
    }
}
