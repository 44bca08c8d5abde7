//! Growing and shrinking in pages with the virtual memory API: reserve address space, back it with
//! physical chunks (`cuMemMap` of chunks the caller kept, `cuMemCreate` of one new chunk for the
//! rest; one `cuMemSetAccess` per call), unmap whole chunks keeping them, and release them.

use super::properties::{device_location, page_allocation_prop};
use super::Device;
use super::{check, to_usize, CudaBackend};
use crate::backend::{check_pages, PhysicalChunk};
use crate::error::BackendError;
use cudarc::driver::sys::{self, CUmemGenericAllocationHandle};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

impl CudaBackend {
    pub(super) fn reserve(&self, device: usize, size: u64) -> Result<u64, BackendError> {
        let dev = self.make_current(device)?;
        let granularity = dev.properties.allocation_granularity_bytes;
        check_pages("reserve_address_range", 0, size, granularity)?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; size and alignment are non-zero multiples of the granularity;
        // address hint and flags 0 ask the driver to choose.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(
                &mut base,
                to_usize("reserve_address_range", size)?,
                to_usize("reserve_address_range", granularity)?,
                0,
                0,
            )
        })?;
        Ok(base)
    }

    pub(super) fn release(&self, device: usize, base: u64, size: u64) -> Result<(), BackendError> {
        let dev = self.make_current(device)?;
        check_pages(
            "release_address_range",
            base,
            size,
            dev.properties.allocation_granularity_bytes,
        )?;
        let still_mapped = [&self.chunks, &self.detached]
            .iter()
            .map(|table| {
                table
                    .lock()
                    .range((device, base)..(device, base + size))
                    .count()
            })
            .sum::<usize>();
        if still_mapped > 0 {
            return Err(BackendError::InvalidArgument {
                call: "release_address_range",
                reason: format!(
                    "{still_mapped} chunk(s) of the range at {base:#x} are still mapped; unmap them first"
                ),
            });
        }
        free_address_range(base, size)
    }

    /// [`DeviceBackend::map_reusing`](crate::backend::DeviceBackend::map_reusing): kept chunks
    /// are mapped again (`cuMemMap`, about a microsecond), new ones are created for the rest.
    pub(super) fn map_chunks(
        &self,
        device: usize,
        addr: u64,
        size: u64,
        reuse: &mut Vec<PhysicalChunk>,
        new_chunks: &[u32],
    ) -> Result<u64, BackendError> {
        let dev = self.make_current(device)?;
        let granularity = dev.properties.allocation_granularity_bytes;
        check_pages("map", addr, size, granularity)?;
        let count = size / granularity;
        let reused: u64 = reuse.iter().map(|c| c.pages as u64).sum();
        if reused > count {
            return Err(BackendError::InvalidArgument {
                call: "map",
                reason: format!("{reused} pages of chunks to map into a range of {count}"),
            });
        }
        crate::backend::check_new_chunks(new_chunks, count - reused)?;
        if let Some(base) = overlapping(&self.chunks.lock(), device, addr, addr + size, granularity)
        {
            return Err(BackendError::InvalidArgument {
                call: "map",
                reason: format!("memory mapped at {base:#x} overlaps {addr:#x}+{size}"),
            });
        }
        // (address, chunk, created by this call)
        let mut mapped: Vec<(u64, PhysicalChunk, bool)> = Vec::with_capacity(reuse.len() + 1);
        let mut failure = None;
        let mut at = addr;
        for &chunk in reuse.iter() {
            let bytes = chunk_bytes(chunk, granularity)?;
            if let Err(err) = map_existing(at, bytes, chunk.handle) {
                failure = Some(err);
                break;
            }
            mapped.push((at, chunk, false));
            at += bytes as u64;
        }
        if failure.is_none() {
            for &pages in new_chunks {
                let bytes = to_usize("map", pages as u64 * granularity)?;
                match map_new_chunk(dev, at, bytes) {
                    Ok(handle) => mapped.push((at, PhysicalChunk { handle, pages }, true)),
                    Err(err) => {
                        failure = Some(err);
                        break;
                    }
                }
                at += bytes as u64;
            }
        }
        if failure.is_none() {
            // One cuMemSetAccess for the whole call: the driver charges it per chunk, so fewer,
            // larger chunks are what makes it cheap.
            failure = self
                .grant_access(device, addr, to_usize("map", size)?)
                .err();
        }
        if let Some(err) = failure {
            // Undo: the caller keeps every chunk it lent, unmapped; created ones are released.
            for &(at, chunk, created) in mapped.iter().rev() {
                let bytes = chunk_bytes(chunk, granularity)?;
                if let Err(undo) = unmap_range(at, bytes) {
                    // Still mapped: no longer the caller's to lend again, and the backend
                    // releases it at drop.
                    tracing::warn!(at = format_args!("{at:#x}"), %undo, "undoing a partial map failed");
                    reuse.retain(|c| *c != chunk);
                    self.chunks.lock().insert((device, at), chunk);
                } else if created {
                    release_handle(chunk.handle);
                }
            }
            return Err(self.out_of_memory_or(device, size, err));
        }
        let created = mapped
            .iter()
            .filter(|m| m.2)
            .map(|m| m.1.pages as u64)
            .sum();
        let mut chunks = self.chunks.lock();
        chunks.extend(
            mapped
                .into_iter()
                .map(|(at, chunk, _)| ((device, at), chunk)),
        );
        reuse.clear();
        Ok(created)
    }

    /// [`DeviceBackend::unmap_keeping`](crate::backend::DeviceBackend::unmap_keeping).
    pub(super) fn unmap_chunks(
        &self,
        device: usize,
        addr: u64,
        size: u64,
        into: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        let dev = self.make_current(device)?;
        let granularity = dev.properties.allocation_granularity_bytes;
        check_pages("unmap", addr, size, granularity)?;
        let taken = take_whole_chunks(&mut self.chunks.lock(), device, addr, size, granularity)?;
        for (i, &(at, chunk)) in taken.iter().enumerate() {
            if let Err(err) = unmap_range(at, chunk_bytes(chunk, granularity)?) {
                // Map back what this call unmapped, so that the range is as it was.
                let mut restored = taken[i..].to_vec();
                for &(at, chunk) in &taken[..i] {
                    let bytes = chunk_bytes(chunk, granularity)?;
                    match map_existing(at, bytes, chunk.handle)
                        .and_then(|()| self.grant_access(device, at, bytes))
                    {
                        Ok(()) => restored.push((at, chunk)),
                        Err(again) => {
                            tracing::warn!(at = format_args!("{at:#x}"), %again, "remapping after a failed unmap failed; the chunk is kept unmapped");
                            into.push(chunk);
                        }
                    }
                }
                let mut chunks = self.chunks.lock();
                chunks.extend(
                    restored
                        .into_iter()
                        .map(|(at, chunk)| ((device, at), chunk)),
                );
                return Err(err);
            }
        }
        into.extend(taken.into_iter().map(|(_, chunk)| chunk));
        Ok(())
    }

    /// [`DeviceBackend::release_chunks`](crate::backend::DeviceBackend::release_chunks).
    pub(super) fn release_physical(
        &self,
        device: usize,
        chunks: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        self.make_current(device)?;
        while let Some(&chunk) = chunks.last() {
            // SAFETY: the caller owns `chunk`, a handle from cuMemCreate that is mapped nowhere
            // (the trait's contract); releasing it frees its memory.
            check("cuMemRelease", unsafe { sys::cuMemRelease(chunk.handle) })?;
            self.forget_export(chunk.handle);
            chunks.pop();
        }
        Ok(())
    }

    /// Grants the device read and write access to `[addr, addr + size)`.
    pub(super) fn grant_access(
        &self,
        device: usize,
        addr: u64,
        size: usize,
    ) -> Result<(), BackendError> {
        let dev = self.device(device)?;
        let access = sys::CUmemAccessDesc {
            location: device_location(dev.handle),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped; `access` is one valid descriptor that outlives the call.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(addr, size, &access, 1)
        })
    }
}

