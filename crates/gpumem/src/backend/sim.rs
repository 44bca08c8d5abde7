//! The simulated device: capacity, 2 MiB granularity, address ranges and page mapping like the
//! CUDA driver, memory used by other processes, faults injected on demand, and optionally what
//! the driver's calls cost on an H100 — so the pools run the same code on a laptop or in CI as on
//! a GPU.

use super::{
    BackendKind, DeviceBackend, DeviceProperties, DevicePtr, Fence, MemInfo, PhysicalChunk,
    StreamId,
};
use crate::error::BackendError;
use crate::units::{align_up, GIB, MIB};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Address space each simulated device hands out (1 PiB): every arena reserves twice the
/// device, per kind, shard and stream, so 64 TiB ran out at a 4 TiB device or a few dozen
/// streams on an 80 GiB one (then every allocation failed with a confusing error).
const ADDRESS_SPACE_PER_DEVICE: u64 = 1 << 50;
/// Where device 0's addresses start; like the driver's, they are never 0.
const ADDRESS_BASE: u64 = 1 << 46;

/// One simulated device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimDeviceSpec {
    pub name: String,
    pub total_bytes: u64,
    /// Memory taken by other processes (and the driver), never available to us.
    pub used_by_others: u64,
}

impl Default for SimDeviceSpec {
    fn default() -> Self {
        SimDeviceSpec {
            name: "Simulated H100".to_string(),
            total_bytes: 80 * GIB,
            used_by_others: 0,
        }
    }
}

/// The simulated host: its devices, the page size they allocate in, and what its driver calls
/// cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    pub devices: Vec<SimDeviceSpec>,
    pub granularity: u64,
    pub driver_costs: DriverCosts,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: vec![SimDeviceSpec::default()],
            granularity: 2 * MIB,
            driver_costs: DriverCosts::Free,
        }
    }
}

/// How long the simulated driver's calls take. `Free` answers at once (tests, the demo);
/// `H100` spends, by spinning on the calling thread, what each call cost on an H100 80GB HBM3
/// with driver 580 (`benches/gpu/vmm_probe.c`, medians, docs/gpu-results.md), so that replays
/// and benchmarks on the simulated device show what misses cost on a GPU. A model: per call
/// and per physical chunk, as the driver charges, not the driver itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DriverCosts {
    #[default]
    Free,
    H100,
}

impl crate::named::Named for DriverCosts {
    const CHOICES: &'static [crate::named::Choice<Self>] = &[
        crate::named::Choice::plain("free", DriverCosts::Free),
        crate::named::Choice::plain("h100", DriverCosts::H100),
    ];
}

impl DriverCosts {
    /// Nanoseconds of one call that creates `created` chunks and maps `mapped` chunks (created
    /// ones included), granting access once.
    fn map(self, created: u64, mapped: u64) -> u64 {
        match self {
            DriverCosts::Free => 0,
            // cuMemCreate 8 µs; cuMemMap 0.6 µs; cuMemSetAccess 34 µs for one chunk, 158 µs for
            // eight in one call.
            DriverCosts::H100 => created * 8_000 + mapped * 600 + 14_000 + mapped * 20_000,
        }
    }

    /// An unmap of `chunks` chunks (cuMemUnmap: 21.7 µs for one, 111 µs for eight).
    fn unmap(self, chunks: u64) -> u64 {
        match self {
            DriverCosts::Free => 0,
            DriverCosts::H100 => 8_000 + chunks * 13_000,
        }
    }

    /// Releasing one chunk of `bytes` (cuMemRelease: 9.8 µs at 2 MiB, 33 µs at 64 MiB).
    fn release(self, bytes: u64) -> u64 {
        match self {
            DriverCosts::Free => 0,
            DriverCosts::H100 => 9_000 + bytes / MIB * 375,
        }
    }

    /// cuMemAlloc (42 µs) and cuMemFree (35 µs) on the host these were measured on.
    fn direct(self, allocating: bool) -> u64 {
        match (self, allocating) {
            (DriverCosts::Free, _) => 0,
            (DriverCosts::H100, true) => 42_000,
            (DriverCosts::H100, false) => 35_000,
        }
    }

    /// Recording a fence: cuEventRecord and one cuEventQuery took 1.0 µs together on an H100
    /// (`vmm_probe.c`; the cuEventCreate before them was not timed, so this is a floor).
    fn fence(self) -> u64 {
        match self {
            DriverCosts::Free => 0,
            DriverCosts::H100 => 1_000,
        }
    }

