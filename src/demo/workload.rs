//! The demo's synthetic inference workload on one device, one tick at a time: load the weights,
//! admit and finish sequences whose KV cache grows block by block, run a batch of activations
//! per tick, and leak a small buffer now and then. Everything it holds is bounded — the weights,
//! a KV budget, a cap on leaks — so it can run for days.

use gpumem::manager::{AllocOptions, DeviceBuffer, MemoryManager, Tag};
use gpumem::units::{align_down, KIB, MIB};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Weights are loaded in this many chunks, a few per tick (the chart shows the load ramp).
const WEIGHT_CHUNKS: u64 = 24;
const WEIGHT_CHUNKS_PER_TICK: usize = 2;
/// A leak every this often, up to `LEAK_LIMIT` buffers.
const LEAK_EVERY: Duration = Duration::from_secs(4);
const LEAK_LIMIT: usize = 64;
/// Most sequences in flight at the busiest point of the traffic wave.
const MAX_SEQUENCES: f64 = 48.0;
const TRAFFIC_PERIOD: Duration = Duration::from_secs(90);

/// How much of the device the workload may use, from its free memory at start.
#[derive(Clone, Copy, Debug)]
pub(super) struct Budget {
    pub weight_chunk: u64,
    pub kv_bytes: u64,
    pub kv_block: u64,
    /// Largest activation buffer of a full batch.
    pub activation_max: u64,
    pub leak_bytes: u64,
}

impl Budget {
    /// Weights take 35 % of `free`, the KV cache up to 25 %, activations a few percent.
    pub(super) fn for_free_memory(free: u64) -> Self {
        let weights = free / 100 * 35;
        Budget {
            weight_chunk: align_down(weights / WEIGHT_CHUNKS, MIB).max(MIB),
            kv_bytes: free / 100 * 25,
            kv_block: (free / 4096).clamp(2 * MIB, 32 * MIB),
            activation_max: (free / 400).clamp(4 * MIB, 256 * MIB),
            leak_bytes: MIB,
        }
    }
}

/// Tiny xorshift generator: the demo needs variety, not statistics or a dependency.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn seeded(seed: u64) -> Self {
        Rng(seed | 1)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `[low, high]`.
    pub(super) fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high.saturating_sub(low) + 1)
    }

    pub(super) fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// One request being served: its KV cache, which grows as it generates tokens.
struct Sequence {
    kv: Vec<DeviceBuffer>,
    ends_at: Instant,
}

struct Tags {
    weights: Tag,
    kv_cache: Tag,
    activations: Tag,
    leaky: Tag,
}

/// The workload of one device.
pub(super) struct DeviceWorkload {
    device: usize,
    budget: Budget,
    tags: Tags,
    weights: Vec<DeviceBuffer>,
    sequences: VecDeque<Sequence>,
    leaked: Vec<DeviceBuffer>,
    last_leak: Instant,
    /// Allocations the device refused (out of memory under a spike, ...): counted, not fatal.
    pub refused: u64,
}

impl DeviceWorkload {
    pub(super) fn new(device: usize, budget: Budget) -> Self {
        DeviceWorkload {
            device,
            budget,
            tags: Tags {
                weights: Tag::new("weights"),
                kv_cache: Tag::new("kv_cache"),
                activations: Tag::new("activations"),
                leaky: Tag::new("leaky_cache"),
            },
            weights: Vec::new(),
            sequences: VecDeque::new(),
            leaked: Vec::new(),
            last_leak: Instant::now(),
            refused: 0,
        }
    }

    fn alloc(&mut self, manager: &MemoryManager, size: u64, tag: Tag) -> Option<DeviceBuffer> {
        match manager.alloc(self.device, size, &AllocOptions::tagged(tag)) {
            Ok(buffer) => Some(buffer),
            Err(error) => {
                self.refused += 1;
                tracing::debug!(device = self.device, %error, "demo allocation refused");
                None
            }
        }
    }

    /// One step of serving: `elapsed` since the demo started drives the traffic wave.
    pub(super) fn tick(&mut self, manager: &MemoryManager, elapsed: Duration, rng: &mut Rng) {
        self.load_weights(manager);
        if (self.weights.len() as u64) < WEIGHT_CHUNKS {
            return; // No traffic before the model is loaded, as in a real server.
        }
        self.serve_sequences(manager, elapsed, rng);
        self.run_batch(manager, rng);
        self.maybe_leak(manager, rng);
    }

