//! How the demo swings memory pressure: on the simulated device it changes the memory "other
//! processes" hold; on a real GPU it cannot, so it holds ballast itself (tag `pressure_ballast`).
//! Either way pressure rises and falls on a slow wave, and a spike pushes it to critical.

use gpumem::backend::sim::SimBackend;
use gpumem::manager::{AllocOptions, DeviceBuffer, MemoryManager, Tag};
use gpumem::units::{align_down, MIB};
use std::sync::Arc;
use std::time::Duration;

/// One rise and fall of the wave.
const PERIOD: Duration = Duration::from_secs(120);
/// Ballast moves in chunks of this size, a few per tick, so the chart shows a ramp, not a step.
const BALLAST_CHUNK: u64 = 256 * MIB;
const BALLAST_CHUNKS_PER_TICK: usize = 4;
pub(super) const BALLAST_TAG: &str = "pressure_ballast";

/// Where the pressure comes from.
pub(super) enum PressureSource {
    /// The simulated device's `used_by_others`.
    Simulated(Arc<SimBackend>),
    /// Buffers this process allocates and frees (real GPUs).
    Ballast,
}

/// The pressure of one device over time.
pub(super) struct PressureSwing {
    source: PressureSource,
    device: usize,
    total: u64,
    /// Free memory when the demo started: the ballast's wave is a share of it.
    base: u64,
    ballast: Vec<DeviceBuffer>,
    tag: Tag,
}

impl PressureSwing {
    pub(super) fn new(source: PressureSource, device: usize, total: u64, base: u64) -> Self {
        PressureSwing {
            source,
            device,
            total,
            base,
            ballast: Vec::new(),
            tag: Tag::new(BALLAST_TAG),
        }
    }

    /// 0 at the start, 1 half a period later, back to 0 after a full period.
    fn wave(elapsed: Duration) -> f64 {
        let phase = elapsed.as_secs_f64() / PERIOD.as_secs_f64() * std::f64::consts::TAU;
        0.5 - 0.5 * phase.cos()
    }

    /// Moves the pressure to where the wave (or a spike) says it should be now.
    pub(super) fn apply(&mut self, manager: &MemoryManager, elapsed: Duration, spike: bool) {
        // Others take 3 % to 23 % of the device: with the workload's own swing, pressure moves
        // between low and high; only a spike makes it critical.
        let share = 0.03 + 0.20 * Self::wave(elapsed);
        match &self.source {
            PressureSource::Simulated(sim) => {
                let reserved = manager
                    .device_stats(self.device)
                    .map_or(0, |s| s.counters.reserved_bytes);
                let others = if spike {
                    // Leave about 1 % free: past the critical threshold, short of a full device.
                    self.total
                        .saturating_sub(reserved)
                        .saturating_sub(self.total / 100)
                } else {
                    (self.total as f64 * share) as u64
                };
                if let Err(error) = sim.set_used_by_others(self.device, others) {
                    tracing::debug!(device = self.device, %error, "could not change simulated pressure");
                }
            }
            PressureSource::Ballast => {
                let target = if spike {
                    let free = manager
                        .backend()
                        .mem_info(self.device)
                        .map_or(0, |info| info.free);
                    self.held() + free.saturating_sub(self.total / 100)
                } else {
                    (self.base as f64 * share * 0.6) as u64
                };
                self.move_ballast_towards(manager, target);
            }
        }
    }

    fn held(&self) -> u64 {
        self.ballast.iter().map(DeviceBuffer::size).sum()
    }

    fn move_ballast_towards(&mut self, manager: &MemoryManager, target: u64) {
        let target = align_down(target, BALLAST_CHUNK);
        for _ in 0..BALLAST_CHUNKS_PER_TICK {
            let held = self.held();
            if held + BALLAST_CHUNK <= target {
                match manager.alloc(
                    self.device,
                    BALLAST_CHUNK,
                    &AllocOptions::tagged(self.tag.clone()),
                ) {
                    Ok(buffer) => self.ballast.push(buffer),
                    // The device is as full as it gets; that is the point of a spike.
                    Err(_) => break,
                }
            } else if held > target {
                self.ballast.pop();
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wave_rises_and_falls() {
        assert!(PressureSwing::wave(Duration::ZERO) < 1e-9);
        assert!((PressureSwing::wave(PERIOD / 2) - 1.0).abs() < 1e-9);
        assert!(PressureSwing::wave(PERIOD) < 1e-9);
    }
}
