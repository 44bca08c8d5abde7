//! Fault injection through the simulated device: driver allocations failing at random points,
//! failing frees and unmaps, `mem_info` failing, other processes taking memory, and running out
//! of memory in the middle of a replay. After every fault the manager's invariants hold (no
//! overlap, every byte the device says we hold is a reserved byte, in use + cached = reserved,
//! counters consistent), and the sampler and `/healthz` report failures instead of dying.

use super::alloc_model::{self, Harness, Op, Setup};
use crate::web::{eventually, get, value_of};
use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec};
use gpumem::manager::{AllocOptions, MemoryConfig, MemoryManager, Strategy};
use gpumem::units::{GIB, MIB};
use gpumem::{AllocError, DeviceBackend};
use gpumem_observe::Exporter;
use gpumem_replay::replay::{replay, ReplayError};
use gpumem_replay::trace::parse_trace;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pooled(shards: usize) -> Setup {
    Setup {
        strategy: Strategy::Pooled,
        shards,
        idle_pages_kept: 4,
        max_pool_bytes: None,
        max_cached_bytes: None,
        release_idle_after: None,
    }
}

fn run_ops(harness: &mut Harness, ops: &[Op]) {
    for (step, op) in ops.iter().enumerate() {
        if let Err(broken) = harness.apply(op).and_then(|()| harness.check()) {
            panic!("step {step} ({op:?}): {broken}");
        }
    }
}

/// xorshift64*: a reproducible stream of bytes for long random runs.
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// Many long random sequences of allocations, frees, trims and armed faults, both strategies.
#[test]
fn random_faults_keep_every_invariant() {
    for seed in 0..48 {
        let data = random_bytes(seed, 3000);
        if let Err(broken) = alloc_model::run(&data) {
            panic!("seed {seed}: {broken}");
        }
    }
}

/// Pages 0 and 2 of an arena unmapped, page 1 mapped: a block over all three needs two map
/// calls. The second fails and, with unmapping failing too, the first cannot be rolled back —
/// those pages stay mapped, and must still be counted as reserved.
#[test]
fn a_failed_map_that_cannot_be_rolled_back_stays_accounted() {
    let mut harness = Harness::new(pooled(1));
    let page = 2 * MIB;
    let alloc = |size| Op::Alloc {
        device: 0,
        size,
        align: 256,
        stream: 0,
    };
    run_ops(&mut harness, &[alloc(page), alloc(page), alloc(page)]);
    // Free the first and last page's blocks first (oldest idle), then the middle one, and
    // release the two oldest idle pages.
    run_ops(
        &mut harness,
        &[
            Op::Free {
                index: 0,
                explicit: true,
            },
            // swap_remove moved the last buffer to index 0.
            Op::Free {
                index: 0,
                explicit: true,
            },
            Op::Free {
                index: 0,
                explicit: true,
            },
            Op::Trim { target: page },
        ],
    );
    let reserved = harness.manager().reserved_bytes();
    assert_eq!(reserved, page, "one idle page left mapped");
    run_ops(
        &mut harness,
        &[
            Op::FailNthAlloc(2),
            Op::FailFrees(true),
            alloc(3 * page),
            Op::FailFrees(false),
            alloc(3 * page),
        ],
    );
    assert_eq!(harness.held(), 1, "the retry after the faults succeeds");
    harness.finish().unwrap();
}

/// Two runs of idle pages given back at once, the second unmap failing: the first run is gone
/// from the device and must be gone from the reserved bytes too (it was not: found by the
/// stress test under faults).
#[test]
fn a_release_failing_part_way_counts_what_was_released() {
    let page = 2 * MIB;
    for release in [Op::EmptyCache, Op::Trim { target: 0 }, Op::ReleaseIdle] {
        let mut harness = Harness::new(pooled(1));
        let mut ops: Vec<Op> = (0..4)
            .map(|_| Op::Alloc {
                device: 0,
                size: page,
                align: 256,
                stream: 0,
            })
            .collect();
        // Free the blocks on pages 0 and 2 (held[0] and held[2]): two separate idle runs.
        ops.push(Op::Free {
            index: 2,
            explicit: true,
        });
        ops.push(Op::Free {
            index: 0,
            explicit: true,
        });
        ops.push(Op::FailNthFree(2));
        ops.push(release.clone());
        run_ops(&mut harness, &ops);
        // And an allocation that must make room (the cache budget) while unmapping fails.
        let mut more = vec![Op::FailNthFree(1)];
        more.extend((0..6).map(|_| Op::Alloc {
            device: 0,
            size: 3 * page,
            align: 256,
            stream: 0,
        }));
        run_ops(&mut harness, &more);
        harness.finish().unwrap();
    }
}

