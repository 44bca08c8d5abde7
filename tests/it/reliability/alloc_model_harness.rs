//! The allocator model's harness: a `MemoryManager` over simulated devices that runs the
//! decoded operations, knows what the caller holds and which faults are armed, and says which
//! failures the input allows.

use super::{check_state, Op, Setup, State, DEVICES, DEVICE_BYTES, PAGE};
use gpumem::backend::sim::{SimBackend, SimConfig, SimDeviceSpec, SimFaults};
use gpumem::manager::{AllocOptions, DeviceBuffer, MemoryConfig, MemoryManager, Strategy};
use gpumem::{AllocError, BackendError, StreamId};
use std::sync::Arc;
use std::time::Duration;

/// A manager over simulated devices, what the caller holds, and the faults armed.
pub(crate) struct Harness {
    sim: Arc<SimBackend>,
    faults: Arc<SimFaults>,
    manager: MemoryManager,
    setup: Setup,
    held: Vec<DeviceBuffer>,
    /// Direct buffers dropped while frees failed: the driver still holds them, so the
    /// manager keeps them as live (with no owner left to free them).
    stranded: Vec<(usize, u64)>,
    others: [u64; DEVICES],
    alloc_fault_armed: bool,
    /// A `FailNthFree` was armed (it may or may not have fired yet).
    free_fault_armed: bool,
    frees_failing: bool,
    mem_info_failing: bool,
}

fn align_up(value: u64, align: u64) -> u64 {
    value.div_ceil(align) * align
}

impl Harness {
    pub(crate) fn new(setup: Setup) -> Harness {
        let spec = SimDeviceSpec {
            total_bytes: DEVICE_BYTES,
            ..SimDeviceSpec::default()
        };
        let sim = Arc::new(SimBackend::new(SimConfig {
            devices: vec![spec; DEVICES],
            ..SimConfig::default()
        }));
        let config = MemoryConfig {
            strategy: setup.strategy,
            shards: setup.shards,
            idle_pages_kept: setup.idle_pages_kept,
            max_pool_bytes: setup.max_pool_bytes,
            max_cached_bytes: setup.max_cached_bytes,
            release_idle_after: setup.release_idle_after,
            cleanup_interval: None,
            gpu_memory_fraction: 1.0,
            ..MemoryConfig::default()
        };
        let manager =
            MemoryManager::new(sim.clone(), config).expect("a valid configuration is accepted");
        Harness {
            faults: sim.faults(),
            sim,
            manager,
            setup,
            held: Vec::new(),
            stranded: Vec::new(),
            others: [0; DEVICES],
            alloc_fault_armed: false,
            free_fault_armed: false,
            frees_failing: false,
            mem_info_failing: false,
        }
    }

