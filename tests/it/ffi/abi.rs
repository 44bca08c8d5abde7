//! The entry points PyTorch and the Python package call, exercised from Rust: what they return,
//! what they record as the last error, and that they share one manager. The C ABI has one
//! manager per process, so these tests install a simulated one once and take turns.

// Calling the C ABI as a C host would takes `unsafe`, as it does for any host.
#![allow(unsafe_code)]

use capi::*;
use gpumem::backend::sim::{SimBackend, SimConfig};
use gpumem::manager::MemoryConfig;
use gpumem::{MemoryManager, StreamId};
use serde_json::Value;
use std::ffi::{c_void, CStr, CString};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

const MIB: isize = 1 << 20;
const GIB: u64 = 1 << 30;

/// Installs the 4 GiB simulated device once; returns the lock the tests take turns with.
pub(super) fn abi() -> MutexGuard<'static, ()> {
    installed()
        .1
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The simulated device behind the C ABI (for starting captures), and the turn lock.
fn installed() -> &'static (Arc<SimBackend>, Mutex<()>) {
    static INSTALLED: OnceLock<(Arc<SimBackend>, Mutex<()>)> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let backend = super::one_device(4 * GIB);
        let manager = MemoryManager::new(Arc::clone(&backend) as _, MemoryConfig::default())
            .expect("manager");
        capi::install(manager).expect("the first install succeeds");
        (backend, Mutex::new(()))
    })
}

/// Takes a string the library returned, releasing it.
pub(super) fn take(text: *mut std::ffi::c_char) -> Option<String> {
    if text.is_null() {
        return None;
    }
    // SAFETY: a non-null pointer from the library is a NUL-terminated string it owns.
    let copy = unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: released once, as the ABI asks.
    unsafe { gpumem_string_free(text) };
    Some(copy)
}

pub(super) fn last_error() -> String {
    take(gpumem_last_error()).unwrap_or_default()
}

fn stats() -> Value {
    let text = take(gpumem_memory_stats_json(0)).expect("statistics");
    serde_json::from_str(&text).expect("JSON")
}

