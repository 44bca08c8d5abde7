//! A stand-in inference engine for the node agent's end-to-end test: on a thread, every 200 ms,
//! it publishes what an engine linking gpumem's library publishes (every device field of the
//! publish format that a dashboard panel reads): weights and a KV cache in two pools whose
//! requests mostly hit, tags, a slow leak, CUDA graph pools, and OOM refusals when the test
//! makes it refuse. It writes as the vLLM process of the fixture `/proc` (pid 1 of its PID
//! namespace), so the agent merges it onto that NVML process and its pod.

use crate::sidecar::node_agent::agent::{self, GIB};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const TICK: Duration = Duration::from_millis(200);
/// The model's weights, in the large pool from the start.
const WEIGHTS: u64 = 14 * GIB;
/// The small pool: a constant 1 GiB of activations and scratch.
const SMALL_POOL: u64 = GIB;

#[derive(Default)]
struct Controls {
    /// What the pools reserve, in bytes (the test grows it).
    held: AtomicU64,
    /// OOM refusals so far.
    ooms: AtomicU64,
    stop: AtomicBool,
}

/// The engine; stops publishing when dropped or killed (its last file stays, as a killed
/// process's does).
pub(super) struct Engine {
    controls: Arc<Controls>,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts publishing into `dir`, its pools holding `held` bytes.
    pub(super) fn start(dir: PathBuf, held: u64) -> Engine {
        let controls = Arc::new(Controls::default());
        controls.held.store(held, Ordering::Relaxed);
        let shared = Arc::clone(&controls);
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut tick = 0u64;
            while !shared.stop.load(Ordering::Relaxed) {
                let device = device(
                    tick,
                    started.elapsed().as_secs_f64(),
                    shared.held.load(Ordering::Relaxed),
                    shared.ooms.load(Ordering::Relaxed),
                );
                agent::publish(&dir, TICK.as_secs_f64() * 5.0, device);
                tick += 1;
                std::thread::sleep(TICK);
            }
        });
        Engine {
            controls,
            thread: Some(thread),
        }
    }

    /// The pools grow (or shrink) to `bytes`.
    pub(super) fn hold(&self, bytes: u64) {
        self.controls.held.store(bytes, Ordering::Relaxed);
    }

    /// One more allocation refused as out of memory.
    pub(super) fn refuse(&self) {
        self.controls.ooms.fetch_add(1, Ordering::Relaxed);
    }

    /// The process is killed: nothing more is published.
    pub(super) fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.controls.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The device object published at `tick` (`seconds` after the start), the pools holding `held`.
fn device(tick: u64, seconds: f64, held: u64, ooms: u64) -> serde_json::Value {
    let large = held.saturating_sub(SMALL_POOL);
    let large_in_use = large - large / 40;
    let small_in_use = SMALL_POOL * 4 / 5;
    // A slow leak: a prefix cache that is never trimmed, 8 MiB every second.
    let leaked = tick / 5 * 8 * MIB;
    let kv_cache = large_in_use.saturating_sub(WEIGHTS + leaked);
    // The tags' allocations below, the leak's included; every request allocates.
    let live = 1_990 + tick / 5;
    let allocations = live + tick * 440;
    // Fragmentation of the large pool swings as batches come and go.
    let fragmentation = 0.06 + 0.04 * (seconds / 3.0).sin();
    serde_json::json!({
        "name": "NVIDIA H100 80GB HBM3",
        "requested_bytes": large_in_use + small_in_use,
        "in_use_bytes": large_in_use + small_in_use,
        "reserved_bytes": large + SMALL_POOL,
        "allocations_total": allocations,
        "frees_total": allocations - live,
        "live_allocations": live,
        "leak_suspect_allocations": tick / 5,
        "leak_suspect_bytes": leaked,
        "oldest_allocation_age_seconds": 900.0 + seconds,
        "ooms_total": ooms,
        "oom_retries_total": ooms * 2,
        "cpu_fallbacks_total": ooms,
        "graph_pool_bytes": 768 * MIB,
        "graph_pools": 3,
        "pools": [
            {"pool": "large", "reserved_bytes": large, "in_use_bytes": large_in_use,
             "fragmentation_ratio": fragmentation, "requests_total": tick * 40,
             "hits_total": tick * 38},
            {"pool": "small", "reserved_bytes": SMALL_POOL, "in_use_bytes": small_in_use,
             "fragmentation_ratio": 0.12, "requests_total": tick * 400,
             "hits_total": tick * 399},
        ],
        "tags": [
            {"tag": "weights", "live_bytes": WEIGHTS, "live_allocations": 290},
            {"tag": "kv_cache", "live_bytes": kv_cache, "live_allocations": 1_500},
            {"tag": "activations", "live_bytes": small_in_use, "live_allocations": 200},
            {"tag": "prefix_cache", "live_bytes": leaked, "live_allocations": tick / 5,
             "leak_suspect_bytes": leaked, "leak_suspect_allocations": tick / 5},
        ],
    })
}
