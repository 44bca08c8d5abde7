//! Mapped chunks as POSIX file descriptors another process imports (`cuMemExportToShareableHandle`):
//! what CUDA IPC of memory mapped through the virtual-memory API needs, PyTorch's included. The
//! importer takes the descriptor out of this process (`pidfd_getfd`) whenever its message
//! arrives, so each stays open until its chunk is released.

use super::vmm::{create_chunk, free_address_range, map_existing, release_handle, unmap_range};
use super::{check, to_usize, CudaBackend, Device};
use crate::backend::{ExportedChunk, PhysicalChunk, ShareableMemory};
use crate::error::BackendError;
use cudarc::driver::sys;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

impl ShareableMemory for CudaBackend {
    /// The chunks mapped over `[addr, addr + len)` on `device`, in address order, each exported
    /// once (later calls return the same descriptor). Fails when part of the range is not
    /// mapped by this backend, or a chunk was created without a shareable handle.
    fn export_chunks(
        &self,
        device: usize,
        addr: u64,
        len: u64,
    ) -> Result<Vec<ExportedChunk>, BackendError> {
        let granularity = self
            .make_current(device)?
            .properties
            .allocation_granularity_bytes;
        // Held throughout, so no chunk listed here is unmapped or released before it is exported.
        let mut table = self.chunks.lock();
        let mut chunks = covering(&table, device, addr, len, granularity)?;
        if chunks.iter().any(|c| c.bytes != chunks[0].bytes) {
            // PyTorch's handle describes chunks of one size only.
            self.split_into_pages(device, &mut table, &chunks, granularity)?;
            chunks = covering(&table, device, addr, len, granularity)?;
        }
        chunks
            .into_iter()
            .map(|chunk| {
                Ok(ExportedChunk {
                    addr: chunk.addr,
                    bytes: chunk.bytes,
                    fd: self.exported_fd(chunk.handle)?,
                })
            })
            .collect()
    }
}

impl CudaBackend {
    /// Backs each of `chunks` larger than a page with chunks of one page each, the same memory
    /// under the same addresses: new pages are filled from the old at a scratch range, then
    /// mapped in the old chunk's place, which is released. The context is synchronised first,
    /// so the copy has what queued work wrote; work other threads queue on these pages while
    /// this runs may be lost, which is why only a share that needs it does this.
    fn split_into_pages(
        &self,
        device: usize,
        table: &mut ChunkTable,
        chunks: &[Covering],
        granularity: u64,
    ) -> Result<(), BackendError> {
        let dev = self.device(device)?;
        // SAFETY: the device's context is current (`make_current` by the caller).
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        for chunk in chunks.iter().filter(|c| c.bytes > granularity) {
            let pages = self.copy_into_pages(device, dev, chunk, granularity)?;
            if let Err(err) = swap_in(chunk, &pages, granularity) {
                release_all(&pages);
                return Err(err);
            }
            if let Err(err) =
                self.grant_access(device, chunk.addr, to_usize("export", chunk.bytes)?)
            {
                tracing::warn!(%err, "granting access to re-backed pages failed");
            }
            release_handle(chunk.handle);
            self.forget_export(chunk.handle);
            table.remove(&(device, chunk.addr));
            for (i, &handle) in pages.iter().enumerate() {
                let at = chunk.addr + i as u64 * granularity;
                table.insert((device, at), PhysicalChunk { handle, pages: 1 });
            }
        }
        Ok(())
    }

    /// New one-page chunks holding a copy of `chunk`, mapped nowhere.
    fn copy_into_pages(
        &self,
        device: usize,
        dev: &Device,
        chunk: &Covering,
        granularity: u64,
    ) -> Result<Vec<sys::CUmemGenericAllocationHandle>, BackendError> {
        let page = to_usize("export", granularity)?;
        let scratch = self.reserve(device, chunk.bytes)?;
        let mut pages = Vec::new();
        let mut mapped = 0;
        let mut filled = || -> Result<(), BackendError> {
            for i in 0..chunk.bytes / granularity {
                pages.push(create_chunk(dev, page)?);
                map_existing(scratch + i * granularity, page, pages[pages.len() - 1])?;
                mapped += 1;
            }
            self.grant_access(device, scratch, to_usize("export", chunk.bytes)?)?;
            // SAFETY: both ranges are mapped on this context, readable and writable, and
            // `bytes` long; they do not overlap (the scratch range was just reserved).
            check("cuMemcpyDtoD_v2", unsafe {
                sys::cuMemcpyDtoD_v2(scratch, chunk.addr, to_usize("export", chunk.bytes)?)
            })?;
            // SAFETY: as above; the copy must be complete before the old chunk goes.
            check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
        };
        let result = filled();
        for i in 0..mapped {
            if let Err(err) = unmap_range(scratch + i * granularity, page) {
                tracing::warn!(%err, "unmapping a scratch page failed");
            }
        }
        // Not `release`, which takes the chunk table's lock, held by the caller: the scratch
        // range was never in the table.
        if let Err(err) = free_address_range(scratch, chunk.bytes) {
            tracing::warn!(%err, "releasing a scratch range failed");
        }
        match result {
            Ok(()) => Ok(pages),
            Err(err) => {
                release_all(&pages);
                Err(err)
            }
        }
    }

