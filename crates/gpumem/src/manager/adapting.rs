//! The adaptive default at work: each miss is counted into its device's window (a miss that
//! took the device's held memory to a new high is growth no cache would have saved, and a miss
//! faster than a driver call is no cost); every `WINDOW_MISSES` costly misses the window goes
//! to the pure decision (`adaptive.rs`) and the setting it names is stored into the device's
//! cache knobs. Only misses and upkeep come here: a hit never does.

use super::adaptive::{
    counts_as_cost, decide, maps_a_large_block, setting_at, with_large_blocks, CacheSetting,
    Observation, Tuning, LONG_GPU_WAIT_NS, MEMORY_FIRST_LEVEL, WINDOW_MISSES,
};
use super::config::{CacheMode, MemoryConfig};
use super::{ManagedDevice, MemoryManager, PressureLevel};
use crate::pool::{CacheKnobs, KnobValues, Placed};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// One device's adaptive state.
pub(crate) struct Adapting {
    /// The configured setting: level 1 of the ladder.
    base: CacheSetting,
    window: Mutex<Window>,
    /// Whether a miss has mapped a gigabyte block (`maps_a_large_block`): read by the ladder
    /// and, without the window's lock, by a miss deciding whether to wait to make room.
    large_blocks: AtomicBool,
}

struct Window {
    tuning: Tuning,
    /// Allocations the device's pools had served when the window opened.
    ops_at_start: u64,
    misses: u64,
    miss_ns: u64,
    mapped_bytes: u64,
    /// The most the device has held at a miss so far.
    held_high: u64,
    /// The setting in force.
    setting: CacheSetting,
}

/// The configured cache setting, as the ladder's base.
pub(crate) fn configured_setting(config: &MemoryConfig) -> CacheSetting {
    CacheSetting {
        max_chunk_bytes: config.max_chunk_bytes,
        inside_chunk_bytes: config.inside_chunk_bytes,
        idle_pages_kept: config.idle_pages_kept,
        idle_per_mille: config.idle_per_mille,
        whole_chunks_when_growing: config.whole_chunks_when_growing,
        place_on_mapped_pages: config.place_on_mapped_pages,
        map_ahead_when_growing: config.map_ahead_when_growing,
    }
}

/// The setting a device whose pages are `page_size` bytes starts with under `config`, and its
/// adaptive state if it adapts: [`Tuning::starting`]'s level, before any live peak.
pub(crate) fn starting(config: &MemoryConfig, page_size: u64) -> (CacheSetting, Option<Adapting>) {
    let base = configured_setting(config);
    match config.cache_mode {
        CacheMode::Fixed => (base, None),
        CacheMode::MemoryFirst => (CacheSetting::MEMORY_FIRST, None),
        CacheMode::Adaptive => {
            let tuning = Tuning::starting();
            let first = setting_at(tuning.level, &base, 0, page_size, false);
            let setting = while_running(&first, &base);
            let window = Window {
                tuning,
                ops_at_start: 0,
                misses: 0,
                miss_ns: 0,
                mapped_bytes: 0,
                held_high: 0,
                setting,
            };
            let adapting = Adapting {
                base,
                window: Mutex::new(window),
                large_blocks: AtomicBool::new(false),
            };
            (setting, Some(adapting))
        }
    }
}

/// `setting` as pools that are running may take it: whole-chunk cutting stays as configured.
/// An arena's pages were cut into chunks one way; switching the cut under it made the pools
/// count pages the device no longer held (two pages in two of eight stress runs under load,
/// `reliability::stress::many_threads_under_driver_faults`). The memory-first setting cuts
/// whole from the start (`GPUMEM_CACHE_MODE=memory-first`).
fn while_running(setting: &CacheSetting, base: &CacheSetting) -> CacheSetting {
    CacheSetting {
        whole_chunks_when_growing: base.whole_chunks_when_growing,
        ..*setting
    }
}

impl Adapting {
    /// Whether the device has mapped a gigabyte block (`maps_a_large_block`).
    pub(crate) fn large_blocks(&self) -> bool {
        self.large_blocks.load(Relaxed)
    }

    /// Whether the GPU paces this device's process, so that a miss making room waits for it
    /// rather than take room past the cache budget: a gigabyte block was mapped, or the
    /// device's longest wait for the GPU so far (`longest_wait_ns`) lasted
    /// [`LONG_GPU_WAIT_NS`]. Neither is ever undone (nothing clears a device's wait
    /// histogram), so once true, true for the process's life.
    pub(crate) fn gpu_paces(&self, longest_wait_ns: u64) -> bool {
        self.large_blocks() || longest_wait_ns >= LONG_GPU_WAIT_NS
    }
}

/// Stores `setting` into a device's knobs.
pub(crate) fn store(knobs: &CacheKnobs, setting: &CacheSetting, page_size: u64) {
    let values = KnobValues {
        max_chunk_bytes: setting.max_chunk_bytes,
        inside_chunk_bytes: setting.inside_chunk_bytes,
        whole_when_growing: setting.whole_chunks_when_growing,
        place_on_mapped_pages: setting.place_on_mapped_pages,
        map_ahead_when_growing: setting.map_ahead_when_growing,
        idle_pages_kept: setting.idle_pages_kept,
        idle_per_mille: setting.idle_per_mille,
    };
    knobs.store(&values, page_size);
}

impl MemoryManager {
    /// A miss was served on `managed`: its time into the latency histogram, its cost (the same
    /// time, or what a simulated device's cost model charged) into the adaptive window.
    pub(super) fn record_miss(&self, managed: &ManagedDevice, placed: &Placed) {
        managed.pages.miss_ns.record(u64::from(placed.miss_ns));
        if let Some(adapting) = &managed.adapting {
            let cost_ns = u64::from(placed.miss_cost_ns);
            self.adapt(managed, adapting, cost_ns, placed.mapped_bytes);
        }
    }

