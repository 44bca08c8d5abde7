//! Page-locked host memory (`cuMemHostAlloc` / `cuMemFreeHost`), which the manager's CPU
//! fallback hands out when a device is full: the GPU reads it over PCIe/NVLink without staging.

use super::{check, to_usize, CudaBackend};
use crate::error::BackendError;
use cudarc::driver::sys::{self, CUresult};

impl CudaBackend {
    pub(super) fn host_alloc(&self, device: usize, size: u64) -> Result<u64, BackendError> {
        self.make_current(device)?;
        let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; flags 0 ask for plain page-locked memory,
        // portable to the current context, which `make_current` set.
        let result =
            unsafe { sys::cuMemHostAlloc(&mut ptr, to_usize("alloc_pinned_host", size)?, 0) };
        if result == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(BackendError::OutOfMemory {
                device,
                requested: size,
                free: 0,
            });
        }
        check("cuMemHostAlloc", result)?;
        Ok(ptr as u64)
    }

    pub(super) fn host_free(&self, device: usize, ptr: u64) -> Result<(), BackendError> {
        self.make_current(device)?;
        // SAFETY: `ptr` came from `host_alloc` and is freed once (the fallback buffer owns it);
        // the driver validates it and answers an error for anything else.
        check("cuMemFreeHost", unsafe {
            sys::cuMemFreeHost(ptr as *mut std::ffi::c_void)
        })
    }
}
