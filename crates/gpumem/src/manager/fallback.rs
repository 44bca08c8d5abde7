//! The CPU fallback: a buffer that lives on the GPU when it fits and in host memory (pinned
//! where the driver allows) when it does not — counted, so it shows on the page and in metrics.

use super::{AllocOptions, DeviceBuffer, MemoryManager};
use crate::backend::DeviceBackend;
use crate::error::AllocError;
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Memory for a request that may have spilled to the host.
#[derive(Debug)]
pub enum FallbackBuffer {
    Device(DeviceBuffer),
    Host(HostBuffer),
}

impl FallbackBuffer {
    pub fn is_on_device(&self) -> bool {
        matches!(self, FallbackBuffer::Device(_))
    }

    pub fn size(&self) -> u64 {
        match self {
            FallbackBuffer::Device(buffer) => buffer.size(),
            FallbackBuffer::Host(buffer) => buffer.size,
        }
    }
}

enum HostMemory {
    /// Page-locked memory from the driver; its address, freed through the backend.
    Pinned {
        ptr: u64,
        backend: Arc<dyn DeviceBackend>,
    },
    /// Ordinary memory, when the driver cannot pin any.
    Pageable(Vec<u8>),
}

/// Host memory standing in for device memory; returned (and uncounted) on drop.
pub struct HostBuffer {
    memory: HostMemory,
    size: u64,
    device: usize,
    manager: MemoryManager,
}

impl HostBuffer {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// True when the memory is page-locked (the GPU can read it directly).
    pub fn is_pinned(&self) -> bool {
        matches!(self.memory, HostMemory::Pinned { .. })
    }

    /// The host address of the memory.
    pub fn host_ptr(&self) -> u64 {
        match &self.memory {
            HostMemory::Pinned { ptr, .. } => *ptr,
            HostMemory::Pageable(bytes) => bytes.as_ptr() as u64,
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let HostMemory::Pinned { ptr, backend } = &self.memory {
            if let Err(error) = backend.free_pinned_host(self.device, *ptr) {
                tracing::warn!(device = self.device, %error, "freeing pinned host memory failed");
            }
        }
        if let Ok(managed) = self.manager.device(self.device) {
            managed
                .events
                .host_fallback_bytes
                .fetch_sub(self.size, Relaxed);
        }
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("size", &self.size)
            .field("device", &self.device)
            .field("pinned", &self.is_pinned())
            .finish()
    }
}

impl MemoryManager {
    /// Allocates on `device`, or — when the device is out of memory (or at critical pressure)
    /// and `cpu_fallback` is on — in host memory instead. Other errors pass through.
    pub fn alloc_or_host(
        &self,
        device: usize,
        size: u64,
        options: &AllocOptions,
    ) -> Result<FallbackBuffer, AllocError> {
        let error = match self.alloc(device, size, options) {
            Ok(buffer) => return Ok(FallbackBuffer::Device(buffer)),
            Err(error) => error,
        };
        if !self.config().cpu_fallback || !error.is_out_of_memory() {
            return Err(error);
        }
        let memory = match self.backend().alloc_pinned_host(device, size) {
            Ok(ptr) => HostMemory::Pinned {
                ptr,
                backend: Arc::clone(self.backend()),
            },
            Err(_) => HostMemory::Pageable(pageable(size).ok_or(error)?),
        };
        let managed = self.device(device)?;
        managed.events.cpu_fallbacks.fetch_add(1, Relaxed);
        managed.events.host_fallback_bytes.fetch_add(size, Relaxed);
        tracing::debug!(device, size, "allocation fell back to host memory");
        Ok(FallbackBuffer::Host(HostBuffer {
            memory,
            size,
            device,
            manager: self.clone(),
        }))
    }
}

/// Zeroed host memory, or `None` when the host cannot give that much (no abort).
fn pageable(size: u64) -> Option<Vec<u8>> {
    let size = usize::try_from(size).ok()?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(size).ok()?;
    bytes.resize(size, 0);
    Some(bytes)
}
