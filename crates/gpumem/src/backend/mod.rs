//! The device layer: the `DeviceBackend` trait every pool is written against, device properties,
//! and the choice between the CUDA driver and the simulated device.

pub mod cuda;
mod detaching;
pub mod sim;
pub mod timed;

pub use detaching::Detaching;

use crate::error::BackendError;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// A device virtual address, as the CUDA driver hands them out.
pub type DevicePtr = u64;

/// Physical device memory created by one driver call: `pages` consecutive granularity pages
/// behind one handle (CUDA: a `CUmemGenericAllocationHandle`). It is mapped and unmapped whole,
/// and counts as memory the process holds from its creation until its release, mapped or not.
/// Fewer, larger chunks are what makes a miss cheap: the driver charges granting access and
/// unmapping per chunk, not per byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PhysicalChunk {
    pub handle: u64,
    pub pages: u32,
}

/// `pages` new pages cut into chunks of `chunk_pages` each, the last one shorter.
pub fn new_chunks(pages: u64, chunk_pages: u32) -> impl Iterator<Item = u32> {
    let chunk = chunk_pages.max(1) as u64;
    (0..pages.div_ceil(chunk)).map(move |i| (pages - i * chunk).min(chunk) as u32)
}

/// The check every [`DeviceBackend::map_reusing`] makes of its `new_chunks`: no empty chunk,
/// and `pages` pages in all.
pub fn check_new_chunks(new_chunks: &[u32], pages: u64) -> Result<(), BackendError> {
    let total: u64 = new_chunks.iter().map(|&c| c as u64).sum();
    if total != pages || new_chunks.contains(&0) {
        return Err(BackendError::InvalidArgument {
            call: "map",
            reason: format!("new chunks {new_chunks:?} do not cut the {pages} pages left to map"),
        });
    }
    Ok(())
}

/// A stream handle: 0 is the device's default (legacy) stream; on CUDA other values are `CUstream`s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct StreamId(pub u64);

impl StreamId {
    pub const DEFAULT: StreamId = StreamId(0);
    /// Not a stream: "work on any stream may still use this memory". Synchronising it waits
    /// for the whole device. The pools of CUDA graphs use it, since a graph may be replayed on
    /// any stream. No driver hands out this handle (it is not an aligned pointer).
    pub const ANY: StreamId = StreamId(u64::MAX);
    /// Not a stream: the pools that streams without pools of their own share. A block freed
    /// there comes back only once its own stream is past it (a fence recorded at the free has
    /// passed), so pages that go idle there wait for nothing. No driver is ever asked about it
    /// (nor handed it: an allocation naming it is served as [`ANY`](Self::ANY)'s).
    pub const SHARED: StreamId = StreamId(u64::MAX - 1);
}

/// A point in a stream's work (a CUDA event): passed once everything queued on the stream
/// before it has run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fence(pub u64);

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

/// One device driver as the pools see it: the memory operations a pool needs. Every method
/// names the device it acts on, so one backend serves all devices of a host; implementations
/// make the device's context current themselves. The virtual-memory methods mirror
/// `cuMemAddressReserve` / `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` / `cuMemUnmap` +
/// `cuMemRelease`, which let a pool grow and shrink in pages; the physical chunks are explicit
/// ([`PhysicalChunk`]), so a caller can unmap a chunk, keep it, and map it again elsewhere
/// without the driver creating memory anew (a `cuMemMap` costs about a microsecond, a
/// `cuMemCreate` ten or more).
///
/// What a device may or may not offer beyond that is asked for as a capability:
/// [`streams`](Self::streams) (ordering work on streams, fences, graph capture) and
/// [`direct`](Self::direct) (memory the driver allocates by itself). The same calls are on
/// `dyn DeviceBackend` as methods that fail with a clear error where the capability is missing.
pub trait DeviceBackend: Send + Sync + fmt::Debug {
    fn kind(&self) -> BackendKind;
    fn device_count(&self) -> usize;
    fn properties(&self, device: usize) -> Result<DeviceProperties, BackendError>;
    fn mem_info(&self, device: usize) -> Result<MemInfo, BackendError>;