/// Every driver call of a sequence fails once, in turn: whichever call it is, the manager
/// recovers and its accounting stays exact.
#[test]
fn each_driver_call_in_turn_fails_once() {
    for strategy in [Strategy::Pooled, Strategy::Direct] {
        for k in 1..=12 {
            let mut harness = Harness::new(Setup {
                strategy,
                ..pooled(2)
            });
            let mut ops = vec![Op::FailNthAlloc(k)];
            for (i, size) in [3 * MIB, 100, 70 << 10, 9 * MIB, 1, 5 * MIB]
                .into_iter()
                .enumerate()
            {
                ops.push(Op::Alloc {
                    device: i % 2,
                    size,
                    align: 256,
                    stream: (i % 3) as u64,
                });
                if i % 2 == 1 {
                    ops.push(Op::Free {
                        index: i,
                        explicit: false,
                    });
                }
            }
            ops.extend([Op::EmptyCache, Op::ReleaseIdle]);
            run_ops(&mut harness, &ops);
            harness.finish().unwrap();
        }
    }
}

/// Frees and unmaps failing: nothing is lost, nothing double-counted; once the driver
/// recovers, every byte goes back.
#[test]
fn failing_frees_keep_memory_accounted_until_the_driver_recovers() {
    for strategy in [Strategy::Pooled, Strategy::Direct] {
        let mut harness = Harness::new(Setup {
            strategy,
            ..pooled(1)
        });
        let mut ops = Vec::new();
        for size in [MIB, 6 * MIB, 300, 20 * MIB] {
            ops.push(Op::Alloc {
                device: 0,
                size,
                align: 256,
                stream: 0,
            });
        }
        ops.push(Op::FailFrees(true));
        ops.push(Op::Free {
            index: 1,
            explicit: true,
        });
        ops.push(Op::Free {
            index: 0,
            explicit: false,
        });
        ops.extend([Op::EmptyCache, Op::Trim { target: 0 }, Op::Maintain]);
        ops.push(Op::FailFrees(false));
        ops.extend([Op::EmptyCache, Op::Maintain]);
        run_ops(&mut harness, &ops);
        harness.finish().unwrap();
    }
}

/// `mem_info` failing and other processes filling the device: allocation, upkeep and the
/// pressure check keep working (or fail as out of memory), never panic.
#[test]
fn mem_info_failing_and_a_full_device_are_survived() {
    let mut harness = Harness::new(pooled(2));
    let mut ops = vec![Op::FailMemInfo(true)];
    for i in 0..40u64 {
        ops.push(Op::Alloc {
            device: (i % 2) as usize,
            size: (i + 1) * 3 * MIB,
            align: 256,
            stream: i % 2,
        });
        if i % 5 == 0 {
            ops.push(Op::UsedByOthers {
                device: 0,
                bytes: (i / 5) * GIB / 8,
            });
            ops.push(Op::Maintain);
        }
        if i % 3 == 0 {
            ops.push(Op::Free {
                index: (i * 7) as usize,
                explicit: i % 2 == 0,
            });
        }
    }
    ops.extend([Op::FailMemInfo(false), Op::Maintain, Op::EmptyCache]);
    run_ops(&mut harness, &ops);
    harness.finish().unwrap();
}

fn small_sim(total: u64) -> Arc<SimBackend> {
    Arc::new(SimBackend::new(SimConfig {
        devices: vec![SimDeviceSpec {
            total_bytes: total,
            ..SimDeviceSpec::default()
        }],
        ..SimConfig::default()
    }))
}

/// Bytes the simulated device says are in use (nothing else runs on it here).
fn device_used(sim: &SimBackend) -> u64 {
    sim.mem_info(0).expect("mem_info").used()
}

