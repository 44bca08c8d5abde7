//! The CUDA driver backend, one of the two modules allowed `unsafe` (the C ABI,
//! `crates/gpumem-capi`, is the other): probes libcuda before cudarc touches it, caches device
//! properties, keeps one retained primary context per device, and implements
//! [`DeviceBackend`] and its capabilities with raw `cudarc::driver::sys` calls.
//!
//! Submodules: `probe` (library, symbols, `cuInit`, device count), `properties` (what
//! `gpumem devices` prints; no context needed), `vmm` (reserve address space; create, map,
//! unmap and release physical pages), `stream_ordered` (`cuMemAllocAsync`, the driver-pool
//! baseline), `host` (pinned host memory for the CPU fallback), `host_context` (leaving the
//! calling thread's current context as a host such as PyTorch set it), `graph_capture` (CUDA graph
//! capture: which capture a stream is in, and not breaking it), `events` (`StreamOrder`: fences,
//! whether a stream is idle) and `export` (mapped chunks as file descriptors another process
//! imports: CUDA IPC).

#![allow(unsafe_code)]

mod detaching;
mod events;
mod export;
mod graph_capture;
mod host;
mod host_context;
mod probe;
mod properties;
mod stream_ordered;
mod vmm;

pub use probe::DRIVER_SYMBOLS;

use super::{
    BackendKind, DeviceBackend, DeviceProperties, DevicePtr, DirectMemory, DriverPool, HostContext,
    MemInfo, PhysicalChunk, ShareableMemory, StreamId, StreamOrder,
};
use crate::error::BackendError;
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUresult};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, CStr};
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

/// All devices of the host as the CUDA driver reports them.
pub struct CudaBackend {
    /// The library name that loaded (the one cudarc loads too), for messages.
    library_name: String,
    /// `cuDriverGetVersion`: 1000 * major + 10 * minor.
    driver_version: i32,
    devices: Vec<Device>,
    /// Chunks mapped by `map`, by (device index, address their mapping starts at), so `unmap`
    /// can find, check and release them.
    chunks: Mutex<BTreeMap<(usize, u64), PhysicalChunk>>,
    /// Chunks still mapped at addresses they were detached from (`detaching.rs`), by device
    /// and address, until those are unmapped.
    detached: Mutex<BTreeMap<(usize, u64), PhysicalChunk>>,
    /// The file descriptors chunks were exported as (`export.rs`), by chunk handle: open until
    /// the chunk is released, as another process may import them until then.
    exported: Mutex<HashMap<u64, std::os::fd::OwnedFd>>,
    /// Our handle on the probed library: keeps it loaded while the backend lives (cudarc has its own).
    library_handle: libloading::Library,
}

struct Device {
    handle: CUdevice,
    /// Queried once at `open`; reading them later costs nothing and needs no context.
    properties: DeviceProperties,
    /// Retained on first use, released in `Drop`.
    context: OnceLock<PrimaryContext>,
    /// Whether new chunks are created shareable (`vmm::create_chunk`): until the driver
    /// refuses once.
    shareable_pages: AtomicBool,
}

/// A retained primary context.
#[derive(Clone, Copy)]
struct PrimaryContext(CUcontext);

// SAFETY: a CUcontext is an opaque driver handle, not memory we dereference. The CUDA driver API is
// thread safe and a context may be made current on (and used from) any thread, so moving or sharing
// the handle between threads is sound.
unsafe impl Send for PrimaryContext {}
// SAFETY: see `Send` above; the handle is never mutated after it is stored.
unsafe impl Sync for PrimaryContext {}

impl CudaBackend {
    /// Loads the driver, or says in one sentence why it cannot be used. Never panics: the library
    /// and every symbol this backend calls are checked before cudarc is asked to load anything.
    pub fn open() -> Result<CudaBackend, BackendError> {
        let driver = probe::probe()?;
        let mut devices = Vec::with_capacity(driver.device_count);
        for index in 0..driver.device_count {
            let handle = device_handle(index)?;
            devices.push(Device {
                handle,
                properties: properties::query(index, handle)?,
                context: OnceLock::new(),
                shareable_pages: AtomicBool::new(true),
            });
        }
        tracing::debug!(
            library = %driver.library_name,
            driver_version = driver.driver_version,
            devices = devices.len(),
            "CUDA driver opened"
        );
        Ok(CudaBackend {
            library_name: driver.library_name,
            driver_version: driver.driver_version,
            devices,
            chunks: Mutex::new(BTreeMap::new()),
            detached: Mutex::new(BTreeMap::new()),
            exported: Mutex::new(HashMap::new()),
            library_handle: driver.library,
        })
    }