    /// Reserves `size` bytes (a multiple of the granularity) of address space; no memory yet.
    fn reserve_address_range(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError>;
    /// Gives back an address range; everything in it must be unmapped first.
    fn release_address_range(
        &self,
        device: usize,
        base: DevicePtr,
        size: u64,
    ) -> Result<(), BackendError>;

    /// Backs `[addr, addr + size)` (page aligned, inside a reserved range, not yet mapped) with
    /// physical memory readable and writable by the device: first the chunks in `reuse`, in
    /// order from `addr` (chunks of `device` the caller owns, from
    /// [`unmap_keeping`](Self::unmap_keeping), together no larger than the range), then new
    /// chunks of `new_chunks` pages each, in order, for the rest (`cuMemCreate`). Device
    /// access is granted once for the whole range. Returns how many pages were created. On
    /// success `reuse` is empty; on an error nothing in the range is mapped, `reuse` is as it
    /// was, and nothing created by the call is kept.
    fn map_reusing(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        reuse: &mut Vec<PhysicalChunk>,
        new_chunks: &[u32],
    ) -> Result<u64, BackendError>;

    /// Unmaps `[addr, addr + size)`, which must cover whole chunks mapped by this backend (the
    /// driver cannot unmap part of one), and appends them to `into` in address order, still
    /// held by the process: the caller owns them and must map them again or
    /// [`release_chunks`](Self::release_chunks) them. On an error nothing is unmapped and `into`
    /// is unchanged.
    fn unmap_keeping(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        into: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError>;

    /// Returns unmapped chunks of `device` to the driver (`cuMemRelease`), popping each from
    /// `chunks` once it is gone; on an error the chunks not yet released stay in `chunks`.
    fn release_chunks(
        &self,
        device: usize,
        chunks: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError>;

    /// Size, in bytes, of the pages `map` works in (2 MiB on current NVIDIA GPUs).
    fn granularity(&self, device: usize) -> Result<u64, BackendError> {
        Ok(self.properties(device)?.allocation_granularity_bytes)
    }

    /// Backs `[addr, addr + size)` — page aligned, inside a reserved range, not yet mapped —
    /// with new physical memory readable and writable by the device.
    fn map(&self, device: usize, addr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let pages = size / self.granularity(device)?;
        let chunks: Vec<u32> = new_chunks(pages, u32::MAX).collect();
        self.map_reusing(device, addr, size, &mut Vec::new(), &chunks)
            .map(|_| ())
    }

    /// Unmaps whole chunks mapped by [`map`](Self::map) and returns their physical memory.
    fn unmap(&self, device: usize, addr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let mut chunks = Vec::new();
        self.unmap_keeping(device, addr, size, &mut chunks)?;
        self.release_chunks(device, &mut chunks)
    }

    /// Ordering work on the device's streams, when the device has streams.
    fn streams(&self) -> Option<&dyn StreamOrder> {
        None
    }

    /// Memory the driver allocates by itself, when it does.
    fn direct(&self) -> Option<&dyn DirectMemory> {
        None
    }

    /// Mapping chunks at a second address while the first stays mapped, when it can.
    fn detaching(&self) -> Option<&dyn Detaching> {
        None
    }

    /// The driver's own stream-ordered pool, when it has one: the baseline `replay` and
    /// `bench` measure gpumem against.
    fn driver_pool(&self) -> Option<&dyn DriverPool> {
        None
    }

    /// Keeping a host's current context (a host such as PyTorch reads its current device from
    /// it), when the backend switches contexts.
    fn host_context(&self) -> Option<&dyn HostContext> {
        None
    }

    /// Exporting mapped memory for another process to import (CUDA IPC), when it can.
    fn shareable(&self) -> Option<&dyn ShareableMemory> {
        None
    }

    /// For a backend that models what its calls cost rather than paying it (the simulated
    /// device): the driver time charged to the calling thread so far, in nanoseconds. `None` for
    /// one whose calls take the time they take. The adaptive cache default judges a miss by the
    /// charge where there is one, so that a replay on the simulated device decides the same
    /// whatever else the machine is running (a preempted miss of a costless device once looked
    /// dear and moved the setting).
    fn charged_ns(&self) -> Option<u64> {
        None
    }
}

/// A backend that makes its own context current on the calling thread, and can put the host's
/// back afterwards.
pub trait HostContext: Send + Sync {
    /// Runs `f`, then makes current again the context that was current before, if the backend
    /// switched it inside.
    fn keep_current_context(&self, f: &mut dyn FnMut());
}

/// One chunk under an exported range: where it is mapped, its size, and the file descriptor
/// that stands for it in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportedChunk {
    pub addr: u64,
    pub bytes: u64,
    pub fd: i32,
}

/// Mapped memory another process can import.
pub trait ShareableMemory: Send + Sync {
    /// The chunks mapped over `[addr, addr + len)` on `device`, in address order, each
    /// exported once; the descriptors stay open until their chunks are released.
    fn export_chunks(
        &self,
        device: usize,
        addr: u64,
        len: u64,
    ) -> Result<Vec<ExportedChunk>, BackendError>;
}

impl dyn HostContext + '_ {
    /// [`keep_current_context`](HostContext::keep_current_context) for a closure with a result.
    pub fn keeping<R>(&self, f: impl FnOnce() -> R) -> R {
        let mut f = Some(f);
        let mut result = None;
        self.keep_current_context(&mut || result = f.take().map(|f| f()));
        result.expect("keep_current_context runs its closure once")
    }
}

/// The driver's own stream-ordered pool (`cuMemAllocAsync` / `cuMemFreeAsync` on the device's
/// default pool): not what gpumem allocates with, but what it is measured against.
pub trait DriverPool: Send + Sync {
    /// Checks the driver has stream-ordered allocation and sets the default pool of `device` to
    /// keep what it frees (release threshold: unlimited), as a long-running engine would.
    fn prepare_stream_ordered_pool(&self, device: usize) -> Result<(), BackendError>;
    /// `cuMemAllocAsync` on the default stream.
    fn alloc_stream_ordered(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError>;
    /// `cuMemFreeAsync` on the default stream.
    fn free_stream_ordered(&self, device: usize, ptr: DevicePtr) -> Result<(), BackendError>;
    /// The pool's reserved bytes now and at their peak.
    fn stream_ordered_reserved(&self, device: usize) -> Result<(u64, u64), BackendError>;
    /// Starts the reserved peak again from now.
    fn reset_stream_ordered_peak(&self, device: usize) -> Result<(), BackendError>;
    /// Gives everything the pool keeps unused back to the driver.
    fn trim_stream_ordered_pool(&self, device: usize) -> Result<(), BackendError>;
}

/// Work on a device's streams and CUDA graph captures: what lets a pool hand memory freed on
/// one stream to another only once the work queued on it has run.
pub trait StreamOrder: Send + Sync {
    /// Waits until all work queued on `stream` has finished ([`StreamId::ANY`]: on every stream
    /// of the device). A stream that is capturing a CUDA graph has no finished work to wait for:
    /// that is an error, and the capture goes on unharmed (the driver's own synchronisation
    /// would end it).
    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError>;

