//! `gpumem replay --sweep`: every cache setting replayed, and compared with the driver's own
//! pool where there is one (on a GPU).

use super::{gpumem, stderr, tempdir, write_trace};

#[test]
fn replay_sweeps_the_cache_settings_and_refuses_the_driver_pool_on_sim() {
    let dir = tempdir();
    let trace = steps_trace(&dir);
    let out = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--sweep",
        "--json",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // The adaptive default is replayed beside the grid, last, and reported apart.
    let adaptive = rows.pop().unwrap();
    assert_eq!(adaptive["cache_mode"], "adaptive");
    assert!(adaptive["adaptive_level"].as_u64().is_some());
    assert!(rows.iter().all(|r| r["cache_mode"] == "fixed"));
    assert_eq!(
        rows.len(),
        90,
        "9 layouts (4 chunk sizes, two also whole when growing, three placing on mapped \
         pages) x 5 x 2 cache settings"
    );
    assert!(rows
        .iter()
        .all(|r| r["trace"] == "steps" && r["misses"].as_u64() > Some(0)));
    let settings: std::collections::HashSet<_> = rows
        .iter()
        .map(|r| {
            (
                r["idle_pages_kept"].as_u64(),
                r["idle_per_mille"].as_u64(),
                r["max_chunk_bytes"].as_u64(),
                r["whole_chunks_when_growing"].as_bool(),
                r["place_on_mapped_pages"].as_bool(),
            )
        })
        .collect();
    assert_eq!(settings.len(), 90);
    let count = |key: &str| rows.iter().filter(|r| r[key] == true).count();
    assert_eq!(count("whole_chunks_when_growing"), 20);
    assert_eq!(count("place_on_mapped_pages"), 30);
    // Repeated, the rounds alternate the settings and the table says it shows medians; the
    // simulated device has no driver pool, and the table says so instead of naming a winner.
    let table = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--sweep",
        "--repeat",
        "2",
        trace.to_str().unwrap(),
    ]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.contains("RES/PEAK") && text.contains("(default)"),
        "{text}"
    );
    assert!(text.contains("medians of 2 alternated replays"), "{text}");
    assert!(
        text.contains("has no driver pool to compare with"),
        "{text}"
    );
    assert!(!text.contains("One setting for all"), "{text}");

    let out = gpumem(&[
        "replay",
        "--backend",
        "sim",
        "--strategy",
        "driver-pool",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("needs the CUDA backend"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());

    for extra in [
        &["--backend", "sim"][..],
        &["--backend", "cuda", "--sweep"][..],
        &["--backend", "cuda", "--strategy", "direct"][..],
    ] {
        let mut args = vec!["replay", "--against-driver-pool"];
        args.extend(extra);
        args.push(trace.to_str().unwrap());
        let out = gpumem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--against-driver-pool"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(out.stdout.is_empty());
    }

    // Several allocators per trace make no one chart: --plot is refused, and nothing written.
    let plot = dir.join("never-written.svg");
    for comparing in ["--sweep", "--against-driver-pool"] {
        let out = gpumem(&[
            "replay",
            "--backend",
            "sim",
            comparing,
            "--plot",
            plot.to_str().unwrap(),
            trace.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{comparing}: {}", stderr(&out));
        assert!(stderr(&out).contains("--plot"), "{}", stderr(&out));
        assert!(!plot.exists() && out.stdout.is_empty());
    }
}

/// On a GPU: a sweep replays the driver's own pool beside every setting and ends each trace
/// with its figures and a verdict (a setting that beats it on both axes, or the closest).
#[test]
fn a_sweep_on_a_gpu_compares_every_setting_with_the_driver_pool() {
    if crate::support::cuda_backend().is_none() {
        return;
    }
    let dir = tempdir();
    let trace = steps_trace(&dir);
    // Two traces (the same one twice): a verdict under each, and one setting named for both.
    let out = gpumem(&[
        "replay",
        "--backend",
        "cuda",
        "--sweep",
        trace.to_str().unwrap(),
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("driver pool (cuMemAllocAsync): "), "{text}");
    assert!(
        text.contains(
            "beats the driver pool on both: GPUMEM_CACHE_MODE=fixed GPUMEM_MAX_CHUNK_BYTES="
        ) || text.contains("no setting beats the driver pool on both")
            || text.contains("no setting holds as little memory"),
        "{text}"
    );
    assert!(
        text.contains(
            "One setting for all 2 traces: GPUMEM_CACHE_MODE=fixed GPUMEM_MAX_CHUNK_BYTES="
        ) || text.contains("No setting beats the driver pool on both axes on any of the 2"),
        "{text}"
    );
    let json = gpumem(&[
        "replay",
        "--backend",
        "cuda",
        "--sweep",
        "--json",
        trace.to_str().unwrap(),
    ]);
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        rows.len(),
        92,
        "90 settings, the adaptive default and the driver pool"
    );
    assert!(
        rows.iter()
            .any(|r| r["strategy"].to_string().contains("driver")),
        "{rows:?}"
    );
    assert_eq!(
        rows.iter()
            .filter(|r| r["cache_mode"] == "adaptive")
            .count(),
        1,
        "{rows:?}"
    );

    // One setting against the pool, in alternated rounds: both medians and the verdict.
    let out = gpumem(&[
        "replay",
        "--backend",
        "cuda",
        "--against-driver-pool",
        "--repeat",
        "2",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(default)"), "{text}");
    assert!(text.contains("driver pool (cuMemAllocAsync): "), "{text}");
}

/// A three-allocation trace named "steps" whose every allocation misses on a fresh pool: what
/// the sweep tests replay under each setting.
fn steps_trace(dir: &std::path::Path) -> std::path::PathBuf {
    write_trace(
        dir,
        "steps.trace",
        "# {\"name\": \"steps\"}\na 1 5000000 0\nf 1\na 2 9000000 0\na 3 700 0\nf 2\nf 3\n",
    )
}