fn stat(name: &str) -> u64 {
    stats()[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in the statistics"))
}

pub(super) fn stream(id: usize) -> *mut c_void {
    id as *mut c_void
}

#[test]
fn alloc_and_free_round_trip_through_the_shared_manager() {
    let _turn = abi();
    let in_use = stat("allocated_bytes.all.current");
    let ptr = gpumem_alloc(5 * MIB + 3, 0, stream(0));
    assert!(!ptr.is_null(), "{}", last_error());
    assert_eq!(ptr as usize % 512, 0);
    assert!(stat("allocated_bytes.all.current") >= in_use + 5 * MIB as u64);
    gpumem_free(ptr, 5 * MIB + 3, 0, stream(0));
    assert_eq!(stat("allocated_bytes.all.current"), in_use);
    assert!(capi::install(
        MemoryManager::new(
            Arc::new(SimBackend::new(SimConfig::default())),
            MemoryConfig::default()
        )
        .expect("manager")
    )
    .is_err());
}

#[test]
fn failures_return_null_and_leave_a_message() {
    let _turn = abi();
    assert!(gpumem_alloc(0, 0, stream(0)).is_null());
    assert!(gpumem_alloc(-5, 0, stream(0)).is_null());
    assert!(last_error().contains("negative"), "{}", last_error());
    assert!(gpumem_alloc(MIB, -1, stream(0)).is_null());
    assert!(last_error().contains("device -1"), "{}", last_error());
    assert!(gpumem_alloc(8 << 30, 0, stream(0)).is_null());
    assert!(last_error().contains("never fit"), "{}", last_error());
    gpumem_free(0x1000 as *mut c_void, 1, 0, stream(0));
    assert!(last_error().contains("not allocated by gpumem_alloc"));
    let bad = CString::new("256.0.0.1:99999").expect("no NUL");
    // SAFETY: a valid C string for the call.
    assert_eq!(unsafe { gpumem_serve(bad.as_ptr()) }, -1);
    assert!(last_error().contains("256.0.0.1:99999"), "{}", last_error());
}

#[test]
fn blocks_are_reused_on_their_stream_at_once_and_never_across_streams_without_a_sync() {
    let _turn = abi();
    let (a, b) = (stream(0xa000), stream(0xb000));
    let first = gpumem_alloc(4 * MIB, 0, a);
    gpumem_free(first, 4 * MIB, 0, a);
    let again = gpumem_alloc(4 * MIB, 0, a);
    assert_eq!(again, first);
    let other = gpumem_alloc(4 * MIB, 0, b);
    assert_ne!(other, first);
    gpumem_free(again, 4 * MIB, 0, a);
    let still_other = gpumem_alloc(4 * MIB, 0, b);
    assert_ne!(
        still_other, first,
        "stream a's freed block is not handed to stream b"
    );
    gpumem_free(other, 4 * MIB, 0, b);
    gpumem_free(still_other, 4 * MIB, 0, b);
}

#[test]
fn tags_are_per_thread_with_a_process_wide_default() {
    let _turn = abi();
    let kv = CString::new("ffi_kv_cache").expect("no NUL");
    let grads = CString::new("ffi_gradients").expect("no NUL");
    // SAFETY: valid C strings (or null) for each call.
    unsafe {
        assert_eq!(gpumem_set_tag(kv.as_ptr()), 0);
        assert_eq!(gpumem_set_default_tag(grads.as_ptr()), 0);
    }
    let tagged = gpumem_alloc(3 * MIB, 0, stream(0)) as usize;
    let other_thread = std::thread::spawn(|| gpumem_alloc(2 * MIB, 0, stream(0)) as usize)
        .join()
        .expect("thread");
    // SAFETY: null clears.
    unsafe {
        gpumem_set_tag(std::ptr::null());
        gpumem_set_default_tag(std::ptr::null());
    }
    let snapshot: Value =
        serde_json::from_str(&take(gpumem_snapshot_json()).expect("snapshot")).expect("JSON");
    let tag_bytes = |name: &str| -> u64 {
        snapshot["devices"][0]["by_tag"]
            .as_array()
            .expect("by_tag")
            .iter()
            .filter(|group| group["tag"] == name)
            .map(|group| group["bytes"].as_u64().unwrap_or(0))
            .sum()
    };
    assert_eq!(tag_bytes("ffi_kv_cache"), 3 << 20, "{snapshot}");
    assert_eq!(tag_bytes("ffi_gradients"), 2 << 20, "{snapshot}");
    gpumem_free(tagged as *mut c_void, 3 * MIB, 0, stream(0));
    gpumem_free(other_thread as *mut c_void, 2 * MIB, 0, stream(0));
}

#[test]
fn empty_cache_and_peaks() {
    let _turn = abi();
    let ptrs: Vec<usize> = (0..3)
        .map(|_| gpumem_alloc(64 * MIB, 0, stream(0)) as usize)
        .collect();
    for ptr in ptrs {
        gpumem_free(ptr as *mut c_void, 64 * MIB, 0, stream(0));
    }
    assert!(stat("allocated_bytes.all.peak") >= 192 << 20);
    assert_eq!(gpumem_reset_peak_stats(), 0);
    assert!(stat("allocated_bytes.all.peak") < 192 << 20);
    let reserved = stat("reserved_bytes.all.current");
    let released = gpumem_empty_cache();
    assert!(released > 0);
    assert_eq!(
        stat("reserved_bytes.all.current"),
        reserved - released as u64
    );
}

#[test]
fn the_statistics_say_where_the_adaptive_default_stands() {
    let _turn = abi();
    // The default configuration adapts; no window of costly misses has closed on the costless
    // simulated device, so it stands where a device starts.
    assert_eq!(
        stat("cache_adaptive_level"),
        u64::from(gpumem::manager::adaptive::START_LEVEL)
    );
    // And what its misses waited for the GPU (counted in `fenced_release`).
    let (waits, waited_ns) = (stat("pool_gpu_waits"), stat("pool_gpu_wait_ns_total"));
    assert!(waits > 0 || waited_ns == 0, "{waits} waits, {waited_ns} ns");
    assert!(stat("pool_gpu_wait_ns_longest") <= waited_ns);
    // No gigabyte block and no wait for the simulated GPU: the configured room stands.
    assert_eq!(
        stat("cache_room_without_waiting_bytes"),
        gpumem::ManagerConfig::default().room_without_waiting_bytes
    );
    // Nor a miss that lent its stream's busy pages: no wait has lasted 20 ms.
    assert_eq!(
        (stat("cache_stream_ordered_reuse"), stat("pool_lendings")),
        (0, 0)
    );
}

#[test]
fn a_capture_allocates_from_a_graph_pool_that_other_allocations_never_reach() {
    let _turn = abi();
    let sim = &installed().0;
    let capturing = StreamId(0x7100);
    let capture_stream = stream(0x7100);
    let size = 3 * MIB;

    // Unnamed: the capture gets a pool of its own, reused within the capture.
    sim.begin_capture(0, capturing).unwrap();
    let first = gpumem_alloc(size, 0, capture_stream);
    assert!(!first.is_null(), "{}", last_error());
    gpumem_free(first, size, 0, capture_stream);
    assert_eq!(gpumem_alloc(size, 0, capture_stream), first);
    gpumem_free(first, size, 0, capture_stream);
    sim.end_capture(0, capturing).unwrap();
    assert_eq!(stat("graph_pools.current"), 1);
    let after = gpumem_alloc(size, 0, capture_stream);
    assert!(
        !after.is_null() && after != first,
        "the graph's memory stays the graph's"
    );
    gpumem_free(after, size, 0, capture_stream);

    // Named (as the Python package names PyTorch's pools): released with its last graph.
    assert_eq!(gpumem_graph_pool_begin(0, capture_stream, 1, 2), -1);
    assert!(last_error().contains("not capturing"), "{}", last_error());
    for _graph in 0..2 {
        sim.begin_capture(0, capturing).unwrap();
        assert_eq!(
            gpumem_graph_pool_begin(0, capture_stream, 1, 2),
            0,
            "{}",
            last_error()
        );
        let ptr = gpumem_alloc(size, 0, capture_stream);
        assert!(!ptr.is_null(), "{}", last_error());
        gpumem_free(ptr, size, 0, capture_stream);
        sim.end_capture(0, capturing).unwrap();
    }
    assert_eq!(stat("graph_pools.current"), 2);
    assert_eq!(stat("graph_pool_reserved_bytes.current"), 8 << 20);
    assert_eq!(
        gpumem_graph_pool_release(0, 1, 2),
        0,
        "one graph still uses it"
    );
    assert_eq!(gpumem_graph_pool_release(0, 1, 2), 4 << 20);
    assert_eq!(stat("graph_pools.current"), 1);
    assert_eq!(gpumem_graph_pool_release(0, 1, 2), -1);
    assert!(
        last_error().contains("no graph was captured"),
        "{}",
        last_error()
    );
    assert_eq!(sim.refused_syncs(), 0);
}

#[test]
fn memory_used_on_another_stream_waits_for_that_stream_before_reuse() {
    let _turn = abi();
    let sim = &installed().0;
    let (own, side) = (stream(0x7200), stream(0x7300));
    let size = 3 * MIB;
    let used = gpumem_alloc(size, 0, own);
    assert!(!used.is_null(), "{}", last_error());
    assert_eq!(gpumem_record_stream(used, side), 0, "{}", last_error());

    sim.hold_fences(true); // the side stream is still running a kernel that reads `used`
    gpumem_free(used, size, 0, own);
    assert_eq!(stat("ffi_frees_waiting_for_streams"), 1);
    let others: Vec<_> = (0..3).map(|_| gpumem_alloc(size, 0, own)).collect();
    assert!(
        others.iter().all(|&p| !p.is_null() && p != used),
        "reused while in use"
    );
    for ptr in others {
        gpumem_free(ptr, size, 0, own);
    }
    assert_eq!(stat("ffi_frees_waiting_for_streams"), 1);

    sim.hold_fences(false); // the side stream finished: the next call frees the memory
    let next = gpumem_alloc(size, 0, own);
    // Its fence was queried and dropped with it (the pools' own fences, behind pages gone
    // idle, are another matter: tests/it/fenced_release.rs).
    assert_eq!(stat("ffi_frees_waiting_for_streams"), 0);
    gpumem_free(next, size, 0, own);

    // Emptying the cache frees what waited, once its streams are done.
    let again = gpumem_alloc(size, 0, own);
    assert_eq!(gpumem_record_stream(again, side), 0);
    sim.hold_fences(true);
    gpumem_free(again, size, 0, own);
    sim.hold_fences(false);
    assert_eq!(stat("ffi_frees_waiting_for_streams"), 1);
    assert!(gpumem_empty_cache() >= 0, "{}", last_error());
    assert_eq!(stat("ffi_frees_waiting_for_streams"), 0);

    assert_eq!(gpumem_record_stream(0x1234 as *mut c_void, side), -1);
    assert!(
        last_error().contains("not a live allocation"),
        "{}",
        last_error()
    );

    // Used on a stream that is capturing a graph: no fence can be recorded, so the memory is
    // kept rather than handed out while the graph may use it.
    let capturing = StreamId(0x7400);
    let kept = gpumem_alloc(size, 0, own);
    sim.begin_capture(0, capturing).unwrap();
    assert_eq!(gpumem_record_stream(kept, stream(0x7400)), 0);
    gpumem_free(kept, size, 0, own);
    assert!(
        last_error().contains("kept until the process ends"),
        "{}",
        last_error()
    );
    sim.end_capture(0, capturing).unwrap();
}
