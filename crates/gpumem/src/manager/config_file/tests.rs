//! Tests of `config_file`.

use super::*;
use crate::units::{GIB, MIB};

fn from_file(text: &str) -> Result<MemoryConfig, ConfigError> {
    // A file per call: tests run in parallel threads, and the clock alone can repeat.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gpumem-config-{}-{}-{}",
        std::process::id(),
        crate::clock::now(),
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gpumem.toml");
    std::fs::write(&path, text).unwrap();
    load_config(&ConfigSources {
        file: Some(path),
        env: vec![],
    })
}

fn from_env(vars: &[(&str, &str)]) -> Result<MemoryConfig, ConfigError> {
    let env = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    load_config(&ConfigSources { file: None, env })
}

#[test]
fn a_file_sets_keys_over_its_preset() {
    let config = from_file(
        "preset = \"constrained\"\ngpu_memory_fraction = 0.7\nmin_free_bytes = \"1GiB\"\nleak_age = \"5m\"\n\
         cleanup_interval = \"off\"\ndevices = [0, 1]\n[pressure]\nhigh = 0.85\nreserve = 1073741824\n",
    )
    .unwrap();
    assert!(config.cpu_fallback, "from the preset");
    assert_eq!(config.gpu_memory_fraction, 0.7);
    assert_eq!(config.min_free_bytes, GIB);
    assert_eq!(config.leak_age, Duration::from_secs(300));
    assert_eq!(config.cleanup_interval, None);
    assert_eq!(config.devices, Some(vec![0, 1]));
    assert_eq!(config.pressure.high, 0.85);
    assert_eq!(config.pressure.reserve_bytes, Some(GIB));
}

#[test]
fn bad_files_name_the_key_and_the_problem() {
    let err = from_file("gpu_memory_fraction = 1.5\n").unwrap_err();
    assert!(
        err.to_string().contains("gpu_memory_fraction")
            && err.to_string().contains("0 < value <= 1"),
        "{err}"
    );
    let err = from_file("gpu_memory_fraction = \"most\"\n").unwrap_err();
    assert!(
        err.to_string().contains("gpu_memory_fraction") && err.to_string().contains("not a number"),
        "{err}"
    );
    let err = from_file("turbo = true\n").unwrap_err();
    assert!(
        err.to_string().contains("`") && err.to_string().contains("unknown key"),
        "{err}"
    );
    let err = from_file("leak_age = = 3\n").unwrap_err();
    assert!(err.to_string().contains("not valid TOML"), "{err}");
    let err = from_file("min_free_bytes = \"lots\"\n").unwrap_err();
    assert!(err.to_string().contains("min_free_bytes"), "{err}");
    let err = from_file("[pressure]\nmedium = 0.9\n").unwrap_err();
    assert!(err.to_string().contains("must increase"), "{err}");
}

#[test]
fn a_guide_style_file_with_the_guides_key_names_loads() {
    let config = from_file(
        "preset = \"production\"\nenable_memory_tracking = false\nmax_cached_buffers = 16\n\
         max_pool_size = \"7GB\"\ncpu_fallback = true\n",
    )
    .unwrap();
    assert!(!config.track_allocations);
    assert_eq!(config.max_cached_bytes, Some(16 * 2 * MIB));
    assert_eq!(config.max_pool_bytes, Some(7 * GIB));
    assert!(config.cpu_fallback);
    let err = from_file("enable_memory_tracking = \"sometimes\"\n").unwrap_err();
    assert!(err.to_string().contains("enable_memory_tracking"), "{err}");
    let err = from_file("max_cached_buffers = -1\n").unwrap_err();
    assert!(err.to_string().contains("max_cached_buffers"), "{err}");
}

#[test]
fn a_retired_key_names_its_replacement() {
    let err = from_file("chunks_per_miss = 8\n").unwrap_err().to_string();
    assert!(
        err.contains("chunks_per_miss") && err.contains("inside_chunk_bytes"),
        "{err}"
    );
    assert_eq!(
        retired("GPUMEM_CHUNKS_PER_MISS"),
        retired("chunks_per_miss")
    );
}

#[test]
fn inside_chunks_beyond_64_gib_are_refused_by_name() {
    let err = from_file("inside_chunk_bytes = \"128GiB\"\n").unwrap_err();
    assert!(err.to_string().contains("inside_chunk_bytes"), "{err}");
}