    #[cold]
    fn adapt(&self, managed: &ManagedDevice, adapting: &Adapting, ns: u64, mapped_bytes: u64) {
        // The first gigabyte block lowers the setting at once: the climbs before it were made at
        // a smaller peak, and no window may come before its freed pages are placed on. Once a
        // device, so it waits for the window's lock where other misses would not.
        if maps_a_large_block(mapped_bytes) && !adapting.large_blocks.swap(true, Relaxed) {
            let mut window = adapting.window.lock();
            let tuning = with_large_blocks(window.tuning);
            self.apply(managed, adapting, &mut window, tuning);
        }
        // Another miss deciding right now has this window; one miss less in it changes nothing.
        let Some(mut window) = adapting.window.try_lock() else {
            return;
        };
        let held = managed.reserve.reserved_bytes.load(Relaxed);
        let growth = held > window.held_high;
        window.held_high = window.held_high.max(held);
        // Counted, misses at a new high (nine tenths of graph_message_passing's time at level 1)
        // took every trace to the top rung, and placed 32-64 MiB chunks pinned by live blocks
        // held bert_mlm_dynpad and convnext_multires past the ceiling.
        if growth || !counts_as_cost(ns, mapped_bytes) {
            return;
        }
        window.misses += 1;
        window.miss_ns += ns;
        window.mapped_bytes += mapped_bytes;
        if window.misses < WINDOW_MISSES {
            return;
        }
        let ops = allocations(managed);
        let seen = Observation {
            ops: ops.saturating_sub(window.ops_at_start),
            misses: window.misses,
            miss_ns: window.miss_ns,
            mapped_bytes: window.mapped_bytes,
            pressure: managed.pressure.level(),
            live_peak_bytes: live_peak_pages(managed) * managed.page_size,
            room_bytes: managed.pool_cap().saturating_sub(held),
            large_blocks: adapting.large_blocks(),
        };
        let tuning = decide(window.tuning, &seen);
        tracing::debug!(
            device = managed.index,
            level = tuning.level,
            cost_ns_per_op = seen.cost_ns_per_op(),
            mapped_bytes_per_miss = seen.mapped_bytes_per_miss(),
            "adaptive window"
        );
        self.apply(managed, adapting, &mut window, tuning);
        window.ops_at_start = ops;
        window.misses = 0;
        window.miss_ns = 0;
        window.mapped_bytes = 0;
    }

    /// Puts `tuning` in force on `managed`: its setting at the live peak now, stored into the
    /// device's knobs if it moved.
    fn apply(
        &self,
        managed: &ManagedDevice,
        adapting: &Adapting,
        window: &mut Window,
        tuning: Tuning,
    ) {
        let setting = while_running(
            &setting_at(
                tuning.level,
                &adapting.base,
                live_peak_pages(managed) * managed.page_size,
                managed.page_size,
                adapting.large_blocks(),
            ),
            &adapting.base,
        );
        if setting != window.setting {
            store(managed.pages.knobs(), &setting, managed.page_size);
            tracing::debug!(
                device = managed.index,
                level = tuning.level,
                ?setting,
                "cache setting moved"
            );
        }
        window.tuning = tuning;
        window.setting = setting;
    }

    /// Pressure rose to `level` on `managed` (upkeep): at high and above the adaptive default
    /// goes to memory-first at once, not at the next window of misses.
    pub(super) fn adapt_to_pressure(&self, managed: &ManagedDevice, level: PressureLevel) {
        let Some(adapting) = &managed.adapting else {
            return;
        };
        if level < PressureLevel::High {
            return;
        }
        let mut window = adapting.window.lock();
        let tuning = decide(
            window.tuning,
            &Observation {
                ops: 0,
                misses: 0,
                miss_ns: 0,
                mapped_bytes: 0,
                pressure: level,
                live_peak_bytes: 0,
                room_bytes: 0,
                large_blocks: adapting.large_blocks(),
            },
        );
        debug_assert_eq!(tuning.level, MEMORY_FIRST_LEVEL);
        window.tuning = tuning;
        window.setting = while_running(&CacheSetting::MEMORY_FIRST, &adapting.base);
        store(managed.pages.knobs(), &window.setting, managed.page_size);
    }

    /// The cache setting `device`'s pools use now, and the adaptive level it stands at (`None`
    /// with a fixed or memory-first setting).
    pub fn cache_setting(&self, device: usize) -> Option<(CacheSetting, Option<u8>)> {
        let managed = self.device(device).ok()?;
        match &managed.adapting {
            Some(adapting) => {
                let window = adapting.window.lock();
                Some((window.setting, Some(window.tuning.level)))
            }
            None => Some((managed.fixed_setting, None)),
        }
    }
}

/// Allocations the device's pools have served.
fn allocations(managed: &ManagedDevice) -> u64 {
    let mut total = 0;
    for pool in managed.pools() {
        for kind in [crate::pool::PoolKind::Small, crate::pool::PoolKind::Large] {
            total += pool.slot(kind).counters.allocations.load(Relaxed);
        }
    }
    total
}

/// The most pages under live blocks this window of the cache budget and the last.
pub(super) fn live_peak_pages(managed: &ManagedDevice) -> u64 {
    let peaks = &managed.events.live_pages_peak;
    peaks[0].load(Relaxed).max(peaks[1].load(Relaxed)) as u64
}
