//! gpumem: a GPU memory manager (caching pools over the CUDA driver, leak tracking, pressure)
//! and the observability around it (sampler, Prometheus endpoint, status page, sidecar).

pub mod backend;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod collect;
pub mod demo;
pub mod error;
pub mod exporter;
pub mod ffi;
pub mod manager;
pub mod nvml;
pub mod planner;
pub mod plot;
pub mod pool;
pub mod publish;
pub mod replay;
pub mod sampler;
pub mod snapshot;
pub mod trace;
pub mod units;
pub mod web;

pub use backend::{BackendChoice, BackendKind, DeviceBackend, StreamId};
pub use error::{AllocError, BackendError};
pub use exporter::{Exporter, ExporterHandle};
pub use manager::{AllocOptions, DeviceBuffer, ManagerConfig, MemoryManager, Strategy, Tag};
