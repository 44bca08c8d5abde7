//! `gpumem estimate`: the memory a model needs at inference (weights, KV cache, activations) and,
//! for each device, whether it fits, the largest batch that does, the workspace it would give a
//! quantized linear layer, and which device to use — or, when it fits on none alone, how it
//! splits across the selected devices (`split`).

#[path = "estimate_split.rs"]
mod split;

use super::{CliError, CommonArgs, Given};
use clap::Args;
use gpumem::backend::DeviceBackend;
use gpumem::planner::{
    estimate_inference_memory, max_batch_that_fits, optimal_batch_size, preset, select_device_for,
    DeviceMemory, Dtype, InferenceEstimate, LinearLayer, ModelShape, Placement, Preset, Workload,
    WorkspacePlan,
};
use gpumem::units::Bytes;
use serde::Serialize;

#[derive(Args, Debug)]
#[command(
    after_help = "Shape flags given with --model override the preset's values. \
    A device's usable memory is its free memory minus a reserve for the driver, the context and \
    library workspaces (600 MiB + 10 % of the device, at most 2 GiB). The exit status is 0 \
    whether or not the model fits (the output says so; JSON has \"recommended_device\": null); \
    2 for bad input. The workspace lines give the scratch memory the largest linear layer gets on \
    each device: the largest power-of-two batch within 60 % of what weights and KV cache leave, \
    capped by the device's class (docs/workspace.md). When the model fits on no single device and \
    two or more are selected (--sim-devices N, --devices 0,1), it shows each device's share \
    under tensor and pipeline parallelism."
)]
pub(super) struct EstimateArgs {
    /// Model shape preset: llama-7b, llama-13b, llama-70b, llama3-8b, llama3-70b, mistral-7b.
    #[arg(long, env = "GPUMEM_MODEL", value_name = "PRESET")]
    model: Option<String>,

    /// Hidden size (model width).
    #[arg(
        long,
        env = "GPUMEM_HIDDEN",
        value_name = "N",
        allow_negative_numbers = true
    )]
    hidden: Option<i64>,

    /// MLP intermediate size.
    #[arg(
        long,
        env = "GPUMEM_INTERMEDIATE",
        value_name = "N",
        allow_negative_numbers = true
    )]
    intermediate: Option<i64>,

    /// Number of transformer layers.
    #[arg(
        long,
        env = "GPUMEM_LAYERS",
        value_name = "N",
        allow_negative_numbers = true
    )]
    layers: Option<i64>,

    /// Vocabulary size.
    #[arg(
        long,
        env = "GPUMEM_VOCAB",
        value_name = "N",
        allow_negative_numbers = true
    )]
    vocab: Option<i64>,

    /// Attention (query) heads; must divide --hidden.
    #[arg(
        long,
        env = "GPUMEM_HEADS",
        value_name = "N",
        allow_negative_numbers = true
    )]
    heads: Option<i64>,

    /// Key/value heads (grouped-query attention); must divide --heads.
    #[arg(
        long,
        env = "GPUMEM_KV_HEADS",
        value_name = "N",
        allow_negative_numbers = true
    )]
    kv_heads: Option<i64>,

    /// The LM head shares the embedding matrix.
    #[arg(long, env = "GPUMEM_TIED_EMBEDDINGS")]
    tied_embeddings: bool,

    /// Tokens per sequence the KV cache holds.
    #[arg(
        long,
        env = "GPUMEM_MAX_SEQ",
        default_value_t = 4096,
        allow_negative_numbers = true
    )]
    max_seq: i64,

    /// Sequences in flight.
    #[arg(
        long,
        env = "GPUMEM_BATCH",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    batch: i64,

    /// Storage of the weights (int8/int4: quantized linears, the rest fp16; i2s/tl1/tl2: BitNet
    /// ternary layouts at 2, 2 and 1.67 bits per weight).
    #[arg(long, env = "GPUMEM_DTYPE", value_parser = super::named::<Dtype>(), default_value = "fp16")]
    dtype: Dtype,

    /// Storage of the KV cache.
    #[arg(long, env = "GPUMEM_KV_DTYPE", value_parser = super::named::<Dtype>(), default_value = "fp16")]
    kv_dtype: Dtype,

    /// Print one JSON object instead of the text report.
    #[arg(long, env = "GPUMEM_JSON")]
    json: bool,

    #[command(flatten)]
    common: CommonArgs,
}

/// The validated request.
struct Settings {
    preset: Option<&'static Preset>,
    shape: ModelShape,
    workload: Workload,
}

fn positive(flag: &str, value: i64) -> Result<u64, CliError> {
    u64::try_from(value)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| CliError::usage(format!("--{flag}: must be at least 1 (got {value})")))
}

