//! The flags of `gpumem estimate` and their validation: a preset and the shape flags that
//! override it, the workload, all checked into a model shape and a workload before any device is
//! opened.

use crate::cli::{CliError, CommonArgs};
use clap::Args;
use gpumem::planner::{preset, Dtype, ModelShape, Preset, Workload};

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
pub(crate) struct EstimateArgs {
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
    #[arg(long, env = "GPUMEM_DTYPE", value_parser = crate::cli::named::<Dtype>(), default_value = "fp16")]
    dtype: Dtype,

    /// Storage of the KV cache.
    #[arg(long, env = "GPUMEM_KV_DTYPE", value_parser = crate::cli::named::<Dtype>(), default_value = "fp16")]
    kv_dtype: Dtype,

    /// Print one JSON object instead of the text report.
    #[arg(long, env = "GPUMEM_JSON")]
    pub(super) json: bool,

    #[command(flatten)]
    pub(super) common: CommonArgs,
}

/// The validated request.
pub(super) struct Settings {
    pub(super) preset: Option<&'static Preset>,
    pub(super) shape: ModelShape,
    pub(super) workload: Workload,
}

fn positive(flag: &str, value: i64) -> Result<u64, CliError> {
    u64::try_from(value)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| CliError::usage(format!("--{flag}: must be at least 1 (got {value})")))
}

pub(super) fn settings(args: &EstimateArgs) -> Result<Settings, CliError> {
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
