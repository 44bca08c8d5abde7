//! The memory a decoder-only transformer (Llama/Mistral layout: RMSNorm, grouped-query
//! attention, gated SwiGLU MLP) needs at inference: weights, KV cache and activations.
//!
//! # Formulas
//!
//! With `head_dim = hidden / heads` and `kv = kv_heads * head_dim`:
//!
//! ```text
//! parameters = vocab*hidden                       token embeddings
//!            + vocab*hidden     (unless tied)     LM head
//!            + layers * ( 2*hidden*hidden         q and o projections
//!                       + 2*hidden*kv             k and v projections
//!                       + 3*hidden*intermediate   gate, up and down (SwiGLU)
//!                       + 2*hidden )              two RMSNorms
//!            + hidden                             final norm
//! weights    = linear params (attention + MLP) * weight_bits / 8
//!            + for int8/int4: one fp16 scale and one zero point per group of 128 weights
//!            + other params (embeddings, LM head, norms) * 2 bytes (4 for fp32), since
//!              quantized checkpoints (GPTQ, AWQ) keep those in fp16
//! kv_cache   = 2 * layers * kv * max_seq * batch * kv_bits / 8
//! activations = batch * max_seq * peak_per_token * act_bytes
//!            + batch * vocab * 4                  fp32 logits
//!            + dequant scratch                    int8/int4 only: hidden*max(hidden,
//!                                                 intermediate)*act_bytes (see workspace)
//! peak_per_token = max( 2*hidden + hidden + 2*kv + hidden,   attention block: residual,
//!                                                            normed input, q, k, v, output
//!                       2*hidden + 3*intermediate )          MLP block: residual, normed
//!                                                            input, gate, up, gate*up
//! ```
//!
//! Ternary weights (BitNet b1.58: every weight is -1, 0 or +1) are stored in one of bitnet.cpp's
//! layouts, at their real density: `i2s` 2 bits per weight, `tl1` 2, `tl2` 5/3 (see [`Dtype`]);
//! each weight matrix adds one fp32 scale (kept in a 32-byte slot, as bitnet.cpp lays it out)
//! instead of per-group scales, and the other parameters stay in fp16 as with int8/int4.
//!
//! `act_bytes` is 4 for fp32 weights and 2 otherwise (quantized models compute in fp16).
//! Layers run one after another and inference keeps no activations for a backward pass, so the
//! peak is one block's working set. The activation figure assumes a fused attention kernel
//! (FlashAttention / SDPA: no `seq x seq` score matrix) and the whole batch prefilled in one
//! forward pass — an upper bound for engines that chunk their prefill.
//!
//! Check: Llama-2-7B has 6,738,415,616 parameters (13.48 GB in fp16) and a 4096-token fp16 KV
//! cache of exactly 2 GiB (`2*32*32*128*4096*2` bytes); the tests pin both.

use serde::Serialize;
use thiserror::Error;

/// Largest hidden size, intermediate size, vocabulary and sequence length accepted (2^24); with
/// the other limits every product fits in a `u128`, and real models are far below them.
pub const MAX_DIMENSION: u64 = 1 << 24;
/// Largest number of layers or heads accepted.
pub const MAX_LAYERS: u64 = 1 << 16;
/// Largest batch accepted.
pub const MAX_BATCH: u64 = 1 << 20;
/// Weights per quantization group (one scale and one zero point each), as GPTQ and AWQ use.
pub const QUANT_GROUP: u64 = 128;

/// Bytes each ternary weight matrix adds for its scale: one fp32 absmean scale, which bitnet.cpp
/// keeps in a 32-byte slot after the packed weights (so the next tensor stays aligned).
pub const TERNARY_SCALE_BYTES: u64 = 32;