fn settings(args: &EstimateArgs) -> Result<Settings, CliError> {
    let preset = match &args.model {
        Some(name) => Some(preset(name).map_err(|e| CliError::usage(e.to_string()))?),
        None => None,
    };
    let base = preset.map(|p| p.shape);
    let flags: [(&str, Option<i64>, Option<u64>); 6] = [
        ("hidden", args.hidden, base.map(|s| s.hidden)),
        (
            "intermediate",
            args.intermediate,
            base.map(|s| s.intermediate),
        ),
        ("layers", args.layers, base.map(|s| s.layers)),
        ("vocab", args.vocab, base.map(|s| s.vocab)),
        ("heads", args.heads, base.map(|s| s.heads)),
        ("kv-heads", args.kv_heads, base.map(|s| s.kv_heads)),
    ];
    // A flag overrides the preset's value; without a preset every flag is needed.
    let mut values = [0u64; 6];
    let mut missing = Vec::new();
    for ((flag, given, from_preset), slot) in flags.into_iter().zip(values.iter_mut()) {
        match (given, from_preset) {
            (Some(v), _) => *slot = positive(flag, v)?,
            (None, Some(v)) => *slot = v,
            (None, None) => missing.push(format!("--{flag}")),
        }
    }
    if !missing.is_empty() {
        return Err(CliError::usage(format!(
            "missing {} (give --model PRESET, or all of --hidden --intermediate --layers \
             --vocab --heads --kv-heads)",
            missing.join(", ")
        )));
    }
    let [hidden, intermediate, layers, vocab, heads, kv_heads] = values;
    let shape = ModelShape {
        hidden,
        intermediate,
        layers,
        vocab,
        heads,
        kv_heads,
        tied_embeddings: args.tied_embeddings || base.is_some_and(|s| s.tied_embeddings),
    };
    let workload = Workload {
        max_seq: positive("max-seq", args.max_seq)?,
        batch: positive("batch", args.batch)?,
        weights: args.dtype,
        kv_cache: args.kv_dtype,
    };
    shape
        .validate()
        .map_err(|e| CliError::usage(format!("invalid model shape: {e}")))?;
    workload
        .validate()
        .map_err(|e| CliError::usage(format!("invalid workload: {e}")))?;
    Ok(Settings {
        preset,
        shape,
        workload,
    })
}

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

fn render(report: &Report) -> String {
    let (shape, workload, e) = (&report.shape, &report.workload, &report.estimate);
    let mut out = String::new();
    let model = match (report.model, report.description) {
        (Some(name), Some(description)) => format!("{name} ({description})"),
        _ => "custom shape".to_string(),
    };
    out.push_str(&format!(
        "model        {model}: hidden {}, intermediate {}, {} layers, vocab {}, {} heads \
         ({} KV heads, head dim {}){}\n",
        shape.hidden,
        shape.intermediate,
        shape.layers,
        shape.vocab,
        shape.heads,
        shape.kv_heads,
        report.head_dim,
        if shape.tied_embeddings {
            ", tied embeddings"
        } else {
            ""
        }
    ));
    out.push_str(&format!(
        "workload     batch {} x {} tokens, weights {}, KV cache {}\n",
        workload.batch,
        workload.max_seq,
        workload.weights.name(),
        workload.kv_cache.name()
    ));
    out.push_str(&format!(
        "parameters   {:.2} B\n\n",
        e.parameters as f64 / 1e9
    ));
    for (label, bytes) in [
        ("weights", e.weights_bytes),
        ("KV cache", e.kv_cache_bytes),
        ("activations", e.activation_bytes),
        ("total", e.total_bytes),
    ] {
        out.push_str(&format!(
            "{label:<12} {:>12}  ({bytes} bytes)\n",
            Bytes(bytes).to_string()
        ));
    }
    out.push_str(&format!(
        "\n{:<4} {:<24} {:>12} {:>12} {:>12} {:>5} {:>9} {:>12}\n",
        "GPU", "NAME", "TOTAL", "FREE", "USABLE", "FITS", "MAX BATCH", "LINEAR BATCH"
    ));
    let optional = |v: Option<u64>| v.map_or_else(|| "?".to_string(), |b| Bytes(b).to_string());
    for d in &report.devices {
        let linear = d
            .linear_batch
            .map_or_else(|| "-".to_string(), |b| b.to_string());
        out.push_str(&format!(
            "{:<4} {:<24} {:>12} {:>12} {:>12} {:>5} {:>9} {:>12}\n",
            d.index,
            d.name,
            Bytes(d.total_bytes).to_string(),
            optional(d.free_bytes),
            optional(d.usable_bytes),
            if d.fits { "yes" } else { "no" },
            d.max_batch,
            linear
        ));
        if let Some(error) = &d.mem_info_error {
            out.push_str(&format!("     memory info unavailable: {error}\n"));
        }
    }
    out.push('\n');
    for d in &report.devices {
        match &d.workspace {
            Some(w) => out.push_str(&format!(
                "workspace    GPU {}: {} ({} bytes) for batch {} of the {} layer: {}\n",
                d.index,
                Bytes(w.workspace_bytes),
                w.workspace_bytes,
                w.batch,
                w.layer,
                w.reason
            )),
            None if d.mem_info_error.is_none() => out.push_str(&format!(
                "workspace    GPU {}: none (not one row of the largest linear layer fits in 60 % \
                 of what weights and KV cache leave)\n",
                d.index
            )),
            None => {}
        }
    }
    if let Some(plan) = &report.split {
        out.push('\n');
        out.push_str(&plan.render());
    }
    out.push_str(&format!("\n{}\n", report.verdict));
    out
}