    /// cuStreamSynchronize on an idle stream (0.5 µs).
    fn sync(self) -> u64 {
        match self {
            DriverCosts::Free => 0,
            DriverCosts::H100 => 500,
        }
    }
}

/// Spends `ns` nanoseconds on this thread, as a driver call would.
fn spend(ns: u64) {
    if ns == 0 {
        return;
    }
    let until = std::time::Instant::now() + std::time::Duration::from_nanos(ns);
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Faults to inject; shared, so a test can arm them while pools are running.
#[derive(Debug, Default)]
pub struct SimFaults {
    /// Fail the k-th call that takes memory (`alloc` or `map`, counted from 1); 0 = never.
    fail_alloc_call: AtomicU64,
    /// Every `alloc` and `map` call so far, on all devices.
    alloc_calls: AtomicU64,
    /// Fail the k-th call that gives memory back (`free` or `unmap`, counted from 1); 0 = never.
    fail_free_call: AtomicU64,
    /// Every `free` and `unmap` call so far, on all devices.
    free_calls: AtomicU64,
    fail_frees: AtomicBool,
    fail_mem_info: AtomicBool,
}

impl SimFaults {
    /// Makes the `k`-th memory-taking call from now fail (1 = the next one).
    pub fn fail_nth_alloc_from_now(&self, k: u64) {
        let done = self.alloc_calls.load(Ordering::SeqCst);
        self.fail_alloc_call.store(done + k, Ordering::SeqCst);
    }
    /// Makes the `k`-th call from now that gives memory back fail (1 = the next one): one
    /// release in the middle of several, as a driver failing part-way.
    pub fn fail_nth_free_from_now(&self, k: u64) {
        let done = self.free_calls.load(Ordering::SeqCst);
        self.fail_free_call.store(done + k, Ordering::SeqCst);
    }
    pub fn set_fail_frees(&self, on: bool) {
        self.fail_frees.store(on, Ordering::SeqCst);
    }
    pub fn set_fail_mem_info(&self, on: bool) {
        self.fail_mem_info.store(on, Ordering::SeqCst);
    }
    pub fn clear(&self) {
        self.fail_alloc_call.store(0, Ordering::SeqCst);
        self.fail_free_call.store(0, Ordering::SeqCst);
        self.set_fail_frees(false);
        self.set_fail_mem_info(false);
    }

    fn on_alloc_call(&self) -> Result<(), BackendError> {
        let call = self.alloc_calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_alloc_call.load(Ordering::SeqCst) == call {
            return Err(BackendError::Injected("allocation call failed"));
        }
        Ok(())
    }

    fn on_free_call(&self) -> Result<(), BackendError> {
        let call = self.free_calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_frees.load(Ordering::SeqCst)
            || self.fail_free_call.load(Ordering::SeqCst) == call
        {
            return Err(BackendError::Injected("free failed"));
        }
        Ok(())
    }
}

/// First-fit allocator over a device's address space, so addresses are unique while live and
/// reused after release, as the driver's are.
#[derive(Debug)]
struct AddressSpace {
    free: BTreeMap<u64, u64>,
}

impl AddressSpace {
    fn new(base: u64, size: u64) -> Self {
        AddressSpace {
            free: BTreeMap::from([(base, size)]),
        }
    }

    fn take(&mut self, size: u64) -> Option<u64> {
        let (&start, &len) = self.free.iter().find(|(_, &len)| len >= size)?;
        self.free.remove(&start);
        if len > size {
            self.free.insert(start + size, len - size);
        }
        Some(start)
    }

    fn give_back(&mut self, mut start: u64, mut size: u64) {
        if let Some((&prev, &prev_len)) = self.free.range(..start).next_back() {
            if prev + prev_len == start {
                self.free.remove(&prev);
                start = prev;
                size += prev_len;
            }
        }
        if let Some(next_len) = self.free.remove(&(start + size)) {
            size += next_len;
        }
        self.free.insert(start, size);
    }
}

#[derive(Debug)]
struct SimDevice {
    spec: SimDeviceSpec,
    /// Physical bytes held by this process: direct allocations plus physical pages, mapped or
    /// not (as the driver counts them).
    used: u64,
    direct: HashMap<DevicePtr, u64>,
    reserved: BTreeMap<DevicePtr, u64>,
    /// Mapped page address -> the chunk behind it and where that chunk's mapping starts.
    mapped: HashMap<DevicePtr, (PhysicalChunk, DevicePtr)>,
    /// Chunks created and not mapped anywhere (handle -> pages): their owner holds them.
    unmapped: HashMap<u64, u32>,
    next_chunk: u64,
    addresses: AddressSpace,
}

impl SimDevice {
    fn free_bytes(&self) -> u64 {
        self.spec
            .total_bytes
            .saturating_sub(self.spec.used_by_others)
            .saturating_sub(self.used)
    }

    fn take_physical(&mut self, device: usize, size: u64) -> Result<(), BackendError> {
        let free = self.free_bytes();
        if size > free {
            return Err(BackendError::OutOfMemory {
                device,
                requested: size,
                free,
            });
        }
        self.used += size;
        Ok(())
    }

    fn inside_reservation(&self, addr: u64, size: u64) -> bool {
        self.reserved
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, &len)| addr + size <= base + len)
    }
}

