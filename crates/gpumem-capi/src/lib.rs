//! The C ABI over the manager, for hosts that are not Rust: PyTorch loads `gpumem_alloc` and
//! `gpumem_free` as its CUDA allocator (`CUDAPluggableAllocator`), the PyTorch layer
//! (`python/gpumem/torch_layer/`) calls the entries of `torch_entries.rs`, and the Python package
//! calls the rest through ctypes. Nothing unwinds across this boundary: every entry point catches
//! panics, records what went wrong for `gpumem_last_error`, and returns null or -1.
//!
//! Strings handed out (`gpumem_snapshot_json`, `gpumem_memory_stats_json`, `gpumem_last_error`)
//! are the caller's to release with `gpumem_string_free`. The header is
//! `python/gpumem/gpumem.h` (the Python package ships it); `docs/pytorch.md` describes the
//! behaviour.

// With the CUDA backend, the only module allowed `unsafe`: raw pointers cross this boundary.
#![allow(unsafe_code)]

mod calls;
mod deferred_frees;
mod exporting;
mod fork;
mod graphs;
mod live;
pub mod pytorch;
mod runtime;
mod tags;
mod torch_entries;

pub use runtime::install;
pub use torch_entries::*;

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// At most this many errors are printed to stderr; all are kept for `gpumem_last_error`.
const PRINTED_ERRORS: u32 = 20;

thread_local! {
    /// This thread's latest error, for `gpumem_last_error` (like `errno`: another thread's
    /// failure never shows up here).
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A tag argument: null or "" is no tag.
///
/// # Safety
/// `tag` is null or a NUL-terminated string valid for the call.
unsafe fn tag_argument(tag: *const c_char) -> Result<Option<gpumem::Tag>, String> {
    // SAFETY: forwarded from this function's own contract.
    let name = unsafe { optional_str(tag) }?;
    Ok(name.filter(|n| !n.is_empty()).map(gpumem::Tag::new))
}

/// Runs one entry point: its error (or panic) is recorded and `failed` returned instead.
fn guarded<T>(call: &'static str, failed: T, body: impl FnOnce() -> Result<T, String>) -> T {
    fork::watch();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(message)) => {
            record_error(call, &message);
            failed
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            record_error(call, &format!("internal error (panic): {message}"));
            failed
        }
    }
}

/// This thread's latest error, if any.
fn last_error() -> Option<String> {
    LAST_ERROR.with(|last| last.borrow().clone())
}

/// Keeps the error for `gpumem_last_error` and prints it: a host such as PyTorch sees only a
/// null pointer, so stderr is where a person learns why.
fn record_error(call: &str, message: &str) {
    static PRINTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let line = format!("{call}: {message}");
    LAST_ERROR.with(|last| *last.borrow_mut() = Some(line.clone()));
    // A caller that raises what it reads from gpumem_last_error turns printing off, so a
    // failure is not reported twice; PyTorch's pluggable allocator reads nothing, so what its
    // calls (and a tensor's deleter) hit is printed whatever the setting.
    let unseen = matches!(call, "gpumem_alloc" | "gpumem_free" | "gpumem_free_ptr");
    if !unseen && !PRINT_ERRORS.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let printed = PRINTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let print = |text: &str| {
        if fork::in_forked_child() {
            fork::print_unlocked(text);
        } else {
            eprintln!("{text}");
        }
    };
    if printed < PRINTED_ERRORS {
        print(&format!("gpumem: {line}"));
    } else if printed == PRINTED_ERRORS {
        print("gpumem: more errors follow; gpumem_last_error() has the latest");
    }
}

/// Whether `record_error` prints too (`gpumem_print_errors`).
static PRINT_ERRORS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// A C string argument as UTF-8; null is `None`.
///
/// # Safety
/// `text` is null or points to a NUL-terminated string that stays valid during the call.
unsafe fn optional_str<'a>(text: *const c_char) -> Result<Option<&'a str>, String> {
    if text.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string alive for the call.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str()
        .map(Some)
        .map_err(|_| "the string argument is not UTF-8".to_string())
}

/// Hands a string to C; interior NULs (impossible in JSON and in our messages) become spaces.
fn to_c_string(text: String) -> *mut c_char {
    let bytes: Vec<u8> = text
        .into_bytes()
        .into_iter()
        .map(|b| if b == 0 { b' ' } else { b })
        .collect();
    CString::new(bytes).map_or(std::ptr::null_mut(), CString::into_raw)
}

/// PyTorch's `alloc_fn`: `size` bytes on `device` for use on `stream`. Null when it fails (the
/// reason in `gpumem_last_error`) and for size 0.
#[no_mangle]
pub extern "C" fn gpumem_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    alloc_entry(
        "gpumem_alloc",
        size,
        device,
        stream,
        calls::Capture::ToGraphPool,
    )
}

