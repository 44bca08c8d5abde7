//! Splitting a model that fits on no single device across several: how much of the weights, KV
//! cache and activations each device holds under tensor parallelism (every layer cut across all
//! devices) and under pipeline parallelism (consecutive layers per device).
//!
//! # Tensor parallel over `n` devices
//!
//! As Megatron-LM and vLLM cut a Llama-style model: q/k/v and gate/up by columns, o and down by
//! rows, embeddings and LM head by vocabulary; norms are replicated. Per device:
//!
//! ```text
//! weights     = linear / n + (embeddings + LM head) / n + norms
//! kv_cache    = kv * ceil(kv_heads / n) / kv_heads     kv heads are split; with n > kv_heads each
//!                                                      device keeps a copy of one head group
//! activations = tokens * max(3*hidden + (hidden + 2*kv_width)/n,   attention: residual, normed
//!                            2*hidden + 3*intermediate/n) * act    input and output are whole
//!             + logits / n + dequant scratch / n
//! ```
//!
//! It needs `heads`, `intermediate` and `vocab` to divide by `n`, and `kv_heads` and `n` to
//! divide one another.
//!
//! # Pipeline parallel over `n` devices
//!
//! Layers go in order, as evenly as possible (the first `layers % n` stages take one more); the
//! first stage also holds the embeddings, the last the final norm, LM head and logits. Each stage
//! runs the whole batch through its layers, so each holds a full block's activations and the
//! dequant scratch, and the KV cache of its own layers.

use super::estimate::{
    activation_bytes_per_sequence, fixed_activation_bytes, kv_bytes_per_sequence,
    linear_params_per_layer, linear_weight_bytes, product, saturate,
};
use super::{ModelShape, ShapeError, Workload};
use serde::Serialize;

/// How a model is cut across devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitKind {
    TensorParallel,
    PipelineParallel,
}

impl SplitKind {
    pub fn name(self) -> &'static str {
        match self {
            SplitKind::TensorParallel => "tensor-parallel",
            SplitKind::PipelineParallel => "pipeline-parallel",
        }
    }
}

/// What one device holds of a split model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Share {
    /// Position among the devices of the split (0 to n-1).
    pub rank: usize,
    /// First and one-past-last layer this device runs (all layers, cut, for tensor parallel).
    pub layers: (u64, u64),
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    pub activation_bytes: u64,
    pub total_bytes: u64,
}

/// One way of splitting over `n` devices: a share per device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Split {
    pub kind: SplitKind,
    pub ways: usize,
    pub shares: Vec<Share>,
}

impl Split {
    /// The largest share: what the smallest device must hold.
    pub fn largest_share_bytes(&self) -> u64 {
        self.shares.iter().map(|s| s.total_bytes).max().unwrap_or(0)
    }
}

/// Why a model cannot be cut a given way.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    #[error("{0}")]
    Shape(#[from] ShapeError),
    #[error("a split needs at least 2 devices (got {0})")]
    TooFewDevices(usize),
    #[error("tensor parallelism over {ways} devices needs {what} ({value}) divisible by {ways}")]
    Indivisible {
        ways: usize,
        what: &'static str,
        value: u64,
    },
    #[error(
        "pipeline parallelism over {ways} devices needs at least {ways} layers (got {layers})"
    )]
    TooFewLayers { ways: usize, layers: u64 },
}

fn check_ways(shape: &ModelShape, workload: &Workload, ways: usize) -> Result<u128, SplitError> {
    shape.validate()?;
    workload.validate()?;
    if ways < 2 {
        return Err(SplitError::TooFewDevices(ways));
    }
    Ok(ways as u128)
}

/// Bytes of the parameters that are neither linear nor replicated: embeddings and LM head.
fn vocab_bytes(shape: &ModelShape, act: u128) -> u128 {
    let tables = if shape.tied_embeddings { 1 } else { 2 };
    product(&[
        tables,
        u128::from(shape.vocab),
        u128::from(shape.hidden),
        act,
    ])
}

/// Norm parameters: two per layer and the final one.
fn norm_bytes(shape: &ModelShape, layers: u64, final_norm: bool, act: u128) -> u128 {
    let h = u128::from(shape.hidden);
    (2 * u128::from(layers) * h + if final_norm { h } else { 0 }) * act
}