#[test]
fn a_bad_size_or_duration_is_named_once() {
    // The parsers' own sentences name the value; the key's message does not repeat it.
    for (key, value) in [
        ("max_chunk_bytes", "abc"),
        ("inside_chunk_bytes", "16X"),
        ("leak_age", "5x"),
    ] {
        let from_file = from_file(&format!("{key} = \"{value}\"\n")).unwrap_err();
        let env_key = format!("GPUMEM_{}", key.to_uppercase());
        let from_env = from_env(&[(env_key.as_str(), value)]).unwrap_err();
        for err in [from_file.to_string(), from_env.to_string()] {
            assert!(
                err.contains(&key.to_uppercase()) || err.contains(key),
                "{err}"
            );
            assert_eq!(err.matches(value).count(), 1, "{err}");
        }
    }
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let err = load_config(&ConfigSources {
        file: Some("/no/such/gpumem.toml".into()),
        env: vec![],
    })
    .unwrap_err();
    assert!(err.to_string().contains("/no/such/gpumem.toml"), "{err}");
}

#[test]
fn environment_overrides_and_cuda_variables_are_honoured() {
    let config = from_env(&[
        ("GPUMEM_CPU_FALLBACK", "true"),
        ("GPUMEM_PRESSURE_CRITICAL", "0.97"),
        ("GPUMEM_LISTEN", "ignored: a CLI flag, not a config key"),
        ("CUDA_MEMORY_POOL_SIZE", "2G"),
        ("CUDA_MEMORY_POOL_TRIM", "1"),
    ])
    .unwrap();
    assert!(config.cpu_fallback);
    assert_eq!(config.pressure.critical, 0.97);
    assert_eq!(config.preallocate_bytes, 2 * GIB);
    assert_eq!(config.release_idle_after, Some(Duration::ZERO));
    let err = from_env(&[("GPUMEM_MAX_CACHED_BUFFERS", "many")]).unwrap_err();
    assert!(
        err.to_string().contains("GPUMEM_MAX_CACHED_BUFFERS"),
        "{err}"
    );
    let err = from_env(&[("GPUMEM_SMALL_MAX_BYTES", "1TiB")]).unwrap_err();
    assert!(err.to_string().contains("small_max_bytes"), "{err}");
    let err = from_env(&[("GPUMEM_GPU_MEMORY_FRACTION", "-1")]).unwrap_err();
    assert!(err.to_string().contains("gpu_memory_fraction"), "{err}");
    assert_eq!(
        from_env(&[("GPUMEM_MAX_POOL_SIZE", "512MiB")])
            .unwrap()
            .max_pool_bytes,
        Some(512 * MIB)
    );
}

#[test]
fn mapping_ahead_is_a_key_of_the_file_and_the_environment() {
    assert!(!MemoryConfig::default().map_ahead_when_growing);
    assert!(
        from_file("map_ahead_when_growing = true\n")
            .unwrap()
            .map_ahead_when_growing
    );
    assert!(
        from_env(&[("GPUMEM_MAP_AHEAD_WHEN_GROWING", "true")])
            .unwrap()
            .map_ahead_when_growing
    );
    let err = from_env(&[("GPUMEM_MAP_AHEAD_WHEN_GROWING", "ahead")]).unwrap_err();
    assert!(
        err.to_string().contains("GPUMEM_MAP_AHEAD_WHEN_GROWING"),
        "{err}"
    );
}

#[test]
fn stream_ordered_reuse_is_true_false_or_left_to_the_adaptive_default() {
    let set = |text: &str| from_file(text).map(|c| c.stream_ordered_reuse);
    assert_eq!(set("").unwrap(), None);
    assert_eq!(set("stream_ordered_reuse = \"auto\"\n").unwrap(), None);
    assert_eq!(set("stream_ordered_reuse = true\n").unwrap(), Some(true));
    assert_eq!(
        set("stream_ordered_reuse = \"off\"\n").unwrap(),
        Some(false)
    );
    let err = set("stream_ordered_reuse = \"sometimes\"\n").unwrap_err();
    let err = err.to_string();
    assert!(
        err.contains("stream_ordered_reuse") && err.contains("true, false or auto"),
        "{err}"
    );
}
