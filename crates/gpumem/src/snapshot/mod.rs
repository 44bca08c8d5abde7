//! The snapshot of a manager: [`capture`] fills the contract's types (`gpumem-wire`, re-exported
//! here) from a [`MemoryManager`](crate::manager::MemoryManager) at one instant.

mod capture;

pub use capture::{begun, capture, fold_smallest, CaptureSettings};
pub use gpumem_wire::{
    unix_now, AgeBand, AllocationSummary, DeviceCounters, DeviceMemory, DeviceSnapshot,
    ExternalSummary, GraphSummary, LiveSummary, PoolSnapshot, Pressure, SamplerHealth, Snapshot,
    TagGroup,
};