    /// Whether all work queued on `stream` has finished, without waiting (`cuStreamQuery`). A
    /// capturing stream, and [`StreamId::ANY`], count as busy.
    fn stream_idle(&self, device: usize, stream: StreamId) -> Result<bool, BackendError>;

    /// Marks the work queued on `stream` so far (`cuEventRecord`). A capturing stream has no
    /// work to mark: an error.
    fn record_fence(&self, device: usize, stream: StreamId) -> Result<Fence, BackendError>;

    /// Whether the work before `fence` has finished (`cuEventQuery`). A fence that has passed,
    /// or whose query failed, is gone: ask about it no more.
    fn fence_passed(&self, device: usize, fence: Fence) -> Result<bool, BackendError>;

    /// Waits until the work before `fence` has finished (`cuEventSynchronize`): less than
    /// waiting for its stream, whose later work may still be running. The fence is gone
    /// afterwards, whether the wait succeeded or not.
    fn wait_fence(&self, device: usize, fence: Fence) -> Result<(), BackendError>;

    /// The id of the CUDA graph capture `stream` takes part in (`cuStreamGetCaptureInfo`), or
    /// `None` when it is not capturing. Unique among the process's captures.
    fn capture_of(&self, device: usize, stream: StreamId) -> Result<Option<u64>, BackendError>;
}

/// Memory the driver allocates by itself, outside the pools' pages: device memory for the
/// `direct` strategy and allocations too large to pool (`cuMemAlloc`), and page-locked host
/// memory for the CPU fallback (`cuMemHostAlloc`).
pub trait DirectMemory: Send + Sync {
    /// Allocates `size` bytes straight from the driver (`cuMemAlloc`).
    fn alloc(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError>;
    /// Returns memory from [`alloc`](Self::alloc) to the driver (`cuMemFree`).
    fn free(&self, device: usize, ptr: DevicePtr) -> Result<(), BackendError>;

    /// Page-locked host memory `device` can reach (`cuMemHostAlloc`), for the CPU fallback.
    /// Backends without it say so, and the fallback uses ordinary host memory.
    fn alloc_pinned_host(&self, device: usize, size: u64) -> Result<u64, BackendError> {
        let _ = (device, size);
        Err(BackendError::InvalidArgument {
            call: "alloc_pinned_host",
            reason: "this backend has no pinned host memory".to_string(),
        })
    }

    /// Returns memory from [`alloc_pinned_host`](Self::alloc_pinned_host).
    fn free_pinned_host(&self, device: usize, ptr: u64) -> Result<(), BackendError> {
        Err(BackendError::InvalidAddress { device, ptr })
    }
}

/// The capabilities' calls on any backend, failing with one clear error where the backend
/// lacks the capability: what the pools call.
impl dyn DeviceBackend + '_ {
    fn stream_order(&self, call: &'static str) -> Result<&dyn StreamOrder, BackendError> {
        self.streams()
            .ok_or_else(|| missing(call, self.kind(), "streams"))
    }

