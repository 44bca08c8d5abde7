//! Scratch memory for a quantized linear layer (`y = x·Wᵀ` with packed low-bit weights), and the
//! largest batch of rows per call that the device's *actual* free memory allows — instead of
//! assuming a fixed 6 GB workspace, which wastes small GPUs and starves large ones.
//!
//! # Formula
//!
//! For a layer with `in_features` inputs, `out_features` outputs, `weight_bits` bits per stored
//! weight and `activation_bytes` bytes per activation element (2 for fp16/bf16, 4 for fp32):
//!
//! ```text
//! dequant  = in_features * out_features * activation_bytes   if weight_bits < 8 * activation_bytes
//!          = 0                                                otherwise
//! per_row  = (in_features + out_features) * activation_bytes  input row and output row
//!          + out_features * 4                                 fp32 accumulator (split-K partials)
//! workspace(batch) = dequant + batch * per_row
//! ```
//!
//! `dequant` is the buffer into which kernels such as ExLlama's and GPTQ's unpack the whole
//! weight matrix before handing a large batch to cuBLAS; unquantized weights need none. The
//! packed weights themselves are model weights, not workspace.
//!
//! The optimal batch is the largest power of two (GEMM tiles and tensor cores like them) with
//! `workspace(batch) <= 60 % of available` and `batch <= batch_cap(total)`. The other 40 % stays
//! for the KV cache, activations and the allocator's fragmentation.

use super::InsufficientMemory;
use crate::units::GIB;

/// Share of the available memory a layer's workspace may take, in percent.
pub const WORKSPACE_PERCENT: u64 = 60;

/// One quantized (or plain) linear layer, as far as its scratch memory is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearLayer {
    pub in_features: u64,
    pub out_features: u64,
    /// Bits per stored weight: 4 (int4), 8 (int8), 16 (fp16/bf16) or 32 (fp32).
    pub weight_bits: u32,
    /// Bytes per activation element: 2 for fp16/bf16, 4 for fp32.
    pub activation_bytes: u32,
}

impl LinearLayer {
    /// Bytes of the dequantized weight matrix, or 0 when the weights need no unpacking.
    pub fn dequant_bytes(&self) -> u64 {
        if u64::from(self.weight_bits) < 8 * u64::from(self.activation_bytes) {
            self.in_features
                .saturating_mul(self.out_features)
                .saturating_mul(u64::from(self.activation_bytes))
        } else {
            0
        }
    }

    /// Bytes each row of the batch adds: its input, its output and an fp32 accumulator.
    pub fn bytes_per_row(&self) -> u64 {
        let act = u64::from(self.activation_bytes);
        let io = self
            .in_features
            .saturating_add(self.out_features)
            .saturating_mul(act);
        io.saturating_add(self.out_features.saturating_mul(4))
    }

    fn describe(&self) -> String {
        format!(
            "the workspace of a {}x{} {}-bit linear layer",
            self.in_features, self.out_features, self.weight_bits
        )
    }
}

/// Scratch bytes a call over `batch` rows needs (the formula in the module docs).
pub fn workspace_size(layer: &LinearLayer, batch: u64) -> u64 {
    layer
        .dequant_bytes()
        .saturating_add(batch.saturating_mul(layer.bytes_per_row()))
}

/// The most rows per call worth planning for on a device of `total_bytes` (docs/workspace.md
/// says why these classes and not the design's 24 / 8 / 4 GB ones).
///
/// Past a few hundred rows a linear layer is compute-bound: a bigger batch adds latency and
/// memory but no throughput, and smaller GPUs (fewer SMs) saturate earlier. Classes go by the
/// memory a card is sold with; the boundaries sit below the round numbers because cards report a
/// little less than their label (an RTX 4090 "24 GB" reports 23.99 GiB, a T4 "16 GB" 15 GiB, and
/// 24 decimal GB are only 22.4 GiB):
///
/// | total      | cap | examples                                   |
/// |------------|-----|--------------------------------------------|
/// | >= 60 GiB  | 512 | A100/H100 80 GB, H100 NVL 94 GB, H200 141 GB |
/// | >= 20 GiB  | 256 | RTX 3090/4090, A10, L4 (24 GB), A6000/L40S (48 GB) |
/// | >= 10 GiB  | 128 | RTX 3080 (10 GB), 3060 (12 GB), T4/4080 (16 GB) |
/// | below      | 64  | 8 GB and smaller cards, Jetsons            |
pub fn batch_cap(total_bytes: u64) -> u64 {
    batch_cap_row(total_bytes).1
}

/// The classes of [`batch_cap`]: (smallest total, cap, how a report names the class).
pub const BATCH_CAP_CLASSES: [(u64, u64, &str); 4] = [
    (60 * GIB, 512, "devices of 60 GiB and more"),
    (20 * GIB, 256, "devices of 20 to 60 GiB"),
    (10 * GIB, 128, "devices of 10 to 20 GiB"),
    (0, 64, "devices under 10 GiB"),
];