/// Maps an existing chunk of `bytes` at `at`.
pub(super) fn map_existing(
    at: u64,
    bytes: usize,
    handle: CUmemGenericAllocationHandle,
) -> Result<(), BackendError> {
    // SAFETY: `at` lies in a reserved range (the caller's contract; the driver checks it), is
    // granularity aligned and unmapped; `handle` is an unmapped chunk of exactly `bytes`.
    check("cuMemMap", unsafe {
        sys::cuMemMap(at, bytes, 0, handle, 0)
    })
}

/// Gives back an address range this backend reserved and mapped nothing in (the caller has
/// checked, or never put it in the chunk table).
pub(super) fn free_address_range(base: u64, size: u64) -> Result<(), BackendError> {
    // SAFETY: nothing in the range is mapped by us; the driver validates that it was reserved.
    check("cuMemAddressFree", unsafe {
        sys::cuMemAddressFree(base, to_usize("release_address_range", size)?)
    })
}

/// Unmaps whole mappings in `[at, at + bytes)`; their physical memory stays held by the handles.
pub(super) fn unmap_range(at: u64, bytes: usize) -> Result<(), BackendError> {
    // SAFETY: `[at, at + bytes)` is exactly one chunk we mapped (the callers look it up).
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(at, bytes) })
}

