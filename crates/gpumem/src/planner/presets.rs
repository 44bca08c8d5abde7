//! Shapes of well-known models, by name, for `gpumem estimate --model`. Figures come from each
//! model's published `config.json`; the tests pin their published parameter counts.

use super::ModelShape;
use thiserror::Error;

/// A named model shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    pub description: &'static str,
    pub shape: ModelShape,
}

const fn shape(
    hidden: u64,
    intermediate: u64,
    layers: u64,
    vocab: u64,
    heads: u64,
    kv_heads: u64,
) -> ModelShape {
    ModelShape {
        hidden,
        intermediate,
        layers,
        vocab,
        heads,
        kv_heads,
        tied_embeddings: false,
    }
}

/// Every preset, in the order `--model` lists them.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "llama-7b",
        description: "Llama 2 7B",
        shape: shape(4096, 11008, 32, 32000, 32, 32),
    },
    Preset {
        name: "llama-13b",
        description: "Llama 2 13B",
        shape: shape(5120, 13824, 40, 32000, 40, 40),
    },
    Preset {
        name: "llama-70b",
        description: "Llama 2 70B, vocabulary 32000",
        shape: shape(8192, 28672, 80, 32000, 64, 8),
    },
    Preset {
        name: "llama3-8b",
        description: "Llama 3 / 3.1 8B",
        shape: shape(4096, 14336, 32, 128256, 32, 8),
    },
    Preset {
        name: "llama3-70b",
        description: "Llama 3 / 3.1 70B, vocabulary 128256",
        shape: shape(8192, 28672, 80, 128256, 64, 8),
    },
    Preset {
        name: "mistral-7b",
        description: "Mistral 7B",
        shape: shape(4096, 14336, 32, 32000, 32, 8),
    },
];

/// `--model` named no preset; the message lists the known ones.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("unknown model preset '{name}' (known: {})", known_names())]
pub struct UnknownPreset {
    pub name: String,
}

fn known_names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The preset called `name` (case and surrounding spaces ignored; `_` reads as `-`).
pub fn preset(name: &str) -> Result<&'static Preset, UnknownPreset> {
    let wanted = name.trim().to_ascii_lowercase().replace('_', "-");
    PRESETS
        .iter()
        .find(|p| p.name == wanted)
        .ok_or_else(|| UnknownPreset {
            name: name.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::{estimate_inference_memory, Dtype, Workload};

    #[test]
    fn presets_have_their_published_parameter_counts() {
        let expected = [
            ("llama-7b", 6_738_415_616),
            ("llama-13b", 13_015_864_320),
            ("llama-70b", 68_976_648_192),
            ("llama3-8b", 8_030_261_248),
            ("llama3-70b", 70_553_706_496),
            ("mistral-7b", 7_241_732_096),
        ];
        assert_eq!(PRESETS.len(), expected.len());
        for (name, parameters) in expected {
            let p = preset(name).unwrap();
            p.shape.validate().unwrap();
            assert_eq!(p.shape.parameters().total, parameters, "{name}");
        }
    }

    #[test]
    fn kv_cache_per_4096_tokens_follows_the_kv_heads() {
        let w = Workload {
            max_seq: 4096,
            batch: 1,
            weights: Dtype::Fp16,
            kv_cache: Dtype::Fp16,
        };
        let kv = |name| {
            let shape = preset(name).unwrap().shape;
            estimate_inference_memory(&shape, &w)
                .unwrap()
                .kv_cache_bytes
        };
        let mib = 1 << 20;
        assert_eq!(kv("llama-7b"), 2048 * mib);
        assert_eq!(kv("llama-13b"), 3200 * mib);
        assert_eq!(kv("mistral-7b"), 512 * mib);
        assert_eq!(kv("llama3-8b"), 512 * mib);
        assert_eq!(kv("llama-70b"), 1280 * mib);
        assert_eq!(kv("llama3-70b"), 1280 * mib);
    }

    #[test]
    fn lookup_is_forgiving_and_unknown_names_list_the_presets() {
        assert_eq!(preset(" Llama_7B ").unwrap().name, "llama-7b");
        let error = preset("nope").unwrap_err();
        assert_eq!(
            error.to_string(),
            "unknown model preset 'nope' (known: llama-7b, llama-13b, llama-70b, llama3-8b, \
             llama3-70b, mistral-7b)"
        );
    }
}