    /// The driver library that was loaded, e.g. `libcuda.so.1`.
    pub fn library_name(&self) -> &str {
        &self.library_name
    }

    /// The CUDA version the driver supports, as (major, minor), e.g. (13, 0).
    pub fn driver_version(&self) -> (u32, u32) {
        let version = u32::try_from(self.driver_version).unwrap_or(0);
        (version / 1000, version % 1000 / 10)
    }

    fn library(&self) -> &libloading::Library {
        &self.library_handle
    }

    fn device(&self, device: usize) -> Result<&Device, BackendError> {
        self.devices.get(device).ok_or(BackendError::InvalidDevice {
            requested: device,
            count: self.devices.len(),
        })
    }

    /// Validates `device` and makes its primary context current on the calling thread.
    fn make_current(&self, device: usize) -> Result<&Device, BackendError> {
        let dev = self.device(device)?;
        let context = dev.primary_context()?;
        if self.already_current(context) {
            return Ok(dev);
        }
        // SAFETY: `context` is a primary context retained by this backend and not yet released
        // (that happens only in `Drop`, which cannot run while `&self` is borrowed).
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(context) })?;
        Ok(dev)
    }

    /// Turns a driver out-of-memory error into [`BackendError::OutOfMemory`] with the device's free
    /// memory (0 when even that query fails); other errors pass through.
    fn out_of_memory_or(&self, device: usize, requested: u64, err: BackendError) -> BackendError {
        match err {
            BackendError::DriverCall { code, .. }
                if code == CUresult::CUDA_ERROR_OUT_OF_MEMORY as i32 =>
            {
                BackendError::OutOfMemory {
                    device,
                    requested,
                    free: self.mem_info(device).map(|info| info.free).unwrap_or(0),
                }
            }
            other => other,
        }
    }
}

impl Device {
    fn primary_context(&self) -> Result<CUcontext, BackendError> {
        if let Some(context) = self.context.get() {
            return Ok(context.0);
        }
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: `context` is a valid out-pointer and `self.handle` came from `cuDeviceGet`.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut context, self.handle)
        })?;
        if self.context.set(PrimaryContext(context)).is_err() {
            // Another thread retained it first. A device has one primary context, so the handle is
            // the same; give back the extra reference so `Drop` releases exactly once per retain.
            // SAFETY: we hold one reference from the retain above; releasing it is balanced.
            if let Err(err) = check("cuDevicePrimaryCtxRelease_v2", unsafe {
                sys::cuDevicePrimaryCtxRelease_v2(self.handle)
            }) {
                tracing::warn!(%err, "releasing a duplicate primary context reference failed");
            }
        }
        Ok(context)
    }
}

