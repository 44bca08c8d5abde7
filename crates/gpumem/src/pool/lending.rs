//! Idle chunks a miss maps at its block's address without waiting for the GPU
//! (`stream_ordered_reuse`): the chunks of its own arena's idle pages are detached — taken out
//! of the page table but left mapped at their old address, where work queued on the stream may
//! still read and write them — and lent to the miss's mapping. Work on one stream runs in
//! order, so the block's work, queued after, starts only once the old work has ended: the same
//! reasoning that lets a caching allocator hand a freed block to its own stream at once. The
//! old addresses are unmapped once the GPU has passed the fence behind them. Chunks the miss
//! did not map go into the device's reserve at once, where only mappings for the same stream
//! may take them (its work is queued after the old work, as the miss's own is), and no lent
//! chunk goes back to the driver or to another stream's mapping before. Until then the arena
//! places no block on the old addresses (`arena/old_addresses.rs`); the cache budget sees what
//! the device holds: the same physical chunks, under two addresses for a while.

use super::arena::UnmapsInFlight;
use super::pages::PageRun;
use super::reserve::PageReserve;
use crate::backend::{DevicePtr, Fence, PhysicalChunk, StreamId};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// Chunks one miss detached: where they were mapped, what the GPU must pass before those
/// addresses go, and the chunks not mapped again yet.
#[derive(Debug)]
pub(crate) struct Lending {
    /// The old addresses: (pages in the arena, address, bytes), whole chunks.
    pub(crate) ranges: Vec<(PageRun, DevicePtr, u64)>,
    /// What the GPU must pass before the old addresses go.
    pub(super) fence: Fence,
    /// The chunks the miss has not mapped yet: its mapping takes from here first, and
    /// [`Lendings::park`] puts the rest into the reserve.
    pub(crate) chunks: Vec<PhysicalChunk>,
    /// Every chunk lent: none may go back to the driver, or to another stream's mapping, while
    /// the old addresses are mapped.
    pub(super) handles: Vec<u64>,
    /// The stream whose work may still use the old addresses.
    pub(super) stream: StreamId,
    /// Whether the old addresses left are ones the driver refused to unmap, held off in their
    /// arena rather than being unmapped (tried again at each settle).
    pub(super) held_off: bool,
    pub(super) in_flight: Arc<UnmapsInFlight>,
}

impl Lending {
    /// The bytes detached, the room the miss made.
    pub(crate) fn bytes(&self) -> u64 {
        self.ranges.iter().map(|&(_, _, bytes)| bytes).sum()
    }

    /// Whether this lending's old addresses lie in `arena`'s (its unmaps in flight).
    pub(crate) fn blocks_any(&self, arena: &Arc<UnmapsInFlight>) -> bool {
        Arc::ptr_eq(&self.in_flight, arena)
    }

    /// Whether this lending's old addresses lie in `arena`'s (its unmaps in flight) and meet
    /// `runs`.
    pub(crate) fn blocks(&self, arena: &Arc<UnmapsInFlight>, runs: &[PageRun]) -> bool {
        self.blocks_any(arena)
            && self.ranges.iter().any(|(old, _, _)| {
                runs.iter()
                    .any(|run| old.overlaps(run.first, run.end() - 1))
            })
    }
}

/// A device's lendings whose old addresses are still mapped.
#[derive(Debug, Default)]
pub(crate) struct Lendings {
    pending: Mutex<Vec<Lending>>,
    /// `pending.len()`, so that the paths that ask find none without a lock.
    count: AtomicUsize,
    /// Lendings made so far: misses that did not wait for the GPU because they lent.
    made: AtomicU64,
}

impl Lendings {
    /// A miss has mapped what it could of `lending`'s chunks: the old addresses wait here for
    /// the GPU, and the rest of the chunks go into `reserve`, for mappings on the same stream
    /// only until the lending ends. Parked first, so that no other stream's miss can see them
    /// in the reserve unheld.
    pub(crate) fn park(&self, reserve: &PageReserve, mut lending: Lending) {
        let leftovers = std::mem::take(&mut lending.chunks);
        self.pend(lending);
        self.made.fetch_add(1, Relaxed);
        keep_in_reserve(reserve, leftovers);
    }

    /// `lending` waits for the GPU (or, held off, for the driver) among the pending ones.
    fn pend(&self, lending: Lending) {
        let mut pending = self.pending.lock();
        pending.push(lending);
        self.count.store(pending.len(), Relaxed);
    }

    /// How many lendings have been made: misses that lent instead of waiting for the GPU.
    pub(crate) fn made(&self) -> u64 {
        self.made.load(Relaxed)
    }

    pub(crate) fn any(&self) -> bool {
        self.count.load(Relaxed) > 0
    }

    /// Whether any pending lending lent `handle`: the chunk must not be released yet.
    pub(crate) fn holds(&self, handle: u64) -> bool {
        self.holds_from(handle, |_| true)
    }