/// A host of simulated devices. Cheap to share: pools hold it behind an `Arc`.
#[derive(Debug)]
pub struct SimBackend {
    granularity: u64,
    costs: DriverCosts,
    devices: Vec<Mutex<SimDevice>>,
    faults: Arc<SimFaults>,
    captures: SimCaptures,
    fences: SimFences,
}

/// Streams capturing a CUDA graph, as a test sets them up with
/// [`SimBackend::begin_capture`]: what a host such as PyTorch does around the allocator.
#[derive(Debug, Default)]
struct SimCaptures {
    /// (device, stream) -> capture id.
    active: Mutex<HashMap<(usize, StreamId), u64>>,
    next_id: AtomicU64,
    /// Synchronisations refused because they would have waited on a capture.
    refused_syncs: AtomicU64,
    /// Synchronisations done (each would have stalled the host on a GPU).
    syncs: AtomicU64,
}

/// Fences recorded and not yet passed. Simulated work finishes as it is queued, so a fence
/// passes at once, unless a test holds them ([`SimBackend::hold_fences`]) to play a stream
/// still busy.
#[derive(Debug, Default)]
struct SimFences {
    outstanding: Mutex<HashSet<(usize, u64)>>,
    next: AtomicU64,
    held: AtomicBool,
    /// Fences waited for (`wait_fence`).
    waits: AtomicU64,
}

impl SimBackend {
    pub fn new(config: SimConfig) -> Self {
        let devices = config
            .devices
            .into_iter()
            .enumerate()
            .map(|(index, spec)| {
                let base = ADDRESS_BASE + index as u64 * ADDRESS_SPACE_PER_DEVICE;
                Mutex::new(SimDevice {
                    spec,
                    used: 0,
                    direct: HashMap::new(),
                    reserved: BTreeMap::new(),
                    mapped: HashMap::new(),
                    unmapped: HashMap::new(),
                    next_chunk: 1,
                    addresses: AddressSpace::new(base, ADDRESS_SPACE_PER_DEVICE),
                })
            })
            .collect();
        SimBackend {
            granularity: config.granularity,
            costs: config.driver_costs,
            devices,
            faults: Arc::new(SimFaults::default()),
            captures: SimCaptures::default(),
            fences: SimFences::default(),
        }
    }

    /// Synchronisations done so far: on a GPU, each stalls the calling thread until the stream
    /// drains, and the stream then idles until the host queues more.
    pub fn syncs(&self) -> u64 {
        self.captures.syncs.load(Ordering::Relaxed)
    }

    /// While held, no fence passes and every stream is busy, as a GPU still running a long
    /// kernel.
    pub fn hold_fences(&self, held: bool) {
        self.fences.held.store(held, Ordering::Relaxed);
    }

    /// Fences waited for so far.
    pub fn fence_waits(&self) -> u64 {
        self.fences.waits.load(Ordering::Relaxed)
    }

    /// Fences recorded and not yet seen passed.
    pub fn outstanding_fences(&self) -> usize {
        self.fences.outstanding.lock().len()
    }

    /// `stream` starts capturing a CUDA graph (as `cuStreamBeginCapture`); returns the
    /// capture's id. An error when it is capturing already.
    pub fn begin_capture(&self, device: usize, stream: StreamId) -> Result<u64, BackendError> {
        self.device(device)?;
        let mut active = self.captures.active.lock();
        if active.contains_key(&(device, stream)) {
            return Err(BackendError::InvalidArgument {
                call: "begin_capture",
                reason: format!("stream {:#x} is capturing already", stream.0),
            });
        }
        let id = self.captures.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        active.insert((device, stream), id);
        Ok(id)
    }

