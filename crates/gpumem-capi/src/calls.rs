//! What each C entry point does, in safe Rust with `Result<_, String>`: `mod.rs` only converts
//! arguments, catches panics and records errors.

use super::runtime::{runtime, Runtime};
use gpumem::backend::StreamId;
use gpumem::snapshot::{capture, CaptureSettings};
use serde_json::{json, Map, Value};

/// The alignment PyTorch's own allocator gives every block; kernels may rely on it.
const ALIGNMENT: u64 = 512;

pub(super) fn device_index(device: i32) -> Result<usize, String> {
    usize::try_from(device).map_err(|_| format!("device {device} is not a device index"))
}

/// Whether an allocation on a stream that is capturing a CUDA graph goes to a graph pool.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Capture {
    /// Yes: the memory must stay out of every other allocation's reach while the graph lives.
    ToGraphPool,
    /// No: the caller routes captured allocations itself (the PyTorch layer's private pools,
    /// which hold their memory as long as any graph may replay into it).
    Ignored,
}

/// `size` bytes on `device` for `stream`, tagged with this thread's tag (`tags`).
pub(super) fn alloc(
    size: isize,
    device: i32,
    stream: u64,
    capture: Capture,
) -> Result<u64, String> {
    let size = u64::try_from(size).map_err(|_| format!("size {size} is negative"))?;
    if size == 0 {
        // PyTorch asks for empty tensors too; like its own allocator, no memory and no error.
        return Ok(0);
    }
    let device = device_index(device)?;
    let runtime = runtime()?;
    let stream = StreamId(stream);
    runtime.keeping_host_context(|| {
        runtime.free_what_streams_finished();
        let graph_pool = match capture {
            Capture::ToGraphPool => runtime.graph_pool_for(device, stream)?,
            Capture::Ignored => None,
        };
        let buffer = super::tags::with_options(|options| {
            options.alignment = ALIGNMENT;
            options.stream = stream;
            options.graph_pool = graph_pool;
            runtime.manager.alloc(device, size, options)
        })
        .map_err(|e| e.to_string())?;
        let ptr = buffer.ptr();
        if let Some(stale) = runtime.live.insert(buffer) {
            // Never expected: the pools handed out an address that is still live. Freeing the
            // older record would free the new one's block too, so it is kept (leaked) instead.
            std::mem::forget(stale);
            super::record_error(
                "gpumem_alloc",
                &format!("address {ptr:#x} was handed out twice"),
            );
        }
        Ok(ptr)
    })
}

/// How the host described the allocation it frees, to be checked against gpumem's record.
pub(super) struct Described {
    pub size: isize,
    pub device: i32,
    pub stream: u64,
}

pub(super) fn free(ptr: u64, described: Option<Described>) -> Result<(), String> {
    if ptr == 0 || super::fork::in_forked_child() {
        // A forked child's memory is its parent's, for the parent to free.
        return Ok(());
    }
    let runtime = runtime()?;
    let Some(live) = runtime.live.remove(ptr) else {
        return Err(format!(
            "{ptr:#x} was not allocated by gpumem_alloc, or was freed already"
        ));
    };
    let mismatch = described.and_then(|d| describe_mismatch(&live.buffer, d));
    runtime.keeping_host_context(|| {
        runtime.free_what_streams_finished();
        runtime.free_when_streams_done(live)
    })?;
    // Freed anyway: the pointer is what identifies the allocation.
    mismatch.map_or(Ok(()), Err)
}

/// The host used the allocation at `ptr` on `stream` too: when freed, its memory waits for the
/// work queued on `stream` by then.
pub(super) fn record_stream(ptr: u64, stream: u64) -> Result<(), String> {
    let runtime = runtime()?;
    if runtime.live.record_use(ptr, StreamId(stream)) {
        Ok(())
    } else {
        Err(format!("{ptr:#x} is not a live allocation of gpumem_alloc"))
    }
}

/// The host's idea of the allocation differs from ours: worth saying, not worth leaking over.
fn describe_mismatch(buffer: &gpumem::DeviceBuffer, described: Described) -> Option<String> {
    let Described {
        size,
        device,
        stream,
    } = described;
    let sized = u64::try_from(size).is_ok_and(|s| s == buffer.size());
    let placed = usize::try_from(device).is_ok_and(|d| d == buffer.device());
    (!sized || !placed || stream != buffer.stream().0).then(|| {
        format!(
            "freed {:#x} as {size} bytes on device {device}, stream {stream:#x}, but it was \
             allocated as {} bytes on device {}, stream {:#x} (freed all the same)",
            buffer.ptr(),
            buffer.size(),
            buffer.device(),
            buffer.stream().0
        )
    })
}

