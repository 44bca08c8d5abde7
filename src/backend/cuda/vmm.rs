//! Growing and shrinking in pages with the virtual memory API: reserve address space, back it with
//! physical pages (`cuMemCreate` + `cuMemMap`, one `cuMemSetAccess` per call), unmap and release.

use super::properties::{device_location, page_allocation_prop};
use super::{check, to_usize, CudaBackend};
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

    pub(super) fn map_pages(
        &self,
        device: usize,
        addr: u64,
        size: u64,
    ) -> Result<(), BackendError> {
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
        let mut mapped: Vec<(u64, CUmemGenericAllocationHandle)> = Vec::new();
        for page in page_addresses(addr, size, granularity) {
            match map_page(page, page_size, &prop) {
                Ok(handle) => mapped.push((page, handle)),
                Err(err) => {
                    undo(&mapped, page_size);
                    return Err(self.out_of_memory_or(device, size, err));
                }
            }
        }
        // One cuMemSetAccess for the whole call: it costs ~23 µs however many pages it covers.
        let access = sys::CUmemAccessDesc {
            location: device_location(dev.handle),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: [addr, addr + size) is mapped just above; `access` is one valid descriptor that
        // outlives the call.
        let result = unsafe { sys::cuMemSetAccess(addr, to_usize("map", size)?, &access, 1) };
        if let Err(err) = check("cuMemSetAccess", result) {
            undo(&mapped, page_size);
            return Err(self.out_of_memory_or(device, size, err));
        }
        let mut pages = self.pages.lock();
        pages.extend(
            mapped
                .into_iter()
                .map(|(page, handle)| ((device, page), handle)),
        );
        Ok(())
    }

    pub(super) fn unmap_pages(
        &self,
        device: usize,
        addr: u64,
        size: u64,
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
        let mut first_error = None;
        for (i, &(page, handle)) in taken.iter().enumerate() {
            // SAFETY: `page` was mapped by `map` with exactly `page_size` bytes.
            let result = unsafe { sys::cuMemUnmap(page, page_size) };
            if let Err(err) = check("cuMemUnmap", result) {
                // Still mapped: keep this page and the ones not yet attempted so a retry can work.
                let mut pages = self.pages.lock();
                pages.extend(
                    taken[i..]
                        .iter()
                        .map(|&(page, handle)| ((device, page), handle)),
                );
                return Err(err);
            }
            // SAFETY: `handle` came from `cuMemCreate` and its only mapping was just removed.
            if let Err(err) = check("cuMemRelease", unsafe { sys::cuMemRelease(handle) }) {
                tracing::warn!(device, page = format_args!("{page:#x}"), %err, "releasing an unmapped page failed; its memory may leak");
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Creates one physical page and maps it at `page`; on failure nothing is left behind.
fn map_page(
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

/// Undoes the pages a failed `map` call had mapped so far, logging what cannot be undone.
fn undo(mapped: &[(u64, CUmemGenericAllocationHandle)], page_size: usize) {
    for &(page, handle) in mapped {
        if let Err(err) = unmap_and_release(page, page_size, handle) {
            tracing::warn!(page = format_args!("{page:#x}"), %err, "undoing a partial map failed");
        }
    }
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
