//! `gpumem bench`: the driver's pool skipped by name on the simulated device, and its own miss
//! timed on a GPU.

use super::{gpumem, stderr};

#[test]
fn bench_on_sim_skips_the_drivers_pool_by_name() {
    let out = gpumem(&[
        "bench",
        "--backend",
        "sim",
        "--sizes",
        "64KiB",
        "--threads",
        "1",
        "--iterations",
        "50",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    for name in ["driver-async", "driver-async-miss"] {
        assert!(
            err.contains(&format!("skipping {name} (needs the CUDA backend)")),
            "{err}"
        );
    }
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("pool-miss-cold"), "{table}");
}

/// On a GPU: the driver pool trimmed after every free grows again on every allocation, which
/// costs driver time a cached allocation does not; gpumem's cold miss is beside it.
#[test]
fn bench_times_the_driver_pools_own_miss_on_a_gpu() {
    if crate::support::cuda_backend().is_none() {
        return;
    }
    let out = gpumem(&[
        "bench",
        "--backend",
        "cuda",
        "--allocators",
        "driver-async,driver-async-miss,pool-miss-cold",
        "--sizes",
        "1MiB",
        "--threads",
        "1",
        "--seconds",
        "0.3",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cases: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let median = |name: &str| {
        let case = cases.iter().find(|c| c["allocator"] == name);
        case.and_then(|c| c["median_ns"].as_f64())
            .unwrap_or_else(|| panic!("no {name} in {cases:?}"))
    };
    assert!(
        median("driver-async-miss") > 2.0 * median("driver-async"),
        "{cases:?}"
    );
    assert!(median("pool-miss-cold") > 0.0, "{cases:?}");
}
