//! Detached mappings on the simulated device: a chunk mapped at a second address while the
//! first stays mapped (its address taken) until unmapped, as the driver allows. The device
//! checks what the driver would not forgive: unmapping part of a mapping, releasing a chunk
//! still mapped at a detached address, unmapping as detached what was not.

use super::{costs::spend, SimBackend, SimDevice};
use crate::backend::{Detaching, DevicePtr, PhysicalChunk};
use crate::error::BackendError;

impl SimBackend {
    /// The chunks mapped over `[addr, addr + size)` with where each starts, if the range covers
    /// whole mappings only (like the driver, `call` unmaps no part of one) and holds no
    /// detached one unless `detached` says it must be all detached ones.
    pub(super) fn whole_mappings(
        &self,
        state: &SimDevice,
        device: usize,
        call: &'static str,
        addr: DevicePtr,
        size: u64,
        detached: bool,
    ) -> Result<Vec<(DevicePtr, PhysicalChunk)>, BackendError> {
        self.check_pages(call, addr, size)?;
        let end = addr + size;
        let mut found = Vec::new();
        let mut at = addr;
        while at < end {
            let (base, chunk) = state
                .mapped
                .covering(at, self.granularity)
                .ok_or(BackendError::InvalidAddress { device, ptr: at })?;
            let chunk_end = base + chunk.pages as u64 * self.granularity;
            let reason = if base != at || chunk_end > end {
                format!(
                    "{addr:#x}+{size} cuts the chunk mapped at {base:#x} ({} pages); unmap whole chunks",
                    chunk.pages
                )
            } else if state.detached.contains_key(&base) != detached {
                let was = if detached { "was not" } else { "was" };
                format!("the chunk mapped at {base:#x} {was} detached")
            } else {
                found.push((base, chunk));
                at = chunk_end;
                continue;
            };
            return Err(BackendError::InvalidArgument { call, reason });
        }
        Ok(found)
    }

    /// Chunks mapped at detached addresses and not yet unmapped there, on `device`.
    pub fn detached_mappings(&self, device: usize) -> usize {
        self.device(device).map_or(0, |d| d.lock().detached.len())
    }

    /// Whether `handle` is still mapped at a detached address (it may not be released).
    pub(super) fn still_detached(state: &SimDevice, handle: u64) -> bool {
        state.detached.values().any(|c| c.handle == handle)
    }
}

impl Detaching for SimBackend {
    fn detach_keeping(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        into: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        let mut state = self.device(device)?.lock();
        let found = self.whole_mappings(&state, device, "detach", addr, size, false)?;
        for &(at, chunk) in &found {
            state.detached.insert(at, chunk);
            state.unmapped.insert(chunk.handle, chunk.pages);
        }
        into.extend(found.into_iter().map(|(_, chunk)| chunk));
        Ok(())
    }

    fn unmap_detached(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
    ) -> Result<(), BackendError> {
        self.faults.wait_while_unmaps_held();
        let mut state = self.device(device)?.lock();
        let found = self.whole_mappings(&state, device, "unmap_detached", addr, size, true)?;
        self.faults.on_free_call()?;
        for &(at, _) in &found {
            state.detached.remove(&at);
            state.mapped.remove(at);
        }
        spend(self.costs.unmap(found.len() as u64));
        Ok(())
    }
}
