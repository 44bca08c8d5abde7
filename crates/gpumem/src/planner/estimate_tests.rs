//! Tests of the inference memory estimate: known figures for Llama-2-7B and Mistral-7B, each
//! term of the formulas, validation, and the largest batch on devices from 2 GB to 141 GB.

use super::*;
use crate::planner::TEST_DEVICES_GB;
use crate::units::GIB;

const LLAMA2_7B: ModelShape = ModelShape {
    hidden: 4096,
    intermediate: 11008,
    layers: 32,
    vocab: 32000,
    heads: 32,
    kv_heads: 32,
    tied_embeddings: false,
};

const MISTRAL_7B: ModelShape = ModelShape {
    intermediate: 14336,
    kv_heads: 8,
    ..LLAMA2_7B
};

fn workload(max_seq: u64, batch: u64, weights: Dtype) -> Workload {
    Workload {
        max_seq,
        batch,
        weights,
        kv_cache: Dtype::Fp16,
    }
}

#[test]
fn llama2_7b_has_its_published_parameter_count_and_weights() {
    let counts = LLAMA2_7B.parameters();
    assert_eq!(counts.total, 6_738_415_616);
    assert_eq!(counts.linear, 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008));
    let e = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 1, Dtype::Fp16)).unwrap();
    assert_eq!(e.parameters, 6_738_415_616);
    assert_eq!(e.weights_bytes, 13_476_831_232, "about 13.5 GB in fp16");
}

#[test]
fn llama2_7b_kv_cache_at_4096_tokens_is_exactly_two_gib() {
    let e = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 1, Dtype::Fp16)).unwrap();
    assert_eq!(e.kv_cache_bytes, 2 * 32 * 32 * 128 * 4096 * 2);
    assert_eq!(e.kv_cache_bytes, 2 * GIB);
    // Linear in batch and in sequence length; bf16 is the same size; int8 half, int4 a quarter.
    let e8 = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 8, Dtype::Fp16)).unwrap();
    assert_eq!(e8.kv_cache_bytes, 16 * GIB);
    let short = estimate_inference_memory(&LLAMA2_7B, &workload(1024, 1, Dtype::Fp16)).unwrap();
    assert_eq!(short.kv_cache_bytes, GIB / 2);
    for (dtype, bytes) in [
        (Dtype::Bf16, 2 * GIB),
        (Dtype::Fp32, 4 * GIB),
        (Dtype::Int8, GIB),
        (Dtype::Int4, GIB / 2),
    ] {
        let w = Workload {
            kv_cache: dtype,
            ..workload(4096, 1, Dtype::Fp16)
        };
        let e = estimate_inference_memory(&LLAMA2_7B, &w).unwrap();
        assert_eq!(e.kv_cache_bytes, bytes, "{dtype:?}");
    }
}

#[test]
fn grouped_query_attention_shrinks_the_kv_cache() {
    let e = estimate_inference_memory(&MISTRAL_7B, &workload(4096, 1, Dtype::Fp16)).unwrap();
    assert_eq!(e.parameters, 7_241_732_096);
    assert_eq!(
        e.kv_cache_bytes,
        GIB / 2,
        "8 of 32 heads: a quarter of Llama's"
    );
}

#[test]
fn activations_are_the_mlp_block_peak_plus_fp32_logits() {
    let e = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 1, Dtype::Fp16)).unwrap();
    let mlp_peak = 2 * 4096 + 3 * 11008;
    assert_eq!(e.activation_bytes, 4096 * mlp_peak * 2 + 32000 * 4);
    assert_eq!(e.activation_bytes, 337_769_472);
    assert_eq!(
        e.total_bytes,
        e.weights_bytes + e.kv_cache_bytes + e.activation_bytes
    );
    // fp32 weights compute in fp32: twice the per-token activations.
    let e32 = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 1, Dtype::Fp32)).unwrap();
    assert_eq!(e32.activation_bytes, 4096 * mlp_peak * 4 + 32000 * 4);
    assert_eq!(e32.weights_bytes, 6_738_415_616 * 4);
    // A model with a narrow MLP peaks in attention instead: residual, normed, q, k, v, output.
    let narrow = ModelShape {
        intermediate: 1024,
        ..LLAMA2_7B
    };
    let e = estimate_inference_memory(&narrow, &workload(16, 1, Dtype::Fp16)).unwrap();
    assert_eq!(e.activation_bytes, 16 * (6 * 4096) * 2 + 32000 * 4);
}

#[test]
fn quantized_weights_pack_linears_and_keep_the_rest_in_fp16() {
    let counts = LLAMA2_7B.parameters();
    let groups = counts.linear.div_ceil(QUANT_GROUP);
    let int4 = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 1, Dtype::Int4)).unwrap();
    let expected = (counts.linear * 4 + groups * 20) / 8 + counts.other * 2;
    assert_eq!(int4.weights_bytes, expected);
    assert_eq!(
        int4.weights_bytes, 3_889_307_648,
        "about 3.9 GB, as GPTQ 4-bit 7B files are"
    );
    let int8 = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 1, Dtype::Int8)).unwrap();
    assert_eq!(
        int8.weights_bytes,
        (counts.linear * 8 + groups * 24) / 8 + counts.other * 2
    );
    // Quantized kernels need a dequantized copy of the largest linear layer.
    let fp16 = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 1, Dtype::Fp16)).unwrap();
    assert_eq!(
        int4.activation_bytes - fp16.activation_bytes,
        4096 * 11008 * 2
    );
}

#[test]
fn tied_embeddings_drop_the_lm_head() {
    let tied = ModelShape {
        tied_embeddings: true,
        ..LLAMA2_7B
    };
    assert_eq!(
        LLAMA2_7B.parameters().total - tied.parameters().total,
        32000 * 4096
    );
}

