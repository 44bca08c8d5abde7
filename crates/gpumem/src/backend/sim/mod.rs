//! The simulated device: capacity, 2 MiB granularity, address ranges and page mapping like the
//! CUDA driver, memory used by other processes, faults injected on demand, and optionally what
//! the driver's calls cost on an H100 — so the pools run the same code on a laptop or in CI as on
//! a GPU.

mod address_space;
mod costs;
mod detaching;
mod faults;
mod sim_streams;

use super::{
    BackendKind, DeviceBackend, DeviceProperties, DevicePtr, DirectMemory, Fence, MemInfo,
    PhysicalChunk, StreamId, StreamOrder,
};

pub use costs::DriverCosts;
pub use faults::SimFaults;

use crate::error::BackendError;
use crate::units::{align_up, GIB, MIB};
use address_space::{AddressSpace, Mappings};
use costs::spend;
use parking_lot::Mutex;
use sim_streams::{SimCaptures, SimFences};
use std::collections::{BTreeMap, HashMap, HashSet};
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
    /// A GPU that never catches up by itself: no fence passes and no stream is idle until
    /// waited for ([`SimBackend::hold_fences`] from the start), so every wait a host running
    /// ahead of its GPU would make shows.
    pub gpu_behind: bool,
    /// With `gpu_behind`, how many fences the GPU runs behind on each stream: a fence passes
    /// by itself once that many more are recorded on its stream ([`SimBackend::set_gpu_lag`]).
    /// 0: it never catches up by itself.
    pub gpu_lag_fences: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: vec![SimDeviceSpec::default()],
            granularity: 2 * MIB,
            driver_costs: DriverCosts::Free,
            gpu_behind: false,
            gpu_lag_fences: 0,
        }
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
    /// The chunks mapped, by where each mapping starts.
    mapped: Mappings,
    /// Chunks created and not mapped anywhere (handle -> pages): their owner holds them. A
    /// detached chunk is here too: its owner may map it elsewhere.
    unmapped: HashMap<u64, u32>,
    /// Mappings detached (`detaching.rs`), by where each starts: still in `mapped`, their
    /// addresses taken, until unmapped.
    detached: HashMap<DevicePtr, PhysicalChunk>,
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
                    mapped: Mappings::default(),
                    unmapped: HashMap::new(),
                    detached: HashMap::new(),
                    next_chunk: 1,
                    addresses: AddressSpace::new(base, ADDRESS_SPACE_PER_DEVICE),
                })
            })
            .collect();
        let sim = SimBackend {
            granularity: config.granularity,
            costs: config.driver_costs,
            devices,
            faults: Arc::new(SimFaults::default()),
            captures: SimCaptures::default(),
            fences: SimFences::default(),
        };
        sim.hold_fences(config.gpu_behind);
        sim.set_gpu_lag(config.gpu_lag_fences);
        sim
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
        super::check_pages(call, addr, size, self.granularity)
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
        if self.faults.mem_info_fails() {
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
        if state.mapped.overlaps(base, size, self.granularity) {
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
        if state.mapped.overlaps(addr, size, self.granularity) {
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
            state.mapped.insert(at, chunk);
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
        self.faults.wait_while_unmaps_held();
        let mut state = self.device(device)?.lock();
        let found = self.whole_mappings(&state, device, "unmap", addr, size, false)?;
        self.faults.on_free_call()?;
        for &(at, chunk) in &found {
            state.mapped.remove(at);
            state.unmapped.insert(chunk.handle, chunk.pages);
        }
        spend(self.costs.unmap(found.len() as u64));
        into.extend(found.into_iter().map(|(_, chunk)| chunk));
        Ok(())
    }

    fn release_chunks(
        &self,
        device: usize,
        chunks: &mut Vec<PhysicalChunk>,
    ) -> Result<(), BackendError> {
        let mut state = self.device(device)?.lock();
        if self.faults.frees_fail() && !chunks.is_empty() {
            return Err(BackendError::Injected("release failed"));
        }
        while let Some(&chunk) = chunks.last() {
            if state.unmapped.get(&chunk.handle) != Some(&chunk.pages)
                || Self::still_detached(&state, chunk.handle)
            {
                return Err(BackendError::InvalidArgument {
                    call: "release_chunks",
                    reason: format!(
                        "chunk {} of {} pages is not an unmapped chunk of device {device} (or is still mapped at a detached address)",
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

    fn streams(&self) -> Option<&dyn StreamOrder> {
        Some(self)
    }

    fn detaching(&self) -> Option<&dyn crate::backend::Detaching> {
        Some(self)
    }

    fn direct(&self) -> Option<&dyn DirectMemory> {
        Some(self)
    }

    /// What the cost model charged, not the time spent: the same calls charge the same however
    /// busy the machine is (nothing at all with [`DriverCosts::Free`]).
    fn charged_ns(&self) -> Option<u64> {
        Some(costs::charged_ns())
    }
}

impl DirectMemory for SimBackend {
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
}
