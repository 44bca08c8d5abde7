//! Growing and shrinking in pages with the virtual memory API: reserve address space, back it with
//! physical pages (`cuMemCreate` + `cuMemMap`, or `cuMemMap` alone for a page the caller kept;
//! one `cuMemSetAccess` per call), unmap keeping the pages, and release them.

use super::properties::{device_location, page_allocation_prop};
use super::{check, to_usize, CudaBackend};
use crate::backend::PhysicalPage;
use crate::error::BackendError;
use cudarc::driver::sys::{self, CUmemGenericAllocationHandle};

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
        let end = base + size;
        let still_mapped = self
            .pages
            .lock()
            .keys()
            .filter(|(d, page)| *d == device && (base..end).contains(page))
            .count();
        if still_mapped > 0 {
            return Err(BackendError::InvalidArgument {
                call: "release_address_range",
                reason: format!(
                    "{still_mapped} page(s) of the range at {base:#x} are still mapped; unmap them first"
                ),
            });
        }
        // SAFETY: nothing in the range is mapped by us; the driver validates that it was reserved.
        check("cuMemAddressFree", unsafe {
            sys::cuMemAddressFree(base, to_usize("release_address_range", size)?)
        })
    }

    /// [`DeviceBackend::map_reusing`](crate::backend::DeviceBackend::map_reusing): pages from
    /// `spare` are mapped again (`cuMemMap`, about a microsecond), only the rest are created.
    pub(super) fn map_pages(
        &self,
        device: usize,
        addr: u64,
        size: u64,
        spare: &mut Vec<PhysicalPage>,
    ) -> Result<u64, BackendError> {
        let dev = self.make_current(device)?;
        let granularity = dev.properties.allocation_granularity_bytes;
        check_pages("map", addr, size, granularity)?;
        let page_size = to_usize("map", granularity)?;
        {
            let pages = self.pages.lock();
            if let Some(page) = page_addresses(addr, size, granularity)
                .find(|page| pages.contains_key(&(device, *page)))
            {
                return Err(BackendError::InvalidArgument {
                    call: "map",
                    reason: format!("page {page:#x} is already mapped"),
                });
            }
        }

        let prop = page_allocation_prop(dev.handle);
        let count = (size / granularity) as usize;
        let reusable = spare.len().min(count);
        let mut reusing: Vec<PhysicalPage> = spare.split_off(spare.len() - reusable);
        // (page address, handle, created by this call)
        let mut mapped: Vec<(u64, CUmemGenericAllocationHandle, bool)> = Vec::with_capacity(count);
        let mut failure = None;
        for page in page_addresses(addr, size, granularity) {
            let outcome = match reusing.pop() {
                Some(physical) => map_existing(page, page_size, physical.0)
                    .map(|()| (physical.0, false))
                    .map_err(|e| (e, Some(physical))),
                None => map_new_page(page, page_size, &prop)
                    .map(|handle| (handle, true))
                    .map_err(|e| (e, None)),
            };
            match outcome {
                Ok((handle, created)) => mapped.push((page, handle, created)),
                Err((err, unused)) => {
                    reusing.extend(unused);
                    failure = Some(err);
                    break;
                }
            }
        }
        if failure.is_none() {
            // One cuMemSetAccess for the whole call, however many pages it covers.
            let access = sys::CUmemAccessDesc {
                location: device_location(dev.handle),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: [addr, addr + size) is mapped just above; `access` is one valid descriptor
            // that outlives the call.
            let result = unsafe { sys::cuMemSetAccess(addr, page_size * count, &access, 1) };
            failure = check("cuMemSetAccess", result).err();
        }
        if let Some(err) = failure {
            // Give the caller back every page it lent, unmapped, and release the ones created.
            let mut handed_back: Vec<PhysicalPage> = Vec::new();
            for &(page, handle, created) in mapped.iter().rev() {
                if let Err(undo) = unmap_page(page, page_size) {
                    tracing::warn!(page = format_args!("{page:#x}"), %undo, "undoing a partial map failed");
                    continue;
                }
                if created {
                    release_handle(handle);
                } else {
                    handed_back.push(PhysicalPage(handle));
                }
            }
            // Restore the caller's order: the pages popped last go back last.
            spare.extend(reusing.into_iter().rev());
            spare.extend(handed_back);
            return Err(self.out_of_memory_or(device, size, err));
        }
        let created = mapped.iter().filter(|m| m.2).count() as u64;
        let mut pages = self.pages.lock();
        pages.extend(
            mapped
                .into_iter()
                .map(|(page, handle, _)| ((device, page), handle)),
        );
        Ok(created)
    }

    /// [`DeviceBackend::unmap_keeping`](crate::backend::DeviceBackend::unmap_keeping).
    pub(super) fn unmap_pages(
        &self,
        device: usize,
        addr: u64,
        size: u64,
        into: &mut Vec<PhysicalPage>,
    ) -> Result<(), BackendError> {
        let dev = self.make_current(device)?;
        let granularity = dev.properties.allocation_granularity_bytes;
        check_pages("unmap", addr, size, granularity)?;
        let page_size = to_usize("unmap", granularity)?;
        // Take every page's handle at once, or none: a partly unknown range changes nothing.
        let taken: Vec<(u64, CUmemGenericAllocationHandle)> = {
            let mut pages = self.pages.lock();
            if let Some(page) = page_addresses(addr, size, granularity)
                .find(|page| !pages.contains_key(&(device, *page)))
            {
                return Err(BackendError::InvalidAddress { device, ptr: page });
            }
            page_addresses(addr, size, granularity)
                .filter_map(|page| pages.remove(&(device, page)).map(|handle| (page, handle)))
                .collect()
        };
        for (i, &(page, _)) in taken.iter().enumerate() {
            if let Err(err) = unmap_page(page, page_size) {
                // Map back what this call unmapped, so that the range is as it was.
                let mut restored = taken[i..].to_vec();
                for &(page, handle) in &taken[..i] {
                    match map_existing(page, page_size, handle)
                        .and_then(|()| self.grant_access(device, page, page_size))
                    {
                        Ok(()) => restored.push((page, handle)),
                        Err(again) => {
                            tracing::warn!(page = format_args!("{page:#x}"), %again, "remapping after a failed unmap failed; the page is kept unmapped");
                            into.push(PhysicalPage(handle));
                        }
                    }
                }
                let mut pages = self.pages.lock();
                pages.extend(
                    restored
                        .into_iter()
                        .map(|(page, handle)| ((device, page), handle)),
                );
                return Err(err);
            }
        }
        into.extend(taken.into_iter().map(|(_, handle)| PhysicalPage(handle)));
        Ok(())
    }

    /// [`DeviceBackend::release_pages`](crate::backend::DeviceBackend::release_pages).
    pub(super) fn release_physical(
        &self,
        device: usize,
        pages: &mut Vec<PhysicalPage>,
    ) -> Result<(), BackendError> {
        self.make_current(device)?;
        while let Some(&page) = pages.last() {
            // SAFETY: the caller owns `page`, a handle from cuMemCreate that is mapped nowhere
            // (the trait's contract); releasing it frees its memory.
            check("cuMemRelease", unsafe { sys::cuMemRelease(page.0) })?;
            pages.pop();
        }
        Ok(())
    }

    /// Grants the device read and write access to `[addr, addr + size)`.
    fn grant_access(&self, device: usize, addr: u64, size: usize) -> Result<(), BackendError> {
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

/// Maps an existing physical page at `page`.
fn map_existing(
    page: u64,
    page_size: usize,
    handle: CUmemGenericAllocationHandle,
) -> Result<(), BackendError> {
    // SAFETY: `page` lies in a reserved range (the caller's contract; the driver checks it), is
    // granularity aligned and unmapped; `handle` is an unmapped page of exactly `page_size` bytes.
    check("cuMemMap", unsafe {
        sys::cuMemMap(page, page_size, 0, handle, 0)
    })
}

/// Unmaps one page; its physical memory stays held by its handle.
fn unmap_page(page: u64, page_size: usize) -> Result<(), BackendError> {
    // SAFETY: `page` is mapped with `page_size` bytes of a handle we own.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(page, page_size) })
}

/// Releases a page created by this backend that is mapped nowhere, logging a failure.
fn release_handle(handle: CUmemGenericAllocationHandle) {
    // SAFETY: `handle` came from cuMemCreate and is mapped nowhere.
    if let Err(err) = check("cuMemRelease", unsafe { sys::cuMemRelease(handle) }) {
        tracing::warn!(%err, "releasing a physical page failed; its memory may leak");
    }
}

/// Creates one physical page and maps it at `page`; on failure nothing is left behind.
fn map_new_page(
    page: u64,
    page_size: usize,
    prop: &sys::CUmemAllocationProp,
) -> Result<CUmemGenericAllocationHandle, BackendError> {
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out-pointer; `prop` is fully initialised and `page_size` is the granularity.
    check("cuMemCreate", unsafe {
        sys::cuMemCreate(&mut handle, page_size, prop, 0)
    })?;
    // SAFETY: `page` lies in a reserved range (the caller's contract; the driver checks it), is
    // granularity aligned, and `handle` is a fresh allocation of exactly `page_size` bytes.
    if let Err(err) = check("cuMemMap", unsafe {
        sys::cuMemMap(page, page_size, 0, handle, 0)
    }) {
        // SAFETY: `handle` is unmapped and ours; releasing it frees the page.
        if let Err(release) = check("cuMemRelease", unsafe { sys::cuMemRelease(handle) }) {
            tracing::warn!(%release, "releasing a page that failed to map failed");
        }
        return Err(err);
    }
    Ok(handle)
}

/// Unmaps and releases one page mapped by [`map_page`].
pub(super) fn unmap_and_release(
    page: u64,
    page_size: usize,
    handle: CUmemGenericAllocationHandle,
) -> Result<(), BackendError> {
    // SAFETY: `page` is mapped with `page_size` bytes of `handle`, which we own.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(page, page_size) })?;
    // SAFETY: `handle` is no longer mapped anywhere.
    check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
}

/// Rejects empty, unaligned or overflowing ranges before the driver sees them.
fn check_pages(
    call: &'static str,
    addr: u64,
    size: u64,
    granularity: u64,
) -> Result<(), BackendError> {
    let reason = if size == 0 {
        "size must be greater than zero".to_string()
    } else if granularity == 0 || size % granularity != 0 {
        format!("size {size} is not a multiple of the {granularity}-byte page size")
    } else if addr % granularity != 0 {
        format!("address {addr:#x} is not aligned to the {granularity}-byte page size")
    } else if addr.checked_add(size).is_none() {
        format!("range at {addr:#x} of {size} bytes overflows the address space")
    } else {
        return Ok(());
    };
    Err(BackendError::InvalidArgument { call, reason })
}

/// The page addresses of `[addr, addr + size)` (checked by [`check_pages`] first).
fn page_addresses(addr: u64, size: u64, granularity: u64) -> impl Iterator<Item = u64> {
    (0..size / granularity).map(move |i| addr + i * granularity)
}