    /// `stream` stops capturing (as `cuStreamEndCapture`). An error when it was not capturing.
    pub fn end_capture(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        match self.captures.active.lock().remove(&(device, stream)) {
            Some(_) => Ok(()),
            None => Err(BackendError::InvalidArgument {
                call: "end_capture",
                reason: format!("stream {:#x} is not capturing", stream.0),
            }),
        }
    }

    /// How many synchronisations were refused because they would have waited on a capture: on
    /// CUDA each would have been an error, and without the backend's check, a broken capture.
    pub fn refused_syncs(&self) -> u64 {
        self.captures.refused_syncs.load(Ordering::Relaxed)
    }

    /// The fault switches, for tests and the demo.
    pub fn faults(&self) -> Arc<SimFaults> {
        Arc::clone(&self.faults)
    }

    /// Changes how much memory other processes hold, as when a neighbour loads a model.
    pub fn set_used_by_others(&self, device: usize, bytes: u64) -> Result<(), BackendError> {
        self.device(device)?.lock().spec.used_by_others = bytes;
        Ok(())
    }

    fn device(&self, device: usize) -> Result<&Mutex<SimDevice>, BackendError> {
        self.devices.get(device).ok_or(BackendError::InvalidDevice {
            requested: device,
            count: self.devices.len(),
        })
    }

    fn check_pages(&self, call: &'static str, addr: u64, size: u64) -> Result<(), BackendError> {
        if size == 0 || addr % self.granularity != 0 || size % self.granularity != 0 {
            return Err(BackendError::InvalidArgument {
                call,
                reason: format!(
                    "address {addr:#x} and size {size} must be non-zero multiples of the {} byte granularity",
                    self.granularity
                ),
            });
        }
        Ok(())
    }

    fn pages(&self, addr: u64, size: u64) -> impl Iterator<Item = u64> {
        (addr..addr + size).step_by(self.granularity as usize)
    }
}

