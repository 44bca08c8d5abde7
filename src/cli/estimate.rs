//! `gpumem estimate`: the memory a model needs at inference (weights, KV cache, activations) and,
//! for each device, whether it fits, the largest batch that does, the workspace it would give a
//! quantized linear layer, and which device to use — or, when it fits on none alone, how it
//! splits across the selected devices (`split`). Its flags and their validation are in `flags`,
//! the text report in `render`.

#[path = "estimate_flags.rs"]
mod flags;
#[path = "estimate_render.rs"]
mod render;
#[path = "estimate_split.rs"]
mod split;

pub(super) use flags::EstimateArgs;

use super::{CliError, Given};
use flags::{settings, Settings};
use gpumem::backend::DeviceBackend;
use gpumem::planner::{
    estimate_inference_memory, max_batch_that_fits, optimal_batch_size, select_device_for,
    DeviceMemory, InferenceEstimate, LinearLayer, ModelShape, Placement, Workload, WorkspacePlan,
};
use gpumem::units::Bytes;
use render::render;
use serde::Serialize;

/// One device's answer.
#[derive(Serialize)]
struct DeviceFit {
    index: usize,
    name: String,
    total_bytes: u64,
    free_bytes: Option<u64>,
    usable_bytes: Option<u64>,
    /// The requested batch fits in usable memory.
    fits: bool,
    /// Largest batch at --max-seq that fits (0: not even one sequence).
    max_batch: u64,
    /// Rows per call the workspace rule allows the largest linear layer, in what is left after
    /// weights and KV cache (null when not even one row fits).
    linear_batch: Option<u64>,
    /// The workspace behind `linear_batch`: bytes, batch and why (null with it).
    workspace: Option<Workspace>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mem_info_error: Option<String>,
}

/// The scratch memory the workspace rule gives the model's largest linear layer on one device.
#[derive(Serialize)]
struct Workspace {
    /// `hidden x max(hidden, intermediate)` at the weights' bits.
    layer: String,
    batch: u64,
    /// The device class's cap on the batch.
    cap: u64,
    workspace_bytes: u64,
    /// Usable memory left after weights and KV cache.
    available_bytes: u64,
    /// 60 % of `available_bytes`: what the workspace may take.
    budget_bytes: u64,
    /// Why the batch is what it is: the class cap, or the memory.
    reason: String,
}

impl Workspace {
    fn new(layer: &LinearLayer, plan: &WorkspacePlan, total: u64, available: u64) -> Self {
        let reason = if plan.capped_by_class() {
            format!(
                "the cap for {} (more rows add no throughput)",
                gpumem::planner::batch_cap_class(total)
            )
        } else {
            format!(
                "{} rows would not fit in 60 % of the {} left after weights and KV cache",
                plan.batch * 2,
                Bytes(available)
            )
        };
        Workspace {
            layer: format!(
                "{}x{} {}-bit",
                layer.in_features, layer.out_features, layer.weight_bits
            ),
            batch: plan.batch,
            cap: plan.cap,
            workspace_bytes: plan.workspace_bytes,
            available_bytes: available,
            budget_bytes: plan.budget_bytes,
            reason,
        }
    }
}

#[derive(Serialize)]
struct Report {
    model: Option<&'static str>,
    description: Option<&'static str>,
    shape: ModelShape,
    head_dim: u64,
    workload: Workload,
    estimate: InferenceEstimate,
    devices: Vec<DeviceFit>,
    recommended_device: Option<Placement>,
    /// How the model splits across the selected devices when it fits on none alone (null when
    /// it fits on one, or fewer than two devices could be asked).
    split: Option<split::SplitReport>,
    /// One line: where it goes, or why it fits nowhere.
    verdict: String,
}

