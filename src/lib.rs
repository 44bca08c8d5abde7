//! gpumem: a GPU memory manager (caching pools over the CUDA driver, leak tracking, pressure)
//! and the observability around it (sampler, Prometheus endpoint, status page, sidecar).
//!
//! The core — [`backend`], [`pool`], [`manager`], [`snapshot`], [`planner`] — builds with
//! `default-features = false` and none of the web, command-line, NVML or plotting dependencies.
//! Features add the rest: `exporter` (sampler, `/metrics`, status page, JSON API, publishing
//! for a sidecar), `sidecar` (the collector and NVML), `config-file` (TOML and `GPUMEM_*`
//! settings) and `cli` (the `gpumem` command; on by default, with all of the above).

pub mod backend;
pub mod clock;
pub mod error;
pub mod manager;
pub mod planner;
pub mod pool;
pub mod snapshot;
pub mod units;

#[cfg(feature = "exporter")]
pub mod exporter;
#[cfg(feature = "exporter")]
pub mod flight;
#[cfg(feature = "exporter")]
pub mod nvml;
#[cfg(feature = "exporter")]
pub mod publish;
#[cfg(any(feature = "exporter", feature = "config-file"))]
pub mod safe_fs;
#[cfg(feature = "exporter")]
pub mod sampler;
#[cfg(feature = "exporter")]
pub mod web;

#[cfg(feature = "sidecar")]
pub mod collect;

#[cfg(feature = "cli")]
mod bench;
#[cfg(feature = "cli")]
mod cli;
#[cfg(feature = "cli")]
mod demo;
/// The C ABI (PyTorch's pluggable-allocator entry points and the Python package's calls); it
/// reads its settings as the command line does, from `GPUMEM_*` variables.
#[cfg(feature = "cli")]
pub mod ffi;
#[cfg(feature = "cli")]
mod plot;
#[cfg(feature = "cli")]
pub mod replay;
#[cfg(feature = "cli")]
pub mod trace;

/// The README's code examples, compiled as doc tests so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;

/// The `gpumem` command line, run with the process's arguments; returns the exit code. The
/// binary's whole `main`.
#[cfg(feature = "cli")]
pub use cli::run as run_cli;

pub use backend::{BackendChoice, BackendKind, DeviceBackend, StreamId};
pub use error::{AllocError, BackendError};
#[cfg(feature = "exporter")]
pub use exporter::{Exporter, ExporterHandle};
pub use manager::{
    AllocOptions, DeviceBuffer, GraphPoolId, ManagerConfig, MemoryManager, Strategy, Tag,
};
