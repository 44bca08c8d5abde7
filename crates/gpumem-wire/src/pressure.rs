//! Memory pressure levels: how full a device is, in four steps (the thresholds that classify
//! a device are the core's `PressureThresholds`).

use serde::{Deserialize, Serialize};
use std::fmt;

/// How full a device is, from low to critical.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PressureLevel {
    Low,
    Medium,
    High,
    Critical,
}

impl PressureLevel {
    pub const ALL: [PressureLevel; 4] = [
        PressureLevel::Low,
        PressureLevel::Medium,
        PressureLevel::High,
        PressureLevel::Critical,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PressureLevel::Low => "low",
            PressureLevel::Medium => "medium",
            PressureLevel::High => "high",
            PressureLevel::Critical => "critical",
        }
    }

    /// 0 (low) to 3 (critical): the `gpumem_pressure_level` gauge.
    pub fn as_number(self) -> u8 {
        self as u8
    }

    /// The level of a number [`as_number`](Self::as_number) gave (above 3: critical).
    pub fn from_number(number: u8) -> PressureLevel {
        match number {
            0 => PressureLevel::Low,
            1 => PressureLevel::Medium,
            2 => PressureLevel::High,
            _ => PressureLevel::Critical,
        }
    }
}

impl fmt::Display for PressureLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