    /// Whether a pending lending of a stream other than `stream` (or of any stream, if
    /// `None`) lent `handle`: work there may still use the chunk, and a mapping for `stream`
    /// would not be ordered after it.
    pub(crate) fn holds_against(&self, handle: u64, stream: Option<StreamId>) -> bool {
        self.holds_from(handle, |lending| Some(lending.stream) != stream)
    }

    fn holds_from(&self, handle: u64, counts: impl Fn(&Lending) -> bool) -> bool {
        self.any()
            && self
                .pending
                .lock()
                .iter()
                .any(|l| counts(l) && l.handles.contains(&handle))
    }

    /// Ends the lendings whose fence the GPU has passed, and waits for the GPU to pass the
    /// fences of those `must_end` names and ends them too: unmaps their old addresses, puts
    /// their unmapped chunks into `reserve`, and lets their arena map those addresses again.
    pub(crate) fn settle_with(&self, reserve: &PageReserve, must_end: impl Fn(&Lending) -> bool) {
        if !self.any() {
            return;
        }
        let backend = reserve.backend();
        let device = reserve.device();
        // (lending, whether it must be waited for): a fence seen passed, or whose query
        // failed, is gone, and its lending ends without a wait.
        let due: Vec<(Lending, bool)> = {
            let mut pending = self.pending.lock();
            let mut due = Vec::new();
            let mut index = 0;
            while index < pending.len() {
                let lending = &pending[index];
                let wait = must_end(lending);
                if wait || backend.fence_passed(device, lending.fence).unwrap_or(true) {
                    due.push((pending.swap_remove(index), wait));
                } else {
                    index += 1;
                }
            }
            self.count.store(pending.len(), Relaxed);
            due
        };
        for (lending, wait) in due {
            if wait {
                let started = std::time::Instant::now();
                if let Err(error) = backend.wait_fence(device, lending.fence) {
                    tracing::debug!(device, %error, "fence wait failed; waiting for the device");
                    let _ = backend.synchronize_stream(device, crate::backend::StreamId::ANY);
                }
                let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                reserve.gpu_wait_ns.record(ns);
            }
            self.end(reserve, lending);
        }
    }

    /// Ends every lending, waiting for the GPU where it has not passed their fences (the
    /// cache is being emptied, or the device's pools are going away).
    pub(crate) fn settle_all(&self, reserve: &PageReserve) {
        self.settle_with(reserve, |_| true);
    }

    /// Ends the lendings whose fence the GPU has passed, without waiting.
    pub(crate) fn settle_passed(&self, reserve: &PageReserve) {
        self.settle_with(reserve, |_| false);
    }

    /// The GPU has passed `lending`'s fence: its old addresses go, its leftovers join the
    /// reserve. An old address the driver will not unmap stays mapped: its lending stays
    /// pending with it alone, to be tried again at a later settle, and its pages stay held off
    /// in the arena meanwhile — no block lands there, no miss waits for them, and the arena's
    /// address range is not given back (`Pool::wind_down` keeps the pool for another try).
    fn end(&self, reserve: &PageReserve, mut lending: Lending) {
        let backend = reserve.backend();
        let device = reserve.device();
        let (mut unmapped, mut kept) = (Vec::new(), Vec::new());
        for &(run, addr, bytes) in &lending.ranges {
            match backend.unmap_detached(device, addr, bytes) {
                Ok(()) => unmapped.push(run),
                Err(error) => {
                    // Said once; the tries after it (one per settle) only at debug level.
                    if lending.held_off {
                        tracing::debug!(device, %error, address = addr, bytes, "still cannot unmap an address whose pages a miss lent");
                    } else {
                        tracing::warn!(device, %error, address = addr, bytes, "could not unmap an address whose pages a miss lent; it stays mapped, to be tried again");
                    }
                    kept.push((run, addr, bytes));
                }
            }
        }
        let kept_runs: Vec<PageRun> = kept.iter().map(|&(run, _, _)| run).collect();
        if lending.held_off {
            lending.in_flight.release_held_off(&unmapped);
        } else {
            lending.in_flight.done(&unmapped, &[]);
            lending.in_flight.hold_off(&kept_runs);
        }
        keep_in_reserve(reserve, std::mem::take(&mut lending.chunks));
        // Its arena may free what held the unmapped addresses (`old_addresses.rs`).
        let in_flight = Arc::clone(&lending.in_flight);
        if !kept.is_empty() {
            lending.ranges = kept;
            lending.held_off = true;
            self.pend(lending);
        }
        in_flight.lending_ended();
    }
}

/// Lent chunks no mapping took go into the reserve, no longer counted as on their way to it.
fn keep_in_reserve(reserve: &PageReserve, chunks: Vec<PhysicalChunk>) {
    let pages = chunks.iter().map(|c| c.pages as u64).sum();
    reserve.keep(chunks);
    reserve.end_unmapping(pages);
}
