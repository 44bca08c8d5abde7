//! Multi-GPU placement: which device a request should go to. Requests with the same affinity
//! key (a model, a session) stick to the device the first one got; others go to the device
//! with the most headroom.

use super::{AllocOptions, DeviceBuffer, ManagedDevice, MemoryManager};
use crate::error::{AllocError, BackendError};
use std::sync::atomic::Ordering::Relaxed;

impl MemoryManager {
    /// Bytes `device` could still give this manager: what the driver has free plus what the
    /// pools cache unused, within the pool cap.
    pub fn headroom(&self, device: usize) -> Result<u64, BackendError> {
        let managed = self.device(device)?;
        self.headroom_of(managed)
    }

    fn headroom_of(&self, managed: &ManagedDevice) -> Result<u64, BackendError> {
        let free = self.backend().mem_info(managed.index)?.free;
        let reserved = managed.reserve.reserved_bytes.load(Relaxed);
        let in_use = managed.in_use_bytes();
        let cached = reserved.saturating_sub(in_use);
        let within_cap = managed.pool_cap().saturating_sub(in_use);
        Ok((free + cached).min(within_cap))
    }

    /// The device a request of `size` bytes would go to: the one its affinity key stuck to,
    /// else the one with the most headroom (the first such, on a tie).
    pub fn best_device_for(
        &self,
        size: u64,
        affinity_key: Option<&str>,
    ) -> Result<usize, AllocError> {
        if let Some(key) = affinity_key {
            if let Some(&device) = self.shared().affinity.lock().get(key) {
                return Ok(device);
            }
        }
        let mut best: Option<(usize, u64)> = None;
        for managed in &self.shared().devices {
            let Ok(headroom) = self.headroom_of(managed) else {
                continue;
            };
            if best.is_none_or(|(_, most)| headroom > most) {
                best = Some((managed.index, headroom));
            }
        }
        let Some((device, headroom)) = best else {
            return Err(AllocError::Backend(BackendError::DriverUnavailable {
                reason: "no managed device answers a memory query".to_string(),
            }));
        };
        if headroom < size {
            tracing::debug!(
                device,
                headroom,
                size,
                "no device has room; trying the roomiest"
            );
        }
        Ok(device)
    }

    /// Allocates on the best device for the request (see [`best_device_for`](Self::best_device_for));
    /// the first success for an affinity key makes that device the key's from then on.
    pub fn allocate_on_best_device(
        &self,
        size: u64,
        affinity_key: Option<&str>,
        options: &AllocOptions,
    ) -> Result<DeviceBuffer, AllocError> {
        let device = self.best_device_for(size, affinity_key)?;
        let buffer = self.alloc(device, size, options)?;
        if let Some(key) = affinity_key {
            self.shared()
                .affinity
                .lock()
                .entry(key.to_string())
                .or_insert(device);
        }
        Ok(buffer)
    }
}
