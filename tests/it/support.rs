//! Helpers shared by the integration tests: backends to run against and the GPU switch here;
//! the gpumem binary in `binary`, promtool in `promtool`.

mod binary;
mod promtool;

pub(crate) use binary::{gpumem, gpumem_as_user, Running};
pub(crate) use promtool::promtool_check_metrics;

use gpumem::backend::cuda::CudaBackend;
use gpumem::backend::sim::{SimBackend, SimConfig};
use gpumem::DeviceBackend;
use std::sync::Arc;

/// True when `GPUMEM_REQUIRE_GPU=1`: GPU tests must then run and pass, never skip.
pub(crate) fn gpu_required() -> bool {
    std::env::var("GPUMEM_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The CUDA backend when a GPU is usable; `None` (skip) otherwise, unless a GPU is required.
pub(crate) fn cuda_backend() -> Option<Arc<dyn DeviceBackend>> {
    match CudaBackend::open() {
        Ok(backend) => Some(Arc::new(backend)),
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
