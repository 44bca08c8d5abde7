//! Collecting: the sidecar side of publishing. [`Collector`] reads the files engines publish
//! (`crate::publish`) from a shared directory; [`Sidecar`] combines them with NVML's device and
//! per-process memory into the snapshots `gpumem serve` exports.

mod collector;
pub mod exited;
pub mod read;
mod sidecar;

pub use collector::{check_dir, CollectSettings, Collected, Collector, DROP_REASONS, MAX_FILES};
pub use read::{read_file, Rejection, MAX_FILE_BYTES, REJECTION_REASONS};
pub use sidecar::{DeviceSource, Sidecar};