    fn load_weights(&mut self, manager: &MemoryManager) {
        for _ in 0..WEIGHT_CHUNKS_PER_TICK {
            if self.weights.len() as u64 >= WEIGHT_CHUNKS {
                return;
            }
            let tag = self.tags.weights.clone();
            match self.alloc(manager, self.budget.weight_chunk, tag) {
                Some(chunk) => self.weights.push(chunk),
                None => return,
            }
        }
    }

    fn kv_bytes(&self) -> u64 {
        self.sequences
            .iter()
            .map(|s| s.kv.len() as u64)
            .sum::<u64>()
            * self.budget.kv_block
    }

    fn serve_sequences(&mut self, manager: &MemoryManager, elapsed: Duration, rng: &mut Rng) {
        let now = Instant::now();
        // Finished sequences give their KV cache back.
        self.sequences.retain(|s| s.ends_at > now);

        let phase = elapsed.as_secs_f64() / TRAFFIC_PERIOD.as_secs_f64() * std::f64::consts::TAU;
        let wanted = (2.0 + MAX_SEQUENCES * (0.5 - 0.5 * phase.cos())) as usize;
        let block = self.budget.kv_block;
        let kv_tag = self.tags.kv_cache.clone();
        while self.sequences.len() < wanted && self.kv_bytes() + 8 * block <= self.budget.kv_bytes {
            let prompt_blocks = rng.between(1, 8);
            let mut kv = Vec::with_capacity(prompt_blocks as usize);
            for _ in 0..prompt_blocks {
                if let Some(buffer) = self.alloc(manager, block, kv_tag.clone()) {
                    kv.push(buffer);
                }
            }
            if kv.is_empty() {
                break;
            }
            let lives = Duration::from_millis(rng.between(3_000, 20_000));
            self.sequences.push_back(Sequence {
                kv,
                ends_at: now + lives,
            });
        }
        // Generating tokens: about one sequence in five needs another KV block each tick.
        let mut budget_left = self.budget.kv_bytes.saturating_sub(self.kv_bytes()) / block;
        for index in 0..self.sequences.len() {
            if budget_left == 0 {
                break;
            }
            if rng.chance(20) {
                if let Some(buffer) = self.alloc(manager, block, kv_tag.clone()) {
                    self.sequences[index].kv.push(buffer);
                    budget_left -= 1;
                }
            }
        }
    }

    /// Activations of one forward pass: a few large buffers sized by the batch and many small
    /// ones, all freed when the pass ends — the churn a caching allocator exists for.
    fn run_batch(&mut self, manager: &MemoryManager, rng: &mut Rng) {
        let batch = self.sequences.len().max(1) as u64;
        let scale = self.budget.activation_max / MAX_SEQUENCES as u64;
        let tag = self.tags.activations.clone();
        let mut live = Vec::new();
        for _ in 0..rng.between(3, 6) {
            let size = (scale * batch * rng.between(50, 100) / 100).max(256 * KIB);
            live.extend(self.alloc(manager, size, tag.clone()));
        }
        for _ in 0..rng.between(20, 60) {
            let size = rng.between(4, 512) * KIB;
            live.extend(self.alloc(manager, size, tag.clone()));
            if rng.chance(50) {
                live.pop();
            }
        }
        drop(live);
    }

    fn maybe_leak(&mut self, manager: &MemoryManager, rng: &mut Rng) {
        if self.leaked.len() >= LEAK_LIMIT || self.last_leak.elapsed() < LEAK_EVERY {
            return;
        }
        self.last_leak = Instant::now();
        let size = self.budget.leak_bytes + rng.between(0, 255) * KIB;
        let tag = self.tags.leaky.clone();
        if let Some(buffer) = self.alloc(manager, size, tag) {
            self.leaked.push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem::units::GIB;

    #[test]
    fn the_budget_fits_the_device() {
        let free = 80 * GIB;
        let budget = Budget::for_free_memory(free);
        let weights = budget.weight_chunk * WEIGHT_CHUNKS;
        let leaks = (budget.leak_bytes + 256 * KIB) * LEAK_LIMIT as u64;
        assert!(weights + budget.kv_bytes + budget.activation_max * 6 + leaks < free * 7 / 10);
        assert_eq!(budget.kv_block, 20 * MIB);
    }

    #[test]
    fn rng_stays_in_range() {
        let mut rng = Rng::seeded(42);
        for _ in 0..1000 {
            let value = rng.between(3, 6);
            assert!((3..=6).contains(&value));
        }
    }
}