fn batch_cap_row(total_bytes: u64) -> (u64, u64, &'static str) {
    let last = BATCH_CAP_CLASSES[BATCH_CAP_CLASSES.len() - 1];
    BATCH_CAP_CLASSES
        .into_iter()
        .find(|(smallest, _, _)| total_bytes >= *smallest)
        .unwrap_or(last)
}

/// The device class [`batch_cap`] puts a device of `total_bytes` in, as a report names it.
pub fn batch_cap_class(total_bytes: u64) -> &'static str {
    batch_cap_row(total_bytes).2
}

/// The batch chosen for a layer on a device, and what it costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspacePlan {
    /// Rows per call: a power of two, at most `cap`.
    pub batch: u64,
    /// The device class's cap ([`batch_cap`]).
    pub cap: u64,
    /// `workspace_size(layer, batch)`.
    pub workspace_bytes: u64,
    /// 60 % of the available memory: what the workspace may take.
    pub budget_bytes: u64,
}

impl WorkspacePlan {
    /// Whether the class cap, not memory, set the batch.
    pub fn capped_by_class(&self) -> bool {
        self.batch == self.cap
    }
}

/// The largest power-of-two batch whose workspace fits in 60 % of `available_bytes` (the
/// device's free memory, or what is left of it after the model), capped by the device's class.
/// Errors when not even one row fits; `required` is then the available memory that would do.
pub fn optimal_batch_size(
    layer: &LinearLayer,
    total_bytes: u64,
    available_bytes: u64,
) -> Result<WorkspacePlan, InsufficientMemory> {
    let cap = batch_cap(total_bytes);
    let budget = percent_of(available_bytes, WORKSPACE_PERCENT);
    let one_row = workspace_size(layer, 1);
    if one_row > budget {
        return Err(InsufficientMemory {
            what: layer.describe(),
            required: one_row.saturating_mul(100).div_ceil(WORKSPACE_PERCENT),
            available: available_bytes,
        });
    }
    let rows_that_fit = (budget - layer.dequant_bytes()) / layer.bytes_per_row().max(1);
    let batch = largest_power_of_two_at_most(rows_that_fit.min(cap));
    Ok(WorkspacePlan {
        batch,
        cap,
        workspace_bytes: workspace_size(layer, batch),
        budget_bytes: budget,
    })
}

fn percent_of(value: u64, percent: u64) -> u64 {
    // u128 so that the product cannot overflow for any u64.
    (u128::from(value) * u128::from(percent) / 100) as u64
}

