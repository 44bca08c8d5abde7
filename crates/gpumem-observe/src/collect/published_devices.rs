//! Devices as the publishers see them: without NVML (or another device source) the collector is
//! blind to the device, but every engine that publishes reads its device itself
//! (`cuMemGetInfo`) and computes its pressure. Those readings stand in for the device's own, so
//! `gpumem_device_memory_*` and `gpumem_pressure_*` still exist, and the pressure alerts can
//! still fire, for every device some publisher uses. Where several publish the same device
//! (joined on the UUID, else the index), the freshest reading wins.

use gpumem::manager::pressure::PressureLevel;
use gpumem::snapshot::CaptureSettings;
use gpumem_wire::{CollectedProcess, DeviceMemory, DeviceSnapshot, Pressure};
use std::collections::BTreeMap;

/// One device per UUID (or index) some collected process published a reading of.
pub fn devices(processes: &[CollectedProcess], settings: &CaptureSettings) -> Vec<DeviceSnapshot> {
    // Key: the UUID, or the index for writers that give none.
    let mut freshest: BTreeMap<String, (f64, DeviceSnapshot)> = BTreeMap::new();
    for process in processes {
        for published in &process.devices {
            let Some(reading) = &published.device_memory else {
                continue;
            };
            let total = reading.total_bytes;
            let free = reading.free_bytes.min(total);
            let used = total - free;
            let measured = settings.pressure.measure(used, total);
            let pressure = match (reading.pressure_level, reading.pressure_used_ratio) {
                (Some(level), Some(ratio)) if ratio.is_finite() => Pressure {
                    level: PressureLevel::ALL
                        .get(usize::from(level))
                        .copied()
                        .unwrap_or(measured.level),
                    used_ratio: ratio,
                },
                _ => measured,
            };
            let uuid = published.uuid.clone().unwrap_or_default();
            let key = if uuid.is_empty() {
                format!("index {}", published.gpu)
            } else {
                uuid.clone()
            };
            let device = DeviceSnapshot {
                index: published.gpu as usize,
                name: published.name.clone().unwrap_or_default(),
                uuid,
                total_bytes: total,
                memory: Some(DeviceMemory {
                    total_bytes: total,
                    free_bytes: free,
                    used_bytes: used,
                    used_by_this_process_bytes: 0,
                    used_by_others_bytes: used,
                }),
                pressure: Some(pressure),
                ..DeviceSnapshot::default()
            };
            let newer = freshest
                .get(&key)
                .is_none_or(|(t, _)| process.timestamp_seconds > *t);
            if newer {
                freshest.insert(key, (process.timestamp_seconds, device));
            }
        }
    }
    let mut devices: Vec<DeviceSnapshot> = freshest.into_values().map(|(_, d)| d).collect();
    devices.sort_by(|a, b| (a.index, &a.uuid).cmp(&(b.index, &b.uuid)));
    devices
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_wire::{ProcessDevice, PublishedDeviceMemory};

    fn publisher(t: f64, free: u64, level: Option<u8>) -> CollectedProcess {
        CollectedProcess {
            pid: 7,
            process: "engine".into(),
            timestamp_seconds: t,
            devices: vec![ProcessDevice {
                gpu: 0,
                uuid: Some("GPU-a".into()),
                device_memory: Some(PublishedDeviceMemory {
                    total_bytes: 80 << 30,
                    free_bytes: free,
                    pressure_level: level,
                    pressure_used_ratio: level.map(|_| 0.99),
                }),
                ..ProcessDevice::default()
            }],
            ..CollectedProcess::default()
        }
    }

    #[test]
    fn the_freshest_publisher_reading_stands_in_for_the_device() {
        let settings = CaptureSettings::default();
        let older = publisher(10.0, 40 << 30, None);
        let newer = publisher(11.0, 1 << 30, Some(3));
        let found = devices(&[older.clone(), newer], &settings);
        assert_eq!(found.len(), 1);
        let pressure = found[0].pressure.expect("pressure");
        assert_eq!(pressure.level, PressureLevel::Critical);
        assert_eq!(found[0].memory.map(|m| m.free_bytes), Some(1 << 30));
        // Without the publisher's own level, the collector's thresholds measure it.
        let found = devices(&[older], &settings);
        assert_eq!(found[0].pressure.map(|p| p.level), Some(PressureLevel::Low));
        // A writer that says nothing of the device adds none.
        let mut silent = publisher(12.0, 0, None);
        silent.devices[0].device_memory = None;
        assert!(devices(&[silent], &settings).is_empty());
    }
}
