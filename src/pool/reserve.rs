//! The page reserve of one device: physical pages unmapped from an arena but kept, so the next
//! miss anywhere on the device maps them again (`cuMemMap`) instead of asking the driver for new
//! memory (`cuMemCreate`, ten times the cost or more). Every page the device's pools hold from
//! the driver is counted in [`DeviceReserve`] from its creation to its release, mapped or kept
//! here: the reserve is reserved memory in every figure, and what the driver reports as used
//! matches it to the byte. The cache budget bounds idle mapped pages and kept ones together.
//!
//! Pages a miss takes from idle memory are *detached* rather than unmapped: their handles are
//! mapped at the new address at once while the old address stays mapped (one physical page
//! may sit under several addresses), and the device's pager thread unmaps the old addresses
//! later, off the allocating thread. Reserved bytes do not change either way — only creation
//! and release change them — so deferring the unmap costs no memory and no honesty.

use super::latency::LatencyHistogram;
use super::DeviceReserve;
use crate::backend::{DeviceBackend, DevicePtr, PhysicalPage};
use crate::error::BackendError;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// An address range detached from an arena and still mapped, waiting for the pager.
#[derive(Clone, Copy, Debug)]
struct Detached {
    addr: DevicePtr,
    size: u64,
}

/// Wakes the pager. Shared apart from the reserve, so that a waiting pager does not keep the
/// reserve (and its memory) alive.
#[derive(Debug, Default)]
struct PagerSignal {
    work: Mutex<bool>,
    wake: Condvar,
    stop: AtomicBool,
}

pub struct PageReserve {
    backend: Arc<dyn DeviceBackend>,
    device: usize,
    page_size: u64,
    held: Arc<DeviceReserve>,
    spare: Mutex<Vec<PhysicalPage>>,
    /// `spare.len()`, readable without the lock (cache budget checks, snapshots).
    spare_pages: AtomicU64,
    /// Detached ranges not yet unmapped. A range is unmapped under this lock, so whoever holds
    /// it sees every range either waiting here or gone from the driver.
    detached: Mutex<Vec<Detached>>,
    /// `detached.len()`, so a miss with nothing pending takes no lock for it.
    detached_ranges: AtomicU64,
    pager: Arc<PagerSignal>,
    /// Ranges the pager (or a miss that needed the address) unmapped.
    pub ranges_unmapped_later: AtomicU64,
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
            detached: Mutex::new(Vec::new()),
            detached_ranges: AtomicU64::new(0),
            pager: Arc::new(PagerSignal::default()),
            ranges_unmapped_later: AtomicU64::new(0),
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

    /// Starts the device's pager: a thread that unmaps detached ranges soon after they are
    /// detached, and exits when the reserve is dropped.
    pub fn start_pager(self: &Arc<Self>) -> std::io::Result<()> {
        let reserve: Weak<PageReserve> = Arc::downgrade(self);
        let signal = Arc::clone(&self.pager);
        std::thread::Builder::new()
            .name(format!("gpumem-pager-{}", self.device))
            .spawn(move || loop {
                {
                    let mut work = signal.work.lock();
                    if !*work && !signal.stop.load(Relaxed) {
                        // The timeout retries ranges the driver refused to unmap.
                        signal.wake.wait_for(&mut work, Duration::from_millis(200));
                    }
                    *work = false;
                }
                if signal.stop.load(Relaxed) {
                    return;
                }
                let Some(reserve) = reserve.upgrade() else {
                    return;
                };
                if let Err(error) = reserve.unmap_detached() {
                    tracing::warn!(device = reserve.device, %error, "could not unmap a detached range; will retry");
                }
            })
            .map(|_| ())
    }

    /// Detaches `[addr, addr + size)` (idle pages, no work queued on them any more): their
    /// pages join the reserve at once, the range is unmapped by the pager later.
    pub fn detach(&self, addr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let mut pages = Vec::with_capacity((size / self.page_size) as usize);
        self.backend
            .detach_pages(self.device, addr, size, &mut pages)?;
        {
            let mut detached = self.detached.lock();
            detached.push(Detached { addr, size });
            self.detached_ranges.store(detached.len() as u64, Relaxed);
        }
        let mut spare = self.spare.lock();
        spare.extend(pages);
        self.spare_pages.store(spare.len() as u64, Relaxed);
        drop(spare);
        *self.pager.work.lock() = true;
        self.pager.wake.notify_one();
        Ok(())
    }

    /// Ranges detached and not yet unmapped, now.
    pub fn detached_ranges(&self) -> u64 {
        self.detached_ranges.load(Relaxed)
    }

    /// Unmaps every detached range (the pager's work; also run before pages are released, as
    /// a page must not be released while an old address still maps it). One range at a time,
    /// so a miss waiting on the lock waits for one unmap at most.
    pub fn unmap_detached(&self) -> Result<(), BackendError> {
        self.unmap_detached_where(|_| true)
    }

    fn unmap_detached_where(&self, wanted: impl Fn(&Detached) -> bool) -> Result<(), BackendError> {
        if self.detached_ranges() == 0 {
            return Ok(());
        }
        loop {
            let mut detached = self.detached.lock();
            let Some(index) = detached.iter().position(&wanted) else {
                return Ok(());
            };
            let range = detached[index];
            self.backend
                .unmap_detached(self.device, range.addr, range.size)?;
            detached.swap_remove(index);
            self.detached_ranges.store(detached.len() as u64, Relaxed);
            self.ranges_unmapped_later.fetch_add(1, Relaxed);
        }
    }

    /// Maps `[addr, addr + size)`, with kept pages first and new ones for the rest. A detached
    /// range still mapped there is unmapped first (rare: the pager is usually done by then).
    pub fn map(&self, addr: DevicePtr, size: u64) -> Result<Mapped, BackendError> {
        self.unmap_detached_where(|d| d.addr < addr + size && addr < d.addr + d.size)?;
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
        if (self.spare_pages() as u64) > keep_pages {
            self.unmap_detached()?;
        }
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
        self.pager.stop.store(true, Relaxed);
        self.pager.wake.notify_one();
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
