//! The device layer: the `DeviceBackend` trait every pool is written against, device properties,
//! and the choice between the CUDA driver and the simulated device.

pub mod cuda;
pub mod sim;

use crate::error::BackendError;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// A device virtual address, as the CUDA driver hands them out.
pub type DevicePtr = u64;

/// One page of physical device memory, created by the driver and owned by whoever holds the
/// handle (CUDA: a `CUmemGenericAllocationHandle` of one granularity page). It counts as memory
/// the process holds from the moment it is created until it is released, mapped or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PhysicalPage(pub u64);

/// A stream handle: 0 is the device's default (legacy) stream; on CUDA other values are `CUstream`s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct StreamId(pub u64);

impl StreamId {
    pub const DEFAULT: StreamId = StreamId(0);
}

/// Free and total bytes of one device, as `cuMemGetInfo` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

impl MemInfo {
    pub fn used(&self) -> u64 {
        self.total.saturating_sub(self.free)
    }
}

/// Which implementation sits behind a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Cuda,
    Sim,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Sim => "sim",
        })
    }
}

/// What a device is and can do: the fields `gpumem devices` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceProperties {
    pub index: usize,
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the form nvidia-smi and dcgm-exporter use.
    pub uuid: String,
    pub simulated: bool,
    pub total_memory_bytes: u64,
    pub compute_capability: (u32, u32),
    pub multiprocessor_count: u32,
    pub max_threads_per_block: u32,
    pub max_threads_per_multiprocessor: u32,
    pub shared_memory_per_block_bytes: u64,
    pub memory_clock_khz: u32,
    pub memory_bus_width_bits: u32,
    pub total_constant_memory_bytes: u64,
    pub unified_addressing: bool,
    pub supports_fp16: bool,
    pub supports_bf16: bool,
    pub memory_pools_supported: bool,
    pub virtual_memory_supported: bool,
    pub allocation_granularity_bytes: u64,
}

/// One device driver as the pools see it. Every method names the device it acts on, so one
/// backend serves all devices of a host; implementations make the device's context current
/// themselves. The virtual-memory methods mirror `cuMemAddressReserve` / `cuMemCreate` +
/// `cuMemMap` / `cuMemUnmap` + `cuMemRelease`, which let a pool grow and shrink in pages; the
/// physical pages are explicit ([`PhysicalPage`]), so a caller can unmap a page, keep it, and
/// map it again elsewhere without the driver creating memory anew (a `cuMemMap` costs about a
/// microsecond, a `cuMemCreate` ten or more).
pub trait DeviceBackend: Send + Sync + fmt::Debug {
    fn kind(&self) -> BackendKind;
    fn device_count(&self) -> usize;
    fn properties(&self, device: usize) -> Result<DeviceProperties, BackendError>;
    fn mem_info(&self, device: usize) -> Result<MemInfo, BackendError>;
    /// Size, in bytes, of the pages `map` works in (2 MiB on current NVIDIA GPUs).
    fn granularity(&self, device: usize) -> Result<u64, BackendError>;