/// `1 << floor(log2(n))` for `n >= 1`; 1 for 0 (callers have checked one row fits).
fn largest_power_of_two_at_most(n: u64) -> u64 {
    if n == 0 {
        1
    } else {
        1 << (63 - n.leading_zeros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::TEST_DEVICES_GB;
    use crate::units::MIB;

    /// Llama-2-7B's MLP up projection, 4-bit weights, fp16 activations.
    const LLAMA7B_UP_INT4: LinearLayer = LinearLayer {
        in_features: 4096,
        out_features: 11008,
        weight_bits: 4,
        activation_bytes: 2,
    };

    /// Llama-70B's MLP up projection, 4-bit weights.
    const LLAMA70B_UP_INT4: LinearLayer = LinearLayer {
        in_features: 8192,
        out_features: 28672,
        weight_bits: 4,
        activation_bytes: 2,
    };

    #[test]
    fn formula_terms_match_hand_computation() {
        assert_eq!(LLAMA7B_UP_INT4.dequant_bytes(), 4096 * 11008 * 2);
        assert_eq!(
            LLAMA7B_UP_INT4.bytes_per_row(),
            (4096 + 11008) * 2 + 11008 * 4
        );
        assert_eq!(
            workspace_size(&LLAMA7B_UP_INT4, 64),
            90_177_536 + 64 * 74_240
        );
        let fp16 = LinearLayer {
            weight_bits: 16,
            ..LLAMA7B_UP_INT4
        };
        assert_eq!(fp16.dequant_bytes(), 0, "fp16 weights need no unpacking");
        let fp32_acts = LinearLayer {
            weight_bits: 16,
            activation_bytes: 4,
            ..LLAMA7B_UP_INT4
        };
        assert_eq!(fp32_acts.dequant_bytes(), 4096 * 11008 * 4);
    }

    #[test]
    fn the_documented_caps_are_the_code() {
        let doc = include_str!("../../../../docs/workspace.md");
        let rows: Vec<(u64, u64)> = doc
            .lines()
            .filter_map(|line| line.strip_prefix("| >= "))
            .map(|rest| {
                let cells: Vec<&str> = rest.split('|').map(str::trim).collect();
                let gib = cells[0].trim_end_matches(" GiB").parse::<u64>().unwrap();
                (gib * GIB, cells[1].parse().unwrap())
            })
            .collect();
        let code: Vec<(u64, u64)> = BATCH_CAP_CLASSES.iter().map(|&(t, c, _)| (t, c)).collect();
        assert_eq!(rows, code);
    }

    #[test]
    fn caps_follow_the_memory_class_of_every_device_size() {
        let expected = [64, 64, 64, 128, 256, 256, 512, 512];
        for ((name, total), cap) in TEST_DEVICES_GB.iter().zip(expected) {
            assert_eq!(batch_cap(*total), cap, "{name}");
        }
        // What real cards report, a little under their label.
        assert_eq!(batch_cap(24_564 * MIB), 256, "RTX 4090");
        assert_eq!(batch_cap(15_360 * MIB), 128, "T4");
        assert_eq!(batch_cap(81_559 * MIB), 512, "H100 80GB");
        assert_eq!(batch_cap(143_771 * MIB), 512, "H200");
    }

    #[test]
    fn plenty_of_free_memory_hits_the_class_cap_on_every_device() {
        for (name, total) in TEST_DEVICES_GB {
            let free = total / 10 * 9;
            let plan = optimal_batch_size(&LLAMA7B_UP_INT4, total, free).expect(name);
            assert_eq!(plan.batch, batch_cap(total), "{name}");
            assert!(plan.workspace_bytes <= plan.budget_bytes, "{name}");
            assert_eq!(
                plan.budget_bytes,
                free / 100 * 60 + free % 100 * 60 / 100,
                "{name}"
            );
        }
    }

    #[test]
    fn little_free_memory_limits_the_batch_below_the_cap() {
        // 120 MiB of budget: (125_829_120 - 90_177_536) / 74_240 = 480 rows -> 256.
        let plan = optimal_batch_size(&LLAMA7B_UP_INT4, 80_000_000_000, 200 * MIB).unwrap();
        assert_eq!(plan.batch, 256);
        assert_eq!(plan.cap, 512);
        // The same free memory on a 2 GB card: the class cap (64) is the limit.
        let plan = optimal_batch_size(&LLAMA7B_UP_INT4, 2_000_000_000, 200 * MIB).unwrap();
        assert_eq!(plan.batch, 64);
        // Every batch is a power of two whose workspace fits in 60 %.
        for (name, total) in TEST_DEVICES_GB {
            for free in [total / 20, total / 4, total / 2, total] {
                if let Ok(plan) = optimal_batch_size(&LLAMA70B_UP_INT4, total, free) {
                    assert!(plan.batch.is_power_of_two(), "{name}");
                    assert!(plan.batch <= plan.cap, "{name}");
                    assert!(plan.workspace_bytes <= free / 10 * 6 + 60, "{name}");
                    let doubled = workspace_size(&LLAMA70B_UP_INT4, plan.batch * 2);
                    assert!(
                        plan.batch == plan.cap || doubled > plan.budget_bytes,
                        "{name}"
                    );
                }
            }
        }
    }

    #[test]
    fn too_little_memory_is_an_error_with_required_and_available() {
        // A 70B layer's 448 MiB dequant buffer does not fit in 60 % of 500 MB.
        let error = optimal_batch_size(&LLAMA70B_UP_INT4, 2_000_000_000, 500_000_000).unwrap_err();
        let one_row = 8192 * 28672 * 2 + (8192 + 28672) * 2 + 28672 * 4;
        assert_eq!(error.available, 500_000_000);
        assert_eq!(error.required, (one_row * 100_u64).div_ceil(60));
        assert!(error.to_string().contains("8192x28672 4-bit linear layer"));
        // With exactly the required memory available, batch 1 fits.
        let plan = optimal_batch_size(&LLAMA70B_UP_INT4, 2_000_000_000, error.required).unwrap();
        assert_eq!(plan.batch, 1);
        // No free memory at all.
        assert!(optimal_batch_size(&LLAMA7B_UP_INT4, 4_000_000_000, 0).is_err());
    }

    #[test]
    fn degenerate_layers_do_not_panic() {
        let empty = LinearLayer {
            in_features: 0,
            out_features: 0,
            weight_bits: 4,
            activation_bytes: 0,
        };
        let plan = optimal_batch_size(&empty, 8_000_000_000, 1_000_000_000).unwrap();
        assert_eq!(plan.batch, 64);
        let huge = LinearLayer {
            in_features: u64::MAX,
            out_features: u64::MAX,
            weight_bits: 4,
            activation_bytes: 2,
        };
        assert_eq!(workspace_size(&huge, u64::MAX), u64::MAX);
        assert!(optimal_batch_size(&huge, u64::MAX, u64::MAX).is_err());
    }
}