/// Storage type of weights or of the KV cache.
///
/// The ternary types are the weight layouts of BitNet b1.58 models in bitnet.cpp (Microsoft's
/// inference framework for them), at their real bits per weight:
/// - `i2s` (I2_S): each weight in 2 bits, four to a byte, with one scale per tensor — 2 bits.
/// - `tl1` (TL1): every two weights packed into a 4-bit index into a 9-entry lookup table of
///   their activations' sums (3^2 = 9 combinations fit in 16) — 4 bits per 2 weights, 2 bits.
/// - `tl2` (TL2): every three weights packed into a 4-bit index plus a 1-bit sign (3^3 = 27
///   combinations, folded to 14 by sign symmetry, fit in 16) — 5 bits per 3 weights, 1.67 bits.
///
/// A ternary weight carries log2(3) = 1.58 bits of information; TL2 comes closest to it. These
/// are weight formats only: `Workload::validate` refuses them for the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Fp16,
    Bf16,
    Fp32,
    Int8,
    Int4,
    /// bitnet.cpp's I2_S: 2 bits per ternary weight.
    I2s,
    /// bitnet.cpp's TL1: two ternary weights per 4-bit index, 2 bits per weight.
    Tl1,
    /// bitnet.cpp's TL2: three ternary weights per 5 bits, 1.67 bits per weight.
    Tl2,
}

impl Dtype {
    /// Bits of storage per element, rounded up to a whole bit (TL2's 5/3 counts as 2): what a
    /// kernel's buffers are sized by. The exact density is [`bits_per_weight`](Self::bits_per_weight).
    pub fn bits(self) -> u32 {
        let (bits, per) = self.bits_per_elements();
        bits.div_ceil(per)
    }

    /// Exact storage density as (bits, elements): 5 bits per 3 weights for TL2.
    pub fn bits_per_elements(self) -> (u32, u32) {
        match self {
            Dtype::Fp32 => (32, 1),
            Dtype::Fp16 | Dtype::Bf16 => (16, 1),
            Dtype::Int8 => (8, 1),
            Dtype::Int4 => (4, 1),
            Dtype::I2s | Dtype::Tl1 => (2, 1),
            Dtype::Tl2 => (5, 3),
        }
    }

    /// Bits per weight as a decimal, for reports (1.67 for TL2).
    pub fn bits_per_weight(self) -> f64 {
        let (bits, per) = self.bits_per_elements();
        f64::from(bits) / f64::from(per)
    }

    /// Packed low-bit weights that kernels unpack (int8, int4 and the ternary layouts).
    pub fn is_quantized(self) -> bool {
        matches!(self, Dtype::Int8 | Dtype::Int4) || self.is_ternary()
    }

    /// One of BitNet's ternary layouts (a per-tensor scale, no groups).
    pub fn is_ternary(self) -> bool {
        matches!(self, Dtype::I2s | Dtype::Tl1 | Dtype::Tl2)
    }

    /// Bytes per activation (and per unquantized parameter) when weights are stored as `self`.
    pub fn activation_bytes(self) -> u32 {
        if self == Dtype::Fp32 {
            4
        } else {
            2
        }
    }

    /// The name flags and reports use (`fp16`, `i2s`).
    pub fn name(self) -> &'static str {
        crate::named::Named::name(self)
    }
}

impl crate::named::Named for Dtype {
    const CHOICES: &'static [crate::named::Choice<Self>] = &[
        crate::named::Choice::plain("fp16", Dtype::Fp16),
        crate::named::Choice::plain("bf16", Dtype::Bf16),
        crate::named::Choice::plain("fp32", Dtype::Fp32),
        crate::named::Choice::plain("int8", Dtype::Int8),
        crate::named::Choice::plain("int4", Dtype::Int4),
        crate::named::Choice {
            name: "i2s",
            value: Dtype::I2s,
            help: "",
            aliases: &["i2_s"],
        },
        crate::named::Choice::plain("tl1", Dtype::Tl1),
        crate::named::Choice::plain("tl2", Dtype::Tl2),
    ];
}

/// The shape of a decoder-only transformer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ModelShape {
    pub hidden: u64,
    /// MLP width (each of gate, up and down is `hidden x intermediate`).
    pub intermediate: u64,
    pub layers: u64,
    pub vocab: u64,
    /// Query heads; `hidden` must be a multiple.
    pub heads: u64,
    /// Key/value heads (grouped-query attention); must divide `heads`.
    pub kv_heads: u64,
    /// Whether the LM head shares the embedding matrix (no separate `vocab x hidden`).
    pub tied_embeddings: bool,
}

/// What is run on the model: context length, concurrent sequences and storage types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Workload {
    /// Tokens per sequence the KV cache holds.
    pub max_seq: u64,
    /// Sequences in flight.
    pub batch: u64,
    pub weights: Dtype,
    pub kv_cache: Dtype,
}

