//! The one manager behind the C ABI, opened on first use from the environment: `GPUMEM_BACKEND`
//! (`cuda`, the default, or `sim` for tests without a GPU), `GPUMEM_CONFIG` and the `GPUMEM_*`
//! settings the command line reads too. Also the exporter and publisher it may run.

use super::deferred_frees::DeferredFrees;
use super::graphs::GraphCaptures;
use super::live::LiveBuffers;
use gpumem::backend::{open_backend, BackendChoice};
use gpumem::manager::MemoryManager;
use gpumem::settings::Settings;
use std::sync::OnceLock;

pub(super) struct Runtime {
    pub manager: MemoryManager,
    pub live: LiveBuffers,
    pub graphs: GraphCaptures,
    pub deferred: DeferredFrees,
    /// The exporter and publisher the host started (`exporting.rs`; empty without them).
    #[cfg_attr(not(feature = "exporter"), allow(dead_code))]
    pub exporting: super::exporting::Handles,
}

/// The runtime, opened by the first call that needs it. A failure to open is kept and returned
/// to every later call: the environment will not change its answer.
pub(super) fn runtime() -> Result<&'static Runtime, String> {
    if super::fork::in_forked_child() {
        // Its locks may be held for good, and its driver context is the parent's.
        return Err(super::fork::IN_FORKED_CHILD.to_string());
    }
    RUNTIME
        .get_or_init(|| open().map_err(|why| format!("gpumem could not start: {why}")))
        .as_ref()
        .map_err(Clone::clone)
}

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// Makes `manager` the one the C ABI uses, instead of opening one from the environment: for a
/// Rust program that hosts Python and wants one manager for both, and for tests. Only before
/// the first call of the C ABI; an error afterwards.
pub fn install(manager: MemoryManager) -> Result<(), String> {
    super::fork::watch();
    RUNTIME
        .set(Ok(Runtime::new(manager)))
        .map_err(|_| "the C ABI already has its memory manager".to_string())
}

fn open() -> Result<Runtime, String> {
    // One pool per device and stream, shared by every thread (a file or GPUMEM_SHARDS may say
    // otherwise). PyTorch's autograd threads free what the main thread allocated in the
    // forward pass and allocate the gradients: with a shard per thread, one thread's cached
    // pages are of no use to the other, and the cache budget moves them between the shards
    // through the driver at every step.
    let base = gpumem::manager::MemoryConfig {
        shards: 1,
        ..Default::default()
    };
    let settings = Settings::from_environment(base).map_err(|e| e.to_string())?;
    // Memory handed to a host must be real: "auto" would fall back to a simulated device
    // without a GPU and give PyTorch addresses no kernel can touch.
    let choice = match settings.backend {
        None => BackendChoice::Cuda,
        Some(BackendChoice::Auto) => {
            return Err(
                "GPUMEM_BACKEND=auto is not accepted here: a library must hand out real \
                        device memory; use cuda (the default) or sim (simulated, for tests)"
                    .to_string(),
            )
        }
        Some(choice) => choice,
    };
    let backend = open_backend(choice, settings.sim.clone())
        .map_err(|e| match choice {
            BackendChoice::Cuda => format!(
                "{e} (GPUMEM_BACKEND=sim gives a simulated device, for tests without a GPU)"
            ),
            _ => e.to_string(),
        })?
        .backend;
    // The same checks as the command line's: the selection, and a reserve or preallocation
    // that no selected device can hold.
    let config = settings
        .resolve(backend.as_ref())
        .map_err(|e| e.to_string())?;
    let manager = MemoryManager::new(backend, config).map_err(|e| e.to_string())?;
    tracing::debug!(backend = %manager.backend().kind(), "gpumem library opened");
    Ok(Runtime::new(manager))
}

impl Runtime {
    fn new(manager: MemoryManager) -> Self {
        Runtime {
            manager,
            live: LiveBuffers::new(),
            graphs: GraphCaptures::default(),
            deferred: DeferredFrees::default(),
            exporting: Default::default(),
        }
    }

    /// Runs `f` so that the thread's current CUDA context is the same afterwards as before.
    pub(super) fn keeping_host_context<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.manager.backend().host_context() {
            Some(host) => host.keeping(f),
            None => f(),
        }
    }
}
