//! Helpers shared by the integration tests: backends to run against and the GPU switch here;
//! the gpumem binary in `binary`, headless Chromium in `chromium`, promtool in `promtool`.

mod binary;
mod chromium;
mod promtool;

pub(crate) use binary::{gpumem, gpumem_as_user, stderr, stdout, url_on_first_line, Running};
pub(crate) use chromium::Chromium;
pub(crate) use promtool::promtool_check_metrics;

use gpumem::backend::sim::{SimBackend, SimConfig};
use gpumem::manager::CacheMode;
use gpumem::{DeviceBackend, ManagerConfig, MemoryManager};
use std::sync::Arc;

/// `gpumem serve` on the simulated device, on a free loopback port, sampling every `interval`:
/// the arguments every test of a running server starts from.
pub(crate) fn serve_args(interval: &str) -> Vec<&str> {
    vec![
        "serve",
        "--backend",
        "sim",
        "--listen",
        "127.0.0.1:0",
        "--interval",
        interval,
    ]
}

/// A manager of device 0 whose cache keeps exactly `idle_pages_kept` idle pages (none per
/// mille), may use the whole device, and runs no upkeep thread: what the cache-budget tests need
/// to know exactly which pages move.
pub(crate) fn tight_manager(
    backend: Arc<dyn DeviceBackend>,
    idle_pages_kept: usize,
) -> MemoryManager {
    MemoryManager::new(backend, tight_config(idle_pages_kept)).unwrap()
}

/// [`tight_manager`]'s configuration, to change further: the cache budget exactly as given, so
/// a fixed setting (the adaptive default starts a rung above the configured one, with idle
/// pages of its own).
pub(crate) fn tight_config(idle_pages_kept: usize) -> ManagerConfig {
    ManagerConfig {
        devices: Some(vec![0]),
        cache_mode: CacheMode::Fixed,
        idle_pages_kept,
        idle_per_mille: 0,
        gpu_memory_fraction: 1.0,
        cleanup_interval: None,
        release_idle_after: None,
        ..ManagerConfig::default()
    }
}

/// target/ (or wherever Cargo builds), for artefacts a person looks at after the run.
pub(crate) fn target_dir() -> std::path::PathBuf {
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).to_path_buf()
}

/// True when `GPUMEM_REQUIRE_GPU=1`: GPU tests must then run and pass, never skip.
pub(crate) fn gpu_required() -> bool {
    std::env::var("GPUMEM_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The CUDA backend when a GPU is usable; `None` (skip) otherwise, unless a GPU is required.
pub(crate) fn cuda_backend() -> Option<Arc<dyn DeviceBackend>> {
    match gpumem::backend::open_backend(gpumem::BackendChoice::Cuda, SimConfig::default()) {
        Ok(opened) => Some(opened.backend),
        Err(error) if gpu_required() => {
            panic!("GPUMEM_REQUIRE_GPU=1 but CUDA is unusable: {error}")
        }
        Err(error) => {
            eprintln!("skipping CUDA half of the test: {error}");
            None
        }
    }
}

pub(crate) fn sim_backend() -> Arc<SimBackend> {
    Arc::new(SimBackend::new(SimConfig::default()))
}

/// Every backend a contract test runs against: sim always, CUDA when present.
pub(crate) fn all_backends() -> Vec<Arc<dyn DeviceBackend>> {
    let mut backends: Vec<Arc<dyn DeviceBackend>> = vec![sim_backend()];
    backends.extend(cuda_backend());
    backends
}

/// `VmHWM` (peak) and `VmRSS` (now) of process `pid`, in KiB; `None` once it is gone.
pub(crate) fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

/// `VmHWM` of a running process `pid`, in KiB.
pub(crate) fn peak_kib(pid: u32) -> u64 {
    memory_kib(pid).expect("the process's VmHWM").0
}
