//! The direct strategy: every request goes to the driver and every free straight back — the
//! baseline pooling is measured against, and a switch for debugging with driver tools.

use super::stats::PoolCounters;
use super::tlsf::LiveInfo;
use super::DeviceReserve;
use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::BackendError;
use crate::units::align_up;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

pub struct DirectPool {
    backend: Arc<dyn DeviceBackend>,
    pub device: usize,
    granularity: u64,
    live: Mutex<HashMap<DevicePtr, (u64, LiveInfo)>>,
    reserve: Arc<DeviceReserve>,
    pub counters: PoolCounters,
}

impl DirectPool {
    pub fn new(
        backend: Arc<dyn DeviceBackend>,
        device: usize,
        reserve: Arc<DeviceReserve>,
    ) -> Result<Self, BackendError> {
        let granularity = backend.granularity(device)?;
        Ok(DirectPool {
            backend,
            device,
            granularity,
            live: Mutex::new(HashMap::new()),
            reserve,
            counters: PoolCounters::default(),
        })
    }

    pub fn alloc(&self, size: u64, live: LiveInfo) -> Result<DevicePtr, BackendError> {
        let mut map = self.live.lock();
        match self.backend.alloc(self.device, size) {
            Ok(ptr) => {
                map.insert(ptr, (size, live));
                // The driver hands out whole pages; count what it really holds.
                let held = align_up(size, self.granularity);
                self.counters.on_reserve(held, 1);
                self.reserve.grow(held);
                self.counters.on_alloc(live.requested, size, false);
                self.reserve.on_alloc(live.requested, size);
                Ok(ptr)
            }
            Err(error) => {
                self.counters.on_failed_request();
                self.counters.on_driver_error();
                Err(error)
            }
        }
    }

    pub fn free(&self, ptr: DevicePtr) -> Result<(), BackendError> {
        let mut map = self.live.lock();
        let Some(&(size, live)) = map.get(&ptr) else {
            return Err(BackendError::InvalidAddress {
                device: self.device,
                ptr,
            });
        };
        if let Err(error) = self.backend.free(self.device, ptr) {
            self.counters.on_driver_error();
            return Err(error);
        }
        map.remove(&ptr);
        self.counters.on_free(live.requested, size);
        self.reserve.on_free(live.requested, size);
        let held = align_up(size, self.granularity);
        self.counters.on_release(held, 1);
        self.reserve.shrink(held);
        Ok(())
    }

    /// Peaks restart from the current values, under the lock that orders every other write
    /// to the counters (the counters have one writer at a time).
    pub fn reset_peaks(&self) {
        let _writers = self.live.lock();
        self.counters.reset_peaks();
    }

    /// Event counts restart from zero (under the same lock).
    pub fn reset_counts(&self) {
        let _writers = self.live.lock();
        self.counters.reset_counts();
    }

    pub fn for_each_live(&self, mut visit: impl FnMut(DevicePtr, u64, LiveInfo)) {
        for (&ptr, &(size, live)) in self.live.lock().iter() {
            visit(ptr, size, live);
        }
    }
}
