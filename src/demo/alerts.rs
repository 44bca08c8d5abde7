//! What the `alerts` scenario does to one simulated device, tick by tick, to make its timeline
//! (`scenario`) true: fills the device to the pressure wanted through what "other processes"
//! hold, leaks a steady 128 MiB a minute under its own tag, keeps the small pool fragmented
//! (every other small buffer of a run pinned), asks for more than is left while the device is
//! critical (each such request refused as out of memory, as a long prompt's would be), and
//! makes the driver's memory query fail while the sampler is meant to fail. Everything it holds
//! is freed when the cycle starts again.

use super::node::{NodeView, NEIGHBOURS_FLOOR};
use super::scenario::{self, Moment, LEAK_FROM, LEAK_PER_MINUTE, REFUSE_EVERY};
use gpumem::backend::sim::SimBackend;
use gpumem::manager::{AllocOptions, DeviceBuffer, MemoryManager, Tag};
use gpumem::units::{GIB, KIB, MIB};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The leak grows in buffers of this size.
const LEAK_CHUNK: u64 = 8 * MIB;
/// The fragmented run: this many small buffers, every other one freed again. 1024 holes of
/// 32 KiB that cannot merge (each sits between two live buffers) make the small pool's cached
/// free memory mostly splinters, whatever the activations' churn leaves beside them.
const FRAGMENT_BUFFERS: usize = 2048;
const FRAGMENT_BYTES: u64 = 32 * KIB;

/// What the neighbours hold when the demo starts, in percent of the device.
const NEIGHBOURS_AT_START_PERCENT: u64 = 30;

/// The tag of the buffers that keep the small pool fragmented: held for good, not a leak.
pub(super) const PINNED_TAG: &str = "pinned_small_buffers";

/// The `alerts` scenario's hold on one device.
pub(super) struct AlertsLoad {
    device: usize,
    total: u64,
    sim: Arc<SimBackend>,
    node: Arc<NodeView>,
    leaked: Vec<DeviceBuffer>,
    pinned: Vec<DeviceBuffer>,
    last_refusal: Option<Instant>,
    cycle: u64,
    leak_tag: Tag,
    pinned_tag: Tag,
    prefill_tag: Tag,
}

impl AlertsLoad {
    pub(super) fn new(
        device: usize,
        total: u64,
        sim: Arc<SimBackend>,
        node: Arc<NodeView>,
    ) -> Self {
        // The neighbours load their models first, so the demo sizes its own budget (from the
        // free memory it finds) to leave the device clearly below medium pressure at rest.
        let at_start = total / 100 * NEIGHBOURS_AT_START_PERCENT;
        if sim.set_used_by_others(device, at_start).is_ok() {
            node.set_others(device, at_start);
        }
        AlertsLoad {
            device,
            total,
            sim,
            node,
            leaked: Vec::new(),
            pinned: Vec::new(),
            last_refusal: None,
            cycle: 0,
            leak_tag: Tag::new("leaked_requests"),
            pinned_tag: Tag::new(PINNED_TAG),
            prefill_tag: Tag::new("prefill"),
        }
    }

    /// One step: `elapsed` since the demo started says where on the timeline it is.
    pub(super) fn apply(&mut self, manager: &MemoryManager, elapsed: Duration) {
        let cycle = scenario::cycle(elapsed);
        if cycle != self.cycle {
            // The leaky worker restarts with the timeline: its memory comes back.
            self.cycle = cycle;
            self.leaked.clear();
            tracing::info!("alerts scenario: cycle {cycle} begins; the leak is freed");
        }
        let moment = scenario::moment(elapsed);
        // First: only the driver's answer to "how much is free" fails, nothing else.
        self.sim.faults().set_fail_mem_info(moment.sampling_fails);
        self.fill(manager, moment);
        if self.pinned.is_empty() {
            self.fragment(manager);
        }
        self.leak(manager, scenario::in_cycle(elapsed));
        if moment.refuse {
            self.refuse(manager);
        }
    }

    /// What this process holds from the driver on the device.
    fn reserved(&self, manager: &MemoryManager) -> u64 {
        manager
            .device_stats(self.device)
            .map_or(0, |s| s.counters.reserved_bytes)
    }

    /// Others hold what brings the device to the fill wanted, given what this process holds.
    fn fill(&mut self, manager: &MemoryManager, moment: Moment) {
        let wanted = (self.total as f64 * moment.fill.ratio()) as u64;
        let others = wanted
            .saturating_sub(self.reserved(manager))
            .max(NEIGHBOURS_FLOOR);
        match self.sim.set_used_by_others(self.device, others) {
            Ok(()) => self.node.set_others(self.device, others),
            Err(error) => {
                tracing::debug!(device = self.device, %error, "could not change simulated pressure")
            }
        }
    }

    fn fragment(&mut self, manager: &MemoryManager) {
        let options = AllocOptions::tagged(self.pinned_tag.clone());
        let mut run = Vec::with_capacity(FRAGMENT_BUFFERS);
        for _ in 0..FRAGMENT_BUFFERS {
            match manager.alloc(self.device, FRAGMENT_BYTES, &options) {
                Ok(buffer) => run.push(buffer),
                Err(_) => return, // The model is still loading; try again next tick.
            }
        }
        self.pinned = run
            .into_iter()
            .enumerate()
            .filter_map(|(i, buffer)| (i % 2 == 0).then_some(buffer))
            .collect();
    }

    fn leak(&mut self, manager: &MemoryManager, at: Duration) {
        let growing_for = at.saturating_sub(LEAK_FROM).as_secs_f64();
        let wanted = (LEAK_PER_MINUTE as f64 * growing_for / 60.0) as u64;
        let options = AllocOptions::tagged(self.leak_tag.clone());
        while (self.leaked.len() as u64 + 1) * LEAK_CHUNK <= wanted {
            match manager.alloc(self.device, LEAK_CHUNK, &options) {
                Ok(buffer) => self.leaked.push(buffer),
                Err(_) => return, // Full for now (critical pressure): it leaks on later.
            }
        }
    }

    /// Asks for 1 GiB more than is free: refused, counted as out of memory.
    fn refuse(&mut self, manager: &MemoryManager) {
        if self
            .last_refusal
            .is_some_and(|at| at.elapsed() < REFUSE_EVERY)
        {
            return;
        }
        self.last_refusal = Some(Instant::now());
        let free = self
            .total
            .saturating_sub(self.node.others(self.device))
            .saturating_sub(self.reserved(manager));
        let options = AllocOptions::tagged(self.prefill_tag.clone());
        match manager.alloc(self.device, free + GIB, &options) {
            Ok(buffer) => {
                tracing::warn!(
                    device = self.device,
                    "alerts scenario: a request meant to be refused fit"
                );
                drop(buffer);
            }
            Err(error) => {
                tracing::info!(device = self.device, %error, "alerts scenario: prefill refused")
            }
        }
    }
}
