//! The memory planner: pure functions that answer "how much memory will this need, and where does
//! it fit?" — scratch space for quantized linear layers ([`workspace`]), the memory of a whole
//! transformer at inference ([`estimate`]), well-known model shapes ([`presets`]), the choice
//! of device ([`select`]) and how a model too large for one device splits across several
//! ([`split`]). Nothing here touches a device: callers pass in the figures a backend
//! reported, so every rule is tested on made-up devices from 2 GB to 141 GB.

pub mod estimate;
pub mod presets;
pub mod select;
pub mod split;
pub mod workspace;

pub use estimate::{
    estimate_inference_memory, max_batch_that_fits, Dtype, InferenceEstimate, ModelShape,
    ParameterCounts, ShapeError, Workload,
};
pub use presets::{preset, Preset, UnknownPreset, PRESETS};
pub use select::{
    default_reserve, select_device_for, DeviceMemory, NoDeviceFits, Placement, Shortfall,
};
pub use split::{pipeline_parallel, tensor_parallel, Share, Split, SplitError, SplitKind};
pub use workspace::{
    batch_cap, batch_cap_class, optimal_batch_size, workspace_size, LinearLayer, WorkspacePlan,
};

use crate::units::Bytes;
use thiserror::Error;

/// Something needs more memory than a device has available: the one error every planner rule
/// returns when even its smallest useful configuration (batch 1) does not fit.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error(
    "insufficient GPU memory for {what}: needs {} but only {} is available ({} short)",
    Bytes(*.required),
    Bytes(*.available),
    Bytes(.required.saturating_sub(*.available))
)]
pub struct InsufficientMemory {
    /// What was being planned, e.g. "the workspace of a 4096x11008 int4 linear layer".
    pub what: String,
    /// Bytes of available memory the smallest configuration needs.
    pub required: u64,
    /// Bytes that were available.
    pub available: u64,
}

/// Made-up devices shared by the planner's tests: (name, total bytes) for the 2, 4, 8, 16, 24,
/// 48, 80 and 141 GB classes, in decimal gigabytes as they are sold.
#[cfg(test)]
pub(crate) const TEST_DEVICES_GB: [(&str, u64); 8] = [
    ("2 GB", 2_000_000_000),
    ("4 GB", 4_000_000_000),
    ("8 GB", 8_000_000_000),
    ("16 GB", 16_000_000_000),
    ("24 GB", 24_000_000_000),
    ("48 GB", 48_000_000_000),
    ("80 GB", 80_000_000_000),
    ("141 GB", 141_000_000_000),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::GIB;

    #[test]
    fn insufficient_memory_is_one_line_with_both_figures() {
        let error = InsufficientMemory {
            what: "a test".to_string(),
            required: 3 * GIB,
            available: GIB,
        };
        let text = error.to_string();
        assert_eq!(
            text,
            "insufficient GPU memory for a test: needs 3.00 GiB but only 1.00 GiB is available (2.00 GiB short)"
        );
        assert!(!text.contains('\n'));
    }
}