    /// The descriptor `handle` is exported as, exporting it on first use.
    fn exported_fd(
        &self,
        handle: sys::CUmemGenericAllocationHandle,
    ) -> Result<RawFd, BackendError> {
        let mut exported = self.exported.lock();
        if let Some(fd) = exported.get(&handle) {
            return Ok(fd.as_raw_fd());
        }
        let mut fd: RawFd = -1;
        // SAFETY: `handle` is a live chunk of this backend (looked up under the chunk table) and
        // `fd` a valid out-pointer for the `int` a POSIX-descriptor export writes.
        let result = unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut RawFd).cast(),
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        };
        check("cuMemExportToShareableHandle", result).map_err(|err| {
            BackendError::InvalidArgument {
                call: "export",
                reason: format!(
                    "{err}: the chunk was created without a shareable handle (the driver refused \
                     shareable pages when it was mapped)"
                ),
            }
        })?;
        // SAFETY: the driver just opened `fd` for us; nothing else owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        exported.insert(handle, owned);
        Ok(fd)
    }

    /// Closes the descriptor `handle` was exported as, if any: its chunk is being released.
    pub(super) fn forget_export(&self, handle: sys::CUmemGenericAllocationHandle) {
        self.exported.lock().remove(&handle);
    }
}

type ChunkTable = BTreeMap<(usize, u64), PhysicalChunk>;

/// A chunk under a range to export.
#[derive(Clone, Copy)]
struct Covering {
    addr: u64,
    bytes: u64,
    handle: sys::CUmemGenericAllocationHandle,
}

/// The chunks mapped over `[addr, addr + len)` on `device`, contiguous, in address order.
fn covering(
    table: &ChunkTable,
    device: usize,
    addr: u64,
    len: u64,
    granularity: u64,
) -> Result<Vec<Covering>, BackendError> {
    let end = addr
        .checked_add(len.max(1))
        .ok_or_else(|| not_mapped(addr, len))?;
    let first = table
        .range(..=(device, addr))
        .next_back()
        .filter(|(&(d, _), _)| d == device)
        .map_or(addr, |(&(_, base), _)| base);
    let chunks: Vec<Covering> = table
        .range((device, first)..(device, end))
        .map(|(&(_, base), chunk)| Covering {
            addr: base,
            bytes: chunk.pages as u64 * granularity,
            handle: chunk.handle,
        })
        .skip_while(|c| c.addr + c.bytes <= addr)
        .collect();
    // From a chunk holding `addr` to one holding the range's last byte, with no gap.
    let Some(mut at) = chunks
        .first()
        .map(|c| c.addr)
        .filter(|&start| start <= addr)
    else {
        return Err(not_mapped(addr, len));
    };
    for chunk in &chunks {
        if chunk.addr != at {
            return Err(not_mapped(addr, len));
        }
        at = chunk.addr + chunk.bytes;
    }
    if at < end {
        return Err(not_mapped(addr, len));
    }
    Ok(chunks)
}

/// Unmaps `chunk` and maps `pages` in its place; on failure, `chunk` is mapped as before.
fn swap_in(
    chunk: &Covering,
    pages: &[sys::CUmemGenericAllocationHandle],
    granularity: u64,
) -> Result<(), BackendError> {
    let page = to_usize("export", granularity)?;
    unmap_range(chunk.addr, to_usize("export", chunk.bytes)?)?;
    for (i, &handle) in pages.iter().enumerate() {
        if let Err(err) = map_existing(chunk.addr + i as u64 * granularity, page, handle) {
            for j in 0..i {
                let _ = unmap_range(chunk.addr + j as u64 * granularity, page);
            }
            if let Err(undo) =
                map_existing(chunk.addr, to_usize("export", chunk.bytes)?, chunk.handle)
            {
                tracing::error!(%undo, at = format_args!("{:#x}", chunk.addr), "could not map a chunk back after a failed re-backing");
            }
            return Err(err);
        }
    }
    Ok(())
}

fn release_all(pages: &[sys::CUmemGenericAllocationHandle]) {
    for &handle in pages {
        release_handle(handle);
    }
}

fn not_mapped(addr: u64, len: u64) -> BackendError {
    BackendError::InvalidArgument {
        call: "export",
        reason: format!("{addr:#x}+{len} is not wholly mapped by gpumem"),
    }
}