#[test]
fn invalid_shapes_name_the_field() {
    let w = workload(4096, 1, Dtype::Fp16);
    let zero_layers = ModelShape {
        layers: 0,
        ..LLAMA2_7B
    };
    let err = estimate_inference_memory(&zero_layers, &w).unwrap_err();
    assert_eq!(err.to_string(), "layers must be at least 1");
    let odd_heads = ModelShape {
        heads: 30,
        ..LLAMA2_7B
    };
    assert_eq!(
        estimate_inference_memory(&odd_heads, &w).unwrap_err(),
        ShapeError::HeadsDoNotDivideHidden {
            hidden: 4096,
            heads: 30
        }
    );
    let odd_kv = ModelShape {
        kv_heads: 5,
        ..LLAMA2_7B
    };
    assert!(estimate_inference_memory(&odd_kv, &w)
        .unwrap_err()
        .to_string()
        .contains("kv-heads (5) must divide heads (32)"));
    let huge = ModelShape {
        vocab: u64::MAX,
        ..LLAMA2_7B
    };
    assert!(matches!(
        estimate_inference_memory(&huge, &w),
        Err(ShapeError::TooLarge { field: "vocab", .. })
    ));
    assert!(
        huge.parameters().total > 0,
        "unvalidated shapes saturate, never panic"
    );
    assert!(estimate_inference_memory(&LLAMA2_7B, &workload(0, 1, Dtype::Fp16)).is_err());
    assert!(estimate_inference_memory(&LLAMA2_7B, &workload(4096, 0, Dtype::Fp16)).is_err());
}

#[test]
fn the_largest_shapes_accepted_do_not_overflow() {
    let biggest = ModelShape {
        hidden: MAX_DIMENSION,
        intermediate: MAX_DIMENSION,
        layers: MAX_LAYERS,
        vocab: MAX_DIMENSION,
        heads: MAX_LAYERS,
        kv_heads: MAX_LAYERS,
        tied_embeddings: false,
    };
    let w = Workload {
        max_seq: MAX_DIMENSION,
        batch: MAX_BATCH,
        weights: Dtype::Fp32,
        kv_cache: Dtype::Fp32,
    };
    let e = estimate_inference_memory(&biggest, &w).unwrap();
    assert_eq!(e.total_bytes, u64::MAX, "saturates");
    assert_eq!(max_batch_that_fits(&biggest, &w, u64::MAX).unwrap(), 0);
}

#[test]
fn largest_batch_on_every_device_size() {
    // Llama-2-7B fp16, 4096 tokens: 13.48 GB of weights, then 2.49 GB per sequence.
    let expected = [0, 0, 0, 1, 4, 13, 26, 51];
    for ((name, budget), want) in TEST_DEVICES_GB.iter().zip(expected) {
        let w = workload(4096, 1, Dtype::Fp16);
        let batch = max_batch_that_fits(&LLAMA2_7B, &w, *budget).unwrap();
        assert_eq!(batch, want, "{name}");
        let total = |batch| {
            let w = workload(4096, batch, Dtype::Fp16);
            estimate_inference_memory(&LLAMA2_7B, &w)
                .unwrap()
                .total_bytes
        };
        if batch > 0 {
            assert!(total(batch) <= *budget, "{name}: batch {batch} fits");
        }
        assert!(
            total(batch + 1) > *budget,
            "{name}: batch {} does not",
            batch + 1
        );
    }
    // Quantized to int4 the weights fit even on 8 GB, with room for one 4096-token sequence.
    let w = workload(4096, 1, Dtype::Int4);
    assert_eq!(
        max_batch_that_fits(&LLAMA2_7B, &w, 4_000_000_000).unwrap(),
        0
    );
    assert_eq!(
        max_batch_that_fits(&LLAMA2_7B, &w, 8_000_000_000).unwrap(),
        1
    );
}

#[test]
fn ternary_weights_are_stored_at_bitnet_cpp_densities() {
    let counts = LLAMA2_7B.parameters();
    let scales = 32 * 7 * 32;
    for (dtype, bits, per) in [(Dtype::I2s, 2, 1), (Dtype::Tl1, 2, 1), (Dtype::Tl2, 5, 3)] {
        let e = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 1, dtype)).unwrap();
        let packed = (counts.linear * bits).div_ceil(per).div_ceil(8);
        assert_eq!(
            e.weights_bytes,
            packed + scales + counts.other * 2,
            "{dtype:?}"
        );
        assert_eq!(dtype.bits_per_elements(), (bits as u32, per as u32));
    }
    // 6.48 G linear weights: 1.62 GB at 2 bits, 1.35 GB at 5/3.
    let i2s = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 1, Dtype::I2s)).unwrap();
    let tl2 = estimate_inference_memory(&LLAMA2_7B, &workload(4096, 1, Dtype::Tl2)).unwrap();
    assert_eq!(i2s.weights_bytes, 2_143_828_992);
    assert_eq!(tl2.weights_bytes, 1_873_995_435);
    assert_eq!(Dtype::Tl2.bits(), 2, "buffers round TL2 up to whole bits");
    assert!((Dtype::Tl2.bits_per_weight() - 5.0 / 3.0).abs() < 1e-12);
    // Ternary layouts describe weights, not a KV cache.
    let w = Workload {
        kv_cache: Dtype::Tl1,
        ..workload(4096, 1, Dtype::Fp16)
    };
    assert_eq!(
        estimate_inference_memory(&LLAMA2_7B, &w)
            .unwrap_err()
            .to_string(),
        "kv-dtype tl1 is a ternary weight layout; the KV cache is fp16, bf16, fp32, int8 or int4"
    );
}
