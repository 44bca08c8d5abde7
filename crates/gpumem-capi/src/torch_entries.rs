//! The entry points of the C ABI that only the PyTorch layer (`python/gpumem/torch_layer/`,
//! PyTorch's `CUDAAllocator` interface implemented over this library) calls; what each does is
//! in `pytorch.rs`. Like every entry point, none unwinds: failures return -1 or null and leave
//! their message for `gpumem_last_error`.

use super::{calls, guarded, pytorch, to_c_string};
use std::ffi::{c_char, c_double, c_int, c_void};

/// Like `gpumem_alloc`, for a caller that routes allocations made during CUDA graph capture
/// itself (the PyTorch layer sends them to PyTorch's private pools, as PyTorch's own allocator
/// does): the memory never goes to one of gpumem's graph pools, even while `stream` captures,
/// and no driver call asks whether it does. The PyTorch layer's pools take their segments here
/// too, and keep them as long as a graph may replay into them.
#[no_mangle]
pub extern "C" fn gpumem_alloc_routed(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    super::alloc_entry(
        "gpumem_alloc_routed",
        size,
        device,
        stream,
        calls::Capture::Ignored,
    )
}

/// Frees an allocation by its pointer alone (a tensor's deleter knows nothing else).
#[no_mangle]
pub extern "C" fn gpumem_free_ptr(ptr: *mut c_void) {
    guarded("gpumem_free_ptr", (), || {
        calls::free(ptr as usize as u64, None)
    })
}

/// Fills `out` with `device`'s statistics under PyTorch's names (`gpumem_device_stats_t`).
/// Returns 0, or -1.
///
/// # Safety
/// `out` is null or points to a writable `gpumem_device_stats_t`.
#[no_mangle]
pub unsafe extern "C" fn gpumem_device_stats(
    device: c_int,
    out: *mut pytorch::DeviceStats,
) -> c_int {
    guarded("gpumem_device_stats", -1, || {
        if out.is_null() {
            return Err("the statistics' destination is null".to_string());
        }
        let stats = pytorch::device_stats(calls::device_index(device)?)?;
        // SAFETY: non-null, and the caller promises a writable struct of this layout.
        unsafe { out.write(stats) };
        Ok(0)
    })
}

/// The pools of `device` map at most `fraction` of it from now on (PyTorch's
/// `set_per_process_memory_fraction`). Returns 0, or -1 for a fraction outside (0, 1].
#[no_mangle]
pub extern "C" fn gpumem_set_memory_fraction(device: c_int, fraction: c_double) -> c_int {
    guarded("gpumem_set_memory_fraction", -1, || {
        pytorch::set_memory_fraction(calls::device_index(device)?, fraction).map(|()| 0)
    })
}

/// The share of `device` the pools may map, or -1.
#[no_mangle]
pub extern "C" fn gpumem_memory_fraction(device: c_int) -> c_double {
    guarded("gpumem_memory_fraction", -1.0, || {
        pytorch::memory_fraction(calls::device_index(device)?)
    })
}

/// The largest block `device` can hand out without calling the driver, in bytes, or -1.
#[no_mangle]
pub extern "C" fn gpumem_largest_free_block(device: c_int) -> i64 {
    guarded("gpumem_largest_free_block", -1, || {
        let runtime = super::runtime::runtime()?;
        let bytes = pytorch::largest_free_block(runtime, calls::device_index(device)?);
        Ok(i64::try_from(bytes).unwrap_or(i64::MAX))
    })
}

/// The size asked for at `ptr`, a live allocation of this library, or -1.
#[no_mangle]
pub extern "C" fn gpumem_allocation_size(ptr: *mut c_void) -> i64 {
    guarded("gpumem_allocation_size", -1, || {
        let ptr = ptr as usize as u64;
        let size = super::runtime::runtime()?
            .live
            .size_of(ptr)
            .ok_or_else(|| format!("{ptr:#x} is not a live allocation of gpumem"))?;
        Ok(i64::try_from(size).unwrap_or(i64::MAX))
    })
}

/// `device`'s segments and blocks as text (see `pytorch::segments_text`), or null.
#[no_mangle]
pub extern "C" fn gpumem_segments_text(device: c_int) -> *mut c_char {
    guarded("gpumem_segments_text", std::ptr::null_mut(), || {
        pytorch::segments_text(calls::device_index(device)?).map(to_c_string)
    })
}

/// The chunks under `[ptr, ptr + len)` on `device`, exported as file descriptors another
/// process imports (see `pytorch::export_chunks_text`), or null.
#[no_mangle]
pub extern "C" fn gpumem_export_chunks(device: c_int, ptr: *mut c_void, len: u64) -> *mut c_char {
    guarded("gpumem_export_chunks", std::ptr::null_mut(), || {
        pytorch::export_chunks_text(calls::device_index(device)?, ptr as usize as u64, len)
            .map(to_c_string)
    })
}

/// The message of the out-of-memory error for `size` bytes refused on `device`, gpumem's
/// reason (this thread's latest error) included; or null.
#[no_mangle]
pub extern "C" fn gpumem_oom_message(device: c_int, size: isize) -> *mut c_char {
    let reason = super::last_error().unwrap_or_else(|| "the allocation was refused".into());
    guarded("gpumem_oom_message", std::ptr::null_mut(), || {
        let size = u64::try_from(size).map_err(|_| format!("size {size} is negative"))?;
        let reason = reason.strip_prefix("gpumem_alloc: ").unwrap_or(&reason);
        pytorch::oom_message(calls::device_index(device)?, size, reason).map(to_c_string)
    })
}

/// Whether failures are also printed on stderr (1, the default) or only kept for
/// `gpumem_last_error` (0: the caller raises them itself, and a second report on stderr would
/// say the same thing twice). Failures of `gpumem_alloc`, `gpumem_free` and `gpumem_free_ptr`
/// are printed either way: PyTorch's pluggable allocator and a tensor's deleter read nothing.
#[no_mangle]
pub extern "C" fn gpumem_print_errors(on: c_int) -> c_int {
    super::PRINT_ERRORS.store(on != 0, std::sync::atomic::Ordering::Relaxed);
    0
}
