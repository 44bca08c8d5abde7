//! Timing a miss twice: the wall-clock time it took (its latency, in every figure), and what it
//! cost in the adaptive default's eyes — the same time on a real device, the driver time the
//! cost model charged on the simulated one (see `DeviceBackend::charged_ns`).

use crate::backend::DeviceBackend;
use std::time::Instant;

/// Started before a miss's first driver call, read after its last.
pub(crate) struct MissClock {
    started: Instant,
    charged_before: Option<u64>,
}

/// How long a miss took and what it cost, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MissTime {
    pub ns: u32,
    pub cost_ns: u32,
}

impl MissClock {
    pub(crate) fn start(backend: &dyn DeviceBackend) -> Self {
        MissClock {
            charged_before: backend.charged_ns(),
            started: Instant::now(),
        }
    }

    pub(crate) fn stop(&self, backend: &dyn DeviceBackend) -> MissTime {
        let ns = clamp(self.started.elapsed().as_nanos());
        let cost_ns = match (self.charged_before, backend.charged_ns()) {
            (Some(before), Some(after)) => clamp(u128::from(after.wrapping_sub(before))),
            _ => ns,
        };
        MissTime { ns, cost_ns }
    }
}

impl MissTime {
    /// Both times of two parts of one miss together.
    pub(crate) fn plus(self, other: MissTime) -> MissTime {
        MissTime {
            ns: self.ns.saturating_add(other.ns),
            cost_ns: self.cost_ns.saturating_add(other.cost_ns),
        }
    }
}

fn clamp(ns: u128) -> u32 {
    ns.min(u128::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{DriverCosts, SimBackend, SimConfig};

    #[test]
    fn a_costless_simulated_miss_costs_nothing_however_long_it_took() {
        let backend = SimBackend::new(SimConfig::default());
        let clock = MissClock::start(&backend);
        std::thread::sleep(std::time::Duration::from_millis(2)); // a preempted miss
        let time = clock.stop(&backend);
        assert!(time.ns >= 2_000_000, "{time:?}");
        assert_eq!(time.cost_ns, 0);
    }

    #[test]
    fn a_simulated_miss_costs_what_its_calls_were_charged() {
        let backend = SimBackend::new(SimConfig {
            driver_costs: DriverCosts::H100,
            ..SimConfig::default()
        });
        let page = backend.granularity(0).unwrap();
        let range = backend.reserve_address_range(0, page).unwrap();
        let clock = MissClock::start(&backend);
        backend.map(0, range, page).unwrap();
        let time = clock.stop(&backend);
        // One created and mapped chunk, access granted once: 8 + 0.6 + 14 + 20 µs.
        assert_eq!(time.cost_ns, 42_600);
        assert!(time.ns >= time.cost_ns, "{time:?}");
        backend.unmap(0, range, page).unwrap();
        backend.release_address_range(0, range, page).unwrap();
    }

    #[test]
    fn parts_of_a_miss_add_up_without_overflowing() {
        let part = MissTime {
            ns: u32::MAX - 1,
            cost_ns: 5,
        };
        assert_eq!(
            part.plus(part),
            MissTime {
                ns: u32::MAX,
                cost_ns: 10
            }
        );
    }
}