    fn direct_memory(&self, call: &'static str) -> Result<&dyn DirectMemory, BackendError> {
        self.direct()
            .ok_or_else(|| missing(call, self.kind(), "memory of its own"))
    }

    fn detached_mapping(&self, call: &'static str) -> Result<&dyn Detaching, BackendError> {
        self.detaching()
            .ok_or_else(|| missing(call, self.kind(), "detached mappings"))
    }

    pub fn detach_keeping(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        into: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        self.detached_mapping("detach_keeping")?
            .detach_keeping(device, addr, size, into)
    }

    pub fn unmap_detached(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
    ) -> Result<(), BackendError> {
        self.detached_mapping("unmap_detached")?
            .unmap_detached(device, addr, size)
    }

    pub fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        self.stream_order("synchronize_stream")?
            .synchronize_stream(device, stream)
    }

    pub fn stream_idle(&self, device: usize, stream: StreamId) -> Result<bool, BackendError> {
        self.stream_order("stream_idle")?
            .stream_idle(device, stream)
    }

    pub fn record_fence(&self, device: usize, stream: StreamId) -> Result<Fence, BackendError> {
        self.stream_order("record_fence")?
            .record_fence(device, stream)
    }

    pub fn fence_passed(&self, device: usize, fence: Fence) -> Result<bool, BackendError> {
        self.stream_order("fence_passed")?
            .fence_passed(device, fence)
    }

    pub fn wait_fence(&self, device: usize, fence: Fence) -> Result<(), BackendError> {
        self.stream_order("wait_fence")?.wait_fence(device, fence)
    }

    /// `None` on a backend without streams: nothing there captures.
    pub fn capture_of(&self, device: usize, stream: StreamId) -> Result<Option<u64>, BackendError> {
        match self.streams() {
            Some(streams) => streams.capture_of(device, stream),
            None => Ok(None),
        }
    }

