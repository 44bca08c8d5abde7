//! The repository's trace corpus (benches/traces) through the allocator on the simulated device,
//! at the default settings: the waste bound holds on every trace but the ones known to pass it
//! (which may not get worse), and the pools' count of reserved bytes matches the device's to the
//! byte throughout. At the memory-first setting the bound holds on every trace; under the H100's
//! driver costs the adaptive default stays under its ceiling.

use gpumem::backend::sim::{DriverCosts, SimBackend, SimConfig};
use gpumem::manager::adaptive::{ceiling_slack_bytes, inside_chunk_cap_bytes};
use gpumem::manager::CacheMode;
use gpumem::{ManagerConfig, MemoryManager};
use gpumem_replay::replay::{replay, replay_config};
use gpumem_replay::trace::load_trace;
use std::path::Path;
use std::sync::Arc;

/// The most reserved bytes may exceed the peak of requested bytes, on any trace.
const WASTE_BOUND: f64 = 1.03;

/// Traces the allocator does not yet keep within the bound, with what they reach today: each may
/// not get worse, and one that comes within the bound must leave this list. (cnn_serve_cycled
/// left it when 6 MiB chunks took it from 1.0377 to 1.0246, detect_multiscale when idle inside
/// chunks a block would pin went back at a new high of mapped pages: 1.0316 -> 1.0235.) The three
/// were recorded on 2026-11-25 as workloads unlike the corpus and passed the bound at first
/// sight: the first in the first set, the other two in the second (docs/performance.md says
/// where their excess lies).
/// The test replays the configured keys as a fixed setting since the adaptive default starts a
/// rung above them; as a fixed setting, bert_mlm_dynpad, detect_multiscale and gpt2_train_cycled
/// are within the bound (a fixed setting bounds inside chunks by twice its slack, where the
/// adaptive default lets them reach an eighth of the live peak), and llama_train_ckpt holds
/// 1.0434 instead of 1.0619.
const OVER_THE_BOUND_TODAY: &[(&str, f64)] = &[
    ("unet_diffusion", 1.0342),
    ("convnext_multires", 1.0508),
    ("llama_train_ckpt", 1.0434),
];

/// Every trace of the corpus, in name order.
fn corpus() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/traces");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".trace.gz"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 10, "the corpus is in {}", dir.display());
    paths
}

#[test]
fn every_trace_stays_within_the_waste_bound_at_the_memory_first_setting() {
    let backend = Arc::new(SimBackend::new(SimConfig::default()));
    let mut failures = Vec::new();
    for path in corpus() {
        let trace = load_trace(&path).unwrap_or_else(|e| panic!("{e}"));
        let config = replay_config(ManagerConfig::memory_first(), 0);
        let manager = MemoryManager::new(backend.clone(), config).unwrap();
        let (report, _) = replay(&manager, 0, &trace, |_| {}).unwrap();
        if report.reserved_over_peak > WASTE_BOUND {
            failures.push(format!(
                "{} at {:.4}",
                report.trace, report.reserved_over_peak
            ));
        }
        assert_eq!(report.cache_mode, "memory-first");
    }
    assert!(failures.is_empty(), "over {WASTE_BOUND}: {failures:?}");
}

/// Under the H100's measured driver costs misses cost what they do on a GPU, so the adaptive
/// default climbs where misses are frequent; whatever level it reaches, what the pools hold stays
/// within the ceiling: the live peak plus at most a sixteenth of it as idle slack, and the free
/// part of the chunks live blocks touch, which on the corpus stays within one of the largest
/// chunks the default cuts (an eighth of the peak).
#[test]
fn the_adaptive_default_stays_under_its_ceiling_when_misses_cost_time() {
    let costly = SimConfig {
        driver_costs: DriverCosts::H100,
        ..SimConfig::default()
    };
    let backend = Arc::new(SimBackend::new(costly));
    let (mut climbed, mut failures) = (0, Vec::new());
    for path in corpus() {
        let trace = load_trace(&path).unwrap_or_else(|e| panic!("{e}"));
        let config = replay_config(ManagerConfig::default(), 0);
        let manager = MemoryManager::new(backend.clone(), config).unwrap();
        let (report, _) = replay(&manager, 0, &trace, |_| {}).unwrap();
        let peak = report.peak_requested_bytes;
        let ceiling =
            (peak + ceiling_slack_bytes(peak) + inside_chunk_cap_bytes(peak)) as f64 / peak as f64;
        if report.reserved_over_peak > ceiling {
            failures.push(format!(
                "{} at {:.4} over {ceiling:.4} (level {:?})",
                report.trace, report.reserved_over_peak, report.adaptive_level
            ));
        }
        climbed += usize::from(report.adaptive_level.is_some_and(|level| level > 1));
        assert_eq!(
            report.max_device_vs_reserved_gap_bytes, 0,
            "{}",
            report.trace
        );
    }
    assert!(failures.is_empty(), "{failures:?}");
    assert!(
        climbed > 0,
        "misses at an H100's prices moved no trace's setting"
    );
}

/// The configured keys' defaults, as a fixed setting. (The adaptive default starts a rung above
/// them and climbs where misses cost time: its bound is the ceiling, tested below under the
/// H100's driver costs.)
#[test]
fn every_trace_stays_within_the_waste_bound_at_the_configured_defaults() {
    let paths = corpus();
    let backend = Arc::new(SimBackend::new(SimConfig::default()));
    let mut failures = Vec::new();
    for path in &paths {
        let trace = load_trace(path).unwrap_or_else(|e| panic!("{e}"));
        let fixed = ManagerConfig {
            cache_mode: CacheMode::Fixed,
            ..ManagerConfig::default()
        };
        let config = replay_config(fixed, 0);
        let manager = MemoryManager::new(backend.clone(), config).unwrap();
        let (report, _) = replay(&manager, 0, &trace, |_| {}).unwrap();
        eprintln!(
            "{}: reserved/peak {:.4}, {} misses",
            report.trace, report.reserved_over_peak, report.misses
        );
        let known = OVER_THE_BOUND_TODAY
            .iter()
            .find(|(name, _)| *name == report.trace)
            .map(|&(_, today)| today);
        match known {
            Some(today) if report.reserved_over_peak > today + 0.00005 => failures.push(format!(
                "{} at {:.4}, worse than {today}",
                report.trace, report.reserved_over_peak
            )),
            Some(_) if report.reserved_over_peak <= WASTE_BOUND => failures.push(format!(
                "{} at {:.4} is within the bound now: take it off OVER_THE_BOUND_TODAY",
                report.trace, report.reserved_over_peak
            )),
            Some(_) => {}
            None if report.reserved_over_peak > WASTE_BOUND => failures.push(format!(
                "{} at {:.4}",
                report.trace, report.reserved_over_peak
            )),
            None => {}
        }
        assert_eq!(
            report.max_device_vs_reserved_gap_bytes, 0,
            "{}",
            report.trace
        );
        assert_eq!(
            report.reserved_after_empty_cache_bytes, 0,
            "{}",
            report.trace
        );
        assert_eq!(
            report.pages_created, report.pages_released,
            "{}",
            report.trace
        );
        assert!(report.misses > 0 && report.miss_p99_ns >= report.miss_p50_ns);
    }
    assert!(failures.is_empty(), "over {WASTE_BOUND}: {failures:?}");
}