pub(super) fn run(args: EstimateArgs, given: &Given) -> Result<(), CliError> {
    let settings = settings(&args)?;
    let estimate = estimate_inference_memory(&settings.shape, &settings.workload)
        .map_err(|e| CliError::usage(e.to_string()))?;
    refuse_overflow(&estimate)?;
    let config = args.common.memory_config()?;
    let (opened, selected) = args.common.open_checked(&config, given)?;
    let backend = opened.backend;
    let mut memories = Vec::new();
    let mut devices = Vec::new();
    for index in selected {
        let (fit, memory) = device_fit(&*backend, index, &settings, &estimate)?;
        devices.push(fit);
        memories.extend(memory);
    }
    let mut split = None;
    let (recommended_device, verdict) = match select_device_for(estimate.total_bytes, &memories) {
        Ok(p) => {
            let name = devices.iter().find(|d| d.index == p.index).map(|d| &d.name);
            let line = format!(
                "recommended: GPU {} ({}), {} usable left",
                p.index,
                name.map_or("?", |n| n.as_str()),
                Bytes(p.headroom_after)
            );
            (Some(p), line)
        }
        Err(e) => {
            split = split::plan(&settings.shape, &settings.workload, &memories);
            let verdict = match &split {
                Some(plan) => format!("does not fit on one device; {}", plan.summary()),
                None => format!("does not fit: {e}"),
            };
            (None, verdict)
        }
    };
    let report = Report {
        model: settings.preset.map(|p| p.name),
        description: settings.preset.map(|p| p.description),
        shape: settings.shape,
        head_dim: settings.shape.head_dim(),
        workload: settings.workload,
        estimate,
        devices,
        recommended_device,
        split,
        verdict,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::runtime(format!("could not encode JSON: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

/// Sizes are computed saturating at 2^64 bytes: a shape that reaches it has no meaningful
/// estimate (it printed "16777216 TiB"), so it is refused as bad input.
fn refuse_overflow(estimate: &InferenceEstimate) -> Result<(), CliError> {
    let parts = [
        estimate.weights_bytes,
        estimate.kv_cache_bytes,
        estimate.activation_bytes,
        estimate.total_bytes,
    ];
    if parts.contains(&u64::MAX) || estimate.parameters == u64::MAX {
        return Err(CliError::usage(
            "the model shape is too large: its memory does not fit in 64 bits \
             (check --hidden, --intermediate, --layers, --vocab, --max-seq and --batch)",
        ));
    }
    Ok(())
}

fn device_fit(
    backend: &dyn DeviceBackend,
    index: usize,
    settings: &Settings,
    estimate: &InferenceEstimate,
) -> Result<(DeviceFit, Option<DeviceMemory>), CliError> {
    let properties = backend
        .properties(index)
        .map_err(|e| CliError::runtime(format!("device {index}: {e}")))?;
    let mut fit = DeviceFit {
        index,
        name: properties.name,
        total_bytes: properties.total_memory_bytes,
        free_bytes: None,
        usable_bytes: None,
        fits: false,
        max_batch: 0,
        linear_batch: None,
        workspace: None,
        mem_info_error: None,
    };
    let info = match backend.mem_info(index) {
        Ok(info) => info,
        Err(error) => {
            fit.mem_info_error = Some(error.to_string());
            return Ok((fit, None));
        }
    };
    let memory = DeviceMemory {
        index,
        name: fit.name.clone(),
        total: info.total,
        free: info.free,
    };
    let usable = memory.usable();
    let (shape, workload) = (&settings.shape, &settings.workload);
    let largest_linear = LinearLayer {
        in_features: shape.hidden,
        out_features: shape.hidden.max(shape.intermediate),
        weight_bits: workload.weights.bits(),
        activation_bytes: workload.weights.activation_bytes(),
    };
    let after_model = usable.saturating_sub(estimate.weights_bytes + estimate.kv_cache_bytes);
    fit.free_bytes = Some(info.free);
    fit.usable_bytes = Some(usable);
    fit.fits = estimate.total_bytes <= usable;
    fit.max_batch =
        max_batch_that_fits(shape, workload, usable).map_err(|e| CliError::usage(e.to_string()))?;
    if let Ok(plan) = optimal_batch_size(&largest_linear, info.total, after_model) {
        fit.linear_batch = Some(plan.batch);
        fit.workspace = Some(Workspace::new(
            &largest_linear,
            &plan,
            info.total,
            after_model,
        ));
    }
    Ok((fit, Some(memory)))
}