/// Releases a chunk created by this backend that is mapped nowhere, logging a failure.
pub(super) fn release_handle(handle: CUmemGenericAllocationHandle) {
    // SAFETY: `handle` came from cuMemCreate and is mapped nowhere.
    if let Err(err) = check("cuMemRelease", unsafe { sys::cuMemRelease(handle) }) {
        tracing::warn!(%err, "releasing a physical chunk failed; its memory may leak");
    }
}

/// Creates one chunk of `bytes` (a multiple of the granularity) and maps it at `at`; on failure
/// nothing is left behind.
fn map_new_chunk(
    dev: &Device,
    at: u64,
    bytes: usize,
) -> Result<CUmemGenericAllocationHandle, BackendError> {
    let handle = create_chunk(dev, bytes)?;
    if let Err(err) = map_existing(at, bytes, handle) {
        release_handle(handle);
        return Err(err);
    }
    Ok(handle)
}

/// Creates one chunk of `bytes`, shareable with other processes while the device allows it. A
/// driver or device that refuses shareable pages (`NOT_SUPPORTED`, `INVALID_VALUE`) gets plain
/// ones from then on: only CUDA IPC needs them, and it then says why it cannot share.
pub(super) fn create_chunk(
    dev: &Device,
    bytes: usize,
) -> Result<CUmemGenericAllocationHandle, BackendError> {
    let mut handle: CUmemGenericAllocationHandle = 0;
    if dev.shareable_pages.load(Relaxed) {
        let prop = page_allocation_prop(dev.handle, true);
        // SAFETY: valid out-pointer; `prop` is fully initialised and `bytes` a multiple of the
        // granularity (checked by the caller).
        let result = unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) };
        match result {
            sys::CUresult::CUDA_SUCCESS => return Ok(handle),
            sys::CUresult::CUDA_ERROR_NOT_SUPPORTED | sys::CUresult::CUDA_ERROR_INVALID_VALUE => {
                dev.shareable_pages.store(false, Relaxed);
                tracing::info!(
                    device = dev.properties.index,
                    "the driver refuses shareable pages here; mapping plain ones (CUDA IPC of \
                     this memory is then unavailable)"
                );
            }
            other => check("cuMemCreate", other)?,
        }
    }
    let prop = page_allocation_prop(dev.handle, false);
    // SAFETY: as above.
    check("cuMemCreate", unsafe {
        sys::cuMemCreate(&mut handle, bytes, &prop, 0)
    })?;
    Ok(handle)
}

/// Takes every chunk of `[addr, addr + size)` out of `table`, with where each starts, or none:
/// a range that is partly unknown, or cuts a chunk (the driver cannot unmap part of one),
/// changes nothing.
pub(super) fn take_whole_chunks(
    table: &mut BTreeMap<(usize, u64), PhysicalChunk>,
    device: usize,
    addr: u64,
    size: u64,
    granularity: u64,
) -> Result<Vec<(u64, PhysicalChunk)>, BackendError> {
    let end = addr + size;
    let mut found = Vec::new();
    let mut at = addr;
    while at < end {
        let Some(&chunk) = table.get(&(device, at)) else {
            return Err(match overlapping(table, device, at, at + 1, granularity) {
                Some(base) => cut_chunk(addr, size, base),
                None => BackendError::InvalidAddress { device, ptr: at },
            });
        };
        let next = at + chunk.pages as u64 * granularity;
        if next > end {
            return Err(cut_chunk(addr, size, at));
        }
        found.push((at, chunk));
        at = next;
    }
    for (at, _) in &found {
        table.remove(&(device, *at));
    }
    Ok(found)
}

/// The chunk mapped over `[start, end)` on `device`, if any: its mapping's start address.
fn overlapping(
    chunks: &BTreeMap<(usize, u64), PhysicalChunk>,
    device: usize,
    start: u64,
    end: u64,
    granularity: u64,
) -> Option<u64> {
    let before = chunks
        .range(..(device, start))
        .next_back()
        .filter(|(&(d, base), chunk)| {
            d == device && base + chunk.pages as u64 * granularity > start
        });
    let inside = chunks.range((device, start)..(device, end)).next();
    before.or(inside).map(|(&(_, base), _)| base)
}

pub(super) fn chunk_bytes(chunk: PhysicalChunk, granularity: u64) -> Result<usize, BackendError> {
    to_usize("map", chunk.pages as u64 * granularity)
}

fn cut_chunk(addr: u64, size: u64, base: u64) -> BackendError {
    BackendError::InvalidArgument {
        call: "unmap",
        reason: format!("{addr:#x}+{size} cuts the chunk mapped at {base:#x}; unmap whole chunks"),
    }
}

/// Unmaps and releases one chunk mapped at `at`.
pub(super) fn unmap_and_release(
    at: u64,
    bytes: usize,
    handle: CUmemGenericAllocationHandle,
) -> Result<(), BackendError> {
    unmap_range(at, bytes)?;
    // SAFETY: `handle` is no longer mapped anywhere.
    check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
}
