//! The publish format: one JSON object per process, documented in `docs/publish-format.md`.
//! Kept small and flat on purpose, so that a Python engine can write the same file from
//! `torch.cuda.memory_stats()` in a dozen lines.

use crate::{
    DeviceSnapshot, PoolSnapshot, ProcessDevice, ProcessPool, ProcessTag, PublishedDeviceMemory,
    Snapshot, TagGroup,
};
use serde::{Deserialize, Serialize};

/// The value of the `format` field: says what the file is before anything else is trusted.
pub const FORMAT: &str = "gpumem.publish";
/// The format version this gpumem writes and the newest it reads. Adding optional fields keeps
/// the version; anything a version-1 reader would misread (renamed fields, changed units) bumps it.
pub const VERSION: u32 = 1;
/// Published files are named `gpumem-<pid>.json`; readers take any `*.json` not starting with `.`.
pub const FILE_PREFIX: &str = "gpumem-";
pub const FILE_SUFFIX: &str = ".json";

/// The name of a process's file in the publish directory.
pub fn file_name(pid: u32) -> String {
    format!("{FILE_PREFIX}{pid}{FILE_SUFFIX}")
}

/// Whether a directory entry is a published file the collector should read: `*.json`, not
/// hidden (writers create their temporary files as `.name.tmp` and rename them into place).
pub fn is_published_name(name: &str) -> bool {
    name.ends_with(FILE_SUFFIX) && !name.starts_with('.') && name.len() > FILE_SUFFIX.len()
}

/// One published file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PublishedFile {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format version, [`VERSION`] for this gpumem.
    pub version: u32,
    /// The publishing process's pid, as its own PID namespace sees it.
    pub pid: u32,
    /// A short name for the process (the `process` label).
    pub process: String,
    /// `readlink /proc/self/ns/pid` of the writer (`pid:[4026531836]`): when it matches the
    /// collector's, the collector can tell a dead pid from one it merely cannot see.
    pub pid_namespace: Option<String>,
    /// When the snapshot was taken, in seconds since the Unix epoch.
    pub timestamp_seconds: f64,
    /// How often the writer publishes; the file is stale after three of these.
    pub interval_seconds: Option<f64>,
    /// What wrote it (`gpumem 0.1.0`, `torch 2.4.0`), for people reading the file.
    pub writer: Option<String>,
    #[serde(default)]
    pub devices: Vec<ProcessDevice>,
}

/// Who is publishing: the process's identity, fixed for its lifetime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub pid: u32,
    pub process: String,
    pub pid_namespace: Option<String>,
}

impl PublishedFile {
    /// The published form of an in-process snapshot.
    pub fn from_snapshot(snapshot: &Snapshot, identity: &Identity) -> Self {
        PublishedFile {
            format: FORMAT.to_string(),
            version: VERSION,
            pid: identity.pid,
            process: identity.process.clone(),
            pid_namespace: identity.pid_namespace.clone(),
            timestamp_seconds: snapshot.timestamp_seconds,
            interval_seconds: Some(snapshot.interval_seconds),
            writer: Some(format!("gpumem {}", snapshot.version)),
            devices: snapshot.devices.iter().map(device_record).collect(),
        }
    }
}

/// One device of an in-process snapshot as the device record the publish format carries (and
/// `/metrics` reads its manager families from).
pub fn device_record(d: &DeviceSnapshot) -> ProcessDevice {
    ProcessDevice {
        // Device indices are small; a u32 is what Python and the format use.
        gpu: u32::try_from(d.index).unwrap_or(u32::MAX),
        uuid: Some(d.uuid.clone()).filter(|u| !u.is_empty()),
        name: Some(d.name.clone()).filter(|n| !n.is_empty()),
        device_memory: d.memory.map(|m| PublishedDeviceMemory {
            total_bytes: m.total_bytes,
            free_bytes: m.free_bytes,
            pressure_level: d.pressure.map(|p| p.level.as_number()),
            pressure_used_ratio: d.pressure.map(|p| p.used_ratio),
        }),
        pools: d.pools.iter().map(published_pool).collect(),
        tags: d.by_tag.iter().map(published_tag).collect(),
        ..ProcessDevice::figures_of(d)
    }
}

/// A tag group as the publish format writes it.
pub fn published_tag(g: &TagGroup) -> ProcessTag {
    ProcessTag {
        tag: g.tag.clone(),
        live_bytes: Some(g.bytes),
        live_allocations: Some(g.count),
        leak_suspect_bytes: Some(g.leak_suspect_bytes),
        leak_suspect_allocations: Some(g.leak_suspect_count),
    }
}

/// A published device's tags as groups (unknown numbers count as 0), e.g. to fold them.
pub fn tag_groups(tags: &[ProcessTag]) -> Vec<TagGroup> {
    tags.iter()
        .map(|t| TagGroup {
            tag: t.tag.clone(),
            count: t.live_allocations.unwrap_or(0),
            bytes: t.live_bytes.unwrap_or(0),
            oldest_age_seconds: 0.0,
            leak_suspect_count: t.leak_suspect_allocations.unwrap_or(0),
            leak_suspect_bytes: t.leak_suspect_bytes.unwrap_or(0),
        })
        .collect()
}

/// A pool as the publish format writes it.
pub fn published_pool(p: &PoolSnapshot) -> ProcessPool {
    ProcessPool {
        pool: p.pool.clone(),
        reserved_bytes: Some(p.reserved_bytes),
        in_use_bytes: Some(p.in_use_bytes),
        requested_bytes: Some(p.requested_bytes),
        cached_free_bytes: Some(p.cached_free_bytes),
        largest_free_block_bytes: Some(p.largest_free_block_bytes),
        fragmentation_ratio: Some(p.fragmentation_ratio),
        idle_pages: Some(p.idle_pages),
        live_allocations: Some(p.live_allocations),
        requests_total: Some(p.requests),
        hits_total: Some(p.hits),
        driver_allocs_total: Some(p.driver_allocs),
        driver_frees_total: Some(p.driver_frees),
        driver_errors_total: Some(p.driver_errors),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_collectors_read() {
        assert_eq!(file_name(42), "gpumem-42.json");
        assert!(is_published_name("gpumem-42.json"));
        assert!(is_published_name("engine.json"));
        assert!(!is_published_name(".gpumem-42.json.7.tmp"));
        assert!(!is_published_name(".hidden.json"));
        assert!(!is_published_name("gpumem-42.json.tmp"));
        assert!(!is_published_name(".json"));
    }

    #[test]
    fn a_snapshot_round_trips_through_json() {
        let snapshot = Snapshot {
            version: "0.1.0".into(),
            timestamp_seconds: 1_700_000_000.5,
            interval_seconds: 1.0,
            devices: vec![DeviceSnapshot {
                index: 1,
                uuid: "GPU-x".into(),
                pools: vec![PoolSnapshot {
                    pool: "large".into(),
                    reserved_bytes: 4 << 20,
                    ..PoolSnapshot::default()
                }],
                ..DeviceSnapshot::default()
            }],
            ..Snapshot::default()
        };
        let identity = Identity {
            pid: 7,
            process: "engine".into(),
            pid_namespace: None,
        };
        let file = PublishedFile::from_snapshot(&snapshot, &identity);
        let text = serde_json::to_string(&file).expect("serialises");
        let back: PublishedFile = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, file);
        assert_eq!(back.devices[0].gpu, 1);
        assert_eq!(back.devices[0].pools[0].reserved_bytes, Some(4 << 20));
        assert_eq!(back.writer.as_deref(), Some("gpumem 0.1.0"));
    }
}
