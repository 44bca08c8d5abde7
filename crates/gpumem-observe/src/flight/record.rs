//! One flight record: a self-contained JSON picture of a device at the moment something went
//! wrong (an out-of-memory refusal, or a rise to critical pressure). Everything an operator needs
//! to answer "why did this run out of memory?" is inside: the request, the device, each pool's
//! free / cached / largest free block, the largest tags, the last minutes of history and who else
//! held memory on the device (with their pods, where the node agent named them). The node agent
//! also records a GPU process that vanished while it held memory (trigger `exited`).

use crate::history::HistoryPoint;
use gpumem::manager::ooms::OomEvent;
use gpumem_wire::{DeviceMemory, PodRef, Pressure, ProcessPool, TagGroup, ThisPod};
use serde::{Deserialize, Serialize};

/// The value of `format`: what the file is, before anything else is trusted.
pub const FORMAT: &str = "gpumem.flight";
pub const VERSION: u32 = 1;

/// Why a record was written (also part of its file name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Allocations were refused with out-of-memory.
    Oom,
    /// The device's pressure rose to critical.
    CriticalPressure,
    /// A GPU process vanished while it held memory (exited, killed, its container restarted).
    Exited,
}

impl Trigger {
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Oom => "oom",
            Trigger::CriticalPressure => "critical_pressure",
            Trigger::Exited => "exited",
        }
    }
}

/// The file's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlightRecord {
    /// Always [`FORMAT`].
    pub format: String,
    pub version: u32,
    pub trigger: Trigger,
    /// When it was written, in seconds since the Unix epoch.
    pub timestamp_seconds: f64,
    /// The file name it was written under (relative to its directory); `None` when it was kept
    /// in memory only (no directory configured, or the write failed).
    pub file: Option<String>,
    /// The one line that was logged, for lists.
    pub summary: String,
    /// The process that was refused memory (for an OOM), or whose exporter saw the pressure.
    pub process: Option<RecordProcess>,
    pub device: RecordDevice,
    /// The newest refusal: what was requested, with which tag, and the error text.
    pub request: Option<OomEvent>,
    /// Refusals since the previous record of this device (the newest few of them listed).
    pub ooms_since_previous: u64,
    pub recent_ooms: Vec<OomEvent>,
    pub ooms_total: Option<u64>,
    pub oom_retries_total: Option<u64>,
    /// Each pool's reserved, in-use, cached free and largest free block bytes.
    pub pools: Vec<ProcessPool>,
    /// The largest tags by live bytes (then `other`), with their leak suspects.
    pub top_tags: Vec<TagGroup>,
    /// Device memory over the last minutes, oldest first.
    pub history: Vec<RecordPoint>,
    /// Other processes holding memory on the device, and where that was learnt.
    pub other_processes: Vec<OtherProcess>,
    /// Why `other_processes` may be incomplete (no NVML, ...).
    pub other_processes_note: Option<String>,
    /// What the process held on the device when it was last seen (trigger `exited`: NVML's
    /// count of its memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_bytes: Option<u64>,
    /// Why it is gone (trigger `exited`): `exited`, or `restarted` (its container).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_reason: Option<String>,
    /// The pod of the gpumem that wrote the record (the downward API), when it knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_in: Option<ThisPod>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordProcess {
    pub pid: u32,
    pub process: String,
    /// Its pod, where the node agent named it (or, in a sidecar, the sidecar's own pod, for the
    /// processes that publish into it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordDevice {
    pub gpu: usize,
    pub uuid: String,
    pub name: String,
    pub memory: Option<DeviceMemory>,
    pub pressure: Option<Pressure>,
    /// Bytes this process's pools held from the driver, and of those handed out.
    pub reserved_bytes: Option<u64>,
    pub in_use_bytes: Option<u64>,
}

/// One point of history for the record's device.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordPoint {
    /// Seconds since the Unix epoch.
    pub t: f64,
    pub in_use_bytes: u64,
    pub reserved_bytes: u64,
    pub device_used_bytes: Option<u64>,
}

/// Another holder of device memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherProcess {
    pub pid: u32,
    pub process: String,
    pub used_bytes: Option<u64>,
    /// `nvml` (the driver's per-process accounting) or `published` (its own snapshot).
    pub source: String,
    /// Its pod, where the node agent named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// The history points of device `gpu` newer than `since` (Unix seconds).
pub fn device_history(points: &[HistoryPoint], gpu: usize, since: f64) -> Vec<RecordPoint> {
    points
        .iter()
        .filter(|p| p.t >= since)
        .filter_map(|p| {
            let d = p.devices.iter().find(|d| d.gpu == gpu)?;
            Some(RecordPoint {
                t: p.t,
                in_use_bytes: d.in_use_bytes,
                reserved_bytes: d.reserved_bytes,
                device_used_bytes: d.device_used_bytes,
            })
        })
        .collect()
}
