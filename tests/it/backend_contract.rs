//! The DeviceBackend contract: one body per property, run against the simulated device and,
//! when a GPU is present, the CUDA driver.

use crate::support::{all_backends, sim_backend};
use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec};
use gpumem::backend::{DirectMemory, StreamOrder};
use gpumem::units::MIB;
use gpumem::{BackendError, DeviceBackend, StreamId};
use std::time::{Duration, Instant};

fn each_backend(check: impl Fn(&dyn DeviceBackend)) {
    for backend in all_backends() {
        eprintln!("contract on {}", backend.kind());
        check(&*backend);
    }
}

#[test]
fn reports_devices_with_sane_properties() {
    each_backend(|b| {
        assert!(b.device_count() >= 1);
        for index in 0..b.device_count() {
            let p = b.properties(index).unwrap();
            assert_eq!(p.index, index);
            assert!(
                p.uuid.starts_with("GPU-") && p.uuid.len() == 40,
                "{}",
                p.uuid
            );
            assert!(p.total_memory_bytes > 0);
            assert!(p.allocation_granularity_bytes.is_power_of_two());
            assert_eq!(
                b.granularity(index).unwrap(),
                p.allocation_granularity_bytes
            );
            let info = b.mem_info(index).unwrap();
            assert!(info.free <= info.total);
            assert_eq!(info.total, p.total_memory_bytes);
        }
    });
}

#[test]
fn rejects_devices_that_do_not_exist() {
    each_backend(|b| {
        let missing = b.device_count();
        let expected = BackendError::InvalidDevice {
            requested: missing,
            count: missing,
        };
        assert_eq!(b.properties(missing).unwrap_err(), expected);
        assert_eq!(b.mem_info(missing).unwrap_err(), expected);
        assert_eq!(b.alloc(missing, MIB).unwrap_err(), expected);
    });
}

#[test]
fn direct_allocations_are_unique_aligned_and_freed_once() {
    each_backend(|b| {
        let before = b.mem_info(0).unwrap().free;
        let first = b.alloc(0, 64 * MIB).unwrap();
        let second = b.alloc(0, 64 * MIB).unwrap();
        assert_eq!(first % 256, 0);
        assert_eq!(second % 256, 0);
        assert!(
            first + 64 * MIB <= second || second + 64 * MIB <= first,
            "overlap"
        );
        let during = b.mem_info(0).unwrap().free;
        assert!(
            before - during >= 128 * MIB,
            "free dropped by {}",
            before - during
        );
        b.free(0, first).unwrap();
        b.free(0, second).unwrap();
        assert!(matches!(
            b.free(0, first),
            Err(BackendError::InvalidAddress { .. }) | Err(BackendError::DriverCall { .. })
        ));
    });
}

#[test]
fn refuses_more_than_the_device_has() {
    each_backend(|b| {
        let total = b.mem_info(0).unwrap().total;
        let err = b.alloc(0, total + total / 2).unwrap_err();
        assert!(matches!(err, BackendError::OutOfMemory { .. }), "{err:?}");
    });
}

#[test]
fn mapped_pages_take_exactly_their_bytes() {
    each_backend(|b| {
        let page = b.granularity(0).unwrap();
        let base = b.reserve_address_range(0, 8 * page).unwrap();
        let before = b.mem_info(0).unwrap().free;
        b.map(0, base + page, 2 * page).unwrap();
        let mapped = b.mem_info(0).unwrap().free;
        assert_eq!(before - mapped, 2 * page);
        assert!(
            b.map(0, base + 2 * page, page).is_err(),
            "a page cannot be mapped twice"
        );
        assert!(
            b.map(0, base + 1, page).is_err(),
            "unaligned map is refused"
        );
        b.unmap(0, base + page, 2 * page).unwrap();
        assert_eq!(b.mem_info(0).unwrap().free, before);
        b.release_address_range(0, base, 8 * page).unwrap();
    });
}

