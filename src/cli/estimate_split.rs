//! The part of `gpumem estimate` that answers "and across several devices?": each device's share
//! of a model under tensor and pipeline parallelism, checked against that device's usable memory.

use gpumem::planner::{
    pipeline_parallel, tensor_parallel, DeviceMemory, ModelShape, Share, Split, SplitError,
    SplitKind, Workload,
};
use gpumem::units::Bytes;
use serde::Serialize;

/// Both ways of splitting over the selected devices.
#[derive(Serialize)]
pub(super) struct SplitReport {
    /// Backend indices of the devices, in rank order.
    devices: Vec<usize>,
    tensor_parallel: SplitFit,
    pipeline_parallel: SplitFit,
}

/// One way of splitting: each device's share and whether it fits, or why it cannot be cut so.
#[derive(Serialize)]
struct SplitFit {
    kind: SplitKind,
    /// Every share fits in its device's usable memory.
    fits: bool,
    shares: Vec<DeviceShare>,
    /// Why the model cannot be cut this way (then `shares` is empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize)]
struct DeviceShare {
    device: usize,
    #[serde(flatten)]
    share: Share,
    usable_bytes: u64,
    fits: bool,
}

impl SplitFit {
    fn new(kind: SplitKind, split: Result<Split, SplitError>, devices: &[DeviceMemory]) -> Self {
        match split {
            Ok(split) => {
                let shares: Vec<DeviceShare> = split
                    .shares
                    .into_iter()
                    .zip(devices)
                    .map(|(share, device)| DeviceShare {
                        device: device.index,
                        usable_bytes: device.usable(),
                        fits: share.total_bytes <= device.usable(),
                        share,
                    })
                    .collect();
                SplitFit {
                    kind,
                    fits: shares.iter().all(|s| s.fits),
                    shares,
                    error: None,
                }
            }
            Err(error) => SplitFit {
                kind,
                fits: false,
                shares: Vec::new(),
                error: Some(error.to_string()),
            },
        }
    }

    /// "tensor-parallel fits (at most 65.1 GiB per device)" and the like.
    fn summary(&self) -> String {
        let name = self.kind.name();
        if let Some(error) = &self.error {
            return format!("{name} impossible ({error})");
        }
        let largest = self.shares.iter().map(|s| s.share.total_bytes).max();
        let verdict = if self.fits { "fits" } else { "does not fit" };
        format!(
            "{name} {verdict} (at most {} per device)",
            Bytes(largest.unwrap_or(0))
        )
    }
}

/// Both splits over `devices` (in the order given), or `None` with fewer than two devices.
pub(super) fn plan(
    shape: &ModelShape,
    workload: &Workload,
    devices: &[DeviceMemory],
) -> Option<SplitReport> {
    if devices.len() < 2 {
        return None;
    }
    let ways = devices.len();
    Some(SplitReport {
        devices: devices.iter().map(|d| d.index).collect(),
        tensor_parallel: SplitFit::new(
            SplitKind::TensorParallel,
            tensor_parallel(shape, workload, ways),
            devices,
        ),
        pipeline_parallel: SplitFit::new(
            SplitKind::PipelineParallel,
            pipeline_parallel(shape, workload, ways),
            devices,
        ),
    })
}

impl SplitReport {
    /// One line for the verdict.
    pub(super) fn summary(&self) -> String {
        format!(
            "split across {} devices: {}; {}",
            self.devices.len(),
            self.tensor_parallel.summary(),
            self.pipeline_parallel.summary()
        )
    }

    /// The table of shares, one block per way of splitting.
    pub(super) fn render(&self) -> String {
        let mut out = format!(
            "split across {} devices (the model fits on none alone):\n",
            self.devices.len()
        );
        for fit in [&self.tensor_parallel, &self.pipeline_parallel] {
            out.push_str(&format!("  {}\n", fit.summary()));
            if fit.error.is_some() {
                continue;
            }
            out.push_str(&format!(
                "    {:<4} {:<9} {:>12} {:>12} {:>12} {:>12} {:>12} {:>5}\n",
                "GPU", "LAYERS", "WEIGHTS", "KV CACHE", "ACTIVATIONS", "TOTAL", "USABLE", "FITS"
            ));
            for s in &fit.shares {
                out.push_str(&format!(
                    "    {:<4} {:<9} {:>12} {:>12} {:>12} {:>12} {:>12} {:>5}\n",
                    s.device,
                    match fit.kind {
                        SplitKind::TensorParallel => "all (cut)".to_string(),
                        SplitKind::PipelineParallel =>
                            format!("{}-{}", s.share.layers.0, s.share.layers.1 - 1),
                    },
                    Bytes(s.share.weights_bytes).to_string(),
                    Bytes(s.share.kv_cache_bytes).to_string(),
                    Bytes(s.share.activation_bytes).to_string(),
                    Bytes(s.share.total_bytes).to_string(),
                    Bytes(s.usable_bytes).to_string(),
                    if s.fits { "yes" } else { "no" }
                ));
            }
        }
        out
    }
}