    /// Allocates `size` bytes straight from the driver (`cuMemAlloc`).
    fn alloc(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError>;
    /// Returns memory from [`alloc`](Self::alloc) to the driver (`cuMemFree`).
    fn free(&self, device: usize, ptr: DevicePtr) -> Result<(), BackendError>;

    /// Reserves `size` bytes (a multiple of the granularity) of address space; no memory yet.
    fn reserve_address_range(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError>;
    /// Gives back an address range; everything in it must be unmapped first.
    fn release_address_range(
        &self,
        device: usize,
        base: DevicePtr,
        size: u64,
    ) -> Result<(), BackendError>;
    /// Backs `[addr, addr + size)` — page aligned, inside a reserved range, not yet mapped —
    /// with new physical memory readable and writable by the device.
    fn map(&self, device: usize, addr: DevicePtr, size: u64) -> Result<(), BackendError> {
        self.map_reusing(device, addr, size, &mut Vec::new())
            .map(|_| ())
    }

    /// Unmaps pages mapped by [`map`](Self::map) and returns their physical memory.
    fn unmap(&self, device: usize, addr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let mut pages = Vec::new();
        self.unmap_keeping(device, addr, size, &mut pages)?;
        self.release_pages(device, &mut pages)
    }

    /// Backs `[addr, addr + size)` (page aligned, inside a reserved range, not yet mapped) with
    /// physical pages readable and writable by the device: first those popped from the back of
    /// `spare` (pages of `device` the caller owns, from [`unmap_keeping`](Self::unmap_keeping)),
    /// then new ones for the rest (`cuMemCreate`). Device access is granted once for the whole
    /// range. Returns how many pages were created. On an error nothing in the range is mapped,
    /// `spare` holds exactly the pages it held before, and no page created by the call is kept.
    fn map_reusing(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        spare: &mut Vec<PhysicalPage>,
    ) -> Result<u64, BackendError>;

    /// Unmaps `[addr, addr + size)` (mapped by this backend) and appends its physical pages to
    /// `into`, one per page in address order, still held by the process: the caller owns them
    /// and must map them again or [`release_pages`](Self::release_pages) them. On an error
    /// nothing is unmapped and `into` is unchanged.
    fn unmap_keeping(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        into: &mut Vec<PhysicalPage>,
    ) -> Result<(), BackendError>;

    /// Returns unmapped physical pages of `device` to the driver (`cuMemRelease`), popping each
    /// from `pages` once it is gone; on an error the pages not yet released stay in `pages`.
    fn release_pages(
        &self,
        device: usize,
        pages: &mut Vec<PhysicalPage>,
    ) -> Result<(), BackendError>;

    /// Waits until all work queued on `stream` has finished.
    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError>;

    /// Page-locked host memory `device` can reach (`cuMemHostAlloc`), for the CPU fallback.
    /// Backends without it say so, and the fallback uses ordinary host memory.
    fn alloc_pinned_host(&self, device: usize, size: u64) -> Result<u64, BackendError> {
        let _ = (device, size);
        Err(BackendError::InvalidArgument {
            call: "alloc_pinned_host",
            reason: format!("the {} backend has no pinned host memory", self.kind()),
        })
    }

    /// Returns memory from [`alloc_pinned_host`](Self::alloc_pinned_host).
    fn free_pinned_host(&self, device: usize, ptr: u64) -> Result<(), BackendError> {
        let _ = device;
        Err(BackendError::InvalidAddress { device, ptr })
    }
}

/// The `--backend` choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// CUDA when the driver loads and reports a device, else the simulated device.
    Auto,
    /// The CUDA driver; an error when it is unavailable.
    Cuda,
    /// The simulated device.
    Sim,
}

/// An opened backend and a sentence saying why it was chosen (the first log line).
pub struct OpenedBackend {
    pub backend: Arc<dyn DeviceBackend>,
    pub reason: String,
}

/// Opens the backend the user asked for. `auto` falls back to the simulated device when the
/// CUDA driver is missing, broken or has no devices; `cuda` turns that into an error.
pub fn open_backend(
    choice: BackendChoice,
    sim: sim::SimConfig,
) -> Result<OpenedBackend, BackendError> {
    match choice {
        BackendChoice::Sim => Ok(OpenedBackend {
            backend: Arc::new(sim::SimBackend::new(sim)),
            reason: "backend sim: simulated device requested with --backend sim".to_string(),
        }),
        BackendChoice::Cuda => {
            let backend = cuda::CudaBackend::open()?;
            let reason = format!(
                "backend cuda: CUDA driver loaded with {} device(s)",
                backend.device_count()
            );
            Ok(OpenedBackend {
                backend: Arc::new(backend),
                reason,
            })
        }
        BackendChoice::Auto => match cuda::CudaBackend::open() {
            Ok(backend) => {
                let reason = format!(
                    "backend cuda: auto picked the CUDA driver, which reports {} device(s)",
                    backend.device_count()
                );
                Ok(OpenedBackend {
                    backend: Arc::new(backend),
                    reason,
                })
            }
            Err(why) => Ok(OpenedBackend {
                backend: Arc::new(sim::SimBackend::new(sim)),
                reason: format!(
                    "backend sim: auto fell back to the simulated device because {why}"
                ),
            }),
        },
    }
}
