//! Memory pressure: how full a device is, measured against its *usable* memory (total minus a
//! reserve for the driver and the CUDA context), as four levels with configurable thresholds.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};

pub use gpumem_wire::PressureLevel;

/// A device moving from one pressure level to another, as callbacks receive it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PressureChange {
    pub device: usize,
    pub from: PressureLevel,
    pub to: PressureLevel,
    /// Used over usable memory when the change was seen.
    pub used_ratio: f64,
}

/// Called on every level change (from the upkeep thread or whoever runs `maintain`).
pub type Callback = Box<dyn Fn(&PressureChange) + Send + Sync>;

/// A device's last seen level, readable on the allocation path without a lock.
#[derive(Debug, Default)]
pub struct PressureState {
    level: AtomicU8,
    /// Whether fragmentation was above the warning line at the last look (logged once per
    /// crossing, never per allocation).
    pub(crate) fragmented: AtomicBool,
}

impl PressureState {
    pub fn level(&self) -> PressureLevel {
        PressureLevel::from_number(self.level.load(Relaxed))
    }

    /// Records `level`; returns the previous one.
    pub fn set(&self, level: PressureLevel) -> PressureLevel {
        PressureLevel::from_number(self.level.swap(level.as_number(), Relaxed))
    }
}

/// Where the levels start, as fractions of usable memory, and the reserve that is not usable.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PressureThresholds {
    pub medium: f64,
    pub high: f64,
    pub critical: f64,
    /// Bytes kept out of "usable"; `None` uses [`default_reserve`](crate::planner::default_reserve).
    pub reserve_bytes: Option<u64>,
}

impl Default for PressureThresholds {
    fn default() -> Self {
        PressureThresholds {
            medium: 0.60,
            high: 0.80,
            critical: 0.95,
            reserve_bytes: None,
        }
    }
}

impl PressureThresholds {
    /// The pressure of a device with `used` of `total` bytes taken.
    pub fn measure(&self, used: u64, total: u64) -> gpumem_wire::Pressure {
        gpumem_wire::Pressure {
            level: self.classify(used, total),
            used_ratio: self.used_ratio(used, total),
        }
    }

    /// Checks the thresholds are increasing fractions in (0, 1]; names the key that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in [
            ("medium", self.medium),
            ("high", self.high),
            ("critical", self.critical),
        ] {
            if !(value > 0.0 && value <= 1.0) {
                return Err(format!(
                    "pressure.{key} = {value} is out of range (0 < value <= 1)"
                ));
            }
        }
        if !(self.medium < self.high && self.high < self.critical) {
            return Err(format!(
                "pressure thresholds must increase: medium {} < high {} < critical {}",
                self.medium, self.high, self.critical
            ));
        }
        Ok(())
    }

    pub fn reserve_for(&self, total: u64) -> u64 {
        self.reserve_bytes
            .unwrap_or_else(|| crate::planner::default_reserve(total))
    }

    /// Usable bytes of a device with `total` bytes.
    pub fn usable(&self, total: u64) -> u64 {
        total.saturating_sub(self.reserve_for(total)).max(1)
    }

    /// The level of a device with `used` of `total` bytes taken (by anyone).
    pub fn classify(&self, used: u64, total: u64) -> PressureLevel {
        let ratio = used as f64 / self.usable(total) as f64;
        if ratio > self.critical {
            PressureLevel::Critical
        } else if ratio >= self.high {
            PressureLevel::High
        } else if ratio >= self.medium {
            PressureLevel::Medium
        } else {
            PressureLevel::Low
        }
    }

    /// Used over usable, the number the levels are drawn from.
    pub fn used_ratio(&self, used: u64, total: u64) -> f64 {
        used as f64 / self.usable(total) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::GIB;

    #[test]
    fn levels_follow_usable_memory() {
        let t = PressureThresholds::default();
        let total = 80 * GIB;
        let usable = t.usable(total);
        assert_eq!(usable, 78 * GIB);
        assert_eq!(t.classify(usable / 2, total), PressureLevel::Low);
        assert_eq!(t.classify(usable * 7 / 10, total), PressureLevel::Medium);
        assert_eq!(t.classify(usable * 9 / 10, total), PressureLevel::High);
        assert_eq!(
            t.classify(usable * 96 / 100, total),
            PressureLevel::Critical
        );
        assert_eq!(t.classify(total, total), PressureLevel::Critical);
    }

    #[test]
    fn validation_names_the_bad_key() {
        let bad = PressureThresholds {
            high: 1.5,
            ..PressureThresholds::default()
        };
        assert!(bad.validate().unwrap_err().contains("pressure.high"));
        let unordered = PressureThresholds {
            medium: 0.9,
            ..PressureThresholds::default()
        };
        assert!(unordered.validate().unwrap_err().contains("must increase"));
    }
}
