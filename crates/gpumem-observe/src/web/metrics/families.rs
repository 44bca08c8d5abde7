//! Every per-device and per-pool family of a memory manager, declared once: name, help, type,
//! labels, and how it is read from the one device record (`ProcessDevice`, with its pools) that
//! an in-process manager publishes and a collected process is read into. `/metrics` renders this
//! process's devices and every collected process's from these tables; the collector's series
//! budget counts them; the publish format's fields are checked against them (tests below).
//! The device families themselves are declared with the record's fields, in `gpumem_wire`
//! (`device_record.rs`): adding a device metric is a line there.

use super::{def, Def, COUNTER, GAUGE};
use gpumem_wire::{DeviceSnapshot, FamilyKind, ProcessDevice, ProcessPool, DEVICE_FAMILIES};

pub(crate) const DEVICE: &[&str] = &["gpu", "uuid"];
pub(crate) const POOL: &[&str] = &["gpu", "uuid", "pool"];

pub(crate) type DeviceValue = fn(&DeviceSnapshot) -> Option<f64>;
pub(crate) type RecordValue = fn(&ProcessDevice) -> Option<f64>;
pub(crate) type PoolRecordValue = fn(&ProcessPool) -> Option<f64>;

fn n(v: Option<u64>) -> Option<f64> {
    v.map(|v| v as f64)
}

/// What the driver says about the device itself (memory, pressure): one series per device, never
/// per process.
pub(crate) const DEVICE_READINGS: &[(Def, DeviceValue)] = &[
    (def("gpumem_device_memory_total_bytes", GAUGE, DEVICE, "Total memory of the device."),
        |d| Some(d.memory.map_or(d.total_bytes, |m| m.total_bytes) as f64)),
    (def("gpumem_device_memory_free_bytes", GAUGE, DEVICE, "Free memory of the device as the driver reports it (cuMemGetInfo), for all processes."),
        |d| d.memory.map(|m| m.free_bytes as f64)),
    (def("gpumem_device_memory_used_bytes", GAUGE, DEVICE, "Used memory of the device (total minus free), by every process."),
        |d| d.memory.map(|m| m.used_bytes as f64)),
    (def("gpumem_device_memory_used_by_others_bytes", GAUGE, DEVICE, "Device memory used by anything but this process's pools: other processes, CUDA contexts, libraries allocating on their own."),
        |d| d.memory.map(|m| m.used_by_others_bytes as f64)),
    (def("gpumem_pressure_level", GAUGE, DEVICE, "Memory pressure of the device: 0 low, 1 medium, 2 high, 3 critical."),
        |d| d.pressure.map(|p| f64::from(p.level.as_number()))),
    (def("gpumem_pressure_used_ratio", GAUGE, DEVICE, "Used device memory over usable memory (total minus a reserve for the driver); the pressure levels are thresholds on it."),
        |d| d.pressure.map(|p| p.used_ratio)),
];

/// The manager's per-device families: the device record's own table (`gpumem_wire`'s
/// `DEVICE_FAMILIES`, where each is declared with its field), with the labels `gpu`, `uuid`.
pub(crate) static MANAGER_DEVICE: [(Def, RecordValue); DEVICE_FAMILIES.len()] = {
    let mut families =
        [(def("", GAUGE, DEVICE, ""), no_value as RecordValue); DEVICE_FAMILIES.len()];
    let mut i = 0;
    while i < DEVICE_FAMILIES.len() {
        let family = &DEVICE_FAMILIES[i];
        let kind = match family.kind {
            FamilyKind::Gauge => GAUGE,
            FamilyKind::Counter => COUNTER,
        };
        families[i] = (def(family.metric, kind, DEVICE, family.help), family.read);
        i += 1;
    }
    families
};

fn no_value(_: &ProcessDevice) -> Option<f64> {
    None
}

