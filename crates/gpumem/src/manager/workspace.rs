//! A linear layer's scratch buffer that follows the device at run time: sized by the planner's
//! workspace rule ([`crate::planner::workspace`]) from the memory free *now*, shrunk when the
//! device comes under pressure and grown back when it eases — so an engine takes big batches
//! while the GPU is idle and gives memory back before it runs out, instead of sizing once at
//! start-up for the worst case.
//!
//! The batch is the rule's batch for the memory this manager could use now (headroom minus the
//! pressure reserve, plus the workspace's own buffer), halved at high pressure and quartered at
//! critical pressure: the level is a warning that others are taking memory, so the workspace
//! yields before the allocator has to refuse anyone.

use super::{AllocOptions, DeviceBuffer, MemoryManager, PressureLevel, Tag};
use crate::error::{AllocError, BackendError};
use crate::planner::{optimal_batch_size, workspace_size, InsufficientMemory, LinearLayer};
use serde::Serialize;
use thiserror::Error;

/// The tag workspace buffers carry on the page and in snapshots.
pub const WORKSPACE_TAG: &str = "workspace";

/// Why a workspace could not be sized or allocated.
#[derive(Debug, Error)]
pub enum WorkspaceError {
    #[error(transparent)]
    Device(#[from] BackendError),
    #[error(transparent)]
    TooLittleMemory(#[from] InsufficientMemory),
    #[error("could not allocate the workspace: {0}")]
    Alloc(#[from] AllocError),
}

/// A change of a workspace's size, as [`Workspace::adapt`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WorkspaceResize {
    pub device: usize,
    pub from_batch: u64,
    pub to_batch: u64,
    pub from_bytes: u64,
    pub to_bytes: u64,
    /// The device's pressure level the new size was chosen at.
    pub pressure: PressureLevel,
}

/// A workspace buffer for one linear layer on one device; see the module docs.
pub struct Workspace {
    manager: MemoryManager,
    device: usize,
    layer: LinearLayer,
    /// 0 while there is no buffer (an allocation failed after a resize let the old one go).
    batch: u64,
    buffer: Option<DeviceBuffer>,
}

/// How far pressure shrinks the batch: a right shift (halve at high, quarter at critical).
fn pressure_shift(level: PressureLevel) -> u32 {
    match level {
        PressureLevel::Low | PressureLevel::Medium => 0,
        PressureLevel::High => 1,
        PressureLevel::Critical => 2,
    }
}

impl MemoryManager {
    /// A workspace for `layer` on `device`, sized for the memory and pressure of now.
    pub fn workspace(
        &self,
        device: usize,
        layer: LinearLayer,
    ) -> Result<Workspace, WorkspaceError> {
        let (batch, _) = self.workspace_batch(device, &layer, 0)?;
        let buffer = allocate(self, device, &layer, batch)?;
        Ok(Workspace {
            manager: self.clone(),
            device,
            layer,
            batch: buffer_batch(&layer, &buffer),
            buffer: Some(buffer),
        })
    }

    /// The batch the rule gives `layer` on `device` now, counting `own_bytes` (a workspace
    /// being resized) as available, and the pressure level it was chosen at.
    fn workspace_batch(
        &self,
        device: usize,
        layer: &LinearLayer,
        own_bytes: u64,
    ) -> Result<(u64, PressureLevel), WorkspaceError> {
        let managed = self.device(device)?;
        let total = managed.properties.total_memory_bytes;
        let reserve = self.config().pressure.reserve_for(total);
        let available = self
            .headroom(device)?
            .saturating_sub(reserve)
            .saturating_add(own_bytes);
        let plan = optimal_batch_size(layer, total, available)?;
        let level = managed.pressure.level();
        Ok(((plan.batch >> pressure_shift(level)).max(1), level))
    }
}

/// Allocates the buffer for `batch` rows, halving the batch while the allocator refuses (the
/// plan is made from figures another process may change before the allocation).
fn allocate(
    manager: &MemoryManager,
    device: usize,
    layer: &LinearLayer,
    mut batch: u64,
) -> Result<DeviceBuffer, WorkspaceError> {
    let options = AllocOptions::tagged(Tag::new(WORKSPACE_TAG));
    loop {
        match manager.alloc(device, workspace_size(layer, batch).max(1), &options) {
            Ok(buffer) => return Ok(buffer),
            Err(_) if batch > 1 => batch /= 2,
            Err(error) => return Err(error.into()),
        }
    }
}

/// The batch a buffer was allocated for (its size minus the dequant part, per row).
fn buffer_batch(layer: &LinearLayer, buffer: &DeviceBuffer) -> u64 {
    let rows = buffer.size().saturating_sub(layer.dequant_bytes()) / layer.bytes_per_row().max(1);
    rows.max(1)
}

impl Workspace {
    pub fn device(&self) -> usize {
        self.device
    }

    /// Rows per call the buffer holds now (0 without a buffer).
    pub fn batch(&self) -> u64 {
        self.batch
    }

    pub fn bytes(&self) -> u64 {
        self.buffer.as_ref().map_or(0, DeviceBuffer::size)
    }

    /// The buffer, valid until the next [`adapt`](Self::adapt) that resizes it; `None` when
    /// the last resize could not allocate even one row (the next `adapt` tries again).
    pub fn buffer(&self) -> Option<&DeviceBuffer> {
        self.buffer.as_ref()
    }

    /// Re-plans for the device's memory and pressure now and, when the batch changes,
    /// reallocates the buffer; returns the change, or `None` when the size stays. With not even
    /// one row's room left it shrinks to one row. Call it
    /// between steps (not while a kernel uses the buffer), after the manager's upkeep has
    /// updated the pressure level.
    pub fn adapt(&mut self) -> Result<Option<WorkspaceResize>, WorkspaceError> {
        let planned = self
            .manager
            .workspace_batch(self.device, &self.layer, self.bytes());
        let (target, pressure) = match planned {
            Ok(planned) => planned,
            // Not even one row fits in what is left: keep the smallest useful workspace (the
            // engine still has to run) rather than fail the step.
            Err(WorkspaceError::TooLittleMemory(_)) => {
                (1, self.manager.device(self.device)?.pressure.level())
            }
            Err(error) => return Err(error),
        };
        if target == self.batch {
            return Ok(None);
        }
        let (from_batch, from_bytes) = (self.batch, self.bytes());
        // The old buffer goes back to the pool first: the new one is then a cache hit when
        // shrinking (no driver call, which critical pressure would refuse), and reuses the
        // same pages when growing.
        self.buffer = None;
        self.batch = 0;
        let buffer = allocate(&self.manager, self.device, &self.layer, target)?;
        self.batch = buffer_batch(&self.layer, &buffer);
        self.buffer = Some(buffer);
        Ok(Some(WorkspaceResize {
            device: self.device,
            from_batch,
            to_batch: self.batch,
            from_bytes,
            to_bytes: self.bytes(),
            pressure,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{SimBackend, SimConfig, SimDeviceSpec};
    use crate::manager::MemoryConfig;
    use crate::units::{GIB, MIB};
    use std::sync::Arc;

    /// Llama-2-7B's MLP up projection with int4 weights: 86 MiB to unpack, 72.5 KiB a row.
    const LAYER: LinearLayer = LinearLayer {
        in_features: 4096,
        out_features: 11008,
        weight_bits: 4,
        activation_bytes: 2,
    };

    fn setup() -> (Arc<SimBackend>, MemoryManager) {
        let sim = Arc::new(SimBackend::new(SimConfig {
            devices: vec![SimDeviceSpec {
                total_bytes: 80 * GIB,
                ..SimDeviceSpec::default()
            }],
            ..SimConfig::default()
        }));
        let manager = MemoryManager::new(sim.clone(), MemoryConfig::default()).unwrap();
        (sim, manager)
    }

    #[test]
    fn the_workspace_shrinks_under_pressure_and_grows_back() {
        let (sim, manager) = setup();
        let mut ws = manager.workspace(0, LAYER).unwrap();
        assert_eq!(ws.batch(), 512, "an idle 80 GiB device: the class cap");
        assert_eq!(ws.bytes(), workspace_size(&LAYER, 512));
        assert_eq!(ws.adapt().unwrap(), None, "nothing changed");
        // Others take 70 GiB of 78 usable: high pressure halves the batch.
        sim.set_used_by_others(0, 70 * GIB).unwrap();
        manager.update_pressure();
        let change = ws.adapt().unwrap().expect("a resize");
        assert_eq!((change.from_batch, change.to_batch), (512, 256));
        assert_eq!(change.pressure, PressureLevel::High);
        assert_eq!(ws.bytes(), workspace_size(&LAYER, 256));
        // Critical: a quarter of what memory allows. 80 - 76 GiB leaves 2 GiB over the
        // reserve, 60 % of which still holds 512 rows.
        sim.set_used_by_others(0, 76 * GIB).unwrap();
        manager.update_pressure();
        assert_eq!(ws.adapt().unwrap().map(|c| c.to_batch), Some(128));
        // Memory itself runs short: with the workspace's own buffer, 150 MiB above the reserve.
        // 60 % of it is 90 MiB, 4 MiB past the dequant buffer: 56 rows, so 32, quartered.
        let leave = 2 * GIB + 150 * MIB - ws.bytes();
        sim.set_used_by_others(0, 80 * GIB - leave - ws.bytes())
            .unwrap();
        manager.update_pressure();
        let change = ws.adapt().unwrap().expect("a resize");
        assert_eq!((change.from_batch, change.to_batch), (128, 8));
        // Nothing left at all: one row, the smallest workspace that still runs the layer.
        sim.set_used_by_others(0, 80 * GIB - 2 * ws.bytes())
            .unwrap();
        manager.update_pressure();
        assert_eq!(ws.adapt().unwrap().map(|c| c.to_batch), Some(1));
        // The pressure eases: back to the cap.
        sim.set_used_by_others(0, 0).unwrap();
        manager.update_pressure();
        let change = ws.adapt().unwrap().expect("a resize");
        assert_eq!(
            (change.to_batch, change.pressure),
            (512, PressureLevel::Low)
        );
        assert_eq!(manager.live_summary(), (1, workspace_size(&LAYER, 512)));
    }

    #[test]
    fn too_little_memory_for_one_row_is_an_error() {
        let (sim, manager) = setup();
        sim.set_used_by_others(0, 78 * GIB).unwrap();
        assert!(matches!(
            manager.workspace(0, LAYER),
            Err(WorkspaceError::TooLittleMemory(_))
        ));
        assert!(matches!(
            manager.workspace(5, LAYER),
            Err(WorkspaceError::Device(_))
        ));
    }
}