    pub fn alloc(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError> {
        self.direct_memory("alloc")?.alloc(device, size)
    }

    pub fn free(&self, device: usize, ptr: DevicePtr) -> Result<(), BackendError> {
        self.direct_memory("free")?.free(device, ptr)
    }

    pub fn alloc_pinned_host(&self, device: usize, size: u64) -> Result<u64, BackendError> {
        self.direct_memory("alloc_pinned_host")?
            .alloc_pinned_host(device, size)
    }

    pub fn free_pinned_host(&self, device: usize, ptr: u64) -> Result<(), BackendError> {
        self.direct_memory("free_pinned_host")?
            .free_pinned_host(device, ptr)
    }
}

fn missing(call: &'static str, kind: BackendKind, what: &str) -> BackendError {
    BackendError::InvalidArgument {
        call,
        reason: format!("the {kind} backend has no {what}"),
    }
}

/// Rejects empty, unaligned or overflowing page ranges before a driver sees them: the one
/// check every backend makes of `reserve`, `map` and `unmap` arguments.
pub fn check_pages(
    call: &'static str,
    addr: u64,
    size: u64,
    granularity: u64,
) -> Result<(), BackendError> {
    let reason = if size == 0 {
        "size must be greater than zero".to_string()
    } else if granularity == 0 || !size.is_multiple_of(granularity) {
        format!("size {size} is not a multiple of the {granularity}-byte page size")
    } else if !addr.is_multiple_of(granularity) {
        format!("address {addr:#x} is not aligned to the {granularity}-byte page size")
    } else if addr.checked_add(size).is_none() {
        format!("range at {addr:#x} of {size} bytes overflows the address space")
    } else {
        return Ok(());
    };
    Err(BackendError::InvalidArgument { call, reason })
}

/// Which device implementation to open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// CUDA when the driver loads and reports a device. What happens otherwise is the opener's
    /// choice: [`open_backend`] refuses, [`open_backend_or_simulate`] falls back to the
    /// simulated device (the command line's `--backend auto`).
    Auto,
    /// The CUDA driver; an error when it is unavailable.
    Cuda,
    /// The simulated device.
    Sim,
}

impl crate::named::Named for BackendChoice {
    const CHOICES: &'static [crate::named::Choice<Self>] = &[
        crate::named::Choice {
            name: "auto",
            value: BackendChoice::Auto,
            help: "CUDA when a GPU is usable, else the simulated device",
            aliases: &[],
        },
        crate::named::Choice::plain("cuda", BackendChoice::Cuda),
        crate::named::Choice::plain("sim", BackendChoice::Sim),
    ];
}

/// An opened backend and a sentence saying why it was chosen (the first log line).
pub struct OpenedBackend {
    pub backend: Arc<dyn DeviceBackend>,
    pub reason: String,
    /// True when `auto` found no usable CUDA driver and the simulated device stands in.
    pub simulated_fallback: bool,
}

/// Opens the backend asked for, never substituting one for another: `auto` and `cuda` both
/// need a usable CUDA driver with a device, so an engine on a host whose driver is missing or
/// broken gets an error instead of simulated memory. Use [`open_backend_or_simulate`] to opt
/// in to the fallback.
pub fn open_backend(
    choice: BackendChoice,
    sim: sim::SimConfig,
) -> Result<OpenedBackend, BackendError> {
    match choice {
        BackendChoice::Sim => Ok(simulated(
            sim,
            "backend sim: simulated device requested".to_string(),
            false,
        )),
        BackendChoice::Cuda | BackendChoice::Auto => {
            let backend = cuda::CudaBackend::open()?;
            let devices = backend.device_count();
            let reason = if choice == BackendChoice::Auto {
                format!(
                    "backend cuda: auto picked the CUDA driver, which reports {devices} device(s)"
                )
            } else {
                format!("backend cuda: CUDA driver loaded with {devices} device(s)")
            };
            Ok(OpenedBackend {
                backend: Arc::new(backend),
                reason,
                simulated_fallback: false,
            })
        }
    }
}

/// As [`open_backend`], except that `auto` falls back to the simulated device when the CUDA
/// driver is missing, broken or has no devices, and says so in the reason (and in
/// [`OpenedBackend::simulated_fallback`]). For tools and demos, where a laptop without a GPU
/// should still work.
pub fn open_backend_or_simulate(
    choice: BackendChoice,
    sim: sim::SimConfig,
) -> Result<OpenedBackend, BackendError> {
    match (choice, open_backend(choice, sim.clone())) {
        (BackendChoice::Auto, Err(why)) => Ok(simulated(
            sim,
            format!("backend sim: auto fell back to the simulated device because {why}"),
            true,
        )),
        (_, opened) => opened,
    }
}

fn simulated(sim: sim::SimConfig, reason: String, simulated_fallback: bool) -> OpenedBackend {
    OpenedBackend {
        backend: Arc::new(sim::SimBackend::new(sim)),
        reason,
        simulated_fallback,
    }
}
