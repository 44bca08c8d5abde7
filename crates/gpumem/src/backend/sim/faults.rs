//! Faults a test arms on the simulated device: the n-th allocation or free failing, every free
//! failing, memory queries failing, unmaps held back (a driver slow to unmap).

use crate::error::BackendError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
    /// While set, every unmap waits before it starts: what other threads can do while the
    /// driver is slow to unmap.
    hold_unmaps: AtomicBool,
    /// Unmap calls waiting on `hold_unmaps` now.
    unmaps_held: AtomicU64,
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
    /// Holds every unmap from now on (`true`) until let go (`false`).
    pub fn hold_unmaps(&self, on: bool) {
        self.hold_unmaps.store(on, Ordering::SeqCst);
    }
    /// Unmap calls held now.
    pub fn unmaps_held_now(&self) -> u64 {
        self.unmaps_held.load(Ordering::SeqCst)
    }
    pub fn clear(&self) {
        self.fail_alloc_call.store(0, Ordering::SeqCst);
        self.fail_free_call.store(0, Ordering::SeqCst);
        self.set_fail_frees(false);
        self.set_fail_mem_info(false);
        self.hold_unmaps(false);
    }

    /// Waits while unmaps are held (before the call takes the device's lock).
    pub(super) fn wait_while_unmaps_held(&self) {
        if !self.hold_unmaps.load(Ordering::SeqCst) {
            return;
        }
        self.unmaps_held.fetch_add(1, Ordering::SeqCst);
        while self.hold_unmaps.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        self.unmaps_held.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether memory queries fail now.
    pub(super) fn mem_info_fails(&self) -> bool {
        self.fail_mem_info.load(Ordering::SeqCst)
    }

    /// Whether every free fails now.
    pub(super) fn frees_fail(&self) -> bool {
        self.fail_frees.load(Ordering::SeqCst)
    }

    pub(super) fn on_alloc_call(&self) -> Result<(), BackendError> {
        let call = self.alloc_calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_alloc_call.load(Ordering::SeqCst) == call {
            return Err(BackendError::Injected("allocation call failed"));
        }
        Ok(())
    }

    pub(super) fn on_free_call(&self) -> Result<(), BackendError> {
        let call = self.free_calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_frees.load(Ordering::SeqCst)
            || self.fail_free_call.load(Ordering::SeqCst) == call
        {
            return Err(BackendError::Injected("free failed"));
        }
        Ok(())
    }
}
