//! The page reserve of one device: physical pages unmapped from an arena but kept, so the next
//! miss anywhere on the device maps them again (`cuMemMap`) instead of asking the driver for new
//! memory (`cuMemCreate`, ten times the cost or more). Every page the device's pools hold from
//! the driver is counted in [`DeviceReserve`] from its creation to its release, mapped or kept
//! here: the reserve is reserved memory in every figure, and what the driver reports as used
//! matches it to the byte. The cache budget bounds idle mapped pages and kept ones together.

use super::latency::LatencyHistogram;
use super::DeviceReserve;
use crate::backend::{DeviceBackend, DevicePtr, PhysicalPage};
use crate::error::BackendError;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

pub struct PageReserve {
    backend: Arc<dyn DeviceBackend>,
    device: usize,
    page_size: u64,
    held: Arc<DeviceReserve>,
    spare: Mutex<Vec<PhysicalPage>>,
    /// `spare.len()`, readable without the lock (cache budget checks, snapshots).
    spare_pages: AtomicU64,
    pub pages_created: AtomicU64,
    /// Pages mapped again from the reserve instead of created.
    pub pages_reused: AtomicU64,
    pub pages_released: AtomicU64,
    /// How long allocations that called the driver took, in nanoseconds.
    pub miss_ns: LatencyHistogram,
}

/// What one [`PageReserve::map`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mapped {
    pub created_pages: u64,
    pub reused_pages: u64,
}

impl PageReserve {
    pub fn new(
        backend: Arc<dyn DeviceBackend>,
        device: usize,
        held: Arc<DeviceReserve>,
    ) -> Result<Self, BackendError> {
        let page_size = backend.granularity(device)?;
        Ok(PageReserve {
            backend,
            device,
            page_size,
            held,
            spare: Mutex::new(Vec::new()),
            spare_pages: AtomicU64::new(0),
            pages_created: AtomicU64::new(0),
            pages_reused: AtomicU64::new(0),
            pages_released: AtomicU64::new(0),
            miss_ns: LatencyHistogram::default(),
        })
    }

    pub fn backend(&self) -> &dyn DeviceBackend {
        &*self.backend
    }

    pub fn device(&self) -> usize {
        self.device
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// The bytes held from the driver by the device's pools, kept pages included.
    pub fn held(&self) -> &DeviceReserve {
        &self.held
    }

    /// Pages kept unmapped, now.
    pub fn spare_pages(&self) -> u64 {
        self.spare_pages.load(Relaxed)
    }

    /// Maps `[addr, addr + size)`, with kept pages first and new ones for the rest.
    pub fn map(&self, addr: DevicePtr, size: u64) -> Result<Mapped, BackendError> {
        let mut spare = self.spare.lock();
        let before = spare.len() as u64;
        let created = self
            .backend
            .map_reusing(self.device, addr, size, &mut spare)?;
        self.spare_pages.store(spare.len() as u64, Relaxed);
        let reused = before - spare.len() as u64;
        drop(spare);
        if created > 0 {
            self.held.grow(created * self.page_size);
            self.pages_created.fetch_add(created, Relaxed);
        }
        self.pages_reused.fetch_add(reused, Relaxed);
        Ok(Mapped {
            created_pages: created,
            reused_pages: reused,
        })
    }

    /// Unmaps `[addr, addr + size)` and keeps its pages here (still held).
    pub fn unmap(&self, addr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let mut pages = Vec::with_capacity((size / self.page_size) as usize);
        self.backend
            .unmap_keeping(self.device, addr, size, &mut pages)?;
        let mut spare = self.spare.lock();
        spare.extend(pages);
        self.spare_pages.store(spare.len() as u64, Relaxed);
        Ok(())
    }

    /// Returns kept pages to the driver until at most `keep_pages` are left; returns the bytes
    /// released. On an error, what was released before it is accounted all the same.
    pub fn trim(&self, keep_pages: u64) -> Result<u64, BackendError> {
        let mut spare = self.spare.lock();
        let excess = (spare.len() as u64).saturating_sub(keep_pages) as usize;
        if excess == 0 {
            return Ok(0);
        }
        let from = spare.len() - excess;
        let mut going = spare.split_off(from);
        let result = self.backend.release_pages(self.device, &mut going);
        let released = (excess - going.len()) as u64;
        spare.extend(going);
        self.spare_pages.store(spare.len() as u64, Relaxed);
        drop(spare);
        if released > 0 {
            self.held.shrink(released * self.page_size);
            self.pages_released.fetch_add(released, Relaxed);
        }
        result.map(|()| released * self.page_size)
    }
}

impl Drop for PageReserve {
    fn drop(&mut self) {
        if let Err(error) = self.trim(0) {
            tracing::warn!(device = self.device, %error, "could not release kept pages at shutdown");
        }
    }
}

impl std::fmt::Debug for PageReserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageReserve")
            .field("device", &self.device)
            .field("spare_pages", &self.spare_pages())
            .finish_non_exhaustive()
    }
}
