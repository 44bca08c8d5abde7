//! The entry points only the PyTorch layer calls (`crates/gpumem-capi/src/torch_entries.rs`),
//! from Rust on the simulated device behind the C ABI: statistics under PyTorch's names, the
//! memory fraction, the segments a memory snapshot draws, and the out-of-memory message.

// Calling the C ABI as a C host would takes `unsafe`, as it does for any host.
#![allow(unsafe_code)]

use super::abi::{abi, last_error, stream, take};
use capi::pytorch::DeviceStats;
use capi::*;

const MIB: isize = 1 << 20;

fn device_stats() -> DeviceStats {
    let mut stats = DeviceStats::default();
    // SAFETY: a writable struct of the header's layout.
    let status = unsafe { gpumem_device_stats(0, &mut stats) };
    assert_eq!(status, 0, "{}", last_error());
    stats
}

#[test]
fn statistics_count_a_routed_allocation_in_its_pools_column() {
    let _turn = abi();
    let before = device_stats();
    let small = gpumem_alloc_routed(4096, 0, stream(0));
    let large = gpumem_alloc_routed(6 * MIB + 1, 0, stream(0));
    assert!(!small.is_null() && !large.is_null(), "{}", last_error());
    assert_eq!(gpumem_allocation_size(large), 6 * MIB as i64 + 1);
    let during = device_stats();
    let grew = |column: usize| {
        during.requested_bytes[column].current - before.requested_bytes[column].current
    };
    assert_eq!(grew(0), 4096 + 6 * MIB as u64 + 1, "all");
    assert_eq!(grew(1), 4096, "small pool");
    assert_eq!(grew(2), 6 * MIB as u64 + 1, "large pool");
    assert_eq!(
        during.allocation[0].current,
        before.allocation[0].current + 2
    );
    assert!(during.reserved_bytes[0].current >= during.allocated_bytes[0].current);
    assert!(during.allocated_bytes[0].peak >= during.allocated_bytes[0].current);
    gpumem_free_ptr(small);
    gpumem_free_ptr(large);
    assert_eq!(
        device_stats().requested_bytes[0].current,
        before.requested_bytes[0].current
    );
    assert_eq!(gpumem_allocation_size(large), -1, "freed");
    gpumem_free_ptr(large);
    assert!(last_error().contains("freed already"), "{}", last_error());
    // SAFETY: null is refused, not written.
    assert_eq!(unsafe { gpumem_device_stats(0, std::ptr::null_mut()) }, -1);
    assert_eq!(gpumem_device_stats_checked(7), -1);
}

fn gpumem_device_stats_checked(device: i32) -> i32 {
    let mut stats = DeviceStats::default();
    // SAFETY: a writable struct of the header's layout.
    unsafe { gpumem_device_stats(device, &mut stats) }
}

#[test]
fn the_memory_fraction_caps_the_pools_until_set_again() {
    let _turn = abi();
    let configured = gpumem_memory_fraction(0);
    assert!(configured > 0.0 && configured <= 1.0, "{configured}");
    assert_eq!(gpumem_set_memory_fraction(0, 0.25), 0, "{}", last_error());
    assert!((gpumem_memory_fraction(0) - 0.25).abs() < 1e-9);
    // The simulated device has 4 GiB: a quarter is 1 GiB.
    let refused = gpumem_alloc_routed(1536 * MIB, 0, stream(0));
    assert!(refused.is_null());
    assert!(last_error().contains("capped"), "{}", last_error());
    let message = take(gpumem_oom_message(0, 1536 * MIB)).expect("a message");
    assert!(
        message.starts_with("CUDA out of memory. Tried to allocate 1.50 GiB."),
        "{message}"
    );
    assert!(message.contains("gpumem: "), "{message}");
    assert!(message.contains("capped"), "gpumem's own reason: {message}");
    let fits = gpumem_alloc_routed(512 * MIB, 0, stream(0));
    assert!(!fits.is_null(), "{}", last_error());
    gpumem_free_ptr(fits);
    for wrong in [0.0, -1.0, 1.5, f64::NAN] {
        assert_eq!(gpumem_set_memory_fraction(0, wrong), -1, "{wrong}");
        assert!(last_error().contains("out of range"), "{}", last_error());
    }
    assert_eq!(gpumem_set_memory_fraction(0, configured), 0);
}

#[test]
fn segments_cover_their_pages_with_live_and_free_blocks() {
    let _turn = abi();
    let ptr = gpumem_alloc_routed(3 * MIB, 0, stream(0));
    assert!(!ptr.is_null(), "{}", last_error());
    let text = take(gpumem_segments_text(0)).expect("segments");
    let mut segments: Vec<(u64, u64, u64)> = Vec::new(); // address, size, sum of blocks
    let mut found = false;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let number = |i: usize| fields[i].parse::<u64>().expect("decimal");
        match fields[0] {
            "S" => segments.push((number(1), number(2), 0)),
            "B" => {
                let segment = segments.last_mut().expect("a block inside a segment");
                assert_eq!(number(1), segment.0 + segment.2, "blocks follow each other");
                segment.2 += number(2);
                if number(1) == ptr as u64 {
                    assert_eq!((number(3), fields[4]), (3 * MIB as u64, "1"));
                    found = true;
                }
            }
            other => panic!("an unknown line kind {other:?} in {text}"),
        }
    }
    assert!(found, "the live allocation is listed: {text}");
    for (address, size, blocks) in segments {
        assert_eq!(size, blocks, "segment at {address:#x} covered exactly");
    }
    gpumem_free_ptr(ptr);
    assert!(take(gpumem_segments_text(9)).is_none());
    assert!(last_error().contains("device 9"), "{}", last_error());
}

/// CUDA IPC exports the driver's chunks, which a simulated device has none of: one message
/// that says so, no descriptors (the GPU test in `torch_gpu.rs` sends tensors for real).
#[test]
fn exporting_chunks_for_ipc_needs_the_cuda_backend() {
    let _turn = abi();
    let ptr = gpumem_alloc_routed(3 * MIB, 0, stream(0));
    assert!(!ptr.is_null(), "{}", last_error());
    assert!(take(gpumem_export_chunks(0, ptr, 3 * MIB as u64)).is_none());
    assert!(
        last_error().contains("needs the CUDA backend"),
        "{}",
        last_error()
    );
    gpumem_free_ptr(ptr);
}