#[test]
fn chunks_are_unmapped_whole_and_mapped_again_elsewhere() {
    each_backend(|b| {
        let page = b.granularity(0).unwrap();
        let base = b.reserve_address_range(0, 8 * page).unwrap();
        let before = b.mem_info(0).unwrap().free;
        let mut kept = Vec::new();
        let created = b
            .map_reusing(0, base, 3 * page, &mut kept, &[2, 1])
            .unwrap();
        assert_eq!(created, 3);
        let err = b.unmap_keeping(0, base, page, &mut kept).unwrap_err();
        assert!(
            matches!(err, BackendError::InvalidArgument { .. }),
            "part of a chunk cannot be unmapped: {err:?}"
        );
        assert!(kept.is_empty(), "a refused unmap keeps nothing");
        b.unmap_keeping(0, base, 3 * page, &mut kept).unwrap();
        let pages: Vec<u32> = kept.iter().map(|c| c.pages).collect();
        assert_eq!(
            pages,
            vec![2, 1],
            "new chunks of two pages, the last shorter"
        );
        assert_eq!(
            b.mem_info(0).unwrap().free,
            before - 3 * page,
            "kept chunks are held"
        );
        // Mapped again at another address, with one new page for the rest of the range.
        let created = b
            .map_reusing(0, base + 4 * page, 4 * page, &mut kept, &[1])
            .unwrap();
        assert_eq!((created, kept.len()), (1, 0));
        assert_eq!(b.mem_info(0).unwrap().free, before - 4 * page);
        b.unmap(0, base + 4 * page, 4 * page).unwrap();
        assert_eq!(b.mem_info(0).unwrap().free, before);
        b.release_address_range(0, base, 8 * page).unwrap();
    });
}

#[test]
fn detached_chunks_map_again_elsewhere_while_their_old_address_stays_mapped() {
    each_backend(|b| {
        let page = b.granularity(0).unwrap();
        let base = b.reserve_address_range(0, 8 * page).unwrap();
        let before = b.mem_info(0).unwrap().free;
        let mut lent = Vec::new();
        b.map_reusing(0, base, 2 * page, &mut lent, &[2]).unwrap();
        let err = b.detach_keeping(0, base, page, &mut lent).unwrap_err();
        assert!(
            matches!(err, BackendError::InvalidArgument { .. }),
            "part of a chunk cannot be detached: {err:?}"
        );
        assert!(lent.is_empty(), "a refused detach lends nothing");
        b.detach_keeping(0, base, 2 * page, &mut lent).unwrap();
        assert_eq!(lent.len(), 1);
        // The same chunk under a second address, while the first stays mapped.
        b.map_reusing(0, base + 4 * page, 2 * page, &mut lent, &[])
            .unwrap();
        assert!(lent.is_empty());
        assert_eq!(
            b.mem_info(0).unwrap().free,
            before - 2 * page,
            "one chunk under two addresses holds its pages once"
        );
        let mut none = Vec::new();
        assert!(
            b.map_reusing(0, base, 2 * page, &mut none, &[2]).is_err(),
            "the old address is still mapped"
        );
        assert_eq!(b.mem_info(0).unwrap().free, before - 2 * page);
        b.unmap_detached(0, base, 2 * page).unwrap();
        assert!(
            b.unmap_detached(0, base, 2 * page).is_err(),
            "a detached range is unmapped once"
        );
        b.unmap(0, base + 4 * page, 2 * page).unwrap();
        assert_eq!(b.mem_info(0).unwrap().free, before);
        b.release_address_range(0, base, 8 * page).unwrap();
    });
}

#[test]
fn sim_keeps_a_chunk_mapped_at_a_detached_address_from_the_driver() {
    let sim = sim_backend();
    let b: &dyn DeviceBackend = &*sim;
    let page = b.granularity(0).unwrap();
    let base = b.reserve_address_range(0, 4 * page).unwrap();
    let mut lent = Vec::new();
    b.map_reusing(0, base, page, &mut lent, &[1]).unwrap();
    b.detach_keeping(0, base, page, &mut lent).unwrap();
    assert_eq!(sim.detached_mappings(0), 1);
    assert!(
        b.release_chunks(0, &mut lent.clone()).is_err(),
        "released while still mapped at its old address"
    );
    assert!(
        b.unmap_keeping(0, base, page, &mut Vec::new()).is_err(),
        "a detached address is unmapped as such"
    );
    assert!(b.release_address_range(0, base, 4 * page).is_err());
    b.unmap_detached(0, base, page).unwrap();
    assert_eq!(sim.detached_mappings(0), 0);
    b.release_chunks(0, &mut lent).unwrap();
    b.release_address_range(0, base, 4 * page).unwrap();
}