/// An allocation entry point: `calls::alloc` guarded, its pointer as C sees it.
fn alloc_entry(
    call: &'static str,
    size: isize,
    device: c_int,
    stream: *mut c_void,
    capture: calls::Capture,
) -> *mut c_void {
    guarded(call, std::ptr::null_mut(), || {
        calls::alloc(size, device, stream as usize as u64, capture).map(|ptr| ptr as *mut c_void)
    })
}

/// PyTorch's `free_fn`: gives back memory from `gpumem_alloc`. Its memory is reused at once on
/// the stream it was allocated for (after the other streams named with `gpumem_record_stream`
/// are done with it); `size`, `device` and `stream` are checked against the allocation's own.
#[no_mangle]
pub extern "C" fn gpumem_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    guarded("gpumem_free", (), || {
        let described = calls::Described {
            size,
            device,
            stream: stream as usize as u64,
        };
        calls::free(ptr as usize as u64, Some(described))
    })
}

/// The CUDA graph capture now running on `stream` allocates from the graph pool PyTorch names
/// `(pool_high, pool_low)` (`CUDAGraph.pool()`), shared with other graphs captured into it; one
/// more graph now uses that pool. Without this call a capture allocates from a pool of its own,
/// kept for the life of the process. Returns 0, or -1 when the stream is not capturing.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_begin(
    device: c_int,
    stream: *mut c_void,
    pool_high: u64,
    pool_low: u64,
) -> c_int {
    guarded("gpumem_graph_pool_begin", -1, || {
        let device = calls::device_index(device)?;
        let pool = graphs::named_pool(pool_high, pool_low);
        let stream = gpumem::backend::StreamId(stream as usize as u64);
        runtime::runtime()?.begin_graph_pool(device, stream, pool)?;
        Ok(0)
    })
}

/// A graph captured into pool `(pool_high, pool_low)` is gone. When no graph uses the pool any
/// more, its free memory goes back to the cache (what is still allocated from it follows when
/// freed). Returns the bytes released now, or -1.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_release(device: c_int, pool_high: u64, pool_low: u64) -> i64 {
    guarded("gpumem_graph_pool_release", -1, || {
        let device = calls::device_index(device)?;
        let pool = graphs::named_pool(pool_high, pool_low);
        let released = runtime::runtime()?.release_graph_pool(device, pool)?;
        Ok(i64::try_from(released).unwrap_or(i64::MAX))
    })
}

/// The allocation at `ptr` is used on `stream` too (PyTorch's `Tensor.record_stream`): when it
/// is freed, its memory is reused only after the work queued on `stream` by then has run.
/// Returns 0, or -1 when `ptr` is not a live allocation of `gpumem_alloc`.
#[no_mangle]
pub extern "C" fn gpumem_record_stream(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    guarded("gpumem_record_stream", -1, || {
        calls::record_stream(ptr as usize as u64, stream as usize as u64).map(|()| 0)
    })
}

/// Tags this thread's next allocations (`kv_cache`, `weights`, ...); null or "" clears the tag.
/// Returns 0, or -1 when the tag is not UTF-8.
///
/// # Safety
/// `tag` is null or a NUL-terminated string valid for the call.
#[no_mangle]
pub unsafe extern "C" fn gpumem_set_tag(tag: *const c_char) -> c_int {
    guarded("gpumem_set_tag", -1, || {
        if fork::in_forked_child() {
            // Tags only name allocations, which a child cannot make; interning one would
            // take a lock.
            return Ok(0);
        }
        // SAFETY: forwarded from this function's own contract.
        let tag = unsafe { tag_argument(tag) }?;
        tags::set_own(tag);
        Ok(0)
    })
}

/// Tags the allocations of every thread that has no tag of its own; null or "" clears it.
/// Returns 0, or -1 when the tag is not UTF-8.
///
/// # Safety
/// `tag` is null or a NUL-terminated string valid for the call.
#[no_mangle]
pub unsafe extern "C" fn gpumem_set_default_tag(tag: *const c_char) -> c_int {
    guarded("gpumem_set_default_tag", -1, || {
        if fork::in_forked_child() {
            // Tags only name allocations, which a child cannot make; interning one would
            // take a lock.
            return Ok(0);
        }
        // SAFETY: forwarded from this function's own contract.
        let tag = unsafe { tag_argument(tag) }?;
        tags::set_default(tag);
        Ok(0)
    })
}

