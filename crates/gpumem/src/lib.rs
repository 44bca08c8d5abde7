//! gpumem's core: a GPU memory manager for inference engines — caching pools over the CUDA
//! driver, leak tracking, pressure — and the serialisable snapshot of it.
//!
//! [`backend`] (the CUDA driver, loaded at run time, or a simulated device), [`pool`],
//! [`manager`], [`settings`] (the one reader of `GPUMEM_*` variables and config files),
//! [`snapshot`] and [`planner`]. No web, command-line, NVML or plotting dependency: those live
//! in `gpumem-observe` and the `gpumem` binary. The feature `config-file` adds TOML files.

pub mod backend;
pub mod clock;
pub mod error;
pub mod manager;
pub mod named;
pub mod planner;
pub mod pool;
pub mod safe_fs;
pub mod settings;
pub mod snapshot;
pub mod units;

/// The README's code examples, compiled as doc tests so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;

pub use backend::{BackendChoice, BackendKind, DeviceBackend, StreamId};
pub use error::{AllocError, BackendError};
pub use manager::{
    AllocOptions, DeviceBuffer, GraphPoolId, ManagerConfig, MemoryManager, Strategy, Tag,
};