impl DeviceBackend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn properties(&self, device: usize) -> Result<DeviceProperties, BackendError> {
        Ok(self.device(device)?.properties.clone())
    }

    fn mem_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        self.make_current(device)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both out-pointers are valid; a context for `device` is current.
        check("cuMemGetInfo_v2", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn granularity(&self, device: usize) -> Result<u64, BackendError> {
        Ok(self.device(device)?.properties.allocation_granularity_bytes)
    }

    fn reserve_address_range(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError> {
        self.reserve(device, size)
    }

    fn release_address_range(
        &self,
        device: usize,
        base: DevicePtr,
        size: u64,
    ) -> Result<(), BackendError> {
        self.release(device, base, size)
    }

    fn map_reusing(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        reuse: &mut Vec<PhysicalChunk>,
        new_chunks: &[u32],
    ) -> Result<u64, BackendError> {
        self.relaxed(|| self.map_chunks(device, addr, size, reuse, new_chunks))
    }

    fn unmap_keeping(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        into: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        self.relaxed(|| self.unmap_chunks(device, addr, size, into))
    }

    fn release_chunks(
        &self,
        device: usize,
        chunks: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        self.relaxed(|| self.release_physical(device, chunks))
    }

    fn streams(&self) -> Option<&dyn StreamOrder> {
        Some(self)
    }

    fn detaching(&self) -> Option<&dyn crate::backend::Detaching> {
        Some(self)
    }

    fn direct(&self) -> Option<&dyn DirectMemory> {
        Some(self)
    }

    fn driver_pool(&self) -> Option<&dyn DriverPool> {
        Some(self)
    }

    fn host_context(&self) -> Option<&dyn HostContext> {
        Some(self)
    }

    fn shareable(&self) -> Option<&dyn ShareableMemory> {
        Some(self)
    }
}

impl DirectMemory for CudaBackend {
    fn alloc(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError> {
        self.make_current(device)?;
        if size == 0 {
            return Err(BackendError::InvalidArgument {
                call: "alloc",
                reason: "size must be greater than zero".to_string(),
            });
        }
        let bytes = to_usize("alloc", size)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; a context for `device` is current.
        check("cuMemAlloc_v2", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, bytes)
        })
        .map_err(|err| self.out_of_memory_or(device, size, err))?;
        Ok(ptr)
    }

    fn free(&self, device: usize, ptr: DevicePtr) -> Result<(), BackendError> {
        self.make_current(device)?;
        // SAFETY: freeing takes a plain address; the driver validates it and answers
        // CUDA_ERROR_INVALID_VALUE for one it did not hand out, which we report as such.
        let result = unsafe { sys::cuMemFree_v2(ptr) };
        match result {
            CUresult::CUDA_ERROR_INVALID_VALUE => Err(BackendError::InvalidAddress { device, ptr }),
            other => check("cuMemFree_v2", other),
        }
    }

    fn alloc_pinned_host(&self, device: usize, size: u64) -> Result<u64, BackendError> {
        self.host_alloc(device, size)
    }

    fn free_pinned_host(&self, device: usize, ptr: u64) -> Result<(), BackendError> {
        self.host_free(device, ptr)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let leftover = std::mem::take(self.chunks.get_mut());
        if !leftover.is_empty() {
            tracing::warn!(
                chunks = leftover.len(),
                "CUDA backend dropped with memory still mapped; unmapping it"
            );
            for ((device, base), chunk) in leftover {
                if let Err(err) = self.make_current(device).and_then(|dev| {
                    let size = dev.properties.allocation_granularity_bytes * chunk.pages as u64;
                    vmm::unmap_and_release(base, to_usize("unmap", size)?, chunk.handle)
                }) {
                    tracing::warn!(device, at = format_args!("{base:#x}"), %err, "unmapping a chunk at drop failed");
                }
            }
        }
        for (index, device) in self.devices.iter().enumerate() {
            if device.context.get().is_some() {
                // SAFETY: this backend retained the primary context exactly once (see
                // `primary_context`) and nothing uses it after `drop`.
                let result = unsafe { sys::cuDevicePrimaryCtxRelease_v2(device.handle) };
                if let Err(err) = check("cuDevicePrimaryCtxRelease_v2", result) {
                    tracing::warn!(device = index, %err, "releasing the primary context failed");
                }
            }
        }
    }
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBackend")
            .field("library", &self.library_name)
            .field("driver_version", &self.driver_version)
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

/// `CUdevice` for ordinal `index`.
fn device_handle(index: usize) -> Result<CUdevice, BackendError> {
    let ordinal = i32::try_from(index).map_err(|_| BackendError::InvalidDevice {
        requested: index,
        count: 0,
    })?;
    let mut handle: CUdevice = 0;
    // SAFETY: `handle` is a valid out-pointer; the driver checks the ordinal.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut handle, ordinal)
    })?;
    Ok(handle)
}

/// Turns a driver result into `Ok` or a [`BackendError::DriverCall`] naming the call.
fn check(call: &'static str, result: CUresult) -> Result<(), BackendError> {
    if result == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(BackendError::DriverCall {
            call,
            code: result as i32,
            message: error_string(result),
        })
    }
}

/// The driver's description of `result` (`cuGetErrorString`).
fn error_string(result: CUresult) -> String {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: `text` is a valid out-pointer. `cuGetErrorString` works before `cuInit` and was
    // checked to exist by the probe, which runs before anything can call `check`.
    let status = unsafe { sys::cuGetErrorString(result, &mut text) };
    if status != CUresult::CUDA_SUCCESS || text.is_null() {
        // Stub libraries answer without a description; the enum name still says what happened.
        return format!("{result:?}");
    }
    // SAFETY: on success the driver points `text` at a static NUL-terminated string it owns.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// The driver's handle for `stream` (0, the legacy default stream, is the null handle).
fn stream_handle(call: &'static str, stream: StreamId) -> Result<sys::CUstream, BackendError> {
    let raw = usize::try_from(stream.0).map_err(|_| BackendError::InvalidArgument {
        call,
        reason: format!(
            "stream handle {:#x} is not a pointer on this host",
            stream.0
        ),
    })?;
    Ok(raw as sys::CUstream)
}

fn to_usize(call: &'static str, bytes: u64) -> Result<usize, BackendError> {
    usize::try_from(bytes).map_err(|_| BackendError::InvalidArgument {
        call,
        reason: format!("{bytes} bytes does not fit this host's address size"),
    })
}
