//! The manager's upkeep, run every `cleanup_interval` on its own thread (or, with the thread
//! off, by whoever calls `maintain`): pressure levels and their callbacks, trimming under
//! pressure, the pools of streams gone unused and idle pages returned by age, and fragmentation
//! warnings.

use super::pressure::{PressureChange, PressureLevel};
use super::views::fragmentation;
use super::{MemoryManager, Shared};
use crate::pool::PoolKind;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Weak;
use std::time::{Duration, Instant};

/// Fragmentation above this is worth a warning (the status page and alerts use it too).
pub const FRAGMENTATION_WARNING: f64 = 0.30;
/// A warned pool is "back to normal" only under this: without the gap a pool hovering around
/// 30 % logged a warning and a recovery every few seconds (73 lines in 10 minutes).
pub const FRAGMENTATION_CLEAR: f64 = 0.20;

impl MemoryManager {
    /// One round of upkeep; returns the bytes given back to the driver.
    pub fn maintain(&self) -> u64 {
        let mut released = self.update_pressure();
        if let Some(age) = self.config().release_idle_after {
            let mut window = self.shared().window_started.lock();
            if window.elapsed() >= age.max(Duration::from_secs(1)) {
                *window = Instant::now();
                self.roll_peak_window();
            }
            drop(window);
            // First, so that the pages of streams gone quiet go back with the rest.
            self.retire_unused_streams(age);
            self.wind_down_retired();
            released += self.release_idle_older_than(age);
        }
        released += self.enforce_max_cached();
        self.log_fragmentation();
        released
    }

    /// Registers `callback` for every pressure level change of any managed device.
    pub fn on_pressure_change(&self, callback: impl Fn(&PressureChange) + Send + Sync + 'static) {
        self.shared()
            .pressure_callbacks
            .write()
            .push(Box::new(callback));
    }

    /// The level last seen on `device` (Low until the first upkeep).
    pub fn pressure(&self, device: usize) -> Option<PressureLevel> {
        self.device(device).ok().map(|d| d.pressure.level())
    }

    /// Reads each device's memory, updates its level, and on a change logs it, tells the
    /// callbacks, and at High or above trims the cache if configured. Returns bytes released.
    pub fn update_pressure(&self) -> u64 {
        let thresholds = self.config().pressure;
        let mut released = 0;
        for managed in &self.shared().devices {
            let Ok(info) = self.backend().mem_info(managed.index) else {
                continue;
            };
            let used = info.used();
            let level = thresholds.classify(used, info.total);
            let previous = managed.pressure.set(level);
            if previous == level {
                continue;
            }
            let change = PressureChange {
                device: managed.index,
                from: previous,
                to: level,
                used_ratio: thresholds.used_ratio(used, info.total),
            };
            if level > previous {
                tracing::warn!(device = change.device, from = %previous, to = %level, used_ratio = change.used_ratio, "memory pressure rose");
            } else {
                tracing::info!(device = change.device, from = %previous, to = %level, used_ratio = change.used_ratio, "memory pressure eased");
            }
            self.adapt_to_pressure(managed, level);
            for callback in self.shared().pressure_callbacks.read().iter() {
                callback(&change);
            }
            if level >= PressureLevel::High
                && level > previous
                && self.config().trim_on_high_pressure
            {
                released += self.empty_cache_on(managed);
            }
        }
        released
    }

    /// Logs once when a pool's fragmentation crosses the warning line, and once when it drops back
    /// under the (lower) clearing line.
    fn log_fragmentation(&self) {
        for managed in &self.shared().devices {
            let worst = [PoolKind::Small, PoolKind::Large]
                .into_iter()
                .map(|kind| {
                    let (mut largest, mut cached) = (0, 0);
                    for pool in managed.pools() {
                        let counters = pool.slot(kind).counters.read();
                        cached += counters
                            .reserved_bytes
                            .saturating_sub(counters.in_use_bytes);
                        largest = largest.max(pool.arena_view(kind).largest_cached_free_block);
                    }
                    fragmentation(largest, cached)
                })
                .fold(0.0, f64::max);
            let was_above = managed.pressure.fragmented.load(Relaxed);
            let above = if was_above {
                worst >= FRAGMENTATION_CLEAR
            } else {
                worst > FRAGMENTATION_WARNING
            };
            if above == was_above {
                continue;
            }
            managed.pressure.fragmented.store(above, Relaxed);
            let percent = (worst * 100.0).round();
            if above {
                tracing::warn!(
                    "GPU {}: pool fragmentation at {percent:.0}% (above {:.0}%): large requests may miss the cache",
                    managed.index,
                    FRAGMENTATION_WARNING * 100.0
                );
            } else {
                tracing::info!(
                    "GPU {}: pool fragmentation back to {percent:.0}% (under {:.0}%)",
                    managed.index,
                    FRAGMENTATION_CLEAR * 100.0
                );
            }
        }
    }
}

/// Starts the upkeep thread. It holds the manager weakly and exits when the manager is
/// dropped (its `stop` sender goes away, which wakes it at once).
pub(super) fn spawn(
    manager: &MemoryManager,
    interval: Duration,
    stop: Receiver<()>,
) -> std::io::Result<()> {
    let weak: Weak<Shared> = std::sync::Arc::downgrade(&manager.shared);
    std::thread::Builder::new()
        .name("gpumem-upkeep".to_string())
        .spawn(move || loop {
            match stop.recv_timeout(interval) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
            let Some(shared) = weak.upgrade() else {
                return;
            };
            MemoryManager { shared }.maintain();
        })
        .map(|_| ())
}