#[test]
fn sim_waits_finish_what_their_stream_queued_before_even_while_work_is_held() {
    let sim = sim_backend();
    let b: &dyn DeviceBackend = &*sim;
    sim.hold_fences(true);
    let (stream, another) = (StreamId(0x10), StreamId(0x20));
    let first = b.record_fence(0, stream).unwrap();
    let elsewhere = b.record_fence(0, another).unwrap();
    let last = b.record_fence(0, stream).unwrap();
    assert!(!b.fence_passed(0, first).unwrap(), "held");
    b.wait_fence(0, last).unwrap();
    assert!(
        b.fence_passed(0, first).unwrap(),
        "the wait finished what its stream queued before"
    );
    assert!(
        !b.fence_passed(0, elsewhere).unwrap(),
        "not another stream's"
    );
    b.synchronize_stream(0, another).unwrap();
    assert!(b.fence_passed(0, elsewhere).unwrap());
    sim.hold_fences(false);
}

#[test]
fn sim_counts_memory_of_other_processes() {
    let sim = SimBackend::new(SimConfig {
        devices: vec![SimDeviceSpec {
            name: "small".into(),
            total_bytes: 1024 * MIB,
            used_by_others: 256 * MIB,
        }],
        granularity: 2 * MIB,
        ..SimConfig::default()
    });
    assert_eq!(sim.mem_info(0).unwrap().free, 768 * MIB);
    let err = sim.alloc(0, 770 * MIB).unwrap_err();
    assert_eq!(
        err,
        BackendError::OutOfMemory {
            device: 0,
            requested: 770 * MIB,
            free: 768 * MIB
        }
    );
    let ptr = sim.alloc(0, 768 * MIB).unwrap();
    assert_eq!(sim.mem_info(0).unwrap().free, 0);
    sim.free(0, ptr).unwrap();
    sim.set_used_by_others(0, 0).unwrap();
    assert_eq!(sim.mem_info(0).unwrap().free, 1024 * MIB);
}

#[test]
fn fences_can_be_waited_for_and_pass() {
    each_backend(|backend| {
        let waited = backend.record_fence(0, StreamId::DEFAULT).unwrap();
        backend.wait_fence(0, waited).unwrap();
        let polled = backend.record_fence(0, StreamId::DEFAULT).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !backend.fence_passed(0, polled).unwrap() {
            assert!(
                Instant::now() < deadline,
                "an empty stream's fence never passed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

#[test]
fn a_simulated_gpu_lagging_two_fences_passes_each_once_two_more_are_on_its_stream() {
    let sim = sim_backend();
    sim.hold_fences(true);
    sim.set_gpu_lag(2);
    let (mine, other) = (StreamId(0x10), StreamId(0x20));
    let first = sim.record_fence(0, mine).unwrap();
    let second = sim.record_fence(0, mine).unwrap();
    // Fences on another stream are another queue: they finish none of this one's work.
    for _ in 0..4 {
        sim.record_fence(0, other).unwrap();
    }
    assert!(
        !sim.fence_passed(0, first).unwrap(),
        "one later fence on its stream"
    );
    let third = sim.record_fence(0, mine).unwrap();
    assert!(
        sim.fence_passed(0, first).unwrap(),
        "two later fences on its stream"
    );
    assert!(!sim.fence_passed(0, second).unwrap());
    assert!(!sim.fence_passed(0, third).unwrap());
    // A wait still finishes everything before the fence waited for, lag or not.
    sim.wait_fence(0, third).unwrap();
    assert!(sim.fence_passed(0, second).unwrap());
}

#[test]
fn sim_rounds_allocations_to_its_granularity() {
    let sim = sim_backend();
    let before = sim.mem_info(0).unwrap().free;
    let ptr = sim.alloc(0, 1).unwrap();
    assert_eq!(before - sim.mem_info(0).unwrap().free, 2 * MIB);
    sim.free(0, ptr).unwrap();
}

#[test]
fn sim_injects_the_faults_it_is_told_to() {
    let sim = sim_backend();
    let faults = sim.faults();
    faults.fail_nth_alloc_from_now(2);
    let first = sim.alloc(0, MIB).unwrap();
    assert_eq!(
        sim.alloc(0, MIB),
        Err(BackendError::Injected("allocation call failed"))
    );
    let third = sim.alloc(0, MIB).unwrap();
    faults.set_fail_frees(true);
    assert!(sim.free(0, first).is_err());
    faults.set_fail_mem_info(true);
    assert!(sim.mem_info(0).is_err());
    faults.clear();
    sim.free(0, first).unwrap();
    sim.free(0, third).unwrap();
    assert_eq!(
        sim.mem_info(0).unwrap().free,
        sim.mem_info(0).unwrap().total
    );
}
