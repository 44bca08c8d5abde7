//! The share of a device the pools may hold, changed while running: what PyTorch's
//! `torch.cuda.set_per_process_memory_fraction` asks of its allocator.

use super::MemoryManager;
use crate::error::BackendError;
use std::sync::atomic::Ordering::Relaxed;

impl MemoryManager {
    /// From now on the pools of `device` map at most `fraction` of its memory (in `(0, 1]`);
    /// a request past it is refused as over the pool limit once the cache has been released.
    /// Replaces the configured `gpu_memory_fraction` and `max_pool_size` for this device.
    pub fn set_memory_fraction(&self, device: usize, fraction: f64) -> Result<(), BackendError> {
        let managed = self.device(device)?;
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(BackendError::InvalidArgument {
                call: "set_memory_fraction",
                reason: format!("fraction {fraction} is out of range (0 < fraction <= 1)"),
            });
        }
        let total = managed.properties.total_memory_bytes;
        managed
            .pool_cap
            .store((total as f64 * fraction) as u64, Relaxed);
        Ok(())
    }

    /// The share of `device` the pools may map now.
    pub fn memory_fraction(&self, device: usize) -> Result<f64, BackendError> {
        let managed = self.device(device)?;
        let total = managed.properties.total_memory_bytes.max(1);
        Ok((managed.pool_cap() as f64 / total as f64).min(1.0))
    }
}
