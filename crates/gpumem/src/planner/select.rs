//! Choosing a device: given each device's total and free memory, which one has the most room
//! left for a request of a given size — or, when none fits, by how much each falls short.
//!
//! A device's *usable* free memory is `free - reserve(total)`, with the reserve the pressure
//! levels use ([`default_reserve`]: 600 MiB for the driver and context plus 10 % of the device
//! for library workspaces, at most 2 GiB). Since `used = total - free`, staying within
//! `free - reserve` is the same as staying within the manager's usable memory `total - reserve`.

use crate::units::{Bytes, GIB, MIB};
use serde::Serialize;
use std::fmt;

/// The memory figures of one device, as its backend reported them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    pub index: usize,
    pub name: String,
    pub total: u64,
    pub free: u64,
}

impl DeviceMemory {
    /// Bytes kept back for the driver, the context and libraries' workspaces.
    pub fn reserve(&self) -> u64 {
        default_reserve(self.total)
    }

    /// Free memory a plan may use: `free - reserve`, 0 when the reserve is already eaten into.
    pub fn usable(&self) -> u64 {
        self.free.saturating_sub(self.reserve())
    }
}

/// Where a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The device's index (as in [`DeviceMemory::index`]).
    pub index: usize,
    /// Usable bytes left on it after the request.
    pub headroom_after: u64,
}

/// How far one device is from fitting a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Shortfall {
    pub index: usize,
    pub name: String,
    pub free: u64,
    pub usable: u64,
    /// `required - usable`.
    pub short_by: u64,
}

/// No device has room: the request and every device's shortfall.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NoDeviceFits {
    pub required: u64,
    pub devices: Vec<Shortfall>,
}

impl fmt::Display for NoDeviceFits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.devices.is_empty() {
            return write!(f, "no device to place {} on", Bytes(self.required));
        }
        write!(
            f,
            "no device has {} of usable memory (free minus reserve):",
            Bytes(self.required)
        )?;
        for (n, d) in self.devices.iter().enumerate() {
            let separator = if n == 0 { " " } else { "; " };
            write!(
                f,
                "{separator}GPU {} ({}) has {} free, {} usable, {} short",
                d.index,
                d.name,
                Bytes(d.free),
                Bytes(d.usable),
                Bytes(d.short_by)
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for NoDeviceFits {}

/// The device with the most usable memory left after `bytes`, among those it fits on; ties go
/// to the lowest index. An error lists every device's free memory and shortfall.
pub fn select_device_for(bytes: u64, devices: &[DeviceMemory]) -> Result<Placement, NoDeviceFits> {
    let best = devices
        .iter()
        .filter(|d| d.usable() >= bytes)
        .map(|d| Placement {
            index: d.index,
            headroom_after: d.usable() - bytes,
        })
        .max_by(|a, b| {
            a.headroom_after
                .cmp(&b.headroom_after)
                .then(b.index.cmp(&a.index))
        });
    best.ok_or_else(|| NoDeviceFits {
        required: bytes,
        devices: devices
            .iter()
            .map(|d| Shortfall {
                index: d.index,
                name: d.name.clone(),
                free: d.free,
                usable: d.usable(),
                short_by: bytes.saturating_sub(d.usable()),
            })
            .collect(),
    })
}

/// Memory never counted as usable: about 500 MiB the driver keeps, about 100 MiB of context
/// state beyond that, and 10 % of the device for libraries' workspaces (cuBLAS, NCCL) that
/// allocate behind the allocator's back — capped at 2 GiB so large GPUs are not penalised.
pub fn default_reserve(total: u64) -> u64 {
    (500 * MIB + 100 * MIB + total / 10).min(2 * GIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_is_capped_at_two_gib() {
        assert_eq!(default_reserve(4 * GIB), 600 * MIB + 4 * GIB / 10);
        assert_eq!(default_reserve(80 * GIB), 2 * GIB);
    }
    use crate::planner::TEST_DEVICES_GB;
    use crate::units::{GIB, MIB};

    /// One device of each size, with 10 % of each already in use.
    fn fleet() -> Vec<DeviceMemory> {
        TEST_DEVICES_GB
            .iter()
            .enumerate()
            .map(|(index, (name, total))| DeviceMemory {
                index,
                name: name.to_string(),
                total: *total,
                free: total / 10 * 9,
            })
            .collect()
    }

    #[test]
    fn usable_memory_subtracts_the_pressure_reserve() {
        for d in fleet() {
            let reserve = (600 * MIB + d.total / 10).min(2 * GIB);
            assert_eq!(d.reserve(), reserve, "{}", d.name);
            assert_eq!(d.usable(), d.free.saturating_sub(reserve), "{}", d.name);
        }
        let full = DeviceMemory {
            index: 0,
            name: "full".to_string(),
            total: 8 * GIB,
            free: 100 * MIB,
        };
        assert_eq!(full.usable(), 0);
    }

    #[test]
    fn picks_the_device_with_the_most_headroom() {
        let devices = fleet();
        let placement = select_device_for(GIB, &devices).unwrap();
        assert_eq!(placement.index, 7, "the 141 GB device");
        assert_eq!(placement.headroom_after, devices[7].usable() - GIB);
        // Each device alone takes what fits on it and refuses what does not.
        for d in &devices {
            let alone = std::slice::from_ref(d);
            assert_eq!(
                select_device_for(d.usable(), alone).unwrap().headroom_after,
                0
            );
            assert!(
                select_device_for(d.usable() + 1, alone).is_err(),
                "{}",
                d.name
            );
        }
    }

    #[test]
    fn a_busy_large_device_loses_to_an_idle_smaller_one() {
        let mut devices = fleet();
        devices[6].free = 10_000_000_000; // the 80 GB card is mostly taken
        devices[7].free = 5_000_000_000; // and so is the 141 GB one
        let placement = select_device_for(20_000_000_000, &devices).unwrap();
        assert_eq!(placement.index, 5, "the 48 GB device");
    }

    #[test]
    fn ties_go_to_the_lowest_index() {
        let twin = |index| DeviceMemory {
            index,
            name: "twin".to_string(),
            total: 24 * GIB,
            free: 20 * GIB,
        };
        let devices = [twin(3), twin(1), twin(2)];
        assert_eq!(select_device_for(GIB, &devices).unwrap().index, 1);
    }

    #[test]
    fn nothing_fits_lists_every_device_and_its_shortfall() {
        let devices = fleet();
        let error = select_device_for(200_000_000_000, &devices).unwrap_err();
        assert_eq!(error.devices.len(), 8);
        for (shortfall, device) in error.devices.iter().zip(&devices) {
            assert_eq!(shortfall.free, device.free);
            assert_eq!(shortfall.short_by, 200_000_000_000 - device.usable());
        }
        let text = error.to_string();
        assert!(!text.contains('\n'));
        assert!(
            text.starts_with("no device has 186.26 GiB of usable memory"),
            "{text}"
        );
        assert!(text.contains("GPU 0 (2 GB) has 1.68 GiB free"), "{text}");
        assert!(text.contains("GPU 7 (141 GB)"), "{text}");
        let none = select_device_for(1, &[]).unwrap_err();
        assert_eq!(none.to_string(), "no device to place 1 B on");
    }
}