/// Each device's share under tensor parallelism over `ways` devices (module docs).
pub fn tensor_parallel(
    shape: &ModelShape,
    workload: &Workload,
    ways: usize,
) -> Result<Split, SplitError> {
    let n = check_ways(shape, workload, ways)?;
    for (what, value) in [
        ("heads", shape.heads),
        ("intermediate", shape.intermediate),
        ("vocab", shape.vocab),
    ] {
        if u128::from(value) % n != 0 {
            return Err(SplitError::Indivisible { ways, what, value });
        }
    }
    let kv_heads = u128::from(shape.kv_heads);
    if kv_heads % n != 0 && n % kv_heads != 0 {
        return Err(SplitError::Indivisible {
            ways,
            what: "kv-heads",
            value: shape.kv_heads,
        });
    }
    let dtype = workload.weights;
    let act = u128::from(dtype.activation_bytes());
    let linear = linear_weight_bytes(
        product(&[u128::from(shape.layers), linear_params_per_layer(shape)]),
        shape.layers,
        dtype,
    );
    let weights = linear.div_ceil(n)
        + vocab_bytes(shape, act).div_ceil(n)
        + norm_bytes(shape, shape.layers, true, act);
    let batch = u128::from(workload.batch);
    let kv_heads_here = kv_heads.div_ceil(n);
    let kv = (batch * kv_bytes_per_sequence(shape, workload) * kv_heads_here).div_ceil(kv_heads);
    let (h, i) = (u128::from(shape.hidden), u128::from(shape.intermediate));
    let attention = 3 * h + (h + 2 * shape.kv_width()).div_ceil(n);
    let mlp = 2 * h + (3 * i).div_ceil(n);
    let tokens = batch * u128::from(workload.max_seq);
    let activations = tokens * attention.max(mlp) * act
        + (batch * u128::from(shape.vocab) * 4).div_ceil(n)
        + fixed_activation_bytes(shape, dtype).div_ceil(n);
    let share = |rank| Share {
        rank,
        layers: (0, shape.layers),
        weights_bytes: saturate(weights),
        kv_cache_bytes: saturate(kv),
        activation_bytes: saturate(activations),
        total_bytes: saturate(weights + kv + activations),
    };
    Ok(Split {
        kind: SplitKind::TensorParallel,
        ways,
        shares: (0..ways).map(share).collect(),
    })
}