impl DeviceBackend for SimBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Sim
    }

    fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn properties(&self, device: usize) -> Result<DeviceProperties, BackendError> {
        let spec = self.device(device)?.lock().spec.clone();
        Ok(DeviceProperties {
            index: device,
            name: spec.name,
            uuid: format!("GPU-5157a000-0000-4000-8000-{device:012x}"),
            simulated: true,
            total_memory_bytes: spec.total_bytes,
            compute_capability: (9, 0),
            multiprocessor_count: 132,
            max_threads_per_block: 1024,
            max_threads_per_multiprocessor: 2048,
            shared_memory_per_block_bytes: 48 * 1024,
            memory_clock_khz: 2_619_000,
            memory_bus_width_bits: 5120,
            total_constant_memory_bytes: 64 * 1024,
            unified_addressing: true,
            supports_fp16: true,
            supports_bf16: true,
            memory_pools_supported: true,
            virtual_memory_supported: true,
            allocation_granularity_bytes: self.granularity,
        })
    }

    fn mem_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        let state = self.device(device)?.lock();
        if self.faults.fail_mem_info.load(Ordering::SeqCst) {
            return Err(BackendError::Injected("mem_info failed"));
        }
        Ok(MemInfo {
            free: state.free_bytes(),
            total: state.spec.total_bytes,
        })
    }

    fn granularity(&self, device: usize) -> Result<u64, BackendError> {
        self.device(device)?;
        Ok(self.granularity)
    }

    fn alloc(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError> {
        let mut state = self.device(device)?.lock();
        if size == 0 {
            return Err(BackendError::InvalidArgument {
                call: "alloc",
                reason: "size is zero".to_string(),
            });
        }
        self.faults.on_alloc_call()?;
        let rounded = align_up(size, self.granularity);
        state.take_physical(device, rounded)?;
        let Some(ptr) = state.addresses.take(rounded) else {
            state.used -= rounded;
            return Err(BackendError::OutOfMemory {
                device,
                requested: size,
                free: 0,
            });
        };
        state.direct.insert(ptr, rounded);
        spend(self.costs.direct(true));
        Ok(ptr)
    }

    fn free(&self, device: usize, ptr: DevicePtr) -> Result<(), BackendError> {
        let mut state = self.device(device)?.lock();
        self.faults.on_free_call()?;
        let size = state
            .direct
            .remove(&ptr)
            .ok_or(BackendError::InvalidAddress { device, ptr })?;
        state.used -= size;
        state.addresses.give_back(ptr, size);
        spend(self.costs.direct(false));
        Ok(())
    }

    fn reserve_address_range(&self, device: usize, size: u64) -> Result<DevicePtr, BackendError> {
        let mut state = self.device(device)?.lock();
        self.check_pages("reserve_address_range", 0, size)?;
        let base = state
            .addresses
            .take(size)
            .ok_or(BackendError::InvalidArgument {
                call: "reserve_address_range",
                reason: format!("no {size} byte range of address space is left"),
            })?;
        state.reserved.insert(base, size);
        Ok(base)
    }

    fn release_address_range(
        &self,
        device: usize,
        base: DevicePtr,
        size: u64,
    ) -> Result<(), BackendError> {
        let mut state = self.device(device)?.lock();
        if state.reserved.get(&base) != Some(&size) {
            return Err(BackendError::InvalidAddress { device, ptr: base });
        }
        if self
            .pages(base, size)
            .any(|page| state.mapped.contains_key(&page))
        {
            return Err(BackendError::InvalidArgument {
                call: "release_address_range",
                reason: "pages in the range are still mapped".to_string(),
            });
        }
        state.reserved.remove(&base);
        state.addresses.give_back(base, size);
        Ok(())
    }

    fn map_reusing(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        reuse: &mut Vec<PhysicalChunk>,
        new_chunks: &[u32],
    ) -> Result<u64, BackendError> {
        let mut state = self.device(device)?.lock();
        self.check_pages("map", addr, size)?;
        if !state.inside_reservation(addr, size) {
            return Err(BackendError::InvalidAddress { device, ptr: addr });
        }
        if self
            .pages(addr, size)
            .any(|page| state.mapped.contains_key(&page))
        {
            return Err(BackendError::InvalidArgument {
                call: "map",
                reason: format!("a page in {addr:#x}+{size} is already mapped"),
            });
        }
        let count = size / self.granularity;
        let reused: u64 = reuse.iter().map(|c| c.pages as u64).sum();
        let mut seen = HashSet::new();
        if let Some(bad) = reuse.iter().find(|chunk| {
            state.unmapped.get(&chunk.handle) != Some(&chunk.pages) || !seen.insert(chunk.handle)
        }) {
            return Err(BackendError::InvalidArgument {
                call: "map",
                reason: format!(
                    "chunk {} of {} pages is not an unmapped chunk of device {device}",
                    bad.handle, bad.pages
                ),
            });
        }
        if reused > count {
            return Err(BackendError::InvalidArgument {
                call: "map",
                reason: format!("{reused} pages of chunks to map into a range of {count}"),
            });
        }
        let created = count - reused;
        super::check_new_chunks(new_chunks, created)?;
        self.faults.on_alloc_call()?;
        state.take_physical(device, created * self.granularity)?;
        let mut fresh = Vec::new();
        for &pages in new_chunks {
            state.next_chunk += 1;
            fresh.push(PhysicalChunk {
                handle: state.next_chunk,
                pages,
            });
        }
        spend(
            self.costs
                .map(fresh.len() as u64, (reuse.len() + fresh.len()) as u64),
        );
        let mut at = addr;
        for chunk in reuse.drain(..).chain(fresh) {
            state.unmapped.remove(&chunk.handle);
            for page in self.pages(at, chunk.pages as u64 * self.granularity) {
                state.mapped.insert(page, (chunk, at));
            }
            at += chunk.pages as u64 * self.granularity;
        }
        Ok(created)
    }

    fn unmap_keeping(
        &self,
        device: usize,
        addr: DevicePtr,
        size: u64,
        into: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        let mut state = self.device(device)?.lock();
        self.check_pages("unmap", addr, size)?;
        // Like the driver, unmap only whole mappings: every chunk met must start and end inside.
        let end = addr + size;
        let mut chunks = Vec::new();
        let mut at = addr;
        while at < end {
            let &(chunk, base) = state
                .mapped
                .get(&at)
                .ok_or(BackendError::InvalidAddress { device, ptr: at })?;
            let chunk_end = base + chunk.pages as u64 * self.granularity;
            if base != at || chunk_end > end {
                return Err(BackendError::InvalidArgument {
                    call: "unmap",
                    reason: format!(
                        "{addr:#x}+{size} cuts the chunk mapped at {base:#x} ({} pages); unmap whole chunks",
                        chunk.pages
                    ),
                });
            }
            chunks.push(chunk);
            at = chunk_end;
        }
        self.faults.on_free_call()?;
        for page in self.pages(addr, size) {
            state.mapped.remove(&page);
        }
        for chunk in &chunks {
            state.unmapped.insert(chunk.handle, chunk.pages);
        }
        spend(self.costs.unmap(chunks.len() as u64));
        into.extend(chunks);
        Ok(())
    }

    fn release_chunks(
        &self,
        device: usize,
        chunks: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        let mut state = self.device(device)?.lock();
        if self.faults.fail_frees.load(Ordering::SeqCst) && !chunks.is_empty() {
            return Err(BackendError::Injected("release failed"));
        }
        while let Some(&chunk) = chunks.last() {
            if state.unmapped.get(&chunk.handle) != Some(&chunk.pages) {
                return Err(BackendError::InvalidArgument {
                    call: "release_chunks",
                    reason: format!(
                        "chunk {} of {} pages is not an unmapped chunk of device {device}",
                        chunk.handle, chunk.pages
                    ),
                });
            }
            state.unmapped.remove(&chunk.handle);
            state.used -= chunk.pages as u64 * self.granularity;
            spend(self.costs.release(chunk.pages as u64 * self.granularity));
            chunks.pop();
        }
        Ok(())
    }

    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        // Simulated work completes as it is queued, so there is never anything to wait for,
        // except on a capturing stream, whose work runs only when the graph is replayed.
        self.device(device)?;
        let waits_on_capture = self
            .captures
            .active
            .lock()
            .keys()
            .any(|&(d, s)| d == device && (s == stream || stream == StreamId::ANY));
        if waits_on_capture {
            self.captures.refused_syncs.fetch_add(1, Ordering::Relaxed);
            return Err(BackendError::StreamCapturing {
                device,
                stream: stream.0,
            });
        }
        self.captures.syncs.fetch_add(1, Ordering::Relaxed);
        spend(self.costs.sync());
        Ok(())
    }

    fn stream_idle(&self, device: usize, stream: StreamId) -> Result<bool, BackendError> {
        let capturing = self.capture_of(device, stream)?.is_some();
        let busy = self.fences.held.load(Ordering::Relaxed);
        Ok(!capturing && !busy && stream != StreamId::ANY)
    }

    fn record_fence(&self, device: usize, stream: StreamId) -> Result<Fence, BackendError> {
        self.device(device)?;
        if self.capture_of(device, stream)?.is_some() {
            return Err(BackendError::StreamCapturing {
                device,
                stream: stream.0,
            });
        }
        let fence = self.fences.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.fences.outstanding.lock().insert((device, fence));
        spend(self.costs.fence());
        Ok(Fence(fence))
    }

    fn fence_passed(&self, device: usize, fence: Fence) -> Result<bool, BackendError> {
        self.device(device)?;
        let mut outstanding = self.fences.outstanding.lock();
        if !outstanding.contains(&(device, fence.0)) {
            return Err(BackendError::InvalidArgument {
                call: "fence_passed",
                reason: format!("fence {} of device {device} is unknown or passed", fence.0),
            });
        }
        if self.fences.held.load(Ordering::Relaxed) {
            return Ok(false);
        }
        outstanding.remove(&(device, fence.0));
        Ok(true)
    }

    fn wait_fence(&self, device: usize, fence: Fence) -> Result<(), BackendError> {
        self.device(device)?;
        // Waiting makes held work finish, as `synchronize_stream` does: simulated work is
        // only ever held back from queries, never from a wait.
        if !self.fences.outstanding.lock().remove(&(device, fence.0)) {
            return Err(BackendError::InvalidArgument {
                call: "wait_fence",
                reason: format!("fence {} of device {device} is unknown or passed", fence.0),
            });
        }
        self.fences.waits.fetch_add(1, Ordering::Relaxed);
        spend(self.costs.sync());
        Ok(())
    }

    fn capture_of(&self, device: usize, stream: StreamId) -> Result<Option<u64>, BackendError> {
        self.device(device)?;
        Ok(self.captures.active.lock().get(&(device, stream)).copied())
    }
}