/// A shape or workload the formulas cannot apply to; the message names the field.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ShapeError {
    #[error("{field} must be at least 1")]
    Zero { field: &'static str },
    #[error("{field} = {value} is larger than the supported maximum {max}")]
    TooLarge {
        field: &'static str,
        value: u64,
        max: u64,
    },
    #[error("heads ({heads}) must divide hidden ({hidden}) evenly")]
    HeadsDoNotDivideHidden { hidden: u64, heads: u64 },
    #[error("kv-heads ({kv_heads}) must divide heads ({heads}) evenly")]
    KvHeadsDoNotDivideHeads { heads: u64, kv_heads: u64 },
    #[error(
        "kv-dtype {} is a ternary weight layout; the KV cache is fp16, bf16, fp32, int8 or int4",
        .0.name()
    )]
    TernaryKvCache(Dtype),
}

fn check(field: &'static str, value: u64, max: u64) -> Result<(), ShapeError> {
    if value == 0 {
        Err(ShapeError::Zero { field })
    } else if value > max {
        Err(ShapeError::TooLarge { field, value, max })
    } else {
        Ok(())
    }
}

/// Parameters by kind; `linear` are the ones quantization applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ParameterCounts {
    /// Attention and MLP projections of all layers.
    pub linear: u64,
    /// Embeddings, LM head and norms.
    pub other: u64,
    pub total: u64,
}

impl ModelShape {
    pub fn validate(&self) -> Result<(), ShapeError> {
        check("hidden", self.hidden, MAX_DIMENSION)?;
        check("intermediate", self.intermediate, MAX_DIMENSION)?;
        check("vocab", self.vocab, MAX_DIMENSION)?;
        check("layers", self.layers, MAX_LAYERS)?;
        check("heads", self.heads, MAX_LAYERS)?;
        check("kv-heads", self.kv_heads, MAX_LAYERS)?;
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(ShapeError::HeadsDoNotDivideHidden {
                hidden: self.hidden,
                heads: self.heads,
            });
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(ShapeError::KvHeadsDoNotDivideHeads {
                heads: self.heads,
                kv_heads: self.kv_heads,
            });
        }
        Ok(())
    }

    pub fn head_dim(&self) -> u64 {
        self.hidden / self.heads.max(1)
    }

    /// Width of the k (and of the v) projection: `kv_heads * head_dim`.
    pub(super) fn kv_width(&self) -> u128 {
        u128::from(self.kv_heads) * u128::from(self.head_dim())
    }

    /// Parameter counts by the formula in the module docs. Saturating, so that a shape that
    /// was never validated gives a huge number rather than a panic.
    pub fn parameters(&self) -> ParameterCounts {
        let (h, l, v) = (
            u128::from(self.hidden),
            u128::from(self.layers),
            u128::from(self.vocab),
        );
        let linear = product(&[l, linear_params_per_layer(self)]);
        let lm_head = if self.tied_embeddings {
            0
        } else {
            product(&[v, h])
        };
        let other = product(&[v, h])
            .saturating_add(lm_head)
            .saturating_add(product(&[l, 2, h]))
            .saturating_add(h);
        ParameterCounts {
            linear: saturate(linear),
            other: saturate(other),
            total: saturate(linear.saturating_add(other)),
        }
    }

    /// Activation elements one token holds at the peak of a layer (module docs).
    pub(super) fn peak_elements_per_token(&self) -> u128 {
        let h = u128::from(self.hidden);
        let attention = 4 * h + 2 * self.kv_width();
        let mlp = 2 * h + 3 * u128::from(self.intermediate);
        attention.max(mlp)
    }
}

impl Workload {
    pub fn validate(&self) -> Result<(), ShapeError> {
        check("max-seq", self.max_seq, MAX_DIMENSION)?;
        check("batch", self.batch, MAX_BATCH)?;
        if self.kv_cache.is_ternary() {
            return Err(ShapeError::TernaryKvCache(self.kv_cache));
        }
        Ok(())
    }
}

/// The estimate, in bytes; `total = weights + kv_cache + activations`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct InferenceEstimate {
    pub parameters: u64,
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    pub activation_bytes: u64,
    pub total_bytes: u64,
}