pub(super) fn empty_cache() -> Result<i64, String> {
    if super::fork::in_forked_child() {
        // Nothing cached is this process's (PyTorch's own empty_cache does nothing there too).
        return Ok(0);
    }
    let runtime = runtime()?;
    let released = runtime.keeping_host_context(|| {
        // Memory whose other streams are done is free: it goes back with the rest.
        runtime.free_what_streams_finished();
        runtime.manager.empty_cache()
    });
    Ok(i64::try_from(released).unwrap_or(i64::MAX))
}

fn capture_settings(runtime: &Runtime) -> CaptureSettings {
    let config = runtime.manager.config();
    CaptureSettings {
        leak_age: config.leak_age,
        pressure: config.pressure,
        ..CaptureSettings::default()
    }
}

pub(super) fn snapshot_json() -> Result<String, String> {
    let runtime = runtime()?;
    let snapshot = runtime.keeping_host_context(|| {
        capture(
            std::slice::from_ref(&runtime.manager),
            &capture_settings(runtime),
        )
    });
    serde_json::to_string(&snapshot).map_err(|e| e.to_string())
}

pub(super) fn memory_stats_json(device: i32) -> Result<String, String> {
    let runtime = runtime()?;
    let stats = memory_stats(runtime, device_index(device)?)?;
    serde_json::to_string(&stats).map_err(|e| e.to_string())
}

/// The keys of `torch.cuda.memory_stats()` that gpumem can fill in, with the same meanings
/// (pools are not split into PyTorch's small and large here: `all` only), plus the number of
/// live allocations the C ABI holds.
pub(super) fn memory_stats(runtime: &Runtime, device: usize) -> Result<Value, String> {
    let stats = runtime
        .manager
        .device_stats(device)
        .map_err(|e| e.to_string())?;
    let c = &stats.counters;
    let mut out = Map::new();
    let mut put = |key: &str, value: u64| {
        out.insert(key.to_string(), json!(value));
    };
    put("allocated_bytes.all.current", c.in_use_bytes);
    put("allocated_bytes.all.peak", c.peak_in_use_bytes);
    put("active_bytes.all.current", c.in_use_bytes);
    put("active_bytes.all.peak", c.peak_in_use_bytes);
    put("requested_bytes.all.current", c.requested_bytes);
    put("requested_bytes.all.peak", c.peak_requested_bytes);
    put("reserved_bytes.all.current", c.reserved_bytes);
    put("reserved_bytes.all.peak", c.peak_reserved_bytes);
    put(
        "inactive_split_bytes.all.current",
        c.reserved_bytes.saturating_sub(c.in_use_bytes),
    );
    put("allocation.all.current", c.live_allocations);
    put("allocation.all.allocated", c.allocations);
    put("allocation.all.freed", c.frees);
    put("segment.all.allocated", c.driver_allocs);
    put("segment.all.freed", c.driver_frees);
    put("num_device_alloc", c.driver_allocs);
    put("num_device_free", c.driver_frees);
    put("num_ooms", stats.ooms);
    put("num_alloc_retries", stats.oom_retries);
    put("pool_requests", c.requests);
    put("pool_hits", c.hits);
    put("pool_misses", stats.misses);
    put("pool_miss_ns_total", stats.miss_ns_total);
    put("pool_gpu_waits", stats.gpu_waits);
    put("pool_gpu_wait_ns_total", stats.gpu_wait_ns_total);
    put("pool_gpu_wait_ns_longest", stats.gpu_wait_ns_longest);
    // Where the adaptive default stands (docs/configuration.md): absent with a fixed setting.
    if let Some((_, Some(level))) = runtime.manager.cache_setting(device) {
        put("cache_adaptive_level", u64::from(level));
    }
    // How far past its budget a miss may go without waiting: absent where it has no end.
    let room = runtime
        .manager
        .room_without_waiting(device)
        .map_err(|e| e.to_string())?;
    if let Some(room) = room {
        put("cache_room_without_waiting_bytes", room);
    }
    // Whether a miss lends its stream's busy idle pages instead of waiting, and how often it did.
    let (lending, lendings) = runtime
        .manager
        .stream_ordered_reuse(device)
        .map_err(|e| e.to_string())?;
    put("cache_stream_ordered_reuse", u64::from(lending));
    put("pool_lendings", lendings);
    put("ffi_live_allocations", runtime.live.len() as u64);
    put(
        "ffi_frees_waiting_for_streams",
        runtime.deferred.len() as u64,
    );
    let graph_pools = runtime
        .manager
        .graph_pools(device)
        .map_err(|e| e.to_string())?;
    let held: Vec<_> = graph_pools.iter().filter(|pool| pool.pinned).collect();
    put("graph_pools.current", held.len() as u64);
    put(
        "graph_pool_reserved_bytes.current",
        held.iter().map(|pool| pool.mapped_bytes).sum(),
    );
    put(
        "graph_pool_allocated_bytes.current",
        held.iter().map(|pool| pool.in_use_bytes).sum(),
    );
    Ok(Value::Object(out))
}