    pub(crate) fn manager(&self) -> &MemoryManager {
        &self.manager
    }

    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// Runs one operation; an error names the broken expectation.
    pub(crate) fn apply(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Alloc {
                device,
                size,
                align,
                stream,
            } => self.alloc(device, size, align, stream)?,
            Op::Free { index, explicit } => {
                if self.held.is_empty() {
                    return Ok(());
                }
                let buffer = self.held.swap_remove(index % self.held.len());
                let (device, size, ptr) = (buffer.device(), buffer.size(), buffer.ptr());
                // Only the direct strategy calls the driver on a free.
                let may_fail = self.setup.strategy == Strategy::Direct
                    && (self.frees_failing || self.free_fault_armed);
                if explicit {
                    match buffer.free() {
                        Ok(()) => {}
                        Err(BackendError::Injected(_)) if may_fail => {}
                        Err(other) => return Err(format!("free failed unexpectedly: {other}")),
                    }
                } else {
                    drop(buffer);
                }
                let still_live = || {
                    self.manager
                        .live_allocations()
                        .iter()
                        .any(|a| a.device == device && a.ptr == ptr)
                };
                if may_fail && still_live() {
                    self.stranded.push((device, size));
                }
            }
            Op::Trim { target } => {
                self.manager.trim(target);
            }
            Op::EmptyCache => {
                self.manager.empty_cache();
            }
            Op::UnmapCached => {
                self.manager.unmap_cached();
            }
            Op::ReleaseIdle => {
                self.manager.release_idle_older_than(Duration::ZERO);
            }
            Op::Maintain => {
                self.manager.maintain();
            }
            Op::ResetPeaks => self.manager.reset_peaks(),
            Op::FailNthAlloc(k) => {
                self.faults.fail_nth_alloc_from_now(k);
                self.alloc_fault_armed = true;
            }
            Op::FailNthFree(k) => {
                self.faults.fail_nth_free_from_now(k);
                self.free_fault_armed = true;
            }
            Op::FailFrees(on) => {
                self.faults.set_fail_frees(on);
                self.frees_failing = on;
            }
            Op::FailMemInfo(on) => {
                self.faults.set_fail_mem_info(on);
                self.mem_info_failing = on;
            }
            Op::UsedByOthers { device, bytes } => {
                self.sim
                    .set_used_by_others(device, bytes)
                    .map_err(|e| format!("set_used_by_others: {e}"))?;
                self.others[device] = bytes;
            }
        }
        Ok(())
    }

    fn alloc(&mut self, device: usize, size: u64, align: u64, stream: u64) -> Result<(), String> {
        let options = AllocOptions::default()
            .with_alignment(align)
            .on_stream(StreamId(stream));
        match self.manager.alloc(device, size, &options) {
            Ok(buffer) => {
                if device >= DEVICES || size == 0 || !align.is_power_of_two() || align > PAGE {
                    return Err(format!(
                        "alloc(device {device}, {size} bytes, align {align}) should have failed"
                    ));
                }
                if buffer.ptr() % align != 0 || buffer.size() != size || buffer.device() != device {
                    return Err(format!("alloc returned a wrong buffer: {buffer:?}"));
                }
                self.held.push(buffer);
                Ok(())
            }
            Err(error) => self.expected_failure(device, size, align, &error),
        }
    }

    /// Whether an allocation failure is one the input allows.
    fn expected_failure(
        &self,
        device: usize,
        size: u64,
        align: u64,
        error: &AllocError,
    ) -> Result<(), String> {
        let allowed = match error {
            AllocError::ZeroSize => size == 0,
            AllocError::InvalidAlignment(_) => !align.is_power_of_two() || align > PAGE,
            AllocError::Backend(BackendError::InvalidDevice { .. }) => device >= DEVICES,
            AllocError::TooLarge { .. } => size > DEVICE_BYTES,
            AllocError::Backend(BackendError::Injected(_)) => self.alloc_fault_armed,
            AllocError::OutOfMemory { .. }
            | AllocError::PoolLimit { .. }
            | AllocError::PressureCritical { .. } => true,
            AllocError::Backend(_) => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "alloc(device {device}, {size} bytes, align {align}) failed unexpectedly: {error}"
            ))
        }
    }

    /// Checks every invariant; the error names the first one broken.
    pub(crate) fn check(&self) -> Result<(), String> {
        check_state(&State {
            manager: &self.manager,
            sim: &self.sim,
            held: &self.held,
            stranded: &self.stranded,
            others: &self.others,
            mem_info_failing: self.mem_info_failing,
        })
    }

    /// Frees everything, clears the faults and empties the cache: every byte goes back to the
    /// device except what stranded direct buffers still hold.
    pub(crate) fn finish(mut self) -> Result<(), String> {
        self.faults.clear();
        self.frees_failing = false;
        self.free_fault_armed = false;
        self.mem_info_failing = false;
        self.held.clear();
        for device in 0..DEVICES {
            self.apply(&Op::UsedByOthers { device, bytes: 0 })?;
        }
        self.manager.empty_cache();
        self.check()?;
        for device in 0..DEVICES {
            let stranded: u64 = self
                .stranded
                .iter()
                .filter(|(d, _)| *d == device)
                .map(|(_, size)| align_up(align_up(*size, 512), PAGE))
                .sum();
            let reserved = self
                .manager
                .device_stats(device)
                .map_err(|e| e.to_string())?
                .counters
                .reserved_bytes;
            if reserved != stranded {
                return Err(format!(
                    "device {device}: {reserved} bytes still reserved after freeing everything and emptying the cache (expected {stranded})"
                ));
            }
        }
        Ok(())
    }
}