/// Weights, KV cache and activations of `shape` running `workload` (formulas in the module docs).
pub fn estimate_inference_memory(
    shape: &ModelShape,
    workload: &Workload,
) -> Result<InferenceEstimate, ShapeError> {
    shape.validate()?;
    workload.validate()?;
    let weights = weight_bytes(shape, workload.weights);
    let batch = u128::from(workload.batch);
    let kv = batch * kv_bytes_per_sequence(shape, workload);
    let activations = fixed_activation_bytes(shape, workload.weights)
        + batch * activation_bytes_per_sequence(shape, workload);
    Ok(InferenceEstimate {
        parameters: shape.parameters().total,
        weights_bytes: saturate(weights),
        kv_cache_bytes: saturate(kv),
        activation_bytes: saturate(activations),
        total_bytes: saturate(weights + kv + activations),
    })
}

/// The largest batch (at most [`MAX_BATCH`]) whose estimate fits in `budget_bytes`; 0 when not
/// even one sequence fits. The estimate is linear in the batch, so this is one division.
pub fn max_batch_that_fits(
    shape: &ModelShape,
    workload: &Workload,
    budget_bytes: u64,
) -> Result<u64, ShapeError> {
    let one = Workload {
        batch: 1,
        ..*workload
    };
    estimate_inference_memory(shape, &one)?;
    let fixed =
        weight_bytes(shape, workload.weights) + fixed_activation_bytes(shape, workload.weights);
    let per_sequence =
        kv_bytes_per_sequence(shape, workload) + activation_bytes_per_sequence(shape, workload);
    let budget = u128::from(budget_bytes);
    if budget < fixed {
        return Ok(0);
    }
    let batch = (budget - fixed) / per_sequence.max(1);
    Ok(saturate(batch.min(u128::from(MAX_BATCH))))
}

fn weight_bytes(shape: &ModelShape, dtype: Dtype) -> u128 {
    let counts = shape.parameters();
    linear_weight_bytes(u128::from(counts.linear), shape.layers, dtype)
        + u128::from(counts.other) * u128::from(dtype.activation_bytes())
}

/// Bytes of `params` linear weights in `layers` layers (7 weight matrices each) stored as `dtype`:
/// packed bits plus int8/int4 group scales and zero points, or one scale slot per ternary matrix.
pub(super) fn linear_weight_bytes(params: u128, layers: u64, dtype: Dtype) -> u128 {
    let (bits, per) = dtype.bits_per_elements();
    let mut linear_bits = (params * u128::from(bits)).div_ceil(u128::from(per));
    if matches!(dtype, Dtype::Int8 | Dtype::Int4) {
        let groups = params.div_ceil(u128::from(QUANT_GROUP));
        linear_bits += groups * (16 + u128::from(bits));
    }
    let mut bytes = linear_bits.div_ceil(8);
    if dtype.is_ternary() {
        bytes += u128::from(layers) * 7 * u128::from(TERNARY_SCALE_BYTES);
    }
    bytes
}

/// Linear parameters of one layer: q, o, k, v and the three MLP matrices.
pub(super) fn linear_params_per_layer(shape: &ModelShape) -> u128 {
    let (h, i) = (u128::from(shape.hidden), u128::from(shape.intermediate));
    product(&[2, h, h])
        .saturating_add(product(&[2, h, shape.kv_width()]))
        .saturating_add(product(&[3, h, i]))
}

pub(super) fn kv_bytes_per_sequence(shape: &ModelShape, workload: &Workload) -> u128 {
    let bits = 2
        * u128::from(shape.layers)
        * shape.kv_width()
        * u128::from(workload.max_seq)
        * u128::from(workload.kv_cache.bits());
    bits.div_ceil(8)
}

pub(super) fn activation_bytes_per_sequence(shape: &ModelShape, workload: &Workload) -> u128 {
    let act = u128::from(workload.weights.activation_bytes());
    let tokens = u128::from(workload.max_seq) * shape.peak_elements_per_token() * act;
    let logits = u128::from(shape.vocab) * 4;
    tokens + logits
}

/// The dequantized copy of the largest linear layer, which quantized kernels unpack into.
pub(super) fn fixed_activation_bytes(shape: &ModelShape, weights: Dtype) -> u128 {
    if !weights.is_quantized() {
        return 0;
    }
    let h = u128::from(shape.hidden);
    h * h.max(u128::from(shape.intermediate)) * u128::from(weights.activation_bytes())
}

pub(super) fn product(factors: &[u128]) -> u128 {
    factors.iter().fold(1, |acc, &f| acc.saturating_mul(f))
}

pub(super) fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "estimate_tests.rs"]
mod tests;