/// The manager's per-pool families (labels `gpu`, `uuid`, `pool`), read from the pool record.
pub(crate) const MANAGER_POOL: &[(Def, PoolRecordValue)] = &[
    (def("gpumem_pool_reserved_bytes", GAUGE, POOL, "Bytes the pool holds from the driver, in use or cached."),
        |p| n(p.reserved_bytes)),
    (def("gpumem_pool_in_use_bytes", GAUGE, POOL, "Bytes of the pool's blocks handed out to live allocations."),
        |p| n(p.in_use_bytes)),
    (def("gpumem_pool_requested_bytes", GAUGE, POOL, "Bytes callers asked for in the pool's live allocations."),
        |p| n(p.requested_bytes)),
    (def("gpumem_pool_cached_free_bytes", GAUGE, POOL, "Bytes the pool holds but has not handed out (reserved minus in use)."),
        |p| n(p.cached_free_bytes)),
    (def("gpumem_pool_largest_free_block_bytes", GAUGE, POOL, "The largest request the pool can serve from its cache, without calling the driver."),
        |p| n(p.largest_free_block_bytes)),
    (def("gpumem_pool_fragmentation_ratio", GAUGE, POOL, "1 minus largest free block over cached free bytes: 0 when the cache is one block, near 1 when it is splinters."),
        |p| p.fragmentation_ratio),
    (def("gpumem_pool_idle_pages", GAUGE, POOL, "Mapped pages of the pool with nothing allocated in them, kept for reuse."),
        |p| n(p.idle_pages)),
    (def("gpumem_pool_live_allocations", GAUGE, POOL, "Live allocations served by the pool."),
        |p| n(p.live_allocations)),
    (def("gpumem_pool_requests_total", COUNTER, POOL, "Allocation requests that reached the pool."),
        |p| n(p.requests_total)),
    (def("gpumem_pool_hits_total", COUNTER, POOL, "Allocation requests the pool served from its cache, without a driver call."),
        |p| n(p.hits_total)),
    (def("gpumem_pool_driver_allocs_total", COUNTER, POOL, "Driver calls the pool made to take memory."),
        |p| n(p.driver_allocs_total)),
    (def("gpumem_pool_driver_frees_total", COUNTER, POOL, "Driver calls the pool made to give memory back."),
        |p| n(p.driver_frees_total)),
    (def("gpumem_pool_driver_errors_total", COUNTER, POOL, "Driver calls of the pool that failed."),
        |p| n(p.driver_errors_total)),
];

#[cfg(test)]
mod tests {
    use super::super::all_defs;
    use super::*;
    use gpumem_wire::ProcessTag;

    /// Every field of the device record (the publish format) is a family named after it, and
    /// every family of the tables is a field: the record and the tables cannot drift apart.
    #[test]
    fn every_record_field_is_a_family_of_its_own_name() {
        let device = ProcessDevice {
            pools: vec![ProcessPool::default()],
            tags: vec![ProcessTag::default()],
            ..ProcessDevice::default()
        };
        let json = serde_json::to_value(&device).expect("serialises");
        let fields = json.as_object().expect("an object");
        let identity = ["gpu", "uuid", "name", "pools", "tags"];
        let mut record: Vec<String> = fields
            .keys()
            .filter(|k| !identity.contains(&k.as_str()))
            .map(|k| format!("gpumem_{k}"))
            .collect();
        let mut families: Vec<String> = MANAGER_DEVICE.iter().map(|(d, _)| d.name.into()).collect();
        record.sort();
        families.sort();
        assert_eq!(record, families);
        let pool = json["pools"][0].as_object().expect("a pool");
        let mut record: Vec<String> = pool
            .keys()
            .filter(|k| *k != "pool")
            .map(|k| format!("gpumem_pool_{k}"))
            .collect();
        let mut families: Vec<String> = MANAGER_POOL.iter().map(|(d, _)| d.name.into()).collect();
        record.sort();
        families.sort();
        assert_eq!(record, families);
        let declared: Vec<&str> = all_defs().map(|d| d.name).collect();
        let tag = json["tags"][0].as_object().expect("a tag");
        for key in tag.keys().filter(|k| *k != "tag") {
            let name = format!("gpumem_tag_{key}");
            assert!(declared.contains(&name.as_str()), "{name} undeclared");
        }
    }

    /// Each table reads what its family says: a record with every field set to a distinct
    /// number gives each family the number of its own field.
    #[test]
    fn each_family_reads_its_own_field() {
        let mut json = serde_json::to_value(ProcessDevice::default()).expect("serialises");
        let fields = json.as_object_mut().expect("an object");
        let names: Vec<String> = fields.keys().cloned().collect();
        for (i, key) in names.iter().enumerate() {
            if !["gpu", "uuid", "name", "pools", "tags"].contains(&key.as_str()) {
                fields.insert(key.clone(), serde_json::json!(1000 + i));
            }
        }
        let record: ProcessDevice = serde_json::from_value(json.clone()).expect("parses");
        for (def, value) in MANAGER_DEVICE {
            let field = def.name.strip_prefix("gpumem_").expect("prefixed");
            assert_eq!(value(&record), json[field].as_f64(), "{}", def.name);
        }
    }
}