/// Each device's share under pipeline parallelism over `ways` devices (module docs).
pub fn pipeline_parallel(
    shape: &ModelShape,
    workload: &Workload,
    ways: usize,
) -> Result<Split, SplitError> {
    let n = check_ways(shape, workload, ways)?;
    let layers = u128::from(shape.layers);
    if layers < n {
        return Err(SplitError::TooFewLayers {
            ways,
            layers: shape.layers,
        });
    }
    let dtype = workload.weights;
    let act = u128::from(dtype.activation_bytes());
    let batch = u128::from(workload.batch);
    let per_layer_params = linear_params_per_layer(shape);
    let kv_per_layer = batch * kv_bytes_per_sequence(shape, workload) / layers;
    let logits = batch * u128::from(shape.vocab) * 4;
    // One block's working set for the whole batch: the per-sequence figure without its logits.
    let block = batch * activation_bytes_per_sequence(shape, workload) - logits
        + fixed_activation_bytes(shape, dtype);
    let embeddings = product(&[u128::from(shape.vocab), u128::from(shape.hidden), act]);
    let lm_head = if shape.tied_embeddings { 0 } else { embeddings };
    let (base, extra) = (layers / n, layers % n);
    let mut first = 0u128;
    let mut shares = Vec::with_capacity(ways);
    for rank in 0..n {
        let count = base + u128::from(rank < extra);
        let (is_first, is_last) = (rank == 0, rank == n - 1);
        let count_u64 = saturate(count);
        let mut weights = linear_weight_bytes(per_layer_params * count, count_u64, dtype)
            + norm_bytes(shape, count_u64, is_last, act);
        if is_first {
            weights += embeddings;
        }
        let mut activations = block;
        if is_last {
            // A tied LM head reuses the embedding matrix, which then lives on the last stage too.
            weights += if shape.tied_embeddings && !is_first {
                embeddings
            } else {
                lm_head
            };
            activations += logits;
        }
        let kv = kv_per_layer * count;
        shares.push(Share {
            rank: rank as usize,
            layers: (saturate(first), saturate(first + count)),
            weights_bytes: saturate(weights),
            kv_cache_bytes: saturate(kv),
            activation_bytes: saturate(activations),
            total_bytes: saturate(weights + kv + activations),
        });
        first += count;
    }
    Ok(Split {
        kind: SplitKind::PipelineParallel,
        ways,
        shares,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::{estimate_inference_memory, preset, Dtype};

    fn fp16(batch: u64) -> Workload {
        Workload {
            max_seq: 4096,
            batch,
            weights: Dtype::Fp16,
            kv_cache: Dtype::Fp16,
        }
    }

    #[test]
    fn tensor_parallel_halves_weights_and_kv_of_llama_70b() {
        let shape = preset("llama-70b").unwrap().shape;
        let whole = estimate_inference_memory(&shape, &fp16(1)).unwrap();
        let split = tensor_parallel(&shape, &fp16(1), 2).unwrap();
        assert_eq!(split.shares.len(), 2);
        let share = &split.shares[0];
        assert_eq!(
            split.shares[1],
            Share {
                rank: 1,
                ..share.clone()
            }
        );
        // Norms are replicated: 161 vectors of 8192 fp16 values on each device.
        let norms = (2 * 80 + 1) * 8192 * 2;
        assert_eq!(
            share.weights_bytes,
            (whole.weights_bytes - norms) / 2 + norms
        );
        assert_eq!(share.kv_cache_bytes, whole.kv_cache_bytes / 2);
        assert!(share.activation_bytes < whole.activation_bytes);
        assert!(share.total_bytes < whole.total_bytes / 2 + whole.activation_bytes);
        // 16 ways: 8 kv heads, so each pair of devices shares a copy of one head group.
        let sixteen = tensor_parallel(&shape, &fp16(1), 16).unwrap();
        assert_eq!(sixteen.shares[0].kv_cache_bytes, whole.kv_cache_bytes / 8);
    }

    #[test]
    fn tensor_parallel_refuses_shapes_that_do_not_divide() {
        let shape = preset("llama-70b").unwrap().shape;
        let error = tensor_parallel(&shape, &fp16(1), 3).unwrap_err();
        assert_eq!(
            error.to_string(),
            "tensor parallelism over 3 devices needs heads (64) divisible by 3"
        );
        let five_kv = ModelShape {
            heads: 40,
            kv_heads: 5,
            hidden: 5120,
            ..shape
        };
        assert!(matches!(
            tensor_parallel(&five_kv, &fp16(1), 4),
            Err(SplitError::Indivisible {
                what: "kv-heads",
                ..
            })
        ));
        assert_eq!(
            tensor_parallel(&shape, &fp16(1), 1).unwrap_err(),
            SplitError::TooFewDevices(1)
        );
    }

    #[test]
    fn pipeline_stages_add_up_to_the_whole_model() {
        let shape = preset("llama-70b").unwrap().shape;
        for ways in [2, 3, 7] {
            let whole = estimate_inference_memory(&shape, &fp16(2)).unwrap();
            let split = pipeline_parallel(&shape, &fp16(2), ways).unwrap();
            let weights: u64 = split.shares.iter().map(|s| s.weights_bytes).sum();
            let kv: u64 = split.shares.iter().map(|s| s.kv_cache_bytes).sum();
            assert_eq!(weights, whole.weights_bytes, "{ways} ways");
            assert_eq!(kv, whole.kv_cache_bytes, "{ways} ways");
            // Every stage holds one block's activations; the last adds the logits.
            let last = split.shares.last().unwrap();
            assert_eq!(last.activation_bytes, whole.activation_bytes);
            assert_eq!(
                split.shares[0].activation_bytes,
                whole.activation_bytes - 2 * 32000 * 4
            );
            // Layers are consecutive and cover the model once.
            let mut next = 0;
            for share in &split.shares {
                assert_eq!(share.layers.0, next);
                next = share.layers.1;
            }
            assert_eq!(next, 80);
        }
        let three = pipeline_parallel(&shape, &fp16(1), 3).unwrap();
        let counts: Vec<u64> = three
            .shares
            .iter()
            .map(|s| s.layers.1 - s.layers.0)
            .collect();
        assert_eq!(counts, [27, 27, 26]);
        assert!(matches!(
            pipeline_parallel(&ModelShape { layers: 2, ..shape }, &fp16(1), 3),
            Err(SplitError::TooFewLayers { ways: 3, layers: 2 })
        ));
    }

    #[test]
    fn ternary_weights_split_too() {
        let shape = preset("llama3-8b").unwrap().shape;
        let w = Workload {
            weights: Dtype::Tl2,
            ..fp16(1)
        };
        let whole = estimate_inference_memory(&shape, &w).unwrap();
        let split = pipeline_parallel(&shape, &w, 2).unwrap();
        let weights: u64 = split.shares.iter().map(|s| s.weights_bytes).sum();
        // Each stage rounds its 5/3-bit packing up to a whole byte.
        assert!((whole.weights_bytes..=whole.weights_bytes + 2).contains(&weights));
    }
}
