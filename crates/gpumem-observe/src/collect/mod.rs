//! Collecting: the reading side of publishing, what `gpumem serve` runs as a sidecar or as the
//! node agent. [`CollectDir`] reads the files engines publish (`crate::publish`) from a shared
//! directory; [`Collector`] combines them with NVML's device and per-process memory into the
//! snapshots `gpumem serve` exports: with their pods (the node agent), joined to what the same
//! processes publish, and with those that vanished.

mod collect_dir;
mod collector;
pub mod exited;
pub mod gpu_exited;
pub mod merge;
pub mod nvml_fixture;
pub mod published_devices;
pub mod read;

pub use collect_dir::{
    check_dir, series_of, CollectDir, CollectSettings, Collected, DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SERIES, DROP_REASONS, MAX_CLOCK_SKEW_SECONDS, MAX_FILES, SERIES_PER_DEVICE,
    SERIES_PER_POOL,
};
pub use collector::{Collector, DeviceSource};
pub use read::{read_file, read_sized, Rejection, MAX_FILE_BYTES, REJECTION_REASONS};
