//! gpumem's contract between processes, in one place: the snapshot of a manager's devices (the
//! JSON of `/api/v1/snapshot`), the file a process publishes for a sidecar or the node agent
//! (`published`), what a collector makes of such files and of NVML's processes and their pods
//! (`collected`), and what `/proc` says about a process (`process`). Plain data with serde and
//! nothing else: the core fills it, observability renders it, and any reader (a collector, a
//! test, another language's writer) depends on this crate alone.

mod collected;
mod counters;
mod device_record;
mod oom;
mod pressure;
pub mod process;
pub mod published;
mod snapshot;

pub use collected::{
    CollectStatus, CollectedProcess, CollectorSnapshot, ExitedGpuProcess, ExitedProcess,
    GpuProcess, PodRef, PodsStatus, ProcessPool, ProcessTag, PublishedDeviceMemory, ReasonCount,
    SourceStatus, ThisPod,
};
pub use counters::CounterValues;
pub use device_record::{DeviceFamily, FamilyKind, ProcessDevice, DEVICE_FAMILIES};
pub use oom::OomEvent;
pub use pressure::PressureLevel;
pub use snapshot::*;
