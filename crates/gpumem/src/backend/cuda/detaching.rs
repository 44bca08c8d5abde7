//! [`Detaching`] on CUDA: a detached range leaves the table of mapped chunks for a table of its
//! own, with no driver call, and stays mapped until `cuMemUnmap` at its address later. Mapping
//! the same handle at a second address (`map_reusing`) is an ordinary `cuMemMap`: the driver
//! lets one physical allocation sit under several addresses.

use super::vmm::{chunk_bytes, take_whole_chunks, unmap_range};
use super::CudaBackend;
use crate::backend::{check_pages, Detaching, DevicePtr, PhysicalChunk};
use crate::error::BackendError;

impl Detaching for CudaBackend {
    fn detach_keeping(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        into: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        let granularity = self.device(device)?.properties.allocation_granularity_bytes;
        check_pages("detach", addr, size, granularity)?;
        let taken = take_whole_chunks(&mut self.chunks.lock(), device, addr, size, granularity)?;
        let mut detached = self.detached.lock();
        for &(at, chunk) in &taken {
            detached.insert((device, at), chunk);
            into.push(chunk);
        }
        Ok(())
    }

    fn unmap_detached(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
    ) -> Result<(), BackendError> {
        let granularity = self
            .make_current(device)?
            .properties
            .allocation_granularity_bytes;
        check_pages("unmap_detached", addr, size, granularity)?;
        // Out of the table first, back into it for whatever the driver would not unmap, so
        // that no other thread unmaps the same range meanwhile.
        let taken = take_whole_chunks(&mut self.detached.lock(), device, addr, size, granularity)?;
        let mut rest = taken.into_iter();
        let mut outcome = Ok(());
        let mut left = Vec::new();
        for (at, chunk) in rest.by_ref() {
            let unmapped = chunk_bytes(chunk, granularity)
                .and_then(|bytes| self.relaxed(|| unmap_range(at, bytes)));
            if let Err(error) = unmapped {
                left.push((at, chunk));
                outcome = Err(error);
                break;
            }
        }
        left.extend(rest);
        self.detached
            .lock()
            .extend(left.into_iter().map(|(at, chunk)| ((device, at), chunk)));
        outcome
    }
}