/// A replay that runs out of memory, or hits an injected driver failure, half-way: the error
/// names the event, and the manager gives every byte back afterwards.
#[test]
fn a_replay_that_fails_half_way_leaves_the_manager_consistent() {
    let mut text = String::new();
    for id in 0..40u64 {
        text.push_str(&format!("a {id} {} 0\n", 100 * MIB + id));
        if id % 4 == 3 {
            text.push_str(&format!("f {}\n", id - 1));
        }
    }
    let trace = parse_trace("grows", text.as_bytes()).expect("a valid trace");
    let config = MemoryConfig {
        shards: 1,
        release_idle_after: None,
        gpu_memory_fraction: 1.0,
        ..MemoryConfig::default()
    };
    for fault_at in [None, Some(3), Some(17)] {
        let sim = small_sim(2 * GIB);
        let manager = MemoryManager::new(sim.clone(), config.clone()).expect("manager");
        if let Some(k) = fault_at {
            sim.faults().fail_nth_alloc_from_now(k);
        }
        let error = replay(&manager, 0, &trace, |_| {}).expect_err("2 GiB cannot hold 3 GiB");
        let ReplayError::Alloc { event, source, .. } = &error else {
            panic!("not an allocation failure: {error}");
        };
        let text = error.to_string();
        assert!(text.starts_with("grows: event "), "{text}");
        match fault_at {
            None => assert!(source.is_out_of_memory(), "{text}"),
            Some(_) => assert!(
                matches!(source, AllocError::Backend(_)),
                "an injected failure is a driver error, not out of memory: {text}"
            ),
        }
        assert!(*event > 0 && *event <= trace.events.len() as u64);
        let stats = manager.device_stats(0).expect("stats").counters;
        assert_eq!(stats.live_allocations, 0, "the replay freed what it held");
        assert_eq!(stats.reserved_bytes, device_used(&sim));
        manager.empty_cache();
        assert_eq!((manager.reserved_bytes(), device_used(&sim)), (0, 0));
    }
}

/// The exporter over a manager whose driver keeps failing — allocations, frees and
/// `mem_info` flapping while a workload churns: every scrape answers, `/healthz` says 503 with
/// the reason while `mem_info` fails, sampling never stops, and everything recovers.
#[test]
fn the_sampler_and_healthz_survive_a_failing_driver() {
    let sim = small_sim(4 * GIB);
    let faults = sim.faults();
    let manager = MemoryManager::new(sim.clone(), MemoryConfig::default()).expect("manager");
    let exporter = Exporter::builder()
        .manager(manager.clone())
        .listen(([127, 0, 0, 1], 0))
        .interval(Duration::from_millis(100))
        .spawn()
        .expect("exporter");
    let addr = exporter.local_addr();
    let stop = AtomicBool::new(false);
    let mut statuses = Vec::new();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut held = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let size = 1 + (i * 2_654_435_761) % (24 * MIB);
                if let Ok(buffer) = manager.alloc(0, size, &AllocOptions::default()) {
                    held.push(buffer);
                }
                if held.len() > 40 {
                    held.swap_remove((i % 41) as usize);
                }
                match i % 97 {
                    0 => faults.fail_nth_alloc_from_now(1 + i % 5),
                    13 => faults.set_fail_frees(true),
                    40 => faults.set_fail_frees(false),
                    _ => {}
                }
                if i.is_multiple_of(50) {
                    manager.trim(GIB);
                }
            }
        });
        let started = Instant::now();
        let mut flip = false;
        while started.elapsed() < Duration::from_secs(3) {
            flip = !flip;
            faults.set_fail_mem_info(flip);
            for path in ["/healthz", "/metrics", "/", "/api/v1/snapshot"] {
                let reply = get(addr, path);
                statuses.push((path, reply.status));
            }
            std::thread::sleep(Duration::from_millis(150));
        }
        stop.store(true, Ordering::Relaxed);
    });
    for (path, status) in &statuses {
        match *path {
            "/healthz" => assert!(*status == 200 || *status == 503, "{path}: {status}"),
            _ => assert_eq!(*status, 200, "{path} must answer while the driver fails"),
        }
    }
    faults.set_fail_mem_info(true);
    assert!(
        eventually(Duration::from_secs(5), || {
            let reply = get(addr, "/healthz");
            reply.status == 503 && reply.body.contains("mem_info failed")
        }),
        "/healthz should name the failing call"
    );
    let metrics = get(addr, "/metrics").body;
    let failures = value_of(&metrics, "gpumem_sample_failures_total", "").unwrap_or(0.0);
    assert!(failures >= 1.0, "failed samples are counted");
    let samples = value_of(&metrics, "gpumem_samples_total", "").unwrap_or(0.0);
    faults.clear();
    assert!(
        eventually(Duration::from_secs(5), || get(addr, "/healthz").status
            == 200),
        "/healthz recovers with the driver"
    );
    let later = value_of(&get(addr, "/metrics").body, "gpumem_samples_total", "").unwrap_or(0.0);
    assert!(
        later > samples,
        "the sampler kept sampling ({samples} -> {later})"
    );
    exporter.shutdown();
    let stats = manager.device_stats(0).expect("stats").counters;
    assert_eq!(stats.live_allocations, 0);
    assert_eq!(stats.reserved_bytes, device_used(&sim));
    manager.empty_cache();
    assert_eq!(device_used(&sim), 0);
}