/// Returns every cached page no live allocation uses to the driver; the bytes released, or -1.
#[no_mangle]
pub extern "C" fn gpumem_empty_cache() -> i64 {
    guarded("gpumem_empty_cache", -1, calls::empty_cache)
}

/// Starts the peaks (`*.peak` in the memory statistics) again from the current values.
#[no_mangle]
pub extern "C" fn gpumem_reset_peak_stats() -> c_int {
    guarded("gpumem_reset_peak_stats", -1, || {
        runtime::runtime()?.manager.reset_peaks();
        Ok(0)
    })
}

/// The manager's snapshot (the `/api/v1/snapshot` document) as JSON, or null.
#[no_mangle]
pub extern "C" fn gpumem_snapshot_json() -> *mut c_char {
    guarded("gpumem_snapshot_json", std::ptr::null_mut(), || {
        calls::snapshot_json().map(to_c_string)
    })
}

/// `torch.cuda.memory_stats()`'s keys for `device` as one JSON object, or null.
#[no_mangle]
pub extern "C" fn gpumem_memory_stats_json(device: c_int) -> *mut c_char {
    guarded("gpumem_memory_stats_json", std::ptr::null_mut(), || {
        calls::memory_stats_json(device).map(to_c_string)
    })
}

/// Serves `/metrics`, the status page and the JSON API on `listen` (null: 127.0.0.1:9400) from
/// a thread of this process. Returns the port bound (useful with port 0), or -1. A second call
/// returns the running exporter's port.
///
/// # Safety
/// `listen` is null or a NUL-terminated string valid for the call.
#[no_mangle]
pub unsafe extern "C" fn gpumem_serve(listen: *const c_char) -> c_int {
    guarded("gpumem_serve", -1, || {
        // SAFETY: forwarded from this function's own contract.
        let listen = unsafe { optional_str(listen) }?;
        exporting::serve(listen)
    })
}

/// Publishes snapshots into `dir` (null: `$GPUMEM_PUBLISH_DIR`, else `/run/gpumem`) for a
/// `gpumem serve --collect-dir` sidecar. Returns 0, or -1.
///
/// # Safety
/// `dir` is null or a NUL-terminated string valid for the call.
#[no_mangle]
pub unsafe extern "C" fn gpumem_publish(dir: *const c_char) -> c_int {
    guarded("gpumem_publish", -1, || {
        // SAFETY: forwarded from this function's own contract.
        let dir = unsafe { optional_str(dir) }?;
        exporting::publish(dir).map(|()| 0)
    })
}

/// The latest error of a call made by this thread, as a new string (release it with
/// `gpumem_string_free`), or null when none of this thread's calls has failed.
#[no_mangle]
pub extern "C" fn gpumem_last_error() -> *mut c_char {
    guarded("gpumem_last_error", std::ptr::null_mut(), || {
        Ok(last_error().map_or(std::ptr::null_mut(), to_c_string))
    })
}

/// Releases a string returned by this library; null is ignored.
///
/// # Safety
/// `text` is null or a pointer returned by one of this library's string functions, not yet
/// released.
#[no_mangle]
pub unsafe extern "C" fn gpumem_string_free(text: *mut c_char) {
    if !text.is_null() {
        // SAFETY: the caller hands back a pointer from `CString::into_raw`, exactly once.
        drop(unsafe { CString::from_raw(text) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_recorded_and_turned_into_the_failure_value() {
        let value = guarded("gpumem_test", -1, || -> Result<i32, String> {
            panic!("boom in the allocator")
        });
        assert_eq!(value, -1);
        let error = last_error().unwrap_or_default();
        assert!(
            error.contains("gpumem_test: internal error (panic): boom"),
            "{error}"
        );
    }

    #[test]
    fn the_last_error_is_the_calling_threads_own() {
        guarded("gpumem_test", (), || -> Result<(), String> {
            Err("this thread's failure".into())
        });
        let elsewhere = std::thread::spawn(last_error).join().expect("thread");
        assert_eq!(elsewhere, None, "another thread sees none of it");
        assert!(last_error().is_some_and(|e| e.contains("this thread's failure")));
    }

    #[test]
    fn strings_cross_the_boundary_and_come_back() {
        let text = to_c_string("nul\0inside".to_string());
        // SAFETY: `text` is a fresh string from `to_c_string`.
        let copy = unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned();
        assert_eq!(copy, "nul inside");
        // SAFETY: returned exactly once; null is ignored.
        unsafe {
            gpumem_string_free(text);
            gpumem_string_free(std::ptr::null_mut());
        }
        // SAFETY: null is "no string".
        assert_eq!(unsafe { optional_str(std::ptr::null()) }, Ok(None));
    }
}
