//! The device record a process publishes and a collector reads, declared once: each field with
//! the metric family it is exported as (`gpumem_<field>`: type and help) and how an in-process
//! snapshot fills it. `/metrics` renders this process's devices and every collected process's
//! from [`DEVICE_FAMILIES`]; the collector's series budget counts it; the Python publisher's keys
//! are checked against the record. Adding a device metric is a line in the table below.

use crate::{DeviceSnapshot, ProcessPool, ProcessTag, PublishedDeviceMemory};
use serde::{Deserialize, Serialize};

/// Whether a family is a gauge or a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FamilyKind {
    Gauge,
    Counter,
}

/// A field of the device record as a metric family (labels `gpu`, `uuid`; a collected process
/// adds its own).
#[derive(Clone, Copy, Debug)]
pub struct DeviceFamily {
    /// `gpumem_` and the field's name.
    pub metric: &'static str,
    pub kind: FamilyKind,
    pub help: &'static str,
    /// The field's value, absent when the writer did not publish it.
    pub read: fn(&ProcessDevice) -> Option<f64>,
}

/// The record, its table of families and its filling from a snapshot, from one list of fields:
/// `name: type, kind, "help", |snapshot| value;` in the published file's order.
macro_rules! device_record {
    ($($field:ident: $ty:ty, $kind:ident, $help:literal, |$d:ident| $fill:expr;)*) => {
        /// One device of a published snapshot. Everything but `gpu` is optional: a writer
        /// publishes what it knows (PyTorch has no leak ages), and what is missing is not
        /// exported. Fields added within version 1 (graphs, external buffers, device memory,
        /// tags) are missing from older writers' files and ignored by older readers.
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
        pub struct ProcessDevice {
            /// The device index in the publishing process (a CUDA index; join on `uuid` across
            /// hosts).
            pub gpu: u32,
            /// `GPU-…`, joinable with NVML's and dcgm-exporter's.
            pub uuid: Option<String>,
            pub name: Option<String>,
            $(
                #[doc = $help]
                pub $field: Option<$ty>,
            )*
            /// What the process itself reads of the device (`cuMemGetInfo`) and the pressure
            /// it computes: a collector without NVML takes the device's memory and pressure from
            /// here.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub device_memory: Option<PublishedDeviceMemory>,
            #[serde(default)]
            pub pools: Vec<ProcessPool>,
            /// Live memory by tag (the largest tags, then `other`).
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub tags: Vec<ProcessTag>,
        }

        /// Every field of the device record with a figure, as its metric family.
        pub const DEVICE_FAMILIES: &[DeviceFamily] = &[$(
            DeviceFamily {
                metric: concat!("gpumem_", stringify!($field)),
                kind: FamilyKind::$kind,
                help: $help,
                read: |record| record.$field.map(|v| v as f64),
            },
        )*];

        impl ProcessDevice {
            /// The record's figures of an in-process device (the rest left empty).
            pub fn figures_of(snapshot: &DeviceSnapshot) -> ProcessDevice {
                ProcessDevice {
                    $($field: Some({
                        let $d = snapshot;
                        $fill
                    }),)*
                    ..ProcessDevice::default()
                }
            }
        }
    };
}

// Each line: the field, its type, its family's kind and help, and how a snapshot fills it.
device_record! {
    requested_bytes: u64, Gauge, "Bytes callers asked for in live allocations on the device.",
        |d| d.stats.pools.requested_bytes;
    in_use_bytes: u64, Gauge, "Bytes of pool blocks handed out to live allocations (requests rounded up to blocks).",
        |d| d.stats.pools.in_use_bytes;
    reserved_bytes: u64, Gauge, "Bytes this process's pools hold from the driver on the device, in use or cached for reuse.",
        |d| d.stats.pools.reserved_bytes;
    in_use_peak_bytes: u64, Gauge, "Highest in-use bytes since start or the last peak reset.",
        |d| d.stats.pools.peak_in_use_bytes;
    reserved_peak_bytes: u64, Gauge, "Highest reserved bytes since start or the last peak reset.",
        |d| d.stats.pools.peak_reserved_bytes;
    allocations_total: u64, Counter, "Allocations served on the device.",
        |d| d.stats.pools.allocations;
    frees_total: u64, Counter, "Allocations freed on the device.",
        |d| d.stats.pools.frees;
    driver_allocs_total: u64, Counter, "Driver calls that took memory for the device (cuMemAlloc, or mapping pool pages).",
        |d| d.stats.pools.driver_allocs;
    driver_frees_total: u64, Counter, "Driver calls that gave the device's memory back (cuMemFree, or unmapping pool pages).",
        |d| d.stats.pools.driver_frees;
    driver_errors_total: u64, Counter, "Driver calls for the device's memory that failed.",
        |d| d.stats.pools.driver_errors;
    ooms_total: u64, Counter, "Allocations refused because the device, or the pool limit, was full.",
        |d| d.stats.ooms;
    oom_retries_total: u64, Counter, "Allocations that hit out-of-memory, released cached pages and tried again.",
        |d| d.stats.oom_retries;
    cpu_fallbacks_total: u64, Counter, "Allocations served from host memory because the device could not serve them.",
        |d| d.stats.cpu_fallbacks;
    host_fallback_bytes: u64, Gauge, "Host memory held now by allocations that fell back from the device.",
        |d| d.stats.host_fallback_bytes;
    live_allocations: u64, Gauge, "Live (allocated, not yet freed) allocations on the device.",
        |d| d.live.count;
    live_bytes: u64, Gauge, "Requested bytes of the live allocations on the device.",
        |d| d.live.bytes;
    leak_suspect_allocations: u64, Gauge, "Live allocations older than the leak age (gpumem_leak_age_seconds) whose tag is not long-lived.",
        |d| d.live.leak_suspect_count;
    leak_suspect_bytes: u64, Gauge, "Requested bytes of the leak suspects (see gpumem_leak_suspect_allocations).",
        |d| d.live.leak_suspect_bytes;
    oldest_allocation_age_seconds: f64, Gauge, "Age of the oldest live allocation whose tag is not long-lived (such as weights); 0 when there is none.",
        |d| d.live.oldest_age_seconds;
    graph_pool_bytes: u64, Gauge, "Device memory held for CUDA graphs (pools of graphs not yet released): part of gpumem_reserved_bytes, but out of reach of every other allocation.",
        |d| d.graphs.reserved_bytes;
    graph_pools: u64, Gauge, "Pools holding memory for CUDA graphs on the device.",
        |d| d.graphs.pools;
    external_bytes: u64, Gauge, "Device memory this process allocated outside gpumem and registered with track_external (NCCL, cuBLAS workspaces, its own cuMemAlloc); not in any pool figure.",
        |d| d.external.bytes;
    external_buffers: u64, Gauge, "Outside buffers registered with track_external on the device.",
        |d| d.external.count;
    requested_peak_bytes: u64, Gauge, "Highest requested bytes (what callers asked for in live allocations) since start or the last peak reset: torch.cuda.max_memory_allocated's figure.",
        |d| d.stats.pools.peak_requested_bytes;
}
